"""The audit's verdict: which samples merge must leave out and why, the thresholds, and the one line.

Plain functions, no I/O. A sample is excluded for the first reason that holds, in this order:

    structural:<kind>   a structural check failed (``checks`` lists the kinds): the ids are not trustworthy
    reasoning_dropped   the provider billed reasoning tokens but returned no reasoning text: the row would
                        teach the drafter to answer without thinking (kept only when ``quality.keep_unusable``
                        kept it on purpose, flagged ``unusable:reasoning_dropped``)
    semantic_mismatch   the rebuilt ids decode to other text than the reference ids (the emulator's ground
                        truth or exact-id records)
    billing_off         the rebuilt completion length is off the billed one by more than
                        ``quality.billing_tolerance`` of it (and by more than 3 tokens)

Thresholds (``audit.*``; null disables one) are judged on every dataset and on the whole run:

    structural_failure_rate     structurally failed samples / records
    semantic_mismatch_rate      semantic mismatches / compared samples, among the samples merge keeps
    billing_disagreement        |rebuilt − billed| / billed completion tokens, among the samples merge keeps
    tokenization_mismatch_rate  same text, other ids (BPE drift) / compared samples

    excluded_share              samples merge must leave out / records (``audit.max_excluded_share``)

Whatever the thresholds, the run's verdict fails when it has records and merge would keep none of them:
"PASS" never means an empty dataset.

Underbilled: a record billed for fewer completion tokens than its ids (beyond the tolerance) whose ids are
exact on their own (``underbilled``: no structural failure, so the ids decode to the text; a rebuild that
added nothing of its own, no flag in ``REBUILD_DOUBTS``; the reference, when there is one, exact) is not
excluded: re-encoding the returned text canonically gives about the fewest tokens that spell it, so a
provider billing fewer miscounted. It is kept, counted apart from the billing disagreement of the kept
rows, and reported by provider (``billing_side_lines``). Billed for more than the text rebuilds to, the
record's text may be short of what was generated: that record stays excluded (``billing_off``).

Truncated samples (``finish_reason`` length) are the model's real tokens and are never excluded for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftgen.config import RunConfig
from draftgen.records import DatasetAudit

__all__ = [
    "EXCLUSION_REASONS",
    "REBUILD_DOUBTS",
    "billing_side_lines",
    "exclusion_reason",
    "rates",
    "thresholds_broken",
    "underbilled",
    "verdict_line",
]

EXCLUSION_REASONS = ("structural", "reasoning_dropped", "semantic_mismatch", "billing_off")
#: parts of flag names saying the rebuilt ids may hold tokens the model did not write (or lack some)
REBUILD_DOUBTS = ("junction_restored", "tool_calls_", "reasoning_dropped", "special_in_text", "unusable:",
                  "reasoning_fields_", "extra_choices", "_repaired", "replacement_char")


def underbilled(*, structural: Sequence[tuple[str, str]], flags: Sequence[str], reference_kind: str | None,
                billed: int, rebuilt: int, billing_tolerance: float) -> bool:
    """Whether a record is billed short while its ids are exact on their own (see the module docstring)."""
    if structural or billed <= 0 or rebuilt - billed <= max(3, billing_tolerance * billed):
        return False
    if reference_kind not in (None, "exact"):
        return False
    return not any(d in f for f in flags for d in REBUILD_DOUBTS)


def billing_side_lines(da: DatasetAudit) -> list[str]:
    """Which side is wrong when billing and ids disagree: the provider's count (underbilled, kept) or the
    record's text (billed more than it rebuilds to, excluded)."""
    lines = []
    if da.underbilled:
        by = ", ".join(f"{k} {v}" for k, v in sorted(da.underbilled_by_provider.items(), key=lambda kv: -kv[1]))
        lines.append(f"billing: {da.underbilled:,} records billed for fewer tokens than their ids, which are exact "
                     f"on their own (billed {da.underbilled_billed_tokens:,} vs {da.underbilled_rebuilt_tokens:,}): "
                     f"the provider's count is wrong, not the ids; kept, flagged underbilled ({by})")
    off = da.excluded_by_reason.get("billing_off", 0)
    if off:
        lines.append(f"billing: {off:,} records billed far off their text (more than it rebuilds to, or ids not "
                     "exact on their own): the record's side is in doubt; excluded (billing_off)")
    return lines


def exclusion_reason(
    *,
    structural: Sequence[tuple[str, str]],
    flags: Sequence[str],
    reference_kind: str | None,
    billed: int | None,
    rebuilt: int,
    keep_unusable: bool,
    billing_tolerance: float,
) -> tuple[str, str] | None:
    """(reason, detail) when merge must leave the sample out, else None (see the module docstring)."""
    if structural:
        kind, detail = structural[0]
        return f"structural:{kind}", detail
    kept_on_purpose = keep_unusable and any(f.startswith("unusable:") for f in flags)
    if "reasoning_dropped" in flags and not kept_on_purpose:
        return "reasoning_dropped", ""
    if reference_kind == "semantic" and not kept_on_purpose:
        return "semantic_mismatch", ""
    if billed:
        diff = rebuilt - billed
        if abs(diff) > max(3, billing_tolerance * billed) and not kept_on_purpose:
            return "billing_off", f"rebuilt {rebuilt} vs billed {billed}"
    return None


def rates(da: DatasetAudit) -> dict[str, float]:
    """Every rate a threshold or the summary uses, for one dataset (or the whole run)."""
    out: dict[str, float] = {}
    if da.records:
        out["structural_failure_rate"] = da.structural_failed_samples / da.records
        out["excluded_share"] = len(da.excluded) / da.records
    if da.billed_completion_tokens:
        out["billing_disagreement_all"] = (abs(da.rebuilt_completion_tokens - da.billed_completion_tokens)
                                           / da.billed_completion_tokens)
    if da.kept_billed_completion_tokens:
        out["billing_disagreement"] = (abs(da.kept_rebuilt_completion_tokens - da.kept_billed_completion_tokens)
                                       / da.kept_billed_completion_tokens)
    if da.kept_reference_compared:
        out["semantic_mismatch_rate"] = da.kept_semantic_mismatch / da.kept_reference_compared
    if da.reference_compared:
        out["tokenization_mismatch_rate"] = da.tokenization_mismatch / da.reference_compared
        out["exact_match_rate"] = da.exact_match / da.reference_compared
    return out


def thresholds_broken(cfg: RunConfig, audits: Sequence[DatasetAudit]) -> list[str]:
    """The thresholds of ``cfg.audit`` broken by any of ``audits`` (every dataset, then the whole run, last),
    and the whole run keeping nothing."""
    a = cfg.audit
    limits = {
        "structural_failure_rate": a.max_structural_failure_rate,
        "semantic_mismatch_rate": a.max_semantic_mismatch_rate,
        "billing_disagreement": a.max_billing_disagreement,
        "tokenization_mismatch_rate": a.max_tokenization_mismatch_rate,
        "excluded_share": a.max_excluded_share,
    }
    names = {"billing_disagreement": "billing disagreement after exclusions",
             "semantic_mismatch_rate": "semantic mismatch rate among kept rows",
             "excluded_share": "share of samples excluded from the merge"}
    broken: list[str] = []
    overall = audits[-1] if audits else None
    if overall is not None and overall.records and not overall.kept:
        broken.append(f"{overall.dataset}: every one of its {overall.records:,} records is excluded; merge would "
                      "keep nothing (rerun generate: excluded samples are generated again)")
    for da in audits:
        r = rates(da)
        for key, limit in limits.items():
            if limit is not None and key in r and r[key] > limit:
                broken.append(f"{da.dataset}: {names.get(key, key.replace('_', ' '))} {r[key]:.4%} > {limit:.4%} "
                              f"(audit.max_{key})")
    return broken


def verdict_line(overall: DatasetAudit, broken: Sequence[str], billing_limit: float | None) -> str:
    """``PASS: …`` or ``FAIL: …`` in one line, the first thing ``draftgen audit`` prints."""
    r = rates(overall)
    excluded = ", ".join(f"{k} {v}" for k, v in sorted(overall.excluded_by_reason.items(), key=lambda kv: -kv[1]))
    parts = [f"{overall.records:,} records", f"{len(overall.excluded):,} excluded" + (f" ({excluded})" if excluded else "")]
    if "billing_disagreement" in r:
        parts.append(f"billing disagreement {r['billing_disagreement']:.3%} after exclusions"
                     + (f" (max {billing_limit:.2%})" if billing_limit is not None else "")
                     + (f", {r['billing_disagreement_all']:.3%} before" if "billing_disagreement_all" in r else ""))
    if broken:
        more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
        return f"FAIL: {broken[0]}{more}; " + "; ".join(parts)
    return "PASS: " + "; ".join(parts)
