"""``draftgen audit``: prove the run's token ids. Reads a run directory, writes ``audit/audit.json``.

Reads ``raw/<dataset>/raw_responses.jsonl`` (ResponseRecord), ``prepared/<dataset>/prompts.jsonl``
(PromptRecord, by sample_id) and optionally reference ids (``audit.reference`` / ``--reference``; default
``emulator/ground_truth.jsonl`` when present). Per dataset and overall:

- structural checks (see ``audit.checks``): end-of-turn iff finish_reason is stop/tool_calls, one
  end-of-think wherever there is reasoning, no unknown/stray control tokens, ids decode to the text
  fields (modulo the junctions the record flags), prompt_ids equal the profile's rendering;
- billing agreement: rebuilt vs billed completion tokens per sample and in aggregate, each disagreement
  labelled with its cause;
- BPE audit against reference ids: exact-match, tokenization-only and semantic mismatch rates, with the
  first differing span of each mismatch (``[' NOR']`` vs ``[' N', 'OR']``).

A sample with several records (one the audit excluded, then generated again: ``phases.generate.excluded``) is
audited on its last record; the earlier ones count as ``duplicates``. Records billed for fewer tokens than
their ids, which are exact on their own (``verdict.underbilled``), are kept and reported as the provider's
miscount (``underbilled``, by provider): the audit says which side is wrong.

Writes ``AuditReport`` (records.py) to ``audit/audit.json``; ``excluded`` per dataset names each sample
merge leaves out with its reason (``audit.verdict``: structural failures, dropped reasoning, semantic
mismatches, billing far off), and ``failed_sample_ids`` lists their ids. Prints the one-line verdict first,
then a summary through ``echo``, and raises ``ThresholdBroken`` (exit 3) when a threshold of ``cfg.audit``
(defaults: no structural failure, no semantic mismatch among kept rows, billing within 0.5% after the
exclusions) is broken, after writing the file.
"""

from __future__ import annotations

import time
from pathlib import Path

from draftgen.config import RunConfig
from draftgen.errors import RunDirError, ThresholdBroken
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.phases.audit.checks import (
    RecordFindings,
    audit_record,
    billing_cause,
    compare_reference,
    first_diff_span,
)
from draftgen.phases.audit.reference import ReferenceIndex, ids_digest, load_reference
from draftgen.phases.audit.verdict import (
    billing_side_lines,
    exclusion_reason,
    rates,
    thresholds_broken,
    underbilled,
    verdict_line,
)
from draftgen.provenance import check_provenance, expected_provenance
from draftgen.records import (
    AuditReport,
    BillingExample,
    DatasetAudit,
    ExcludedSample,
    PromptIdView,
    PromptRecord,
    Provenance,
    ResponseRecord,
    StructuralExample,
    check_ids,
)
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.store import (
    JsonlReader,
    atomic_write_json,
    iter_jsonl,
    iter_jsonl_offsets,
    read_json,
    superseded_lines,
)
from draftgen.tokens import Profile, profile_from_config

__all__ = [
    "RecordFindings",
    "audit_dataset",
    "audit_record",
    "billing_cause",
    "compare_reference",
    "first_diff_span",
    "phase_current",
    "phase_run",
    "run_audit",
]

_MAX_EXAMPLES = 20


class _PromptIndex:
    """sample_id → byte offset in prompts.jsonl (the first line of each id); records are read back one at a
    time through the store's reader."""

    def __init__(self, path: Path) -> None:
        self.offsets: dict[str, int] = {}
        for _, off, row in iter_jsonl_offsets(path, PromptIdView):
            self.offsets.setdefault(row.sample_id, off)
        self._reader = JsonlReader(path, PromptRecord) if self.offsets else None

    def get(self, sample_id: str) -> PromptRecord | None:
        off = self.offsets.get(sample_id)
        if off is None or self._reader is None:
            return None
        rec: PromptRecord = self._reader.at(off)
        return rec

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def _add_failure(da: DatasetAudit, sample_id: str, kind: str, detail: str) -> None:
    da.structural_failures[kind] = da.structural_failures.get(kind, 0) + 1
    if len(da.structural_examples) < _MAX_EXAMPLES:
        da.structural_examples.append(StructuralExample(sample_id=sample_id, kind=kind, detail=detail))


def audit_dataset(
    profile: Profile, name: str, raw_path: Path, prompts_path: Path, reference: ReferenceIndex | None,
    *, provenance: Provenance | None = None, force: bool = False, forced: set[str] | None = None,
    keep_unusable: bool = False, billing_tolerance: float = 0.05,
) -> DatasetAudit:
    """Audit one dataset's raw log (see the module docstring). With ``provenance``, each record's is
    checked against it (``provenance.check_provenance``)."""
    da = DatasetAudit(dataset=name)
    prompts = _PromptIndex(prompts_path)
    superseded = superseded_lines(raw_path)
    failed: set[str] = set()
    vocab = profile.tokenizer.vocab_size
    try:
        for lineno, rec in iter_jsonl(raw_path, ResponseRecord):
            where = f"{raw_path}:{lineno}"
            if provenance is not None:
                check_provenance(rec.provenance, provenance, where, force=force, forced=forced)
            check_ids(rec.output_ids, vocab, where, "output_ids")
            check_ids(rec.prompt_ids, vocab, where, "prompt_ids")
            if lineno in superseded:  # a later record of the sample is its record (generated again)
                da.duplicates += 1
                continue
            da.records += 1
            da.ids_source[rec.ids_source] = da.ids_source.get(rec.ids_source, 0) + 1
            _audit_one(profile, rec, prompts, reference, da, failed, keep_unusable, billing_tolerance)
    finally:
        prompts.close()
    da.failed_sample_ids = sorted(failed)
    return da


def _audit_one(
    profile: Profile,
    rec: ResponseRecord,
    prompts: _PromptIndex,
    reference: ReferenceIndex | None,
    da: DatasetAudit,
    failed: set[str],
    keep_unusable: bool,
    billing_tolerance: float,
) -> None:
    prompt = prompts.get(rec.sample_id) if rec.prompt_ids is not None else None
    if rec.finish_reason == "length":
        da.truncated += 1
    f = audit_record(profile, rec, prompt)
    if f.prompt_checked:
        da.prompt_checked += 1
    for flag in f.flags:
        da.flags[flag] = da.flags.get(flag, 0) + 1
    for kind, detail in f.failures:
        _add_failure(da, rec.sample_id, kind, detail)
    if f.failures:
        failed.add(rec.sample_id)
        da.structural_failed_samples += 1
    ref_kind: str | None = None
    ref_cause = ""
    if reference is not None and rec.output_ids is not None:
        entry = reference.lookup(rec.generation_id, rec.sample_id)
        if entry is None:
            da.reference_missing += 1
        else:
            da.reference_compared += 1
            if ids_digest(rec.output_ids) == entry.digest:
                ref_kind = "exact"
            else:
                ref_ids, _ = reference.ids(entry)
                ref_kind, example = compare_reference(profile, rec.sample_id, rec.output_ids, ref_ids, f.flags)
                if example is not None:
                    ref_cause = example.cause
                    if len(da.examples) < _MAX_EXAMPLES:
                        da.examples.append(example)
            if ref_kind == "exact":
                da.exact_match += 1
            elif ref_kind == "tokenization":
                da.tokenization_mismatch += 1
                da.tokenization_mismatch_ids.append(rec.sample_id)
            else:
                da.semantic_mismatch += 1
                da.semantic_mismatch_ids.append(rec.sample_id)
            if rec.prompt_ids is not None and entry.prompt_digest is not None and ids_digest(rec.prompt_ids) != entry.prompt_digest:
                da.prompt_reference_mismatch += 1
    if f.billed is not None:
        da.billing_checked += 1
        da.billed_completion_tokens += f.billed
        da.rebuilt_completion_tokens += f.rebuilt
        diff = f.rebuilt - f.billed
        if diff:
            da.billing_mismatched_samples += 1
            cause = billing_cause(diff, f.billed, f.flags, f.ended, ref_kind, ref_cause)
            da.billing_explanations[cause] = da.billing_explanations.get(cause, 0) + 1
            if len(da.billing_examples) < _MAX_EXAMPLES:
                da.billing_examples.append(
                    BillingExample(sample_id=rec.sample_id, billed=f.billed, rebuilt=f.rebuilt, cause=cause)
                )
    under = f.billed is not None and underbilled(structural=f.failures, flags=f.flags, reference_kind=ref_kind,
                                                 billed=f.billed, rebuilt=f.rebuilt,
                                                 billing_tolerance=billing_tolerance)
    excluded = None if under else exclusion_reason(
        structural=f.failures, flags=f.flags, reference_kind=ref_kind, billed=f.billed, rebuilt=f.rebuilt,
        keep_unusable=keep_unusable, billing_tolerance=billing_tolerance)
    if excluded is not None:
        reason, detail = excluded
        da.excluded.append(ExcludedSample(sample_id=rec.sample_id, reason=reason, detail=detail,
                                          provider=rec.provider, created_at=rec.created_at))
        da.excluded_by_reason[reason] = da.excluded_by_reason.get(reason, 0) + 1
        failed.add(rec.sample_id)
        return
    da.kept += 1
    if under and f.billed is not None:  # the provider's count is wrong, not the ids: kept, reported apart
        da.underbilled += 1
        da.underbilled_billed_tokens += f.billed
        da.underbilled_rebuilt_tokens += f.rebuilt
        prov = rec.provider or "unknown"
        da.underbilled_by_provider[prov] = da.underbilled_by_provider.get(prov, 0) + 1
        da.flags["underbilled"] = da.flags.get("underbilled", 0) + 1
    elif f.billed is not None:
        da.kept_billed_completion_tokens += f.billed
        da.kept_rebuilt_completion_tokens += f.rebuilt
    if ref_kind is not None:
        da.kept_reference_compared += 1
        da.kept_semantic_mismatch += ref_kind == "semantic"


def _merge_into(total: DatasetAudit, da: DatasetAudit) -> None:
    for name in (
        "records", "billed_completion_tokens", "rebuilt_completion_tokens", "billing_mismatched_samples",
        "reference_compared", "exact_match", "tokenization_mismatch", "semantic_mismatch", "duplicates",
        "prompt_checked", "billing_checked", "reference_missing", "prompt_reference_mismatch",
        "structural_failed_samples", "kept", "kept_billed_completion_tokens", "kept_rebuilt_completion_tokens",
        "kept_reference_compared", "kept_semantic_mismatch", "truncated", "underbilled",
        "underbilled_billed_tokens", "underbilled_rebuilt_tokens",
    ):
        setattr(total, name, getattr(total, name) + getattr(da, name))
    for name in ("structural_failures", "flags", "ids_source", "billing_explanations", "excluded_by_reason",
                 "underbilled_by_provider"):
        acc: dict[str, int] = getattr(total, name)
        for k, v in getattr(da, name).items():
            acc[k] = acc.get(k, 0) + v
    room = _MAX_EXAMPLES - len(total.examples)
    total.examples.extend(da.examples[: max(room, 0)])
    room = _MAX_EXAMPLES - len(total.structural_examples)
    total.structural_examples.extend(da.structural_examples[: max(room, 0)])
    room = _MAX_EXAMPLES - len(total.billing_examples)
    total.billing_examples.extend(da.billing_examples[: max(room, 0)])
    total.failed_sample_ids.extend(da.failed_sample_ids)
    total.excluded.extend(da.excluded)
    total.tokenization_mismatch_ids.extend(da.tokenization_mismatch_ids)
    total.semantic_mismatch_ids.extend(da.semantic_mismatch_ids)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


#: the hint under a table whose ``ref`` column is all 0: where reference ids come from
_NO_REFERENCE = ("ref 0: no reference ids were compared, so the BPE audit did not run; the embedded emulator "
                 "writes them to emulator/ground_truth.jsonl, a separately started one with `draftgen emulate "
                 "--ground-truth FILE`: audit it with `draftgen audit CONFIG --reference FILE` (audit.reference); "
                 "a real endpoint has none")


def summary_lines(report: AuditReport) -> list[str]:
    """A readable summary: one row per dataset and overall, then examples and broken thresholds."""
    head = (f"{'dataset':<20} {'records':>8} {'excluded':>8} {'truncated':>9} {'billing Δ':>10} {'kept Δ':>8} "
            f"{'ref':>7} {'exact':>8} {'tok-only':>8} {'semantic':>8}")
    lines = [f"audit verdict: {report.verdict}",
             f"audit (profile {report.profile})" + (f", reference {report.reference}" if report.reference else ""), head]
    broken_sets = {b.split(":", 1)[0] for b in report.thresholds_broken}
    for da in [*report.datasets, report.overall]:
        r = rates(da)
        mark = "  ← threshold broken" if da.dataset in broken_sets else ""
        lines.append(
            f"{da.dataset:<20} {da.records:>8} {len(da.excluded):>8} {_pct(da.truncated / da.records if da.records else None):>9} "
            f"{_pct(r.get('billing_disagreement_all')):>10} {_pct(r.get('billing_disagreement')):>8} "
            f"{da.reference_compared:>7} {_pct(r.get('exact_match_rate')):>8} {_pct(r.get('tokenization_mismatch_rate')):>8} "
            f"{da.semantic_mismatch:>8}{mark}"
        )
    o = report.overall
    if o.records and not o.reference_compared:
        lines.append(_NO_REFERENCE + ("" if report.reference is None else f" ({report.reference} matched no record)"))
    if o.excluded_by_reason:
        lines.append("excluded from merge: " + ", ".join(
            f"{k} {v}" for k, v in sorted(o.excluded_by_reason.items(), key=lambda kv: -kv[1]))
            + " (each listed with its reason in audit/audit.json)")
    if o.structural_failures:
        lines.append("structural failures: " + ", ".join(f"{k} {v}" for k, v in sorted(o.structural_failures.items())))
        for ex in o.structural_examples[:5]:
            lines.append(f"  {ex.sample_id}: {ex.kind} {ex.detail}".rstrip())
    if o.billing_explanations:
        lines.append(
            f"billing: rebuilt {o.rebuilt_completion_tokens} vs billed {o.billed_completion_tokens} tokens; "
            f"{o.billing_mismatched_samples} samples differ: "
            + ", ".join(f"{k} {v}" for k, v in sorted(o.billing_explanations.items(), key=lambda kv: -kv[1]))
        )
    lines += billing_side_lines(o)
    if o.flags:
        lines.append("flags: " + ", ".join(f"{k} {v}" for k, v in sorted(o.flags.items(), key=lambda kv: -kv[1])))
    for m in o.examples[:10]:
        lines.append(f"  {m.sample_id} @{m.position} ({m.kind}{', ' + m.cause if m.cause else ''}): {m.ours} vs {m.reference}")
    for a in report.assumptions:
        lines.append(f"assumption: {a}")
    for b in report.thresholds_broken:
        lines.append(f"THRESHOLD BROKEN: {b}")
    return lines


def run_audit(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None,
              force: bool = False) -> AuditReport:
    """Audit the run directory of ``cfg`` (see the module docstring). ``profile``: an already loaded
    profile for ``cfg.model`` (default: load it). ``force`` accepts records of another provenance."""
    with writer(cfg, "audit", force=force) as rd:
        return _audit(cfg, rd, echo, profile, force)


def _audit(cfg: RunConfig, rd: RunDir, echo: Echo, profile: Profile | None,
           force: bool) -> AuditReport:
    run = rd.root
    raws = {d.name: rd.raw(d.name) for d in cfg.datasets}
    if not any(p.is_file() for p in raws.values()):
        raise RunDirError(f"{run}: no raw/<dataset>/raw_responses.jsonl to audit; run `draftgen generate` first")
    if profile is None:
        profile = profile_from_config(cfg)
    ref_path: Path | None = cfg.path(cfg.audit.reference) if cfg.audit.reference else None
    if ref_path is None and rd.ground_truth.is_file():
        ref_path = rd.ground_truth
    reference = load_reference(ref_path) if ref_path is not None else None
    datasets: list[DatasetAudit] = []
    overall = DatasetAudit(dataset="overall")
    provenance = expected_provenance(cfg, profile.tokenizer_sha256)
    forced: set[str] = set()
    try:
        for d in cfg.datasets:
            da = audit_dataset(profile, d.name, raws[d.name], rd.prepared(d.name), reference,
                               provenance=provenance, force=force, forced=forced,
                               keep_unusable=cfg.quality.keep_unusable,
                               billing_tolerance=cfg.quality.billing_tolerance)
            datasets.append(da)
            _merge_into(overall, da)
    finally:
        if reference is not None:
            reference.close()
    report = AuditReport(
        profile=profile.name,
        datasets=datasets,
        overall=overall,
        created_at=round(time.time(), 3),
        reference=str(ref_path) if ref_path is not None else None,
        assumptions=list(profile.assumptions),
        forced=sorted(forced),
    )
    report.thresholds_broken = thresholds_broken(cfg, [*datasets, overall])
    report.verdict = verdict_line(overall, report.thresholds_broken, cfg.audit.max_billing_disagreement)
    atomic_write_json(rd.audit_json, report)
    for line in summary_lines(report):
        echo(line)
    if report.thresholds_broken:
        raise ThresholdBroken(
            f"audit threshold broken: {report.thresholds_broken[0]}"
            + (f" (and {len(report.thresholds_broken) - 1} more)" if len(report.thresholds_broken) > 1 else "")
            + f"; see {rd.audit_json}"
        )
    return report


# -- the audit row of phases.PHASES ----------------------------------------------------------------------


def _verdict(ctx: PhaseContext, broken: list[str]) -> PhaseOutcome:
    """A broken threshold skips merge (its data failed a gate the user set) and drops the later marks."""
    if not broken:
        return PhaseOutcome()
    message = "audit thresholds broken: " + "; ".join(broken)
    ctx.echo(f"{message}; merge skipped (fix the data or relax the audit thresholds)")
    return PhaseOutcome(ThresholdBroken.exit_code, message, then="report", stale_after=True)


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``audit`` row of ``phases.PHASES``: audit, then the verdict of its thresholds."""
    try:
        audit = run_audit(ctx.cfg, echo=ctx.echo, force=ctx.options.force, profile=ctx.profile)
        broken = list(audit.thresholds_broken)
    except ThresholdBroken as exc:
        broken = [str(exc).splitlines()[0] if str(exc) else "audit threshold broken"]
    return _verdict(ctx, broken)


def phase_current(ctx: PhaseContext) -> PhaseOutcome:
    """The verdict of the audit.json already there (the phase was up to date)."""
    return _verdict(ctx, read_json(ctx.rd.audit_json, AuditReport).thresholds_broken)
