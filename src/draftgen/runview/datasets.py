"""Per-dataset figures of a run directory, and the reading of its prepared sets and raw logs that the
per-dataset and per-provider figures share.

Reads (all optional; a partial run directory is fine, and an unterminated last line is skipped):

    prepared/<dataset>/stats.json        DatasetStats          prepared samples and prompt tokens
    prepared/<dataset>/prompts.jsonl     PromptIdView          the prepared sample ids; counted when
                                                               stats.json is not written yet
    raw/<dataset>/raw_responses.jsonl    ResponseMetricsView   done samples, tokens, cost, providers, times

A sample is done by its first record in the raw log (later ones are duplicates); a record whose sample id
is no longer in the prepared set is an orphan (``scan_raw``). ``DatasetMetrics`` is one row of the datasets
table (or the ``all`` row), filled by ``DatasetAcc`` in ``metrics.compute_metrics``; the failures are
counted there too. Raw logs are decoded through a narrow struct that skips the text and token-id arrays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec

from draftgen.records import DatasetStats, PromptIdView, ResponseMetricsView, Usage, spend_usd
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, raw_ids_len, read_json

__all__ = [
    "DatasetAcc",
    "DatasetMetrics",
    "dataset_names",
    "prepared_counts",
    "read_prepared_ids",
    "response_lengths",
    "row_cost",
    "scan_raw",
    "sorted_counts",
]


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
    replaced: int = 0
    """Records ``generate --redo`` replaced (raw/<dataset>/replaced.jsonl): never merged."""
    replaced_cost_usd: float = 0.0
    """What the replaced records cost (spent all the same)."""
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
    spent_usd: float = 0.0
    """Everything spent: the done samples, the orphans and the replaced records."""
    progress: float | None = None
    reasoning_share: float | None = None
    usd_per_m_output: float | None = None
    mean_completion_tokens: float | None = None


def row_cost(usage: Usage | None) -> float:
    """Dollars a response cost: ``cost``, plus the upstream cost on BYOK responses (where cost is 0)."""
    return 0.0 if usage is None else spend_usd(usage.cost, usage.is_byok, usage.upstream_cost)


def dataset_names(run_dir: Path, configured: list[str] | None = None) -> list[str]:
    """Configured datasets first (in order), then any other dataset folder found under prepared/ or raw/."""
    names = list(configured or [])
    found: set[str] = set()
    rd = RunDir(run_dir)
    for d in (rd.prepared_root, rd.raw_root):
        if d.is_dir():
            found.update(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    names.extend(sorted(found - set(names)))
    return names


def prepared_counts(run_dir: Path, name: str) -> tuple[int | None, int]:
    """(samples, prompt tokens) of prepared/<dataset>: stats.json, else the prompts counted (tokens 0);
    (None, 0) when not prepared."""
    rd = RunDir(run_dir)
    stats = rd.prepared_stats(name)
    if stats.is_file():
        s = read_json(stats, DatasetStats)
        return s.samples, s.prompt_tokens
    prompts = rd.prepared(name)
    if prompts.is_file():
        n = 0
        with open(prompts, "rb") as fh:
            for line in fh:
                if line.endswith(b"\n") and line.strip():
                    n += 1
        return n, 0
    return None, 0


def read_prepared_ids(run_dir: Path, name: str) -> set[str] | None:
    """The sample ids of the current prepared set (None: not prepared)."""
    path = RunDir(run_dir).prepared(name)
    if not path.is_file():
        return None
    return {r.sample_id for _, r in iter_jsonl(path, PromptIdView)}


def scan_raw(path: Path, prepared_ids: set[str] | None, done: set[str]) -> Iterator[tuple[str, ResponseMetricsView]]:
    """Every response of one raw log, as ("done" | "duplicate" | "orphan", row); ``done`` collects the ids.

    A sample is done by its first record; an orphan's sample is no longer in the prepared set."""
    for _, row in iter_jsonl(path, ResponseMetricsView):
        if row.sample_id in done:
            yield "duplicate", row
        elif prepared_ids is not None and row.sample_id not in prepared_ids:
            yield "orphan", row
        else:
            done.add(row.sample_id)
            yield "done", row


def response_lengths(row: ResponseMetricsView) -> tuple[int, int]:
    """(completion, reasoning) tokens of a response: usage, or the output ids of a legacy row."""
    u = row.usage
    completion = u.completion_tokens if u is not None and u.completion_tokens else raw_ids_len(row.output_ids)
    reasoning = min(u.reasoning_tokens, completion) if u is not None else 0
    return completion, reasoning


def sorted_counts(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


class DatasetAcc:
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

    def add(self, row: ResponseMetricsView, completion: int, reasoning: int) -> None:
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

    def merge(self, other: DatasetAcc) -> None:
        m, o = self.m, other.m
        for f in ("prepared_prompt_tokens", "done", "orphans", "orphan_cost_usd", "replaced", "replaced_cost_usd",
                  "duplicates", "failed", "failure_events", "prompt_tokens", "completion_tokens",
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
        m.providers = sorted_counts(self.providers)
        m.reasoning_fields = sorted_counts(self.fields)
        m.finish_reasons = sorted_counts(self.finish)
        m.ids_source = sorted_counts(self.sources)
        m.recon_flags = sorted_counts(self.flags)
        m.failures_by_kind = sorted_counts(self.failure_kinds)
        m.mean_latency_s = self.latency_sum / self.latency_n if self.latency_n else None
        m.progress = m.done / m.prepared if m.prepared else None
        m.reasoning_share = m.reasoning_tokens / m.completion_tokens if m.completion_tokens else None
        m.usd_per_m_output = m.cost_usd / m.completion_tokens * 1e6 if m.completion_tokens else None
        m.mean_completion_tokens = m.completion_tokens / m.done if m.done else None
        m.spent_usd = m.cost_usd + m.orphan_cost_usd + m.replaced_cost_usd
        return m
