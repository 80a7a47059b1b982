"""Every figure the report and ``status`` show, computed from the files of one run directory.

Reads (all optional; a partial run directory is fine, and an unterminated last line is skipped):

    run.json                              RunManifest      model, endpoint, config hash
    prepared/<dataset>/stats.json         DatasetStats     prepared samples and prompt tokens
    prepared/<dataset>/prompts.jsonl      PromptRecord     counted when stats.json is not written yet
    raw/<dataset>/raw_responses.jsonl     ResponseRecord   done samples, tokens, cost, providers, times
    raw/<dataset>/failures.jsonl          FailureRecord    failures by kind (latest per sample id)
    audit/audit.json                      AuditReport      the audit's figures
    logs/attempts.jsonl                   AttemptRecord    attempts, retries by kind, TTFT, requests in flight, hedges
    logs/health.jsonl                     HealthEvent      provider cool-downs
    logs/settlements.jsonl                SettlementRecord what abandoned requests were billed (``spend``)
    merged/stats.json                     MergeStats       the merged split, drops, hidden-state estimate
    merged/manifest.json                  MergeManifest    every file merge wrote, merged/ and exports/ (written last)
    report.html                           (marker)         a report was written

``compute_metrics(run_dir)`` reads each file once and returns a ``RunMetrics``, built with the modules
beside this one: ``datasets`` (the datasets table and the raw-log scan), ``providers`` (the providers
table), ``charts`` (histograms, timeline, activity, sequence lengths; it reads the merged Parquet shards)
and ``grade`` (the verdict). The report's HTML page embeds it as JSON, and a test recomputes it from the
files and compares.
Nothing here depends on the clock or on the config, so the same directory always gives the same numbers.
Raw logs are decoded through a narrow struct that skips the text and token-id arrays, so a log of
millions of records is read at I/O speed.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from draftgen.records import (
    AttemptRecord,
    AuditReport,
    FailureRecord,
    HealthEvent,
    MergedFile,
    MergeManifest,
    MergeStats,
    ResponseMetricsView,
    RunManifest,
    SettlementRecord,
    attempt_spend,
)
from draftgen.rundir import RunDir
from draftgen.runview.charts import (
    Activity,
    Histogram,
    SeqLengths,
    Timeline,
    make_activity,
    make_histogram,
    make_seq_lengths,
    make_timeline,
    merge_max_seq_len,
)
from draftgen.runview.datasets import (
    DatasetAcc,
    DatasetMetrics,
    dataset_names,
    prepared_counts,
    read_prepared_ids,
    response_lengths,
    row_cost,
    scan_raw,
)
from draftgen.runview.grade import Verdict, grade_run
from draftgen.runview.providers import ProviderAcc, ProviderMetrics
from draftgen.store import iter_jsonl, raw_ids_len, read_json

__all__ = ["RunMetrics", "SpendMetrics", "TailMetrics", "compute_metrics", "tail_metrics"]


class TailMetrics(msgspec.Struct, kw_only=True):
    """What generate did about its tail (``tail.*``; from logs/attempts.jsonl): hedges sent (a second request
    for a sample already on the wire), those whose response became the record, what the losing requests cost
    (booked as spent; ``extra_share`` of everything the attempts cost), and streams cancelled under the rate
    floor."""

    hedges: int = 0
    hedges_won: int = 0
    extra_usd: float = 0.0
    extra_share: float | None = None
    slow_streams: int = 0


def tail_metrics(attempts: list[AttemptRecord]) -> TailMetrics:
    spent = sum(a.cost for a in attempts)
    extra = sum(a.cost for a in attempts if a.outcome == "hedge_lost")
    return TailMetrics(hedges=sum(1 for a in attempts if a.hedge),
                       hedges_won=sum(1 for a in attempts if a.hedge and a.outcome == "ok"),
                       extra_usd=round(extra, 6), extra_share=round(extra / spent, 4) if spent > 0 else None,
                       slow_streams=sum(1 for a in attempts if a.outcome == "slow_stream"))


class SpendMetrics(msgspec.Struct, kw_only=True):
    """The run directory's booked spend, as generate's budget books it (``store.scan_responses`` and
    ``records.attempt_spend``): ``booked_usd`` = ``billed_usd`` + ``held_usd``. Billed: every record (done,
    duplicate, orphan, replaced; a record kept unusable is booked by its attempt instead) and every attempt
    that left no record (rejected, unusable, a hedge's loser, an abandoned request whose bill was looked up);
    held: the worst cases of the ``abandoned`` requests (cancelled on the wire) not settled yet."""

    booked_usd: float = 0.0
    billed_usd: float = 0.0
    held_usd: float = 0.0
    abandoned: int = 0
    settled: int = 0


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
    tail: TailMetrics = msgspec.field(default_factory=TailMetrics)
    spend: SpendMetrics = msgspec.field(default_factory=SpendMetrics)


def compute_metrics(run_dir: Path, configured: list[str] | None = None) -> RunMetrics:
    """Read a run directory (complete or not) and compute every figure of the report and status."""
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    manifest = read_json(rd.marker, RunManifest) if rd.marker.is_file() else None
    total = DatasetAcc("all")
    per: list[DatasetMetrics] = []
    reasoning_lens: list[int] = []
    content_lens: list[int] = []
    events: list[tuple[float, int, float]] = []
    latest: float | None = None
    providers = ProviderAcc()
    seq_lens: list[int] = []
    fail_events: list[tuple[float, str]] = []
    duplicate_usd = unbooked = 0.0  # the records the datasets table leaves out, and those their attempts book

    for name in dataset_names(run_dir, configured):
        acc = DatasetAcc(name)
        acc.m.prepared, prepared_prompt_tokens = prepared_counts(run_dir, name)
        prepared_ids = read_prepared_ids(run_dir, name)
        done: set[str] = set()
        for status, row in scan_raw(rd.raw(name), prepared_ids, done):
            if _kept_unusable(row):  # its attempt booked it (``spend``)
                unbooked += row_cost(row.usage)
            if status == "duplicate":
                acc.m.duplicates += 1
                duplicate_usd += row_cost(row.usage)
                continue
            if status == "orphan":
                acc.m.orphans += 1
                acc.m.orphan_cost_usd += row_cost(row.usage)
                continue
            u = row.usage
            completion, reasoning = response_lengths(row)
            acc.add(row, completion, reasoning)
            providers.add(row, completion, reasoning)
            reasoning_lens.append(reasoning)
            content_lens.append(max(0, completion - reasoning))
            seq_lens.append((u.prompt_tokens if u is not None and u.prompt_tokens else raw_ids_len(row.prompt_ids))
                            + completion)
            if row.created_at:
                events.append((row.created_at, completion, row_cost(u)))
        for _, row in iter_jsonl(rd.replaced(name), ResponseMetricsView):  # generate --redo's: spent, not merged
            acc.m.replaced += 1
            acc.m.replaced_cost_usd += row_cost(row.usage)
        latest_failure: dict[str, FailureRecord] = {}
        for _, fail in iter_jsonl(rd.failures(name), FailureRecord):
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
    audit_path = rd.audit_json
    audit = read_json(audit_path, AuditReport) if audit_path.is_file() else None
    manifest_m = read_json(rd.merged_manifest, MergeManifest) if rd.merged_manifest.is_file() else None
    merged = read_json(rd.merged_stats, MergeStats) if manifest_m and rd.merged_stats.is_file() else None
    phases = {
        "prepared": bool(per) and all(d.prepared is not None for d in per),
        "generated": total_m.done > 0,
        "audited": audit is not None,
        "merged": manifest_m is not None,
        "reported": rd.report_html.is_file(),
    }
    elapsed = (total_m.last_at - total_m.first_at) if total_m.first_at is not None and total_m.last_at is not None else None
    attempts = [a for _, a in iter_jsonl(rd.attempts, AttemptRecord)]
    health = [h for _, h in iter_jsonl(rd.health, HealthEvent)]
    if attempts:
        last_attempt = max(a.ended_at for a in attempts)
        latest = last_attempt if latest is None else max(latest, last_attempt)
    providers_table = providers.finish(attempts, health)
    files = _manifest_files(manifest_m)
    seq = make_seq_lengths(run_dir, seq_lens, files, merge_max_seq_len(manifest, manifest_m))
    activity = make_activity(attempts, fail_events, [t for t in (total_m.first_at, total_m.last_at) if t is not None])
    return RunMetrics(
        run_dir=str(run_dir),
        model=_manifest_str(manifest, "model", "id"),
        endpoint=_manifest_str(manifest, "endpoint", "kind"),
        config_hash=manifest.config_hash if manifest else None,
        phases=phases,
        datasets=per,
        total=total_m,
        histogram=make_histogram(reasoning_lens, content_lens),
        timeline=make_timeline(events),
        audit=audit,
        merged=merged,
        merged_files=_manifest_files(manifest_m),
        latest_activity=latest,
        elapsed_s=elapsed,
        tokens_per_s=(total_m.completion_tokens / elapsed) if elapsed else None,
        providers_table=providers_table,
        activity=activity,
        seq_lengths=seq,
        verdict=grade_run(total_m, audit, merged, phases, providers_table),
        tail=tail_metrics(attempts),
        spend=_spend(total_m.spent_usd + duplicate_usd - unbooked, attempts, rd),
    )


def _kept_unusable(row: ResponseMetricsView) -> bool:
    return any(f.startswith("unusable:") for f in row.recon_flags)


def _spend(records_usd: float, attempts: list[AttemptRecord], rd: RunDir) -> SpendMetrics:
    """The booked spend: what the records cost, plus the attempts' (``records.attempt_spend``)."""
    att = attempt_spend(attempts, (r for _, r in iter_jsonl(rd.settlements, SettlementRecord)))
    billed = max(0.0, records_usd) + att.billed
    return SpendMetrics(booked_usd=round(billed + att.held, 6), billed_usd=round(billed, 6),
                        held_usd=round(att.held, 6), abandoned=att.abandoned, settled=att.settled)


def _manifest_files(manifest: MergeManifest | None) -> list[MergedFile]:
    """The merge's files with paths relative to the run directory (``RunDir.merged_listed``: the manifest's
    layout rule)."""
    if manifest is None:
        return []
    here = RunDir(Path())  # the run directory, as the root of relative paths
    return [msgspec.structs.replace(f, path=here.merged_listed(manifest, f.path).as_posix()) for f in manifest.files]


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
