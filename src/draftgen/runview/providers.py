"""Per-provider figures of a run directory: the providers table of the report, ``status`` and ``generate``.

Reads (all optional; an unterminated last line is skipped):

    raw/<dataset>/raw_responses.jsonl    ResponseMetricsView   responses, tokens, cost, quantization, service
                                                               tier, latency, TTFT, dropped reasoning (done
                                                               samples only, as ``datasets.scan_raw`` says)
    prepared/<dataset>/prompts.jsonl     PromptIdView          which samples are in the current prepared set
    logs/attempts.jsonl                  AttemptRecord         attempts, failed attempts by kind, TTFT
    logs/health.jsonl                    HealthEvent           cool-downs

``provider_metrics(run_dir)`` reads them itself (``generate`` calls it at the end of a run);
``metrics.compute_metrics`` feeds ``ProviderAcc`` the rows it already reads. Either way the result is a
list of ``ProviderMetrics``, one per provider.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec

from draftgen.records import AttemptRecord, HealthEvent, ResponseMetricsView
from draftgen.rundir import RunDir
from draftgen.runview.datasets import (
    dataset_names,
    read_prepared_ids,
    response_lengths,
    row_cost,
    scan_raw,
    sorted_counts,
)
from draftgen.store import iter_jsonl

__all__ = ["ProviderAcc", "ProviderMetrics", "provider_metrics"]


class ProviderMetrics(msgspec.Struct, kw_only=True):
    """One provider's figures over a run directory (``provider_metrics``)."""

    provider: str
    quantization: str | None = None
    responses: int = 0  # records served by it
    attempts: int = 0
    retries: int = 0  # attempts that failed (any kind)
    failures_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    dropped_reasoning: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    usd_per_m_output: float | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    cooldowns: int = 0
    share: float | None = None  # responses / all done responses
    failure_rate: float | None = None  # retries / attempts
    #: the service tiers its records were served at, most first (``default 90, flex 10``; ``batch``)
    service_tiers: str | None = None


def provider_metrics(run_dir: Path, configured: list[str] | None = None) -> list[ProviderMetrics]:
    """Per-provider figures from the raw logs, ``logs/attempts.jsonl`` and ``logs/health.jsonl``.

    From the raw logs (done samples only, as the datasets table counts them: the first record per sample id
    of the current prepared set): responses, completion tokens, cost, quantization, latency, TTFT, and
    dropped reasoning (reasoning tokens billed, no reasoning text). From the attempts (absent in runs older
    than issue 11: those figures stay 0 / None): attempts, failed attempts by kind (``retries``) and TTFT
    (preferred over the records' when the attempts carry it). From the health log: cool-downs.
    p50/p95 interpolate linearly between order statistics. One pass over each file; rows sorted by
    responses, then attempts, then name. ``generate`` calls this at the end of a run.
    """
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    acc = ProviderAcc()
    for name in dataset_names(run_dir, configured):
        done: set[str] = set()
        for status, row in scan_raw(rd.raw(name), read_prepared_ids(run_dir, name), done):
            if status == "done":
                completion, reasoning = response_lengths(row)
                acc.add(row, completion, reasoning)
    return acc.finish([a for _, a in iter_jsonl(rd.attempts, AttemptRecord)],
                      [h for _, h in iter_jsonl(rd.health, HealthEvent)])


_EMPTY_TEXT = (b"", b"null", b'""')


def _dropped_reasoning(row: ResponseMetricsView, reasoning: int) -> bool:
    """Reasoning tokens billed but no reasoning text came back (or reconstruction flagged it so)."""
    if reasoning > 0 and bytes(row.reasoning).strip() in _EMPTY_TEXT:
        return True
    return any(f == "reasoning_dropped" or f == "unusable:reasoning_dropped" for f in row.recon_flags)


def _percentile(values: list[float], q: float) -> float | None:
    """The q-quantile of sorted ``values``, linear between order statistics (numpy's default)."""
    if not values:
        return None
    pos = (len(values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


class _Provider:
    __slots__ = ("attempt_quants", "attempts", "completion", "cooldowns", "cost", "dropped", "kinds", "latencies",
                 "quants", "responses", "retries", "tiers", "ttft_attempts", "ttft_records")

    def __init__(self) -> None:
        self.responses = self.completion = self.dropped = self.attempts = self.retries = self.cooldowns = 0
        self.cost = 0.0
        self.latencies: list[float] = []
        self.ttft_records: list[float] = []
        self.ttft_attempts: list[float] = []
        self.quants: Counter[str] = Counter()
        self.attempt_quants: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.tiers: Counter[str] = Counter()


#: the row of an attempt that names no provider, by its outcome: a request cancelled on the wire before the
#: stream named its provider
_UNNAMED = {"abandoned": "abandoned"}


class ProviderAcc:
    """Per-provider accumulator: responses fed one by one, then the attempts and health logs. A response
    that names no provider is a self-hosted server's: its row is the server's kind (the record's
    ``backend``), and so is that of an attempt naming none when the responses came from that one server alone;
    a request abandoned before its provider was known is ``abandoned``."""

    def __init__(self) -> None:
        self.by: dict[str, _Provider] = {}
        self.servers: set[str] = set()  # the self-hosted servers' kinds the responses named

    def _only_server(self) -> str | None:
        return next(iter(self.servers)) if len(self.servers) == 1 and len(self.by) == 1 else None

    def _get(self, name: str | None) -> _Provider:
        key = name or "unknown"
        p = self.by.get(key)
        if p is None:
            p = self.by[key] = _Provider()
        return p

    def add(self, row: ResponseMetricsView, completion: int, reasoning: int) -> None:
        if not row.provider and row.backend:  # a self-hosted server names no provider: its kind
            self.servers.add(row.backend)
        p = self._get(row.provider or row.backend)
        p.responses += 1
        p.completion += completion
        p.cost += row_cost(row.usage)
        if _dropped_reasoning(row, reasoning):
            p.dropped += 1
        if row.quantization:
            p.quants[row.quantization] += 1
        if row.service_tier:
            p.tiers[row.service_tier] += 1
        if row.latency_s is not None:
            p.latencies.append(row.latency_s)
        if row.ttft_s is not None:
            p.ttft_records.append(row.ttft_s)

    def finish(self, attempts: list[AttemptRecord], health: list[HealthEvent]) -> list[ProviderMetrics]:
        for a in attempts:
            p = self._get(a.provider or _UNNAMED.get(a.outcome) or self._only_server())
            p.attempts += 1
            # a request cancelled because its hedge won, or by the user's interrupt, is no failure of its provider
            if a.outcome not in ("ok", "hedge_lost", "abandoned"):
                p.retries += 1
                p.kinds[a.outcome] += 1
            if a.ttft_s is not None:
                p.ttft_attempts.append(a.ttft_s)
            if a.quantization:
                p.attempt_quants[a.quantization] += 1
        for h in health:
            if h.event == "cooldown":
                self._get(h.provider).cooldowns += 1
        total = sum(p.responses for p in self.by.values())
        out: list[ProviderMetrics] = []
        for name, p in self.by.items():
            p.latencies.sort()
            ttft = sorted(p.ttft_attempts or p.ttft_records)
            out.append(ProviderMetrics(
                provider=name,
                # what the records say, else what the attempts say (a provider that never delivered)
                quantization=", ".join(sorted_counts(p.quants or p.attempt_quants)) or None,
                responses=p.responses,
                attempts=p.attempts,
                retries=p.retries,
                failures_by_kind=sorted_counts(p.kinds),
                # every dropping is an attempt (kept or retried); older runs without attempts: the records
                dropped_reasoning=p.kinds.get("reasoning_dropped", 0) if p.attempts else p.dropped,
                completion_tokens=p.completion,
                cost_usd=p.cost,
                usd_per_m_output=p.cost / p.completion * 1e6 if p.completion else None,
                latency_p50_s=_percentile(p.latencies, 0.5),
                latency_p95_s=_percentile(p.latencies, 0.95),
                ttft_p50_s=_percentile(ttft, 0.5),
                ttft_p95_s=_percentile(ttft, 0.95),
                cooldowns=p.cooldowns,
                share=p.responses / total if total else None,
                failure_rate=p.retries / p.attempts if p.attempts else None,
                service_tiers=", ".join(f"{k} {v}" if len(p.tiers) > 1 else k
                                        for k, v in sorted_counts(p.tiers).items()) or None,
            ))
        out.sort(key=lambda m: (-m.responses, -m.attempts, m.provider))
        return out
