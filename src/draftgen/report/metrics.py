"""Every figure the report and ``status`` show, computed from the files of one run directory.

Reads (all optional; a partial run directory is fine, and an unterminated last line is skipped):

    run.json                              RunManifest      model, endpoint, config hash
    prepared/<dataset>/stats.json         DatasetStats     prepared samples and prompt tokens
    prepared/<dataset>/prompts.jsonl      PromptRecord     counted when stats.json is not written yet
    raw/<dataset>/raw_responses.jsonl     ResponseRecord   done samples, tokens, cost, providers, times
    raw/<dataset>/failures.jsonl          FailureRecord    failures by kind (latest per sample id)
    audit/audit.json                      AuditReport      the audit's figures
    logs/attempts.jsonl                   AttemptRecord    attempts, retries by kind, TTFT, requests in flight
    logs/health.jsonl                     HealthEvent      provider cool-downs
    merged/stats.json                     MergeStats       the merged split, drops, hidden-state estimate
    merged/manifest.json                  MergeManifest    every file merge wrote, merged/ and exports/ (written last)
    report.html                           (marker)         a report was written

``compute_metrics(run_dir)`` returns a ``RunMetrics``; the HTML page embeds it as JSON, and a test
recomputes it from the files and compares. Nothing here depends on the clock or on the config, so the
same directory always gives the same numbers. Raw logs are decoded through a narrow struct that skips
the text and token-id arrays, so a log of millions of records is read at I/O speed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ..records import (
    AttemptRecord,
    AuditReport,
    DatasetStats,
    FailureRecord,
    HealthEvent,
    MergedFile,
    MergeManifest,
    MergeStats,
    RunManifest,
    spend_usd,
)
from ..rundir import RunDir
from ..store import iter_jsonl, raw_ids_len, read_json

__all__ = [
    "TIME_UNITS",
    "Activity",
    "DatasetMetrics",
    "Histogram",
    "ProviderMetrics",
    "RunMetrics",
    "SeqLengths",
    "Timeline",
    "Verdict",
    "compute_metrics",
    "dataset_names",
    "provider_metrics",
    "time_unit",
]

HIST_BINS = 30
TIMELINE_BUCKETS = 60
SEQ_BINS = 40
TIME_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
"""Units of the report's time axes (seconds since the run's first activity, divided by the unit)."""


class DatasetMetrics(msgspec.Struct, kw_only=True):
    """Counts for one dataset (or for all of them, ``name == "all"``)."""

    name: str
    prepared: int | None = None
    """Samples in prepared/<dataset> (None: not prepared yet)."""
    prepared_prompt_tokens: int = 0
    done: int = 0
    """Distinct sample ids in raw_responses.jsonl that are in the current prepared set."""
    orphans: int = 0
    """Records whose sample id is no longer in the prepared set (the dataset shrank): never merged."""
    orphan_cost_usd: float = 0.0
    """What the orphans cost (spent all the same; ``cost_usd`` covers the done samples only)."""
    duplicates: int = 0
    failed: int = 0
    """Samples whose latest failure is not followed by a response (retried on the next run)."""
    failures_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    failure_events: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    content_tokens: int = 0
    cost_usd: float = 0.0
    truncated: int = 0
    """Responses cut by max_tokens (finish_reason length)."""
    no_reasoning: int = 0
    """Responses with zero reasoning tokens."""
    providers: dict[str, int] = msgspec.field(default_factory=dict)
    reasoning_fields: dict[str, int] = msgspec.field(default_factory=dict)
    finish_reasons: dict[str, int] = msgspec.field(default_factory=dict)
    ids_source: dict[str, int] = msgspec.field(default_factory=dict)
    recon_flags: dict[str, int] = msgspec.field(default_factory=dict)
    first_at: float | None = None
    last_at: float | None = None
    mean_latency_s: float | None = None
    # Derived from the counts above (kept in the record so the page and the JSON agree).
    progress: float | None = None
    reasoning_share: float | None = None
    usd_per_m_output: float | None = None
    mean_completion_tokens: float | None = None


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


class Verdict(msgspec.Struct, kw_only=True):
    """Green (usable as is), amber (usable, read the warnings) or red (not usable as is), with the reason."""

    level: str = "green"
    reason: str = ""
    problems: list[str] = msgspec.field(default_factory=list)
    """What makes it red."""
    warnings: list[str] = msgspec.field(default_factory=list)
    """What makes it amber."""


class RunMetrics(msgspec.Struct, kw_only=True):
    run_dir: str
    model: str | None = None
    endpoint: str | None = None
    config_hash: str | None = None
    phases: dict[str, bool] = msgspec.field(default_factory=dict)
    datasets: list[DatasetMetrics] = msgspec.field(default_factory=list)
    total: DatasetMetrics
    histogram: Histogram
    timeline: Timeline
    audit: AuditReport | None = None
    merged: MergeStats | None = None
    merged_files: list[MergedFile] = msgspec.field(default_factory=list)  # paths relative to the run directory
    latest_activity: float | None = None
    elapsed_s: float | None = None
    tokens_per_s: float | None = None
    providers_table: list[ProviderMetrics] = msgspec.field(default_factory=list)
    activity: Activity = msgspec.field(default_factory=Activity)
    seq_lengths: SeqLengths = msgspec.field(default_factory=SeqLengths)
    verdict: Verdict = msgspec.field(default_factory=Verdict)


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    is_byok: bool = False
    upstream_cost: float | None = None


class _Row(msgspec.Struct):
    """The fields of a ResponseRecord the metrics need; text and id arrays are skipped."""

    sample_id: str
    reasoning_field: str | None = None
    finish_reason: str | None = None
    provider: str | None = None
    usage: _Usage | None = None
    output_ids: msgspec.Raw = msgspec.Raw(b"")
    prompt_ids: msgspec.Raw = msgspec.Raw(b"")
    reasoning: msgspec.Raw = msgspec.Raw(b"")
    ids_source: str = "exact"
    recon_flags: list[str] = msgspec.field(default_factory=list)
    latency_s: float | None = None
    ttft_s: float | None = None
    quantization: str | None = None
    created_at: float = 0.0


def row_cost(usage: _Usage | None) -> float:
    """Dollars a response cost: ``cost``, plus the upstream cost on BYOK responses (where cost is 0)."""
    return 0.0 if usage is None else spend_usd(usage.cost, usage.is_byok, usage.upstream_cost)


def dataset_names(run_dir: Path, configured: list[str] | None = None) -> list[str]:
    """Configured datasets first (in order), then any other dataset folder found under prepared/ or raw/."""
    names = list(configured or [])
    found: set[str] = set()
    for sub in ("prepared", "raw"):
        d = run_dir / sub
        if d.is_dir():
            found.update(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    names.extend(sorted(found - set(names)))
    return names


def _prepared(run_dir: Path, name: str) -> tuple[int | None, int]:
    d = run_dir / "prepared" / name
    stats = d / "stats.json"
    if stats.is_file():
        s = read_json(stats, DatasetStats)
        return s.samples, s.prompt_tokens
    prompts = d / "prompts.jsonl"
    if prompts.is_file():
        n = 0
        with open(prompts, "rb") as fh:
            for line in fh:
                if line.endswith(b"\n") and line.strip():
                    n += 1
        return n, 0
    return None, 0


class _IdRow(msgspec.Struct):
    sample_id: str


def _prepared_ids(run_dir: Path, name: str) -> set[str] | None:
    """The sample ids of the current prepared set (None: not prepared)."""
    path = run_dir / "prepared" / name / "prompts.jsonl"
    if not path.is_file():
        return None
    return {r.sample_id for _, r in iter_jsonl(path, _IdRow)}


def _scan(path: Path, prepared_ids: set[str] | None, done: set[str]) -> Iterator[tuple[str, _Row]]:
    """Every response of one raw log, as ("done" | "duplicate" | "orphan", row); ``done`` collects the ids.

    A sample is done by its first record; an orphan's sample is no longer in the prepared set."""
    for _, row in iter_jsonl(path, _Row):
        if row.sample_id in done:
            yield "duplicate", row
        elif prepared_ids is not None and row.sample_id not in prepared_ids:
            yield "orphan", row
        else:
            done.add(row.sample_id)
            yield "done", row


def _lengths(row: _Row) -> tuple[int, int]:
    """(completion, reasoning) tokens of a response: usage, or the output ids of a legacy row."""
    u = row.usage
    completion = u.completion_tokens if u is not None and u.completion_tokens else raw_ids_len(row.output_ids)
    reasoning = min(u.reasoning_tokens, completion) if u is not None else 0
    return completion, reasoning


def _count(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


class _Acc:
    """Accumulates one dataset's rows; also feeds the run-wide lists."""

    def __init__(self, name: str) -> None:
        self.m = DatasetMetrics(name=name)
        self.providers: Counter[str] = Counter()
        self.fields: Counter[str] = Counter()
        self.finish: Counter[str] = Counter()
        self.sources: Counter[str] = Counter()
        self.flags: Counter[str] = Counter()
        self.failure_kinds: Counter[str] = Counter()
        self.latency_sum = 0.0
        self.latency_n = 0

    def add(self, row: _Row, completion: int, reasoning: int) -> None:
        m = self.m
        m.done += 1
        u = row.usage
        m.prompt_tokens += u.prompt_tokens if u else 0
        m.completion_tokens += completion
        m.reasoning_tokens += reasoning
        m.content_tokens += max(0, completion - reasoning)
        m.cost_usd += row_cost(u)
        if row.finish_reason == "length":
            m.truncated += 1
        if reasoning == 0:
            m.no_reasoning += 1
        self.providers[row.provider or "unknown"] += 1
        self.fields[row.reasoning_field or "none"] += 1
        self.finish[row.finish_reason or "none"] += 1
        self.sources[row.ids_source] += 1
        self.flags.update(row.recon_flags)
        if row.latency_s is not None:
            self.latency_sum += row.latency_s
            self.latency_n += 1
        if row.created_at:
            m.first_at = row.created_at if m.first_at is None else min(m.first_at, row.created_at)
            m.last_at = row.created_at if m.last_at is None else max(m.last_at, row.created_at)

    def merge(self, other: _Acc) -> None:
        m, o = self.m, other.m
        for f in ("prepared_prompt_tokens", "done", "orphans", "orphan_cost_usd", "duplicates", "failed", "failure_events", "prompt_tokens", "completion_tokens",
                  "reasoning_tokens", "content_tokens", "truncated", "no_reasoning"):
            setattr(m, f, getattr(m, f) + getattr(o, f))
        m.cost_usd += o.cost_usd
        if o.prepared is not None:
            m.prepared = (m.prepared or 0) + o.prepared
        for mine, theirs in ((self.providers, other.providers), (self.fields, other.fields),
                             (self.finish, other.finish), (self.sources, other.sources),
                             (self.flags, other.flags), (self.failure_kinds, other.failure_kinds)):
            mine.update(theirs)
        self.latency_sum += other.latency_sum
        self.latency_n += other.latency_n
        for t in (o.first_at, o.last_at):
            if t is not None:
                m.first_at = t if m.first_at is None else min(m.first_at, t)
                m.last_at = t if m.last_at is None else max(m.last_at, t)

    def finish_up(self) -> DatasetMetrics:
        m = self.m
        m.providers = _count(self.providers)
        m.reasoning_fields = _count(self.fields)
        m.finish_reasons = _count(self.finish)
        m.ids_source = _count(self.sources)
        m.recon_flags = _count(self.flags)
        m.failures_by_kind = _count(self.failure_kinds)
        m.mean_latency_s = self.latency_sum / self.latency_n if self.latency_n else None
        m.progress = m.done / m.prepared if m.prepared else None
        m.reasoning_share = m.reasoning_tokens / m.completion_tokens if m.completion_tokens else None
        m.usd_per_m_output = m.cost_usd / m.completion_tokens * 1e6 if m.completion_tokens else None
        m.mean_completion_tokens = m.completion_tokens / m.done if m.done else None
        return m


def _nice_step(span: float, bins: int) -> float:
    raw = max(span / bins, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return float(mult * mag)
    return float(10 * mag)


def _histogram(reasoning: list[int], content: list[int]) -> Histogram:
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


def _timeline(events: list[tuple[float, int, float]]) -> Timeline:
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


def compute_metrics(run_dir: Path, configured: list[str] | None = None) -> RunMetrics:
    """Read a run directory (complete or not) and compute every figure of the report and status."""
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / "run.json", RunManifest) if (run_dir / "run.json").is_file() else None
    total = _Acc("all")
    per: list[DatasetMetrics] = []
    reasoning_lens: list[int] = []
    content_lens: list[int] = []
    events: list[tuple[float, int, float]] = []
    latest: float | None = None
    providers = _ProviderAcc()
    seq_lens: list[int] = []
    fail_events: list[tuple[float, str]] = []

    for name in dataset_names(run_dir, configured):
        acc = _Acc(name)
        acc.m.prepared, prepared_prompt_tokens = _prepared(run_dir, name)
        raw = run_dir / "raw" / name
        prepared_ids = _prepared_ids(run_dir, name)
        done: set[str] = set()
        for status, row in _scan(raw / "raw_responses.jsonl", prepared_ids, done):
            if status == "duplicate":
                acc.m.duplicates += 1
                continue
            if status == "orphan":
                acc.m.orphans += 1
                acc.m.orphan_cost_usd += row_cost(row.usage)
                continue
            u = row.usage
            completion, reasoning = _lengths(row)
            acc.add(row, completion, reasoning)
            providers.add(row, completion, reasoning)
            reasoning_lens.append(reasoning)
            content_lens.append(max(0, completion - reasoning))
            seq_lens.append((u.prompt_tokens if u is not None and u.prompt_tokens else raw_ids_len(row.prompt_ids))
                            + completion)
            if row.created_at:
                events.append((row.created_at, completion, row_cost(u)))
        latest_failure: dict[str, FailureRecord] = {}
        for _, fail in iter_jsonl(raw / "failures.jsonl", FailureRecord):
            acc.m.failure_events += 1
            latest_failure[fail.sample_id] = fail
            if fail.created_at:
                latest = fail.created_at if latest is None else max(latest, fail.created_at)
                fail_events.append((fail.created_at, fail.kind))
        for sid, fail in latest_failure.items():
            if sid not in done:
                acc.m.failed += 1
                acc.failure_kinds[fail.kind] += 1
        acc.m.prepared_prompt_tokens = prepared_prompt_tokens
        total.merge(acc)
        per.append(acc.finish_up())

    total_m = total.finish_up()
    if total_m.last_at is not None:
        latest = total_m.last_at if latest is None else max(latest, total_m.last_at)
    audit_path = run_dir / "audit" / "audit.json"
    audit = read_json(audit_path, AuditReport) if audit_path.is_file() else None
    merged_dir = run_dir / "merged"
    manifest_m = read_json(merged_dir / "manifest.json", MergeManifest) if (merged_dir / "manifest.json").is_file() else None
    merged = read_json(merged_dir / "stats.json", MergeStats) if manifest_m and (merged_dir / "stats.json").is_file() else None
    phases = {
        "prepared": bool(per) and all(d.prepared is not None for d in per),
        "generated": total_m.done > 0,
        "audited": audit is not None,
        "merged": manifest_m is not None,
        "reported": (run_dir / "report.html").is_file(),
    }
    elapsed = (total_m.last_at - total_m.first_at) if total_m.first_at is not None and total_m.last_at is not None else None
    rd = RunDir(run_dir)
    attempts = [a for _, a in iter_jsonl(rd.attempts, AttemptRecord)]
    health = [h for _, h in iter_jsonl(rd.health, HealthEvent)]
    if attempts:
        last_attempt = max(a.ended_at for a in attempts)
        latest = last_attempt if latest is None else max(latest, last_attempt)
    providers_table = providers.finish(attempts, health)
    files = _manifest_files(manifest_m)
    seq = _seq_lengths(run_dir, seq_lens, files, _max_seq_len(manifest, manifest_m))
    activity = _activity(attempts, fail_events, [t for t in (total_m.first_at, total_m.last_at) if t is not None])
    return RunMetrics(
        run_dir=str(run_dir),
        model=_manifest_str(manifest, "model", "id"),
        endpoint=_manifest_str(manifest, "endpoint", "kind"),
        config_hash=manifest.config_hash if manifest else None,
        phases=phases,
        datasets=per,
        total=total_m,
        histogram=_histogram(reasoning_lens, content_lens),
        timeline=_timeline(events),
        audit=audit,
        merged=merged,
        merged_files=_manifest_files(manifest_m),
        latest_activity=latest,
        elapsed_s=elapsed,
        tokens_per_s=(total_m.completion_tokens / elapsed) if elapsed else None,
        providers_table=providers_table,
        activity=activity,
        seq_lengths=seq,
        verdict=_verdict(total_m, audit, merged, phases, providers_table),
    )


def _manifest_files(manifest: MergeManifest | None) -> list[MergedFile]:
    """The merge's files with paths relative to the run directory (a layout-1 manifest's are under merged/)."""
    if manifest is None:
        return []
    if manifest.layout >= 2:
        return manifest.files
    return [msgspec.structs.replace(f, path=f"merged/{f.path}") for f in manifest.files]


def _manifest_str(manifest: RunManifest | None, section: str, key: str) -> str | None:
    """A string setting recorded in run.json's config snapshot (``endpoint`` may be a bare string)."""
    if manifest is None:
        return None
    value = manifest.config.get(section)
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        inner = value.get(key)
        return inner if isinstance(inner, str) else None
    return None


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
    acc = _ProviderAcc()
    for name in dataset_names(run_dir, configured):
        done: set[str] = set()
        for status, row in _scan(rd.raw(name), _prepared_ids(run_dir, name), done):
            if status == "done":
                completion, reasoning = _lengths(row)
                acc.add(row, completion, reasoning)
    return acc.finish([a for _, a in iter_jsonl(rd.attempts, AttemptRecord)],
                      [h for _, h in iter_jsonl(rd.health, HealthEvent)])


_EMPTY_TEXT = (b"", b"null", b'""')


def _dropped_reasoning(row: _Row, reasoning: int) -> bool:
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
                 "quants", "responses", "retries", "ttft_attempts", "ttft_records")

    def __init__(self) -> None:
        self.responses = self.completion = self.dropped = self.attempts = self.retries = self.cooldowns = 0
        self.cost = 0.0
        self.latencies: list[float] = []
        self.ttft_records: list[float] = []
        self.ttft_attempts: list[float] = []
        self.quants: Counter[str] = Counter()
        self.attempt_quants: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()


class _ProviderAcc:
    """Per-provider accumulator: responses fed one by one, then the attempts and health logs."""

    def __init__(self) -> None:
        self.by: dict[str, _Provider] = {}

    def _get(self, name: str | None) -> _Provider:
        key = name or "unknown"
        p = self.by.get(key)
        if p is None:
            p = self.by[key] = _Provider()
        return p

    def add(self, row: _Row, completion: int, reasoning: int) -> None:
        p = self._get(row.provider)
        p.responses += 1
        p.completion += completion
        p.cost += row_cost(row.usage)
        if _dropped_reasoning(row, reasoning):
            p.dropped += 1
        if row.quantization:
            p.quants[row.quantization] += 1
        if row.latency_s is not None:
            p.latencies.append(row.latency_s)
        if row.ttft_s is not None:
            p.ttft_records.append(row.ttft_s)

    def finish(self, attempts: list[AttemptRecord], health: list[HealthEvent]) -> list[ProviderMetrics]:
        for a in attempts:
            p = self._get(a.provider)
            p.attempts += 1
            if a.outcome != "ok":
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
                quantization=", ".join(_count(p.quants or p.attempt_quants)) or None,
                responses=p.responses,
                attempts=p.attempts,
                retries=p.retries,
                failures_by_kind=_count(p.kinds),
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
            ))
        out.sort(key=lambda m: (-m.responses, -m.attempts, m.provider))
        return out


# -- time axes, activity, sequence lengths and the verdict ----------------------------------------------

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


def _activity(attempts: list[AttemptRecord], failures: list[tuple[float, str]], others: list[float]) -> Activity:
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


def _max_seq_len(manifest: RunManifest | None, merge_manifest: MergeManifest | None) -> int | None:
    """``merge.max_seq_len``: what the merge used (its manifest), else the run's config (run.json)."""
    for section in (merge_manifest.merge if merge_manifest else None,
                    manifest.config.get("merge") if manifest else None):
        if isinstance(section, dict):
            value = section.get("max_seq_len")
            if isinstance(value, int) and value > 0:
                return value
    return None


def _merged_lengths(run_dir: Path, files: list[MergedFile]) -> list[int]:
    """prompt_len + completion_len of every merged row (Parquet shards listed by the merge manifest)."""
    parquet = [f for f in files if f.kind == "parquet"]
    if not parquet:
        return []
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: list[int] = []
    for f in parquet:
        path = run_dir / f.path
        if not path.is_file() and (run_dir / "merged" / f.path).is_file():
            path = run_dir / "merged" / f.path  # a manifest whose paths are relative to merged/
        if not path.is_file():
            continue
        table = pq.read_table(path, columns=["prompt_len", "completion_len"])
        out += pc.add(table["prompt_len"], table["completion_len"]).to_pylist()
    return out


def _seq_lengths(run_dir: Path, responses: list[int], files: list[MergedFile], max_seq_len: int | None) -> SeqLengths:
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


_BENIGN_DROPS = frozenset({"duplicate_record"})


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _kinds(counts: dict[str, int], limit: int = 4) -> str:
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} {v:,}" for k, v in items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")


def _verdict(t: DatasetMetrics, audit: AuditReport | None, merged: MergeStats | None, phases: dict[str, bool],
             providers: list[ProviderMetrics]) -> Verdict:
    """Red: an audit threshold is broken, or failures remain and nothing was merged (or merge wrote no row).
    Amber: failures, exclusions (audit or merge), provider cool-downs or dropped reasoning, orphans, samples not
    generated, audited or merged yet, merge notes. Green otherwise. ``reason`` is the first finding."""
    problems: list[str] = []
    warnings: list[str] = []
    rows = merged.total.samples if merged is not None else 0
    if audit is not None and audit.thresholds_broken:
        b = audit.thresholds_broken
        problems.append(f"audit threshold broken: {b[0]}" if len(b) == 1 else
                        f"{len(b)} audit thresholds broken, first {b[0]}")
    if t.failed and not rows:
        problems.append(f"{_n(t.failed, 'sample')} failed ({_kinds(t.failures_by_kind)}) and nothing was merged")
    elif merged is not None and not rows:
        problems.append("merge wrote no rows")
    if t.failed and rows:
        warnings.append(f"{_n(t.failed, 'sample')} failed ({_kinds(t.failures_by_kind)}); retried on the next run")
    drops = {k: v for k, v in (merged.total.dropped if merged is not None else {}).items() if k not in _BENIGN_DROPS}
    if drops:
        warnings.append(f"merge excluded {_n(sum(drops.values()), 'sample')} ({_kinds(drops)})")
    elif merged is None and audit is not None and audit.overall.excluded_by_reason:
        ex = audit.overall.excluded_by_reason
        warnings.append(f"the audit excludes {_n(sum(ex.values()), 'sample')} from the merge ({_kinds(ex)})")
    elif merged is None and audit is not None and audit.overall.structural_failures:
        warnings.append(f"{audit.overall.structural_failed_samples or sum(audit.overall.structural_failures.values()):,} "
                        f"samples fail a structural check ({_kinds(audit.overall.structural_failures)})")
    if audit is not None and audit.overall.kept_semantic_mismatch and not audit.thresholds_broken:
        warnings.append(f"{audit.overall.kept_semantic_mismatch:,} kept samples decode to other text than the reference")
    cooled = {p.provider: p.cooldowns for p in providers if p.cooldowns}
    if cooled:
        warnings.append(f"provider cool-downs: {_kinds(cooled)}")
    dropped = {p.provider: p.dropped_reasoning for p in providers if p.dropped_reasoning}
    if dropped:
        warnings.append(f"{_n(sum(dropped.values()), 'response')} with dropped reasoning ({_kinds(dropped)})")
    if t.orphans:
        warnings.append(f"{t.orphans:,} records are no longer in the prepared set (orphans, not merged)")
    pending = (t.prepared or 0) - t.done - t.failed
    if pending > 0:
        warnings.append(f"{pending:,} of {t.prepared:,} prepared samples not generated yet")
    if t.done == 0 and not t.failed:
        warnings.append("nothing generated yet")
    elif t.done and not phases.get("audited"):
        warnings.append("not audited yet")
    if t.done and not phases.get("merged") and not problems:
        warnings.append("not merged yet")
    if audit is not None and audit.forced:
        warnings.append("the audit accepted provenance differences with --force: " + "; ".join(audit.forced))
    for note in merged.notes if merged is not None else []:
        if "orphans" not in note:
            warnings.append(f"merge: {note}")
    if problems:
        level, first, more = "red", problems[0], len(problems) - 1 + len(warnings)
    elif warnings:
        level, first, more = "amber", warnings[0], len(warnings) - 1
    else:
        audited = "audit passed" if audit is not None else "no audit"
        return Verdict(level="green", reason=f"{_n(t.done, 'sample')} done, {audited}, {_n(rows, 'row')} merged")
    return Verdict(level=level, reason=first + (f" (+{more} more)" if more else ""), problems=problems,
                   warnings=warnings)
