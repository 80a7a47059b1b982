"""The counters ``draftgen accept`` reads from a server and the acceptance formulas over them.

- vLLM: ``GET /metrics`` in the Prometheus text format (``parse_prometheus``), its ``vllm:spec_decode_*``
  counters summed over label sets (``vllm_counters``), and the acceptance between two scrapes
  (``vllm_acceptance``: AL = 1 + Δaccepted / Δdrafts, per position, acceptance rate);
- SGLang: the per-request ``meta_info`` (``SGLangMeta``) and AL = Σcompletion_tokens / Σspec_verify_ct
  (``sglang_acceptance``);
- ``offline_al``: the expected accepted length from per-step conditional accuracies.

Pure functions over text and numbers; no I/O (``accept.run`` sends the requests).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from draftgen.errors import APIError
from draftgen.records import AcceptanceFigures

__all__ = ["PromSample", "SGLangMeta", "SpecCounters", "offline_al", "parse_prometheus", "sglang_acceptance",
           "vllm_acceptance", "vllm_counters"]

_VLLM = "vllm:spec_decode_"
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _PER_POS = (f"{_VLLM}num_drafts", f"{_VLLM}num_draft_tokens",
                                               f"{_VLLM}num_accepted_tokens", f"{_VLLM}num_accepted_tokens_per_pos")


# -- Prometheus text ---------------------------------------------------------------------------------------


class PromSample(msgspec.Struct, frozen=True):
    name: str
    labels: dict[str, str]
    value: float


_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_prometheus(text: str) -> list[PromSample]:
    """The samples of a Prometheus text exposition. Tolerant: comments, blank and unparseable lines are
    skipped; a value that is not a number (or NaN) is skipped."""
    out: list[PromSample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels: dict[str, str] = {}
        body = m.group(3) or ""
        pos = 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                break
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        out.append(PromSample(m.group(1), labels, value))
    return out


class SpecCounters(msgspec.Struct, kw_only=True):
    """vLLM's speculative-decoding counters at one scrape, summed over label sets (per position kept)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = msgspec.field(default_factory=dict)
    seen: bool = False  # any spec_decode counter was exposed


def vllm_counters(text: str) -> SpecCounters:
    """Sum ``vllm:spec_decode_*`` counters (``_total`` samples, or the bare name where no ``_total`` is
    exposed; ``_created`` samples ignored) over every label set but ``position``."""
    samples = [s for s in parse_prometheus(text) if s.name.startswith(_VLLM) and not s.name.endswith("_created")]
    totals = {s.name.removesuffix("_total") for s in samples if s.name.endswith("_total")}
    c = SpecCounters(seen=bool(samples))
    for s in samples:
        base = s.name.removesuffix("_total")
        if base in totals and not s.name.endswith("_total"):
            continue  # the bare name next to its _total: counted once
        if base == _DRAFTS:
            c.drafts += s.value
        elif base == _DRAFT_TOKENS:
            c.draft_tokens += s.value
        elif base == _ACCEPTED:
            c.accepted += s.value
        elif base == _PER_POS:
            try:
                p = int(s.labels.get("position", ""))
            except ValueError:
                continue
            c.per_pos[p] = c.per_pos.get(p, 0.0) + s.value
    return c


def _counter_reset(what: str) -> APIError:
    return APIError(f"vLLM /metrics: {what} went down between the scrapes before and after the run: the server "
                    "restarted meanwhile; run accept again against a server that stays up", kind="counter_reset")


def vllm_acceptance(before: SpecCounters, after: SpecCounters) -> AcceptanceFigures | None:
    """Acceptance from two scrapes; None when no draft was made in between. A counter that went down is an
    ``APIError`` (the server restarted between the scrapes)."""
    d_drafts, d_tokens, d_acc = (after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                                 after.accepted - before.accepted)
    for name, d in (("num_drafts", d_drafts), ("num_draft_tokens", d_tokens), ("num_accepted_tokens", d_acc)):
        if d < 0:
            raise _counter_reset(f"vllm:spec_decode_{name}")
    positions = sorted(set(before.per_pos) | set(after.per_pos))
    per_pos = []
    for p in range(positions[-1] + 1 if positions else 0):
        d = after.per_pos.get(p, 0.0) - before.per_pos.get(p, 0.0)
        if d < 0:
            raise _counter_reset(f"vllm:spec_decode_num_accepted_tokens_per_pos{{position={p}}}")
        per_pos.append(d)
    if d_drafts <= 0:
        return None
    return AcceptanceFigures(
        source="vllm-metrics", acceptance_length=1.0 + d_acc / d_drafts,
        per_position=[v / d_drafts for v in per_pos],
        acceptance_rate=d_acc / d_tokens if d_tokens > 0 else None,
        drafts=d_drafts, draft_tokens=d_tokens, accepted=d_acc, accepted_per_pos=per_pos)


class SGLangMeta(msgspec.Struct):
    """The part of SGLang's per-request ``meta_info`` accept reads (``spec_*`` only set when speculating)."""

    completion_tokens: int = 0
    prompt_tokens: int = 0
    spec_verify_ct: int = 0
    spec_accept_length: float | None = None
    spec_num_correct_drafts: int | None = None
    finish_reason: dict[str, Any] | None = None

    def finished_by_stop(self) -> bool:
        """The request ended on an end token (``finish_reason.type`` "stop"), not at max_new_tokens."""
        return isinstance(self.finish_reason, dict) and self.finish_reason.get("type") == "stop"


def sglang_acceptance(metas: Sequence[SGLangMeta]) -> AcceptanceFigures | None:
    """AL = Σcompletion_tokens / Σspec_verify_ct over the requests; None when none was verified."""
    verify = sum(m.spec_verify_ct for m in metas)
    tokens = sum(m.completion_tokens for m in metas)
    if verify <= 0:
        return None
    accepted = float(tokens - verify)
    return AcceptanceFigures(source="sglang-meta_info", acceptance_length=tokens / verify, verify_calls=verify,
                             completion_tokens=tokens, drafts=float(verify), accepted=accepted)


def offline_al(cond_acc: Sequence[float]) -> float:
    """1 + Σ_k Π_{j≤k} acc_j: the expected accepted length of a chain whose step k is right with
    conditional probability acc_k."""
    total, prod = 1.0, 1.0
    for a in cond_acc:
        prod *= a
        total += prod
    return total
