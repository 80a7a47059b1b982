"""``draftgen plan CONFIG --next-round``: the next round of generation, proposed from measured acceptance.

Reads ``accept/acceptance.json`` (the run's own drafter, latest pass: acceptance length per dataset with its
interval, and the served k), ``merged/stats.json`` (each dataset's supervised tokens: what the drafter trained
on), the raw logs (each dataset's cost per response) and ``prepared/<dataset>/stats.json`` (the prompts not
drawn yet). Writes ``rounds/round-<n>.json`` (``records.RoundPlan``); ``generate --round N`` starts it.

The model, stated once: dataset d's acceptance length in its training tokens n follows
``AL_d(n) = A - c_d * n**-alpha`` with the ceiling ``A = k + 1`` (every draft accepted), ``alpha`` =
``plan.round_alpha`` and ``c_d`` set so that the law meets the measured AL at today's n. Adding Δ tokens is
expected to gain ``(A - AL_d) * (1 - (n / (n + Δ))**alpha)``. Datasets are treated as independent (one
dataset's data is assumed not to move another's acceptance) and weighed by their traffic share w_d.

``guided`` spends the budget one prompt at a time where ``w_d`` × the expected gain per unit spent is largest
(the gains are concave, so this is the best split under the model); ``uniform`` gives every dataset the same
share of the budget (the comparison). Each dataset adds at most the prompts its source has left.

Tags (``datasets[].tags_field``): where a dataset's measured prompts carry tags (the acceptance report's
``tags``), each of its tags t is an arm of the same model instead of the dataset, ``AL_t(n) = A - c_t *
n**-alpha``, with the tag's measured AL, and
- its training tokens n_t = the dataset's supervised tokens × the tag's share of the dataset's drawn prompts
  (``runview.loop.tag_training_tokens``: ``prepared/<dataset>/stats.json``'s ``tags`` over ``samples``; a
  prompt of several tags counts in each): merged/ keeps no tags, so this is an estimate that takes the tag's
  prompts to be of the dataset's mean length;
- its traffic w_t = w_d × its share of the dataset's drawn prompts, the shares normalised to sum to 1 (the
  tag mix of what was drawn is taken to be the tag mix of what will be served);
- its cost per sample the dataset's, and its room the prompts carrying it not drawn yet (``tags_not_selected``;
  a prompt of several tags is counted in each tag's room, drawn once).
The prompts without a tag in such a dataset are one more arm (``records.UNTAGGED``). ``guided`` spends over
every arm alike; ``uniform`` gives every dataset the same share and splits a tagged dataset's share evenly over
its tags that can grow. The dataset's line adds the sum of its tags' prompts, and its expected AL is its
measured AL plus its tags' expected gains weighed by their traffic within it.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from pathlib import Path

from draftgen.config import RunConfig
from draftgen.errors import InputError
from draftgen.fmt import fmt_int, fmt_usd
from draftgen.phases import Echo
from draftgen.records import (
    UNTAGGED,
    AcceptReport,
    DatasetAcceptance,
    DatasetStats,
    MergeStats,
    RoundArm,
    RoundDataset,
    RoundPlan,
    RoundTag,
    tag_label,
)
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.runview.datasets import DatasetMetrics
from draftgen.runview.loop import tag_training_tokens
from draftgen.runview.metrics import compute_metrics
from draftgen.runview.rounds import read_rounds
from draftgen.store import atomic_write_json, read_json

__all__ = ["SPREADS", "propose_round", "run_next_round"]

SPREADS = ("guided", "uniform")


@dataclass
class _Arm:
    """One dataset (or one tag of a dataset) under the model: its gap to the ceiling, its training tokens, what a
    sample costs. ``group``: the dataset of a tag's arm (``uniform`` spreads per dataset, then per tag)."""

    line: RoundArm
    gap: float
    n: float
    cost: float  # budget units per sample
    alpha: float
    group: str | None = None

    def gain(self, samples: int) -> float:
        """Expected AL gain from ``samples`` more prompts."""
        if self.n <= 0 or samples <= 0:
            return 0.0
        share = self.n / (self.n + samples * self.line.tokens_per_sample)
        return self.gap * (1.0 - float(share**self.alpha))


def _read_basis(rd: RunDir, acceptance: Path | None) -> tuple[AcceptReport, MergeStats]:
    path = acceptance if acceptance is not None else rd.accept_json
    if not path.is_file():
        raise InputError(f"{path}: no acceptance measured for this run's drafter; run `draftgen accept CONFIG` on "
                         "it first, or name a pass with --acceptance (plan --next-round proposes from it)")
    rep = read_json(path, AcceptReport)
    if not rep.datasets or rep.k is None:
        raise InputError(f"{path}: the measurement has no per-dataset acceptance or no k; measure again with this "
                         "draftgen (`draftgen accept CONFIG`)")
    if not rd.merged_stats.is_file():
        raise InputError(f"{rd.merged_stats}: not found; run `draftgen merge CONFIG` (the proposal weighs each "
                         "dataset's training tokens)")
    return rep, read_json(rd.merged_stats, MergeStats)


def _lines(cfg: RunConfig, rd: RunDir, rep: AcceptReport, merged: MergeStats) -> list[RoundDataset]:
    """Each configured dataset's measured line (traffic shares normalised), with its tags' lines where its
    measured prompts carry tags."""
    total_w = sum(d.traffic for d in cfg.datasets)
    if total_w <= 0:
        raise InputError("datasets[].traffic: every dataset's is 0; give the datasets the drafter will serve a weight")
    acc = {d.dataset: d for d in rep.datasets}
    tok = {d.dataset: d for d in merged.datasets}
    all_tokens = sum(d.supervised_tokens for d in merged.datasets) or 1
    spent = {m.name: m for m in compute_metrics(rd.root, [d.name for d in cfg.datasets]).datasets}
    out = []
    for d in cfg.datasets:
        a, t, m = acc.get(d.name), tok.get(d.name), spent.get(d.name, DatasetMetrics(name=d.name))
        stats = read_json(rd.prepared_stats(d.name), DatasetStats) if rd.prepared_stats(d.name).is_file() else None
        rows = t.samples if t is not None else 0
        out.append(RoundDataset(
            dataset=d.name, traffic=round(d.traffic / total_w, 6),
            acceptance_length=a.acceptance_length if a else None, ci95=a.ci95 if a else None,
            prompts_measured=a.prompts if a else 0,
            training_tokens=t.supervised_tokens if t else 0,
            training_share=round((t.supervised_tokens if t else 0) / all_tokens, 6),
            tokens_per_sample=round(t.supervised_tokens / rows, 3) if t and rows else 0.0,
            usd_per_sample=m.cost_usd / m.done if m.done else 0.0,
            available=stats.not_selected if stats and d.max_samples is not None else 0))
        figs = [f for f in rep.tags if f.dataset == d.name]
        if figs:
            out[-1].tags = _tag_lines(out[-1], figs, stats, d.max_samples is not None)
    return out


def _tag_lines(ln: RoundDataset, figs: list[DatasetAcceptance], stats: DatasetStats | None,
               capped: bool) -> list[RoundTag]:
    """The tag lines of dataset line ``ln``: each tag measured (``figs``), drawn or left in its source."""
    drawn = stats.tags if stats else {}
    left = stats.tags_not_selected if stats and capped else {}
    tokens = tag_training_tokens(ln.training_tokens, stats)
    per_tag = sum(drawn.values())
    acc = {f.tag or UNTAGGED: f for f in figs}
    out = []
    for t in sorted(set(drawn) | set(left) | set(acc)):
        f = acc.get(t)
        out.append(RoundTag(
            tag=t, traffic=round(ln.traffic * drawn.get(t, 0) / per_tag, 6) if per_tag else 0.0,
            acceptance_length=f.acceptance_length if f else None, ci95=f.ci95 if f else None,
            prompts_measured=f.prompts if f else 0, training_tokens=tokens.get(t, 0),
            tokens_per_sample=ln.tokens_per_sample, available=left.get(t, 0)))
    return out


def _arms(lines: list[RoundDataset], k: int, alpha: float, unit: str) -> list[_Arm]:
    """One arm per dataset line, or per tag line of a dataset that has them; each line's note says why it
    cannot grow, where it cannot."""
    arms = []
    for ln in lines:
        cost = ln.usd_per_sample if unit == "usd" else ln.tokens_per_sample
        items: list[RoundArm] = [*ln.tags] if ln.tags else [ln]
        for item in items:
            if item.acceptance_length is None:
                item.note = "no held-out prompt of it was measured: nothing to steer by"
            elif not item.training_tokens or not item.tokens_per_sample:
                item.note = "none of its rows are in merged/: the law has no n"
            elif not item.available:
                item.note = "its source has no prompt left to draw (raise the source, or it has no max_samples)"
            gap = max(k + 1 - (item.acceptance_length or k + 1), 0.0)
            arms.append(_Arm(item, gap, float(item.training_tokens), cost, alpha, ln.dataset if ln.tags else None))
    return arms


def _guided(arms: list[_Arm], budget: float) -> None:
    """Greedy by traffic-weighted marginal gain per unit spent (optimal for concave gains)."""
    def value(i: int) -> float:
        a = arms[i]
        s = a.line.add_samples
        return a.line.traffic * (a.gain(s + 1) - a.gain(s)) / a.cost

    heap = [(-value(i), i) for i, a in enumerate(arms) if a.cost > 0 and a.line.available and a.n > 0]
    heapq.heapify(heap)
    left = budget
    while heap:
        neg, i = heapq.heappop(heap)
        a = arms[i]
        if neg >= 0 or a.cost > left:
            continue
        a.line.add_samples += 1
        left -= a.cost
        if a.line.add_samples < a.line.available:
            heapq.heappush(heap, (-value(i), i))


def _even(arms: list[_Arm], budget: float) -> float:
    """The same share of ``budget`` for every arm that can grow; what a capped one cannot use is shared again
    among the rest. Returns what was spent."""
    open_ = [a for a in arms if a.cost > 0 and a.line.available > a.line.add_samples]
    left = budget
    while open_ and left > 0:
        share = left / len(open_)
        grown = []
        for a in open_:
            take = min(int(share // a.cost), a.line.available - a.line.add_samples)
            a.line.add_samples += take
            left -= take * a.cost
            if a.line.add_samples < a.line.available and take > 0:
                grown.append(a)
        if len(grown) == len(open_) or not grown:
            break
        open_ = grown
    return budget - left


def _uniform(arms: list[_Arm], budget: float) -> None:
    """The same share of the budget for every dataset that can grow, a tagged dataset's share split evenly
    over its tags (``_even``); what a capped one cannot use is shared again among the rest."""
    groups: dict[object, list[_Arm]] = {}
    for i, a in enumerate(arms):
        groups.setdefault(a.group if a.group is not None else i, []).append(a)

    def can_grow(g: list[_Arm]) -> bool:
        return any(a.cost > 0 and a.line.available > a.line.add_samples for a in g)

    open_ = [g for g in groups.values() if can_grow(g)]
    left = budget
    while open_ and left > 0:
        share = left / len(open_)
        grown = []
        for g in open_:
            spent = _even(g, share)
            left -= spent
            if spent > 0 and can_grow(g):
                grown.append(g)
        if len(grown) == len(open_) or not grown:
            break
        open_ = grown


def propose_round(cfg: RunConfig, *, spread: str = "guided", add_usd: float | None = None,
                  add_tokens: int | None = None, acceptance: Path | None = None) -> RoundPlan:
    """The next round's proposal (see the module docstring); nothing written. Without a budget: what round 1
    cost (USD when every dataset's responses were priced, else its supervised tokens). ``acceptance``: the
    ``AcceptReport`` to steer by (default ``accept/acceptance.json``; a pass of this run's drafter measured on
    prompts of the same datasets, for instance in an evaluation run directory of their own)."""
    if spread not in SPREADS:
        raise InputError(f"--spread {spread!r}: one of {', '.join(SPREADS)}")
    rd = RunDir(cfg.run_path)
    rep, merged = _read_basis(rd, acceptance)
    basis, root = (acceptance or rd.accept_json).resolve(), rd.root.resolve()
    shown = str(basis.relative_to(root) if basis.is_relative_to(root) else basis)
    k = int(rep.k or 0)
    lines = _lines(cfg, rd, rep, merged)
    unit = "tokens" if add_tokens is not None or any(ln.usd_per_sample <= 0 for ln in lines) else "usd"
    if add_usd is not None and unit == "tokens" and add_tokens is None:
        raise InputError("--add-usd: some dataset's responses have no known cost; give the round in tokens "
                         "(--add-tokens N, supervised tokens)")
    budget = float(add_tokens if add_tokens is not None else add_usd if add_usd is not None else
                   (sum(ln.usd_per_sample * m for ln, m in zip(lines, _done(merged, lines), strict=True))
                    if unit == "usd" else sum(ln.training_tokens for ln in lines)))
    arms = _arms(lines, k, cfg.plan.round_alpha, unit)
    (_guided if spread == "guided" else _uniform)(arms, budget)
    _settle(lines, arms)
    notes = []
    measured = [ln for ln in lines if ln.acceptance_length is not None]
    wsum = sum(ln.traffic for ln in measured) or 1.0
    now = sum(ln.traffic * (ln.acceptance_length or 0.0) for ln in measured) / wsum
    after = sum(ln.traffic * (ln.expected_acceptance_length or 0.0) for ln in measured) / wsum
    started = [r for r in read_rounds(rd.root) if r.started_at is not None]
    n = 1 + max((r.round for r in started), default=1)
    if started and rep.created_at and rep.created_at < (started[-1].started_at or 0):
        notes.append(f"the acceptance was measured before round {started[-1].round} started: train on that "
                     "round and measure again first, or this proposal repeats the last one")
    return RoundPlan(round=n, spread=spread, budget_unit=unit, budget=budget, k=k, alpha=cfg.plan.round_alpha,
                     basis=shown, drafter=rep.drafter, datasets=lines,
                     weighted_now=round(now, 4), weighted_expected=round(after, 4), notes=notes,
                     proposed_at=time.time())


def _settle(lines: list[RoundDataset], arms: list[_Arm]) -> None:
    """Each line's tokens, dollars and expected AL from the prompts its arm (or its tags' arms) adds."""
    gains = {id(a.line): a.gain(a.line.add_samples) for a in arms}
    for ln in lines:
        for t in ln.tags:
            t.add_tokens = round(t.add_samples * t.tokens_per_sample)
            t.add_usd = round(t.add_samples * ln.usd_per_sample, 6)
            if t.acceptance_length is not None:
                t.expected_acceptance_length = round(t.acceptance_length + gains[id(t)], 4)
        if ln.tags:
            ln.add_samples = sum(t.add_samples for t in ln.tags)
            gain = sum(t.traffic * gains[id(t)] for t in ln.tags) / ln.traffic if ln.traffic else 0.0
        else:
            gain = gains[id(ln)]
        ln.add_tokens = round(ln.add_samples * ln.tokens_per_sample)
        ln.add_usd = round(ln.add_samples * ln.usd_per_sample, 6)
        if ln.acceptance_length is not None:
            ln.expected_acceptance_length = round(ln.acceptance_length + gain, 4)


def _done(merged: MergeStats, lines: list[RoundDataset]) -> list[int]:
    by = {d.dataset: d.unique_samples for d in merged.datasets}
    return [by.get(ln.dataset, 0) for ln in lines]


def round_lines(plan: RoundPlan) -> list[str]:
    """The proposal as the console shows it."""
    money = plan.budget_unit == "usd"
    spent = fmt_usd(plan.budget) if money else f"{fmt_int(round(plan.budget))} supervised tokens"
    out = [f"round {plan.round} ({plan.spread}, {spent}; AL(n) = {plan.k + 1} - c·n^-{plan.alpha:g} per dataset or tag, "
           f"from {plan.basis}):",
           f"  {'dataset':<16} {'traffic':>7} {'AL now':>18} {'train share':>11} {'+prompts':>9} "
           f"{'+tokens':>9} {'+USD':>9} {'AL expected':>11}"]
    for d in plan.datasets:
        out.append(_round_line(d.dataset, d, d.training_share))
        for t in d.tags:
            share = d.training_share * t.training_tokens / d.training_tokens if d.training_tokens else 0.0
            out.append(_round_line(f"  / {tag_label(t.tag)}", t, share))
    if plan.weighted_now is not None and plan.weighted_expected is not None:
        out.append(f"  traffic-weighted AL {plan.weighted_now:.3f} → {plan.weighted_expected:.3f} expected "
                   "(a model's expectation, not a measurement: measure the round's drafter with draftgen accept)")
    out += [f"  note: {n}" for n in plan.notes]
    return out


def _round_line(label: str, d: RoundArm, share: float) -> str:
    al = "-" if d.acceptance_length is None else (
        f"{d.acceptance_length:.3f}" + (f" [{d.ci95[0]:.2f},{d.ci95[1]:.2f}]" if d.ci95 else ""))
    exp = "-" if d.expected_acceptance_length is None else f"{d.expected_acceptance_length:.3f}"
    return (f"  {label:<16} {d.traffic:>7.1%} {al:>18} {share:>11.1%} {fmt_int(d.add_samples):>9} "
            f"{fmt_int(d.add_tokens):>9} {fmt_usd(d.add_usd):>9} {exp:>11}" + (f"  ({d.note})" if d.note else ""))


def run_next_round(cfg: RunConfig, *, spread: str = "guided", add_usd: float | None = None,
                   add_tokens: int | None = None, acceptance: Path | None = None, echo: Echo = print,
                   force: bool = False) -> RoundPlan:
    """Propose the next round and write it to ``rounds/round-<n>.json`` (replacing a proposal not started),
    under the run directory's writer lock."""
    with writer(cfg, "plan", force=force) as rd:
        plan = propose_round(cfg, spread=spread, add_usd=add_usd, add_tokens=add_tokens, acceptance=acceptance)
        for line in round_lines(plan):
            echo(line)
        if not any(d.add_samples for d in plan.datasets):
            raise InputError("plan --next-round: the budget buys no prompt of any dataset (the notes above say "
                             "why); raise --add-usd / --add-tokens, or give the sources more prompts")
        atomic_write_json(rd.round_plan(plan.round), plan)
        echo(f"wrote {rd.round_plan(plan.round)}; start it with `draftgen generate CONFIG --round {plan.round}`")
        return plan
