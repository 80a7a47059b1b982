"""The time part of ``draftgen plan``: waves of work per partition, and each dataset's share of the run.

A partition keeps ``concurrency`` requests in flight, so its requests go out in waves: ``requests ÷
concurrency`` of them (at least one). Every wave but the last lasts one mean request; the last lasts as long
as its slowest request, one that runs to the partition's ``max_tokens`` at the slowest stream rate:

    partition time = (waves - 1) × mean latency + slowest request
    slowest request = time to first token + max_tokens ÷ slowest rate

so a partition never takes less than one request's latency, however many slots it has. The formulas are
``engine.timemodel``'s (``wave_time``, ``last_wave_s`` with ``Lengths.unknown``: before a run no length is
known, so the slowest request runs to ``max_tokens``), the same model the live ETA uses during the run with
the lengths and rates it sees. Partitions run side
by side: the run takes as long as the longest of them. A dataset's row is its share of the run's time (the
slot-seconds of its requests over every dataset's), so the rows add up to the total.

Rates and latencies come from responses already in the raw logs (the pilot's included): the mean latency per
dataset, the mean time to first token, and the slowest stream rate (completion tokens per second after the
first token, over responses of at least ``MIN_RATE_TOKENS``). A pilot sees a few streams of the many the run
will: the slowest rate is the ``timemodel.SLOW_SIGMAS``-sigma low end of a log-normal fit of the rates seen (about
the slowest in 40, ``timemodel.slowest_rate``), and never faster than the slowest one seen. Without responses: ``plan.avg_latency_s`` or
``1 s + output ÷ ASSUMED_TOKENS_PER_S``, and the slowest request at that assumed rate.

Reads only the raw logs it is given (``ResponseMetricsView``); writes nothing. Other ways of sending
(a batch API, say) add a row kind beside ``PartitionTime``, not a new formula inside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec

from draftgen.config import RunConfig
from draftgen.engine.timemodel import MIN_RATE_TOKENS, Lengths, Stream, last_wave_s, slowest_rate, wave_time
from draftgen.records import ResponseMetricsView
from draftgen.store import iter_jsonl

__all__ = ["ASSUMED_TOKENS_PER_S", "ASSUMED_TTFT_S", "MIN_RATE_TOKENS", "PartitionTime", "PartitionWork",
           "StreamRates", "dataset_shares", "partition_times", "stream_rates"]

#: Decode speed of one stream assumed when no response has been seen (nor ``plan.avg_latency_s`` set).
ASSUMED_TOKENS_PER_S = 50.0
#: Time to first token assumed when no response has been seen.
ASSUMED_TTFT_S = 1.0


class StreamRates(msgspec.Struct, kw_only=True):
    """What the responses seen say about one stream: its first-token time and its slowest decode rate."""

    ttft_s: float = ASSUMED_TTFT_S
    slowest_tokens_per_s: float = ASSUMED_TOKENS_PER_S
    responses: int = 0
    """Responses the rate was measured on (0: the assumed figures)."""

    @property
    def basis(self) -> str:
        return f"observed ({self.responses})" if self.responses else f"assumed {ASSUMED_TOKENS_PER_S:g} tokens/s"


def stream_rates(raw_logs: Iterable[Path]) -> StreamRates:
    """The mean time to first token and the slowest stream rate over the responses in ``raw_logs``."""
    ttfts: list[float] = []
    rates: list[float] = []
    for path in raw_logs:
        for _, row in iter_jsonl(path, ResponseMetricsView):
            u = row.usage
            if row.latency_s is None or u is None:
                continue
            ttft = row.ttft_s if row.ttft_s is not None else 0.0
            ttfts.append(ttft)
            decode = row.latency_s - ttft
            if u.completion_tokens >= MIN_RATE_TOKENS and decode > 0:
                rates.append(u.completion_tokens / decode)
    if not rates:
        return StreamRates()
    return StreamRates(ttft_s=sum(ttfts) / len(ttfts), slowest_tokens_per_s=slowest_rate(rates),
                       responses=len(rates))


class PartitionWork(msgspec.Struct, kw_only=True):
    """One dataset's requests still to send in one partition, and their mean latency."""

    dataset: str
    partition: str
    requests: float
    latency_s: float


class PartitionTime(msgspec.Struct, kw_only=True):
    """One partition's waves of work (see the module docstring)."""

    partition: str
    requests: float
    concurrency: int
    max_tokens: int
    waves: float
    """Requests ÷ concurrency, at least 1 (0 when nothing is left)."""
    mean_latency_s: float
    slowest_s: float
    """One request at max_tokens at the slowest rate, plus the time to its first token."""
    time_s: float

    def describe(self) -> str:
        """One line: how the partition's time was reached."""
        if not self.requests:
            return f"{self.partition}: nothing left"
        return (f"{self.partition}: {self.requests:,.0f} requests ÷ {self.concurrency:,} in flight = "
                f"{self.waves:,.1f} waves; ({self.waves:,.1f} - 1) × {self.mean_latency_s:,.1f}s mean + "
                f"{self.slowest_s:,.1f}s slowest (max_tokens {self.max_tokens:,})")


def partition_times(cfg: RunConfig, work: Sequence[PartitionWork], rates: StreamRates) -> list[PartitionTime]:
    """The time of each partition that has work (see the module docstring)."""
    out: list[PartitionTime] = []
    for name in ("short", "long"):
        part = getattr(cfg.partitions, name)
        mine = [w for w in work if w.partition == name and w.requests > 0]
        requests = sum(w.requests for w in mine)
        if not requests:
            continue
        mean = sum(w.requests * w.latency_s for w in mine) / requests
        # the last wave's slowest request: no length known yet, so one at max_tokens at the slowest rate
        last = last_wave_s([Stream(0.0, (rates.slowest_tokens_per_s,), rates.ttft_s)], Lengths.unknown(part.max_tokens))
        waves, time_s = wave_time(requests, part.concurrency, mean, last)
        out.append(PartitionTime(partition=name, requests=requests, concurrency=part.concurrency,
                                 max_tokens=part.max_tokens, waves=waves, mean_latency_s=mean,
                                 slowest_s=max(mean, last), time_s=time_s))
    return out


def dataset_shares(work: Sequence[PartitionWork], total_s: float) -> dict[str, float]:
    """Each dataset's share of ``total_s``: its requests' slot-seconds over everyone's (they add up to it)."""
    by: dict[str, float] = {}
    for w in work:
        by[w.dataset] = by.get(w.dataset, 0.0) + w.requests * w.latency_s
    whole = sum(by.values())
    return {name: (total_s * v / whole if whole else 0.0) for name, v in by.items()}
