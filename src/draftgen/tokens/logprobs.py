"""Exact output ids recovered from per-token logprobs.

OpenAI-shaped logprobs (``choices[0].logprobs.content[] = {token, bytes, logprob}``) name each sampled
content token by its text and (usually) its raw bytes. A token's bytes identify its id in a byte-level
vocabulary exactly (``Tokenizer.bytes_to_id``); without ``bytes`` the token string's UTF-8 is used
(tokens that are partial UTF-8 sequences then cannot be mapped, and recovery gives up).

Rule for exactness: the ids of the *content run* (the text between the control token before the
content and the end-of-turn) come from the logprobs; everything else (reasoning, markers, end-of-turn)
is rebuilt by the profile. This is exact only because a control token separates the content run from
the reasoning run: BPE never merges across a control token, so the two runs are tokenized
independently. Conditions, each checked:

- the content field is bounded by control tokens in the profile's layout (or starts the output);
- the logprob tokens' bytes concatenate to the content run exactly (``lead + content`` where the profile
  has a junction). If they cover only the returned content and the provider trimmed the junction
  (Qwen3's ``\\n\\n``), the junction's canonical ids are prepended and the record is flagged
  ``logprobs_junction_assumed``;
- every token maps to an id (a declared tool-call control token may appear by its string);
- no structured tool calls (their markup is rendered, not sampled text the logprobs cover).

Otherwise ``reconstruct_with_logprobs`` returns None and the caller reconstructs from text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from draftgen.records import ToolCall
from draftgen.tokens.profile import Field, Profile, Reconstruction, Special, restore_lead

__all__ = [
    "TokenLogprob",
    "ids_from_token_bytes",
    "output_ids_from_logprobs",
    "reconstruct_with_logprobs",
    "token_bytes_from_logprobs",
]


class TokenLogprob(msgspec.Struct):
    """One entry of ``choices[0].logprobs.content``."""

    token: str
    bytes: list[int] | None = None
    logprob: float = 0.0


def token_bytes_from_logprobs(entries: Sequence[TokenLogprob]) -> list[bytes]:
    """The raw bytes of each sampled token (``bytes`` when given, else the token string's UTF-8)."""
    return [bytes(e.bytes) if e.bytes is not None else e.token.encode("utf-8") for e in entries]


def ids_from_token_bytes(profile: Profile, token_bytes: Sequence[bytes]) -> list[int] | None:
    """Map each token's bytes to its id; a declared tool-call control token may appear by its string.
    None when any token is unknown."""
    tok = profile.tokenizer
    table = tok.bytes_to_id
    out: list[int] = []
    for b in token_bytes:
        tid = table.get(b)
        if tid is None:
            try:
                sid = tok.special_tokens.get(b.decode("utf-8"))
            except UnicodeDecodeError:
                return None
            if sid is None or sid not in profile.generated_special_ids:
                return None
            tid = sid
        out.append(tid)
    return out


def _content_bounded(profile: Profile, reasoning: str, content: str, reasoning_tokens: int,
                     tool_calls: Sequence[ToolCall] | None) -> Field | None:
    suffix = profile.suffix_for(reasoning, content, reasoning_tokens, tool_calls)
    for i, piece in enumerate(suffix):
        if isinstance(piece, Field) and piece.name == "content":
            before_ok = i == 0 or isinstance(suffix[i - 1], Special)
            after_ok = i == len(suffix) - 1
            return piece if before_ok and after_ok and not piece.trail else None
    return None


def reconstruct_with_logprobs(
    profile: Profile,
    reasoning: str | None,
    content: str | None,
    finish_reason: str | None,
    content_token_bytes: list[bytes],
    *,
    reasoning_tokens: int = 0,
    tool_calls: Sequence[ToolCall] | None = None,
) -> Reconstruction | None:
    """Full output ids with the content run taken from the logprobs (see the module rules), or None."""
    if tool_calls:
        return None
    reasoning = reasoning or ""
    content = content or ""
    field = _content_bounded(profile, reasoning, content, reasoning_tokens, tool_calls)
    if field is None:
        return None
    tok = profile.tokenizer
    # A trailing end-of-turn token some servers list among the logprobs is rebuilt from finish_reason.
    end_strings = {s.encode("utf-8") for s in profile.end_of_turn}
    token_bytes = list(content_token_bytes)
    while token_bytes and token_bytes[-1] in end_strings:
        token_bytes.pop()
    joined = b"".join(token_bytes)
    run_text, _ = restore_lead(content, field.lead)  # the content run as the profile lays it out
    flags: list[str] = []
    if joined == run_text.encode("utf-8"):
        prefix: list[int] = []  # the logprobs cover the whole run, junction included
    elif joined == content.encode("utf-8"):
        # The logprobs cover the returned field only; its trimmed junction gets canonical ids.
        prefix = tok.encode_ordinary(run_text[: len(run_text) - len(content)])
        flags.append("logprobs_junction_assumed")
    else:
        return None
    ids = ids_from_token_bytes(profile, token_bytes)
    if ids is None:
        return None
    rebuilt = profile.build_output(
        reasoning, run_text, finish_reason, reasoning_tokens=reasoning_tokens, content_ids=[*prefix, *ids]
    )
    if run_text != content and "junction_restored" not in rebuilt.flags:
        rebuilt.flags.append("junction_restored")
    rebuilt.flags.extend(flags)
    rebuilt.ids_source = "logprobs"
    return rebuilt


class _HasTokenBytes(Protocol):
    token: str
    bytes: list[int] | None


def output_ids_from_logprobs(
    profile: Profile,
    logprobs: Sequence[_HasTokenBytes] | None,
    *,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    content: str | None = None,
    reasoning_tokens: int = 0,
    tool_calls: Sequence[ToolCall] | None = None,
) -> Reconstruction | None:
    """Engine-facing form: logprob entries (anything with ``token`` and ``bytes``) → Reconstruction or None.

    ``content`` is the returned content field; when omitted it is taken to be the text the logprobs spell.
    """
    if not logprobs:
        return None
    token_bytes = [bytes(e.bytes) if e.bytes is not None else e.token.encode("utf-8") for e in logprobs]
    if content is None:
        try:
            content = b"".join(token_bytes).decode("utf-8")
        except UnicodeDecodeError:
            return None
        for end in profile.end_of_turn:
            if content.endswith(end):
                content = content[: -len(end)]
                break
    return reconstruct_with_logprobs(
        profile, reasoning, content, finish_reason, token_bytes, reasoning_tokens=reasoning_tokens, tool_calls=tool_calls
    )
