"""The data loop read as numbers, for report.html: where the drafter's acceptance is low beside how much of the
training data each dataset (and each tag of a dataset whose prompts carry tags) had (``acceptance_by_length``),
and the rounds of generation (``round_rows``).

Reads:

    accept/<drafter key>/<pass>.prompts.jsonl  ``PromptAcceptance``  the shown pass's acceptance per held-out
                                                                    prompt (a pass without the file: the
                                                                    report's own ``per_prompt``)
    prepared/<dataset>/stats.json              ``DatasetStats``      a tagged dataset's prompts per tag
                                                                    (``tag_training_tokens``)
    rounds/round-<n>.json, prepared/, raw/     through ``runview.rounds`` (``read_rounds``, ``round_counts``)

A tag's training tokens are an estimate, ``tag_training_tokens``: merged/ keeps no tags, so the dataset's
supervised tokens × the tag's share of the dataset's drawn prompts (``plan --next-round`` uses the same).

The pass's ``AcceptReport`` and ``merged/stats.json`` (``MergeStats``) are handed in by the caller
(``chain.read_chain``, the report), read once there. Writes nothing; imports no phase; nothing depends on the
clock or the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from draftgen.errors import InputError
from draftgen.records import (
    UNTAGGED,
    AcceptReport,
    DatasetAcceptance,
    DatasetStats,
    MergeStats,
    PromptAcceptance,
    RoundPlan,
    tag_keys,
)
from draftgen.rundir import RunDir
from draftgen.runview.rounds import RoundCount, read_rounds, round_counts
from draftgen.store import iter_jsonl, read_json

__all__ = ["ALL", "UNKNOWN_BUCKET", "AcceptanceByLength", "DatasetLengths", "LengthCell", "RoundCell", "RoundRow",
           "RoundsView", "acceptance_by_length", "round_rows", "tag_training_tokens"]

#: the row over every dataset (as in ``MergeStats.total``)
ALL = "all"
#: the column of the prompts whose length is not known (``PromptAcceptance.length_bucket`` None)
UNKNOWN_BUCKET = "unknown"


class LengthCell(msgspec.Struct, kw_only=True):
    """The held-out prompts of one dataset in one prompt-length bucket that have their own counters."""

    prompts: int
    drafts: float
    accepted: float
    acceptance_length: float | None  # 1 + accepted / drafts over the cell's prompts (None without a draft)


class DatasetLengths(msgspec.Struct, kw_only=True):
    """One dataset's row (``ALL``: every dataset's), or with ``tag`` one tag's of a dataset whose prompts carry
    tags (``records.UNTAGGED``: its prompts without one): its share of the merged supervised tokens (a tag's:
    ``tag_training_tokens``), its acceptance over the pass with the interval accept gave, and a cell per
    length bucket it has prompts in."""

    dataset: str
    tag: str | None = None
    supervised_tokens: int | None = None  # None: nothing merged
    training_share: float | None = None  # supervised_tokens / all merged supervised tokens
    prompts: int = 0  # its held-out prompts with their own counters
    acceptance_length: float | None = None
    ci95: list[float] | None = None  # accept's 95% bootstrap interval (AcceptReport.datasets / .acceptance)
    cells: dict[str, LengthCell] = msgspec.field(default_factory=dict)  # length bucket → cell


class AcceptanceByLength(msgspec.Struct, kw_only=True):
    """The acceptance of one pass per dataset and prompt-length bucket, beside each dataset's share of the
    training tokens. ``buckets``: the columns, shortest prompts first; ``rows``: the datasets measured (in the
    pass's order), then those merged but not measured, then ``ALL``."""

    source: str  # the per-prompt file read (relative to the run directory), or "per_prompt" of the report
    buckets: list[str] = msgspec.field(default_factory=list)
    rows: list[DatasetLengths] = msgspec.field(default_factory=list)  # each tagged dataset's tag rows follow it
    uncounted: int = 0  # prompts of the pass without their own counters (left out of every cell)
    notes: list[str] = msgspec.field(default_factory=list)


def _prompts(rd: RunDir, rep: AcceptReport, notes: list[str]) -> tuple[str, list[PromptAcceptance]] | None:
    """The pass's per-prompt records: its ``.prompts.jsonl`` when there, else the report's ``per_prompt``."""
    if rep.drafter_key and rep.pass_name:
        path = rd.accept_prompts(rep.drafter_key, rep.pass_name)
        if path.is_file():
            try:
                return str(path.relative_to(rd.root)), [r for _, r in iter_jsonl(path, PromptAcceptance)]
            except InputError as exc:  # one unreadable file costs this table, with a note, not the page
                notes.append(str(exc))
                return None
    return ("per_prompt", list(rep.per_prompt)) if rep.per_prompt else None


def _bucket(r: PromptAcceptance) -> str:
    return r.length_bucket if r.length_bucket is not None else UNKNOWN_BUCKET


def _cell(rows: Sequence[PromptAcceptance]) -> LengthCell:
    drafts, accepted = sum(r.drafts for r in rows), sum(r.accepted for r in rows)
    return LengthCell(prompts=len(rows), drafts=drafts, accepted=accepted,
                      acceptance_length=1.0 + accepted / drafts if drafts > 0 else None)


def _cells(rows: Sequence[PromptAcceptance]) -> dict[str, LengthCell]:
    """length bucket → the cell of ``rows`` in it."""
    by: dict[str, list[PromptAcceptance]] = {}
    for r in rows:
        by.setdefault(_bucket(r), []).append(r)
    return {b: _cell(rs) for b, rs in by.items()}


def _bucket_order(rows: Sequence[PromptAcceptance]) -> list[str]:
    """The buckets present, by the shortest prompt in each (a bucket is a range of prompt tokens, so this is
    their order); the unknown one last."""
    least: dict[str, float] = {}
    for r in rows:
        tokens = float(r.prompt_tokens) if r.prompt_tokens is not None else float("inf")
        least[_bucket(r)] = min(least.get(_bucket(r), tokens), tokens)
    return sorted(least, key=lambda b: (b == UNKNOWN_BUCKET, least[b], b))


def _row_of(row: DatasetLengths, mine: list[PromptAcceptance], fig: DatasetAcceptance | None,
            supervised: int | None, total: int) -> DatasetLengths:
    """``row`` filled: the cells of its prompts ``mine``, accept's figure ``fig`` (None: the same formula over
    ``mine``, no interval) and its share of ``total`` merged supervised tokens (None: nothing merged)."""
    row.prompts, row.cells = len(mine), _cells(mine)
    if supervised is not None:
        row.supervised_tokens = supervised
        row.training_share = supervised / total if total else None
    if fig is not None:
        row.acceptance_length, row.ci95 = fig.acceptance_length, fig.ci95
    elif mine:  # a report without per-dataset figures: the same formula, no interval
        row.acceptance_length = _cell(mine).acceptance_length
    return row


def tag_training_tokens(supervised_tokens: int, stats: DatasetStats | None) -> dict[str, int]:
    """A tagged dataset's supervised tokens per tag key (``records.tag_keys``), estimated: its
    ``supervised_tokens`` × the tag's share of its drawn prompts (``DatasetStats.tags`` over ``samples``; a
    prompt of several tags counts in each). {} without prepared stats or tags."""
    if stats is None or not stats.samples:
        return {}
    return {t: round(supervised_tokens * n / stats.samples) for t, n in stats.tags.items()}


def _tag_rows(rd: RunDir, parent: DatasetLengths, mine: list[PromptAcceptance], figs: list[DatasetAcceptance],
              total: int, notes: list[str]) -> list[DatasetLengths]:
    """The tag rows of the dataset row ``parent``: one per tag its counted prompts ``mine`` or accept's
    per-tag figures ``figs`` name, by tag; a tag's share of the training tokens from the dataset's prepared
    stats (an unreadable stats.json costs the tags' shares, with a note)."""
    name = parent.dataset
    by: dict[str, list[PromptAcceptance]] = {}
    for r in mine:
        for t in tag_keys(r.tags):
            by.setdefault(t, []).append(r)
    acc = {f.tag or UNTAGGED: f for f in figs if f.dataset == name}
    stats, path = None, rd.prepared_stats(name)
    try:
        stats = read_json(path, DatasetStats) if path.is_file() else None
    except InputError as exc:
        notes.append(str(exc))
    tokens = tag_training_tokens(parent.supervised_tokens or 0, stats)
    return [_row_of(DatasetLengths(dataset=name, tag=t), by.get(t, []), acc.get(t),
                    tokens.get(t) if parent.supervised_tokens is not None else None, total)
            for t in sorted(set(by) | set(acc))]


def _merged_tokens(merged: MergeStats | None) -> tuple[dict[str, int], int]:
    if merged is None:
        return {}, 0
    return {d.dataset: d.supervised_tokens for d in merged.datasets}, merged.total.supervised_tokens


def acceptance_by_length(run_dir: Path, rep: AcceptReport, merged: MergeStats | None) -> AcceptanceByLength | None:
    """``rep``'s acceptance per dataset and length bucket (1 + Σ accepted / Σ drafts over the cell's prompts
    with their own counters) beside each dataset's share of ``merged``'s supervised tokens; None when the pass
    has no per-prompt records."""
    rd = RunDir(run_dir)
    notes: list[str] = []
    found = _prompts(rd, rep, notes)
    if found is None:
        return AcceptanceByLength(source="", notes=notes) if notes else None
    source, every = found
    counted = [r for r in every if r.source is not None]
    out = AcceptanceByLength(source=source, buckets=_bucket_order(counted), uncounted=len(every) - len(counted),
                             notes=notes)
    if not counted:
        out.notes.append(f"no prompt of this pass has its own counters ({len(every)} prompts): its acceptance "
                         "per prompt length is not known")
    tokens, total = _merged_tokens(merged)
    figures = {d.dataset: d for d in rep.datasets}
    names = list(dict.fromkeys([*figures, *(r.dataset for r in counted), *tokens]))
    for name in names:
        mine = [r for r in counted if r.dataset == name]
        row = _row_of(DatasetLengths(dataset=name), mine, figures.get(name),
                      None if merged is None else tokens.get(name, 0), total)
        out.rows.append(row)
        if any(r.tags for r in mine) or any(t.dataset == name for t in rep.tags):
            out.rows.extend(_tag_rows(rd, row, mine, rep.tags, total, out.notes))
    a = rep.acceptance
    out.rows.append(DatasetLengths(dataset=ALL, supervised_tokens=total if merged is not None else None,
                                   training_share=1.0 if merged is not None and total else None,
                                   prompts=len(counted), acceptance_length=a.acceptance_length, ci95=a.ci95,
                                   cells=_cells(counted)))
    return out


# -- rounds of generation ---------------------------------------------------------------------------------------------


class RoundCell(msgspec.Struct, kw_only=True):
    """One dataset in one round: the prompts the round adds (round 1: those it drew), those drawn, those with a
    response, and what the proposal expected its acceptance length to become."""

    dataset: str
    added: int = 0
    prepared: int = 0
    done: int = 0
    expected_acceptance_length: float | None = None


class RoundRow(msgspec.Struct, kw_only=True):
    """One round of generation: round 1 is the run as configured (no plan); a later one is ``plan
    --next-round``'s proposal (``started_at`` None: proposed, not started)."""

    round: int
    spread: str | None = None
    budget: float | None = None
    budget_unit: str | None = None
    proposed_at: float | None = None
    started_at: float | None = None
    prepared: int = 0
    done: int = 0
    merged_rows: int | None = None  # rows of merged/ this round's prompts made (None: not merged)
    weighted_now: float | None = None  # the traffic-weighted acceptance length the proposal measured
    weighted_expected: float | None = None  # … and the one it expected after the round
    datasets: list[RoundCell] = msgspec.field(default_factory=list)


class RoundsView(msgspec.Struct, kw_only=True):
    """The report's rounds table: ``rows`` is empty for a run with one round."""

    datasets: list[str] = msgspec.field(default_factory=list)
    rows: list[RoundRow] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


def _row(n: int, plan: RoundPlan | None, count: RoundCount | None, datasets: Sequence[str],
         merged: MergeStats | None) -> RoundRow:
    row = RoundRow(round=n, prepared=count.prepared if count else 0, done=count.done if count else 0)
    if merged is not None:
        row.merged_rows = merged.total.rounds.get(str(n), 0)
    if plan is not None:
        row.spread, row.budget, row.budget_unit = plan.spread, plan.budget, plan.budget_unit
        row.proposed_at, row.started_at = plan.proposed_at, plan.started_at
        row.weighted_now, row.weighted_expected = plan.weighted_now, plan.weighted_expected
    lines = {d.dataset: d for d in plan.datasets} if plan is not None else {}
    for name in datasets:
        prepared, done = count.by_dataset.get(name, [0, 0]) if count else [0, 0]
        line = lines.get(name)
        added = line.add_samples if line is not None else prepared if n == 1 else 0  # round 1 adds what it drew
        row.datasets.append(RoundCell(dataset=name, added=added,
                                      prepared=prepared, done=done,
                                      expected_acceptance_length=line.expected_acceptance_length if line else None))
    return row


def round_rows(run_dir: Path, datasets: Sequence[str], merged: MergeStats | None,
               first: Sequence[tuple[str, int, int]] = ()) -> RoundsView:
    """Every round of the run (round 1 first) with its plan and its prompts per dataset; no rows when the run
    has one round. ``first``: (dataset, prepared, done) of the whole run, round 1's figures when every
    prompt drawn is round 1's (``round_counts`` then counts none; later rounds are only proposed)."""
    out = RoundsView(datasets=list(datasets))
    try:
        plans = {p.round: p for p in read_rounds(run_dir)}
    except InputError as exc:  # a bad round file costs this table, with a note, not the page
        out.notes.append(str(exc))
        return out
    counts = {c.round: c for c in round_counts(run_dir, list(datasets))}
    if not plans and not counts:
        return out
    if not counts:
        by = {name: [prepared, done] for name, prepared, done in first}
        counts[1] = RoundCount(round=1, prepared=sum(p for p, _ in by.values()), done=sum(d for _, d in by.values()),
                               by_dataset=by)
    for n in sorted(set(plans) | set(counts) | {1}):
        out.rows.append(_row(n, plans.get(n), counts.get(n), datasets, merged))
    return out
