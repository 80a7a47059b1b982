"""The report's verdict on a run directory: green (usable as is), amber (usable, read the warnings) or red
(not usable as is), with the reason.

A plain function of figures ``metrics.compute_metrics`` has already read (the ``all`` row of the datasets
table, the audit, the merge's stats, the phases done and the providers table); no I/O.
"""

from __future__ import annotations

import msgspec

from draftgen.records import AuditReport, MergeStats
from draftgen.runview.datasets import DatasetMetrics
from draftgen.runview.providers import ProviderMetrics

__all__ = ["Verdict", "grade_run"]


class Verdict(msgspec.Struct, kw_only=True):
    """Green (usable as is), amber (usable, read the warnings) or red (not usable as is), with the reason."""

    level: str = "green"
    reason: str = ""
    problems: list[str] = msgspec.field(default_factory=list)
    """What makes it red."""
    warnings: list[str] = msgspec.field(default_factory=list)
    """What makes it amber."""


#: merge drops that are no finding: a duplicate record, and samples the config's datasets[].weight / cap left
#: out on purpose (tiny-chain holds its accept prompts out with cap)
_BENIGN_DROPS = frozenset({"duplicate_record", "weight_or_cap"})


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _kinds(counts: dict[str, int], limit: int = 4) -> str:
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} {v:,}" for k, v in items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")


def grade_run(t: DatasetMetrics, audit: AuditReport | None, merged: MergeStats | None, phases: dict[str, bool],
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
