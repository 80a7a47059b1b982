"""What ``draftgen generate`` prints and logs at the end of a run: the failures of this session, what passed
a budget, the dollar budget's spent + left, and the per-provider table.

Reads ``raw/<dataset>/failures.jsonl`` (``store.scan_failures``) and, for the provider table, the run
directory's files through ``runview.providers.provider_metrics``; writes nothing (``generate.run`` prints
and logs the lines).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from draftgen import rundir
from draftgen.engine import BudgetGovernor
from draftgen.errors import DraftgenError
from draftgen.fmt import fmt_held
from draftgen.store import scan_failures

__all__ = ["WIDTH", "budget_lines", "failure_lines", "fit_columns", "overshoot_lines", "provider_table"]


def failure_lines(rd: rundir.RunDir, names: list[str], since: float) -> tuple[list[str], str]:
    """This session's failures (recorded at or after ``since``, the latest per sample), as console lines and the
    run's message: each permanent reason with its count (a rerun fails them again until the request, the
    config or the prompt changes), and the retryable ones (a rerun retries them)."""
    permanent: Counter[str] = Counter()
    retryable = 0
    for name in names:
        for rec in scan_failures(rd.failures(name)).values():
            if rec.created_at < since:
                continue
            if rec.permanent:
                permanent[rec.reason if rec.kind in rec.reason else f"{rec.kind}: {rec.reason}"] += 1
            else:
                retryable += 1
    where = ", ".join(str(rd.failures(n).relative_to(rd.root)) for n in names)
    lines = [f"failed for good: {n:,} × {why}" for why, n in permanent.most_common(5)]
    if len(permanent) > 5:
        lines.append(f"failed for good: {sum(permanent.values()) - sum(n for _, n in permanent.most_common(5)):,} "
                     f"more, for {len(permanent) - 5} other reasons ({where})")
    parts = []
    if permanent:
        parts.append(f"{sum(permanent.values()):,} for good (a rerun sends them again only to fail the same way: "
                     "fix what the reason says first)")
    if retryable:
        parts.append(f"{retryable:,} for now (rerun to retry {'it' if retryable == 1 else 'them'})")
    total = sum(permanent.values()) + retryable
    return lines, f"{total:,} samples failed: {'; '.join(parts) or 'see the failures'} ({where} says why)"


def budget_lines(governor: BudgetGovernor) -> list[str]:
    """The dollar budget at the end, spent + left adding up to it (requests in flight have settled or been
    cancelled by now: nothing is reserved; what abandoned requests hold at their worst case is named apart),
    and what else caps the spend when the key's account does."""
    cap = governor.max_spend
    if cap is None:
        return []
    spent = governor.spent
    if spent > cap:
        return []  # overshoot_lines says by how much
    held = fmt_held(governor.billed, governor.held, governor.abandoned, usd=lambda x: f"${x:.4f}")
    line = f"budget: ${spent:.4f} spent" + (f" ({held})" if held else "") + f" + ${cap - spent:.4f} left = ${cap:g}"
    if governor.session_cap is not None and governor.session_cap - governor.session < cap - spent:
        line += (f"; the key's account allows ${max(0.0, governor.session_cap - governor.session):.4f} more, "
                 "which caps the next run first")
    return [line]


def overshoot_lines(governor: BudgetGovernor) -> list[str]:
    """What passed a budget (``budget.token_policy: expected`` lets in-flight requests finish past it)."""
    lines = [f"{name}: {tb.overshoot:,} completion tokens over its budget of {tb.budget:,} (what was in flight)"
             for name, tb in governor.tokens.items() if tb.overshoot > 0 and tb.budget is not None]
    if governor.max_spend is not None and governor.spent > governor.max_spend:
        lines.append(f"spend: ${governor.spent - governor.max_spend:.4f} over the budget of ${governor.max_spend:g} "
                     "(what was in flight)")
    return lines


def provider_table(run_dir: Path, datasets: list[str]) -> list[str]:
    """Per-provider figures of the run directory, from its files (``runview.providers.provider_metrics``)."""
    from draftgen.runview.providers import provider_metrics

    try:
        rows = provider_metrics(run_dir, datasets)
    except DraftgenError as exc:  # a file it cannot read: the records are written all the same
        return [f"per-provider table not available: {exc}"]
    if not rows:
        return []

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = ("provider", "responses", "$/M out", "p50 lat", "p95 lat", "p50 TTFT", "p95 TTFT", "retries",
            "dropped", "quant", "cool-downs", "tier")
    body = [(m.provider, str(m.responses), num(m.usd_per_m_output, ".3f"), num(m.latency_p50_s, ".2f"),
             num(m.latency_p95_s, ".2f"), num(m.ttft_p50_s, ".2f"), num(m.ttft_p95_s, ".2f"), str(m.retries),
             str(m.dropped_reasoning), m.quantization or "-", str(m.cooldowns), m.service_tiers or "-") for m in rows]
    return ["per provider (raw/, logs/attempts.jsonl, logs/health.jsonl; latency, TTFT in s):",
            *fit_columns(head, body, WIDTH)]


#: The width the end-of-run lines fit in (a terminal's narrowest usual width).
WIDTH = 80


def fit_columns(head: tuple[str, ...], body: Sequence[tuple[str, ...]], width: int) -> list[str]:
    """A table of ``head`` and ``body`` as lines of at most ``width`` characters: the columns that fit beside
    the first one, then (after a blank line) the first column again with the next ones, and so on; nothing
    cut (a single column wider than ``width`` keeps its own width)."""
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    groups: list[list[int]] = []
    used = width + 1
    for i in range(1, len(head)):
        if used + 2 + widths[i] > width:
            groups.append([0])
            used = widths[0]
        groups[-1].append(i)
        used += 2 + widths[i]
    out: list[str] = []
    for g in groups:
        if out:
            out.append("")
        for r in (head, *body):
            out.append("  ".join(r[i].ljust(widths[i]) if i == 0 else r[i].rjust(widths[i]) for i in g).rstrip())
    return out
