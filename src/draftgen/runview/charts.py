"""The report's charts: token histograms, the response timeline, the activity over time (attempts,
retries, failures, requests in flight) and sequence lengths against ``merge.max_seq_len``.

Plain functions over what ``metrics.compute_metrics`` has already read (per-response lengths, times and
costs, ``AttemptRecord``s, failure times, run.json and the merge manifest), except the merged lengths,
read here:

    merged Parquet shards    ``records.MergedLengths`` rows       one value per merged row (the one reader,
                             (prompt_len, completion_len)         ``exporters.parquet.read_merged``); the
                                                                   shards are the ``MergedFile``s of kind
                                                                   parquet that merged/manifest.json lists

Time axes count from the run's first activity in the unit ``time_unit`` picks (``TIME_UNITS``); bin
widths are "nice" (1, 2, 2.5, 5 × 10^k). Every struct here is a field of ``RunMetrics``, which the
report embeds as JSON.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from draftgen.exporters.parquet import PARQUET, read_merged
from draftgen.records import AttemptRecord, MergedFile, MergedLengths, MergeManifest, RunManifest

__all__ = [
    "TIME_UNITS",
    "Activity",
    "Histogram",
    "SeqLengths",
    "Timeline",
    "make_activity",
    "make_histogram",
    "make_seq_lengths",
    "make_timeline",
    "merge_max_seq_len",
    "time_unit",
]

HIST_BINS = 30
TIMELINE_BUCKETS = 60
SEQ_BINS = 40
TIME_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
"""Units of the report's time axes (seconds since the run's first activity, divided by the unit)."""


class Histogram(msgspec.Struct, kw_only=True):
    """Per-sample token counts of reasoning and of content, binned on shared edges."""

    edges: list[float]
    reasoning: list[int]
    content: list[int]


class Timeline(msgspec.Struct, kw_only=True):
    """Responses bucketed by ``created_at``: per bucket, and cumulative cost at each bucket's end."""

    start: list[float] = msgspec.field(default_factory=list)
    bucket_s: float = 0.0
    responses: list[int] = msgspec.field(default_factory=list)
    completion_tokens: list[int] = msgspec.field(default_factory=list)
    tokens_per_s: list[float] = msgspec.field(default_factory=list)
    cost_usd: list[float] = msgspec.field(default_factory=list)
    cumulative_cost_usd: list[float] = msgspec.field(default_factory=list)


class Activity(msgspec.Struct, kw_only=True):
    """Request attempts over time (``logs/attempts.jsonl``) and failures (``failures.jsonl``), in buckets of
    ``bucket_s`` seconds from ``t0``, the run's first activity. ``unit`` is the time axis unit that suits
    the span (``time_unit``); every time chart of the report counts from ``t0`` in that unit."""

    t0: float | None = None
    span_s: float = 0.0
    unit: str = "s"
    bucket_s: float = 0.0
    offsets: list[float] = msgspec.field(default_factory=list)
    """Bucket starts, seconds after ``t0``."""
    attempts: list[int] = msgspec.field(default_factory=list)
    """Attempts started per bucket."""
    retries_by_kind: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """Failed attempts (retried or not) per bucket, by outcome, bucketed by ``ended_at``."""
    failures_by_kind: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """Failure records (a sample given up for this run) per bucket, by kind."""
    in_flight_mean: list[float] = msgspec.field(default_factory=list)
    """Requests in flight, averaged over each bucket (time-weighted)."""
    in_flight_peak: list[int] = msgspec.field(default_factory=list)


class SeqLengths(msgspec.Struct, kw_only=True):
    """Prompt + completion tokens per sample against ``merge.max_seq_len``, on shared bin edges."""

    edges: list[float] = msgspec.field(default_factory=list)
    responses: list[int] = msgspec.field(default_factory=list)
    """Per done response: usage prompt + completion tokens (before any cap)."""
    merged: list[int] = msgspec.field(default_factory=list)
    """Per merged row (Parquet ``prompt_len + completion_len``, after the cap); empty when not merged."""
    max_seq_len: int | None = None
    over_max: int = 0
    """Responses longer than ``max_seq_len``."""
    merged_rows: int = 0
    longest: int = 0


def _nice_step(span: float, bins: int) -> float:
    raw = max(span / bins, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return float(mult * mag)
    return float(10 * mag)


def make_histogram(reasoning: list[int], content: list[int]) -> Histogram:
    top = max([*reasoning, *content, 0])
    step = _nice_step(float(top + 1), HIST_BINS)
    n = max(1, math.ceil((top + 1) / step))
    edges = [i * step for i in range(n + 1)]
    r = [0] * n
    c = [0] * n
    for values, counts in ((reasoning, r), (content, c)):
        for v in values:
            counts[min(n - 1, int(v // step))] += 1
    return Histogram(edges=edges, reasoning=r, content=c)


def make_timeline(events: list[tuple[float, int, float]]) -> Timeline:
    """events: (created_at, completion tokens, cost) of every response with a timestamp."""
    if not events:
        return Timeline()
    events.sort()
    t0, t1 = events[0][0], events[-1][0]
    span = max(t1 - t0, 1.0)
    bucket = _nice_step(span, TIMELINE_BUCKETS) if span > TIMELINE_BUCKETS else 1.0
    n = int((t1 - t0) // bucket) + 1
    tl = Timeline(
        start=[t0 + i * bucket for i in range(n)],
        bucket_s=bucket,
        responses=[0] * n,
        completion_tokens=[0] * n,
        cost_usd=[0.0] * n,
    )
    for t, tokens, cost in events:
        i = int((t - t0) // bucket)
        tl.responses[i] += 1
        tl.completion_tokens[i] += tokens
        tl.cost_usd[i] += cost
    total = 0.0
    for c in tl.cost_usd:
        total += c
        tl.cumulative_cost_usd.append(total)
    tl.tokens_per_s = [tok / bucket for tok in tl.completion_tokens]
    return tl


_TIME_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
               43200, 86400)


def time_unit(span_s: float) -> str:
    """The unit of a time axis over ``span_s`` seconds: seconds up to 2 minutes, minutes up to 2 hours,
    then hours."""
    if span_s <= 120:
        return "s"
    if span_s <= 7200:
        return "min"
    return "h"


def _time_step(span_s: float, buckets: int = TIMELINE_BUCKETS) -> float:
    want = span_s / buckets
    for step in _TIME_STEPS:
        if want <= step:
            return float(step)
    return 86400.0 * math.ceil(want / 86400)


def make_activity(attempts: list[AttemptRecord], failures: list[tuple[float, str]], others: list[float]) -> Activity:
    """Bucket the attempts (started, failed by kind, in flight) and the failure records over the run's span.

    ``others``: more timestamps of the run (first and last response) that widen the span."""
    times = [a.started_at for a in attempts] + [max(a.started_at, a.ended_at) for a in attempts]
    times += [t for t, _ in failures] + others
    if not times:
        return Activity()
    t0, t1 = min(times), max(times)
    span = t1 - t0
    bucket = _time_step(max(span, 1.0))
    n = int(span // bucket) + 1
    act = Activity(t0=t0, span_s=span, unit=time_unit(span), bucket_s=bucket,
                   offsets=[i * bucket for i in range(n)], attempts=[0] * n,
                   in_flight_mean=[0.0] * n, in_flight_peak=[0] * n)

    def index(t: float) -> int:
        return min(n - 1, max(0, int((t - t0) // bucket)))

    for t, kind in failures:
        act.failures_by_kind.setdefault(kind, [0] * n)[index(t)] += 1
    area = [0.0] * n
    peak = act.in_flight_peak

    def spread(a: float, b: float, level: int) -> None:
        i = index(a)
        while i < n:
            lo = t0 + i * bucket
            hi = lo + bucket
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                area[i] += level * overlap
                peak[i] = max(peak[i], level)
            if hi >= b:
                break
            i += 1

    edges: list[tuple[float, int]] = []
    for a in attempts:
        end = max(a.started_at, a.ended_at)
        act.attempts[index(a.started_at)] += 1
        if a.outcome != "ok":
            act.retries_by_kind.setdefault(a.outcome, [0] * n)[index(end)] += 1
        edges.append((a.started_at, 1))
        edges.append((end, -1))
    edges.sort()  # at equal times ends (-1) come first: back-to-back attempts do not overlap
    level = 0
    prev = t0
    for t, delta in edges:
        if t > prev and level > 0:
            spread(prev, t, level)
        prev = max(prev, t)
        level += delta
        if delta > 0:
            i = index(t)
            peak[i] = max(peak[i], level)
    for i in range(n):
        width = min(bucket, span - i * bucket) if span > 0 else bucket
        act.in_flight_mean[i] = area[i] / width if width > 0 else 0.0
    act.retries_by_kind = dict(sorted(act.retries_by_kind.items(), key=lambda kv: (-sum(kv[1]), kv[0])))
    act.failures_by_kind = dict(sorted(act.failures_by_kind.items(), key=lambda kv: (-sum(kv[1]), kv[0])))
    return act


def merge_max_seq_len(manifest: RunManifest | None, merge_manifest: MergeManifest | None) -> int | None:
    """``merge.max_seq_len``: what the merge used (its manifest), else the run's config (run.json)."""
    for section in (merge_manifest.merge if merge_manifest else None,
                    manifest.config.get("merge") if manifest else None):
        if isinstance(section, dict):
            value = section.get("max_seq_len")
            if isinstance(value, int) and value > 0:
                return value
    return None


def _merged_lengths(run_dir: Path, files: list[MergedFile]) -> list[int]:
    """prompt_len + completion_len of every merged row (the Parquet shards the merge manifest lists that are
    there; paths relative to the run directory), through the one reader."""
    paths = [p for p in (run_dir / f.path for f in files if f.kind == PARQUET) if p.is_file()]
    return [r.prompt_len + r.completion_len for r in read_merged(paths, MergedLengths)]


def make_seq_lengths(run_dir: Path, responses: list[int], files: list[MergedFile], max_seq_len: int | None) -> SeqLengths:
    merged = _merged_lengths(run_dir, files)
    longest = max([*responses, *merged, 0])
    top = longest
    if max_seq_len is not None and max_seq_len <= 2 * longest:
        top = max(top, max_seq_len)  # show the cap unless it is far beyond every sample
    step = _nice_step(float(top + 1), SEQ_BINS)
    n = max(1, math.ceil((top + 1) / step))
    out = SeqLengths(edges=[i * step for i in range(n + 1)], responses=[0] * n, merged=[0] * n if merged else [],
                     max_seq_len=max_seq_len, merged_rows=len(merged), longest=longest)
    for values, counts in ((responses, out.responses), (merged, out.merged)):
        for v in values:
            counts[min(n - 1, int(v // step))] += 1
    if max_seq_len is not None:
        out.over_max = sum(v > max_seq_len for v in responses)
    return out
