"""The counters ``draftgen accept`` reads from a server and the acceptance formulas over them.

- vLLM: ``GET /metrics`` in the Prometheus text format (``parse_prometheus``), its ``vllm:spec_decode_*``
  counters summed over label sets (``vllm_counters``), and the acceptance between two scrapes
  (``vllm_acceptance``: AL = 1 + Δaccepted / Δdrafts, per position, acceptance rate);
- vLLM per request (``--per-request-spec-decode-metrics``): one response's ``metrics.speculative_decoding``
  (``request_acceptance``: its counts checked against each other, accepted per position from the histogram:
  position i was accepted in the steps that accepted more than i drafts) and their sum over a pass
  (``sum_figures``);
- SGLang: the per-request ``meta_info`` (``SGLangMeta``) and AL = Σcompletion_tokens / Σspec_verify_ct
  (``sglang_acceptance``);
- ``offline_al``: the expected accepted length from per-step conditional accuracies.

Pure functions over text and numbers; no I/O (``accept.run`` sends the requests).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.errors import APIError, PermanentAPIError
from draftgen.records import AcceptanceFigures

if TYPE_CHECKING:
    from draftgen.backends import SpecDecodeMetrics

__all__ = ["PromSample", "SGLangMeta", "SpecCounters", "offline_al", "parse_prometheus", "request_acceptance",
           "sglang_acceptance", "sum_figures", "vllm_acceptance", "vllm_counters"]

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


def _disagree(m: SpecDecodeMetrics) -> str | None:
    """Why the counts of ``m`` cannot all be true, or None."""
    counts = {"num_spec_steps": m.num_spec_steps, "num_accepted_draft_tokens": m.num_accepted_draft_tokens,
              "num_draft_tokens": m.num_draft_tokens, "num_spec_tokens": m.num_spec_tokens}
    neg = [k for k, v in counts.items() if v < 0] + (["acceptance_histogram"] if any(h < 0 for h in
                                                                                     m.acceptance_histogram) else [])
    if neg:
        return f"{neg[0]} is negative"
    h = m.acceptance_histogram
    if len(h) != m.num_spec_tokens + 1:
        return f"acceptance_histogram has {len(h)} entries, not num_spec_tokens + 1 = {m.num_spec_tokens + 1}"
    if sum(h) != m.num_spec_steps:
        return f"acceptance_histogram sums to {sum(h)} steps, not num_spec_steps {m.num_spec_steps}"
    if sum(j * n for j, n in enumerate(h)) != m.num_accepted_draft_tokens:
        return (f"acceptance_histogram accounts for {sum(j * n for j, n in enumerate(h))} accepted tokens, not "
                f"num_accepted_draft_tokens {m.num_accepted_draft_tokens}")
    if m.num_accepted_draft_tokens > m.num_draft_tokens or m.num_draft_tokens > m.num_spec_steps * m.num_spec_tokens:
        return (f"{m.num_accepted_draft_tokens} accepted of {m.num_draft_tokens} draft tokens in "
                f"{m.num_spec_steps} steps of {m.num_spec_tokens}")
    steps = m.per_step_accepted
    if steps is not None and (len(steps) != m.num_spec_steps or sum(steps) != m.num_accepted_draft_tokens):
        return f"per_step_accepted lists {len(steps)} steps accepting {sum(steps)}"
    return None


def request_acceptance(m: SpecDecodeMetrics, *, where: str) -> AcceptanceFigures:
    """One request's acceptance from its ``metrics.speculative_decoding`` (source ``vllm-per-request``); counts
    that contradict each other are a ``PermanentAPIError`` (kind ``bad_spec_metrics``) naming ``where``."""
    why = _disagree(m)
    if why is not None:
        raise PermanentAPIError(f"{where}: metrics.speculative_decoding does not add up ({why}); fix the server, "
                                "or set accept.per_request: metrics to read /metrics instead", kind="bad_spec_metrics")
    h = m.acceptance_histogram
    per_pos = [float(sum(h[i + 1:])) for i in range(m.num_spec_tokens)]
    steps = float(m.num_spec_steps)
    return AcceptanceFigures(
        source="vllm-per-request", acceptance_length=1.0 + m.num_accepted_draft_tokens / steps if steps else 1.0,
        per_position=[v / steps for v in per_pos] if steps else [],
        acceptance_rate=m.num_accepted_draft_tokens / m.num_draft_tokens if m.num_draft_tokens else None,
        drafts=steps, draft_tokens=float(m.num_draft_tokens), accepted=float(m.num_accepted_draft_tokens),
        accepted_per_pos=per_pos)


def sum_figures(figs: Sequence[AcceptanceFigures], source: str) -> AcceptanceFigures | None:
    """The acceptance of several requests' counts together (vLLM's formulas over the sums); None without a
    draft among them."""
    drafts = sum(f.drafts for f in figs)
    if drafts <= 0:
        return None
    tokens, accepted = sum(f.draft_tokens for f in figs), sum(f.accepted for f in figs)
    k = max((len(f.accepted_per_pos) for f in figs), default=0)
    per_pos = [sum(f.accepted_per_pos[i] for f in figs if i < len(f.accepted_per_pos)) for i in range(k)]
    return AcceptanceFigures(source=source, acceptance_length=1.0 + accepted / drafts,
                             per_position=[v / drafts for v in per_pos],
                             acceptance_rate=accepted / tokens if tokens > 0 else None, drafts=drafts,
                             draft_tokens=tokens, accepted=accepted, accepted_per_pos=per_pos)


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
