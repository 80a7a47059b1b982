"""Per-record audit checks: structure, decoding, prompt rendering, billing and reference comparison.

Plain functions over one ``ResponseRecord`` and the run's profile; no I/O. ``run_audit`` aggregates.

Structural failure kinds (a failed sample is dropped by merge):

    missing_output_ids        the record has no ids
    unknown_token             an id outside the vocabulary
    stray_special             a control token the profile never generates
    end_of_turn_missing       finish_reason stop/tool_calls but no end-of-turn token at the end
    end_of_turn_unexpected    an end-of-turn token although the output was cut (length, error, ...)
    end_of_turn_inside        an end-of-turn token before the end
    end_of_think_missing      reasoning came back but the ids hold no end-of-think
    end_of_think_multiple     more than one end-of-think
    decode_mismatch           decoding the ids does not give back the text fields (beyond junctions)
    text_normalized           … because the tokenizer normalised the text (Qwen3 NFC)
    prompt_mismatch           prompt_ids differ from the profile's rendering of the prepared prompt
    prompt_render_error       the chat template failed on the prepared prompt
    rebuild_error             the text fields could not be rebuilt at all
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from draftgen.errors import TokenizerError
from draftgen.records import MismatchExample, PromptRecord, ResponseRecord
from draftgen.tokens import Profile, Reconstruction

__all__ = ["RecordFindings", "audit_record", "billing_cause", "compare_reference", "first_diff_span"]

_SPAN_MAX = 8
_EDGE_WS = re.compile(r"^\s+|\s+$")


@dataclass
class RecordFindings:
    failures: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail)
    flags: list[str] = field(default_factory=list)  # record flags ∪ the rebuild's flags
    billed: int | None = None
    rebuilt: int = 0
    ended: bool = False
    prompt_checked: bool = False
    rebuild: Reconstruction | None = None


def _edges_equal(a: str, b: str) -> bool:
    """Equal up to whitespace at both ends: a comparison only, nothing is written back."""
    return _EDGE_WS.sub("", a) == _EDGE_WS.sub("", b)


def audit_record(profile: Profile, rec: ResponseRecord, prompt: PromptRecord | None) -> RecordFindings:
    f = RecordFindings(flags=list(rec.recon_flags))
    ids = rec.output_ids
    if rec.usage is not None and rec.usage.completion_tokens > 0:
        f.billed = rec.usage.completion_tokens
    if ids is None:
        f.failures.append(("missing_output_ids", ""))
        return f
    tok = profile.tokenizer
    f.rebuilt = len(ids)
    eot = set(profile.end_of_turn_ids)
    specials = tok.special_ids
    allowed = profile.allowed_output_special_ids
    vocab = tok.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        f.failures.append(("unknown_token", str(bad[0])))
    stray = sorted({tok.id_to_special[t] for t in ids if t in specials and t not in allowed})
    if stray:
        f.failures.append(("stray_special", ",".join(stray[:5])))
    f.ended = bool(ids) and ids[-1] in eot
    if any(t in eot for t in ids[:-1]):
        f.failures.append(("end_of_turn_inside", ""))
    fr = rec.finish_reason
    if fr is not None:
        if fr in ("stop", "tool_calls") and not f.ended:
            f.failures.append(("end_of_turn_missing", fr))
        elif fr not in ("stop", "tool_calls") and f.ended:
            f.failures.append(("end_of_turn_unexpected", fr))
    te = profile.think_end_id
    if te is not None and profile.thinking:
        n = ids.count(te)
        cut = fr == "length" and not rec.content and not rec.tool_calls
        if n > 1 and profile.think_end_unique:
            f.failures.append(("end_of_think_multiple", str(n)))
        elif n == 0 and rec.reasoning and not cut:
            f.failures.append(("end_of_think_missing", ""))
    if rec.reasoning is not None or rec.content is not None or rec.tool_calls:
        _check_decode(profile, rec, ids, f)
    if rec.prompt_ids is not None and prompt is not None:
        f.prompt_checked = True
        try:
            want = profile.prompt_ids(prompt.messages, prompt.tools, when=rec.created_at or None)
        except TokenizerError as exc:
            f.failures.append(("prompt_render_error", str(exc)[:120]))
        else:
            if want != rec.prompt_ids:
                pos, ours, ref = first_diff_span(profile, rec.prompt_ids, want)
                f.failures.append(("prompt_mismatch", f"at {pos}: {ours} vs rendered {ref}"))
    return f


def _check_decode(profile: Profile, rec: ResponseRecord, ids: Sequence[int], f: RecordFindings) -> None:
    tok = profile.tokenizer
    reasoning_tokens = rec.usage.reasoning_tokens if rec.usage is not None else 0
    try:
        rebuilt = profile.build_output(
            rec.reasoning, rec.content, rec.finish_reason, reasoning_tokens=reasoning_tokens, tool_calls=rec.tool_calls
        )
    except TokenizerError as exc:
        f.failures.append(("rebuild_error", str(exc)[:120]))
        return
    f.rebuild = rebuilt
    for flag in rebuilt.flags:
        if flag not in f.flags:
            f.flags.append(flag)
    got = tok.decode(ids)
    if got == rebuilt.text:
        return
    if tok.normalization and got == tok.normalize(rebuilt.text):
        f.failures.append(("text_normalized", tok.normalization))
        return
    if "junction_restored" in rebuilt.flags:
        # The canonical junction differs from the one in the ids: compare field by field, modulo edges.
        parsed = profile.parse_output(ids)
        want = profile.parse_output(rebuilt.ids)
        if (
            parsed.ended == want.ended
            and _edges_equal(parsed.reasoning or "", want.reasoning or "")
            and _edges_equal(parsed.content, want.content)
        ):
            f.flags.append("junction_differs")
            return
    pos = next((i for i, (a, b) in enumerate(zip(got, rebuilt.text, strict=False)) if a != b), min(len(got), len(rebuilt.text)))
    f.failures.append(("decode_mismatch", f"at char {pos}: {got[pos:pos + 20]!r} vs {rebuilt.text[pos:pos + 20]!r}"))


def first_diff_span(profile: Profile, ours: Sequence[int], ref: Sequence[int]) -> tuple[int, list[str], list[str]]:
    """The first differing span: from the first differing position, the shortest token runs of both
    sides that cover the same bytes (``[' NOR']`` vs ``[' N', 'OR']``), at most 8 tokens each."""
    tok = profile.tokenizer
    n = min(len(ours), len(ref))
    i = next((k for k in range(n) if ours[k] != ref[k]), n)

    def nbytes(t: int) -> int:
        try:
            return len(tok.token_bytes(t))
        except (KeyError, ValueError, IndexError):
            return 1

    a, b = i, i
    la = lb = 0
    while True:
        if (la <= lb and a < len(ours)) or (b >= len(ref) and a < len(ours)):
            la += nbytes(ours[a])
            a += 1
        elif b < len(ref):
            lb += nbytes(ref[b])
            b += 1
        else:
            break
        if (la == lb and la > 0) or a - i >= _SPAN_MAX or b - i >= _SPAN_MAX:
            break
    return i, tok.token_strs(ours[i:a]), tok.token_strs(ref[i:b])


def _spelled(profile: Profile, ids: Sequence[int]) -> bytes:
    tok = profile.tokenizer
    out = bytearray()
    for t in ids:
        try:
            out += tok.token_bytes(t)
        except (KeyError, ValueError, IndexError):
            out += f"<unknown:{t}>".encode()
    return bytes(out)


_SEMANTIC_CAUSES = ("replacement_char", "reasoning_dropped", "junction_restored")
_LATE_CAUSES = ("tool_calls_rendered", "tool_call_id_assumed")
_WS = re.compile(r"\s+")


def compare_reference(
    profile: Profile, sample_id: str, ours: Sequence[int], ref: Sequence[int], flags: Sequence[str]
) -> tuple[str, MismatchExample | None]:
    """Classify ours vs reference ids: "exact", "tokenization" (same decoded text) or "semantic"."""
    if list(ours) == list(ref):
        return "exact", None
    tok = profile.tokenizer
    # Compare bytes, not decoded strings: decoding replaces partial UTF-8 with U+FFFD on both sides.
    kind = "tokenization" if _spelled(profile, ours) == _spelled(profile, ref) else "semantic"
    pos, a, b = first_diff_span(profile, ours, ref)
    cause = ""
    eot = set(profile.end_of_turn_ids)
    if kind == "tokenization":
        # Re-encoding a text cut by max_tokens can segment its last characters differently from the
        # sampled prefix of a longer text; elsewhere the sampled segmentation was not canonical.
        at_tail = pos + len(a) >= len(ours) and pos + len(b) >= len(ref)
        cause = "truncation_boundary" if at_tail and any(f.startswith("truncated") for f in flags) else "non_canonical_segmentation"
    elif pos >= min(len(ours), len(ref)) - 1 and (set(ours[pos:]) | set(ref[pos:])) & eot:
        # The outputs differ only in how they end: the end-of-turn token (a guess for some profiles).
        both = bool(ours) and bool(ref) and ours[-1] in eot and ref[-1] in eot
        cause = "assumed_end_token" if both and profile.end_token_assumed else "end_of_turn"
    else:
        cause = next((c for c in _SEMANTIC_CAUSES if c in flags), "")
        if not cause and _WS.sub("", tok.decode(ours)) == _WS.sub("", tok.decode(ref)):
            cause = "whitespace_trimmed"  # only whitespace differs: a provider trimmed the model's own edges
        if not cause:
            specials = [f for f in flags if f.startswith("special_in_text:")]
            cause = next((c for c in _LATE_CAUSES if c in flags), specials[0] if specials else "text_differs")
    return kind, MismatchExample(sample_id=sample_id, kind=kind, position=pos, ours=a, reference=b, cause=cause)


def billing_cause(
    diff: int, billed: int, flags: Sequence[str], ended: bool, reference_kind: str | None, reference_cause: str = ""
) -> str:
    """Why rebuilt and billed completion tokens differ by ``diff`` (rebuilt − billed)."""
    if "reasoning_dropped" in flags and diff < 0:
        return "reasoning_dropped"
    if reference_kind == "tokenization":
        return reference_cause or "non_canonical_segmentation"
    if reference_kind == "semantic":
        return reference_cause or "text_mismatch"
    if ended and diff == 1:
        return "end_token_not_billed"
    if any(f.startswith("special_in_text:") for f in flags):
        return "special_in_text"
    if "tool_calls_rendered" in flags:
        return "tool_calls_rendered"
    if "junction_restored" in flags and abs(diff) <= 2:
        return "junction_restored"
    if abs(diff) <= max(3, billed // 50):
        return "tokenization_drift"
    return "unexplained"
