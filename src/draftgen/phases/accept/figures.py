"""The figures ``draftgen accept`` derives from per-prompt counters: bootstrap intervals, the no-model drafters'
replay, comparisons and per-dataset acceptance.

Input: one ``Series`` per drafter measured on the same held-out prompts (the served drafter's counters per
prompt, a no-model drafter's replayed counters, the zero-aux pass's), in the same prompt order. Output: the
``records.drafter`` figures of the report. Pure computation; no I/O.

- Acceptance length of a series: 1 + Σaccepted / Σdrafts over its prompts (vLLM's formula, summed over the
  prompts, so it equals the AL of the whole pass).
- 95% interval: percentile bootstrap over the prompts (``BOOT_REPS`` resamples with replacement, seeded by
  ``BOOT_SEED``, so a report is reproducible); every figure of one report uses the same resamples, so
  differences are paired by prompt.
- ``no-model``: the better of copy-last and lookup, taken in each resample (the interval of
  "drafter − max(copy-last, lookup)").
- Per dataset: the same, with the resamples drawn within that dataset's prompts; per (dataset, tag), for a
  dataset whose prompts carry tags, the same within the prompts of the dataset carrying the tag (a prompt of
  several tags counts in each; those with none under ``records.UNTAGGED``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from draftgen.drafter.baselines import NO_MODEL, Propose, replay
from draftgen.records import (
    AlternativeFigures,
    Comparison,
    DatasetAcceptance,
    PromptAcceptance,
    tag_keys,
    tag_label,
)
from draftgen.runview.chain import NO_MODEL as NO_MODEL_BEST
from draftgen.runview.chain import NO_MODEL_NAMES

__all__ = ["BOOT_REPS", "BOOT_SEED", "NO_MODEL_BEST", "Compared", "Series", "alternative_figures", "compare",
           "comparison_lines", "comparisons", "dataset_figures", "interval", "no_model_series", "resamples",
           "tag_figures"]

BOOT_REPS = 2000
BOOT_SEED = 0


@dataclass
class Series:
    """Per-prompt counters of one drafter on the held-out prompts (same order for every series of a report)."""

    name: str
    accepted: list[float]
    drafts: list[float]
    per_pos: list[list[float]] = field(default_factory=list)  # per prompt: accepted at position i

    def al(self, idx: Sequence[int] | None = None) -> float:
        """1 + Σaccepted / Σdrafts over the prompts ``idx`` (all by default); 1.0 without drafts."""
        rows = range(len(self.drafts)) if idx is None else idx
        d = sum(self.drafts[i] for i in rows)
        return 1.0 + sum(self.accepted[i] for i in rows) / d if d > 0 else 1.0

    def per_position(self) -> list[float]:
        d = sum(self.drafts)
        if d <= 0 or not self.per_pos:
            return []
        k = max(len(p) for p in self.per_pos)
        return [sum(p[j] for p in self.per_pos if j < len(p)) / d for j in range(k)]


def resamples(idx: Sequence[int], reps: int = BOOT_REPS, seed: int = BOOT_SEED) -> list[list[int]]:
    """``reps`` bootstrap resamples (with replacement) of the prompt indices ``idx``, seeded."""
    rng = random.Random(seed)
    pool = list(idx)
    return [[pool[rng.randrange(len(pool))] for _ in pool] for _ in range(reps)] if pool else []


def _percentiles(values: list[float]) -> list[float]:
    """[2.5th, 97.5th] percentiles (linear interpolation)."""
    v = sorted(values)

    def at(q: float) -> float:
        pos = q * (len(v) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(v) - 1)
        return v[lo] + (v[hi] - v[lo]) * (pos - lo)

    return [round(at(0.025), 4), round(at(0.975), 4)]


def interval(series: Series, rs: list[list[int]]) -> list[float] | None:
    """The 95% interval of the series' acceptance length over the resamples (None with fewer than 2 prompts)."""
    if len(series.drafts) < 2 or not rs:
        return None
    return _percentiles([series.al(r) for r in rs])


def _best(others: Sequence[Series], idx: Sequence[int] | None) -> float:
    return max(o.al(idx) for o in others)


def comparisons(drafter: Series, alternatives: Sequence[Series], rs: list[list[int]],
                no_model: Sequence[str] = NO_MODEL_NAMES) -> list[Comparison]:
    """drafter − each alternative, and drafter − the better no-model drafter, paired over the resamples."""
    if len(drafter.drafts) < 2 or not rs:
        return []
    out = [Comparison(versus=a.name, difference=round(drafter.al() - a.al(), 4),
                      ci95=_percentiles([drafter.al(r) - a.al(r) for r in rs])) for a in alternatives]
    best = [a for a in alternatives if a.name in no_model]
    if best:
        out.append(Comparison(versus=NO_MODEL_BEST, difference=round(drafter.al() - _best(best, None), 4),
                              ci95=_percentiles([drafter.al(r) - _best(best, r) for r in rs])))
    return out


def alternative_figures(s: Series, how: str, rs: list[list[int]], *, base_url: str | None = None) -> AlternativeFigures:
    return AlternativeFigures(name=s.name, how=how, acceptance_length=round(s.al(), 4), ci95=interval(s, rs),
                              per_position=[round(v, 4) for v in s.per_position()], drafts=sum(s.drafts),
                              accepted=sum(s.accepted), prompts=len(s.drafts), base_url=base_url)


def _group(idx: Sequence[int], drafter: Series, alternatives: Sequence[Series], dataset: str,
           tag: str | None = None) -> DatasetAcceptance:
    """The figures of the prompts ``idx``: the drafter's AL with its interval (resamples within them) and each
    alternative's AL on the same prompts."""
    rs = resamples(idx)
    ci = _percentiles([drafter.al(r) for r in rs]) if len(idx) > 1 else None
    return DatasetAcceptance(dataset=dataset, tag=tag, prompts=len(idx), acceptance_length=round(drafter.al(idx), 4),
                             ci95=ci, alternatives={a.name: round(a.al(idx), 4) for a in alternatives})


def dataset_figures(datasets: Sequence[str], drafter: Series, alternatives: Sequence[Series]) -> list[DatasetAcceptance]:
    """Per dataset (in first-seen order): the drafter's AL with its interval (resamples within the dataset) and
    each alternative's AL on the same prompts."""
    return [_group([i for i, d in enumerate(datasets) if d == name], drafter, alternatives, name)
            for name in dict.fromkeys(datasets)]


def tag_figures(datasets: Sequence[str], tags: Sequence[Sequence[str] | None], drafter: Series,
                alternatives: Sequence[Series]) -> list[DatasetAcceptance]:
    """Per (dataset, tag), for each dataset (in first-seen order) some of whose prompts carry tags, by tag: the
    figures of ``dataset_figures`` over the dataset's prompts carrying the tag (``records.tag_keys``)."""
    out = []
    for name in dict.fromkeys(datasets):
        idx = [i for i, d in enumerate(datasets) if d == name]
        if not any(tags[i] for i in idx):
            continue
        groups: dict[str, list[int]] = {}
        for i in idx:
            for t in tag_keys(list(tags[i] or [])):
                groups.setdefault(t, []).append(i)
        out += [_group(groups[t], drafter, alternatives, name, t) for t in sorted(groups)]
    return out


# -- from a pass to the report's figures -------------------------------------------------------------------


@dataclass
class Compared:
    """What ``compare`` adds to a report."""

    ci95: list[float] | None = None  # the served drafter's interval
    alternatives: list[AlternativeFigures] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    datasets: list[DatasetAcceptance] = field(default_factory=list)
    tags: list[DatasetAcceptance] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _series(name: str, rows: Sequence[PromptAcceptance]) -> Series:
    return Series(name, [r.accepted for r in rows], [r.drafts for r in rows], [list(r.accepted_per_pos) for r in rows])


def no_model_series(ids: Sequence[tuple[Sequence[int], Sequence[int]]], ended: Sequence[bool], k: int,
                    extra: Mapping[str, Callable[[], Propose]] | None = None) -> list[Series]:
    """copy-last and lookup (and each of ``extra``'s proposers: the draft LM) replayed on each prompt's (prompt
    ids, greedy continuation)."""
    out = []
    for name, make in {**NO_MODEL, **(extra or {})}.items():
        counts = []
        for (p_ids, cont), done in zip(ids, ended, strict=True):
            counts.append(replay(p_ids, cont, make(), k=k, ended=done, eos_ids=cont[-1:] if done else ()))
        out.append(Series(name, [float(c.accepted) for c in counts], [float(c.drafts) for c in counts],
                          [[float(v) for v in c.accepted_per_pos] for c in counts]))
    return out


def compare(rows: Sequence[PromptAcceptance], ids: Sequence[tuple[Sequence[int], Sequence[int]] | None], k: int | None,
            *, counted: bool, zero_rows: Sequence[PromptAcceptance] | None = None,
            zero_url: str | None = None, extra: Mapping[str, Callable[[], Propose]] | None = None) -> Compared:
    """The served drafter's interval, the alternatives (copy-last and lookup replayed on the continuations
    ``ids``, and ``extra``'s proposers: the draft LM; zero-aux from its own pass ``zero_rows``), the paired
    comparisons, per-dataset and per-(dataset, tag) figures.
    ``counted``: the rows hold per-prompt counters (else only the alternatives, with their intervals)."""
    out = Compared()
    rs = resamples(range(len(rows)))
    alts: list[tuple[Series, str, str | None]] = []
    known = [i for i in ids if i is not None]
    if k is None:
        out.notes.append("the drafter's k is unknown (its config names no speculative_tokens, the server no "
                         "per-position counters): no copy-last / lookup figures")
    elif len(known) < len(rows):
        out.notes.append(f"the server returned the token ids of {len(known)} of {len(rows)} requests: no copy-last "
                         "/ lookup figures (they are replayed on the target's greedy output ids)")
    elif rows:
        alts += [(s, "replay", None) for s in no_model_series(known, [r.ended for r in rows], k, extra)]
    if zero_rows is not None:
        alts.append((_series("zero-aux", zero_rows), "server", zero_url))
    out.alternatives = [alternative_figures(s, how, rs, base_url=u) for s, how, u in alts]
    if not counted:
        if rows:
            out.notes.append("per-prompt counters unknown (accept.one_at_a_time off): no interval for the drafter, "
                             "no paired comparison, no per-dataset figures")
        return out
    drafter = _series("drafter", rows)
    series = [s for s, _, _ in alts]
    out.ci95 = interval(drafter, rs)
    out.comparisons = comparisons(drafter, series, rs)
    out.datasets = dataset_figures([r.dataset for r in rows], drafter, series)
    out.tags = tag_figures([r.dataset for r in rows], [r.tags for r in rows], drafter, series)
    return out


def comparison_lines(alternatives: Sequence[AlternativeFigures], comps: Sequence[Comparison],
                     datasets: Sequence[DatasetAcceptance], tags: Sequence[DatasetAcceptance] = ()) -> list[str]:
    """The console lines of the alternatives, the comparisons and the per-dataset figures, each dataset's tags
    under it (the verdict after them: ``runview.chain.verdict``)."""
    lines = []
    if alternatives:
        parts = [f"{a.name} {a.acceptance_length:.3f}{_ci(a.ci95)}" for a in alternatives]
        lines.append("beside it, same prompts: " + "  ".join(parts)
                     + ("  (copy-last, lookup: no model, replayed on the target's greedy output)"
                        if any(a.how == "replay" for a in alternatives) else ""))
    if comps:
        lines.append("drafter minus: " + "  ".join(
            f"{'max(copy-last, lookup)' if c.versus == NO_MODEL_BEST else c.versus} {c.difference:+.3f}"
            f" [{c.ci95[0]:+.3f}, {c.ci95[1]:+.3f}]" for c in comps))
    for d in datasets:
        lines.append(_figure_line(f"dataset {d.dataset}", d))
        lines.extend(_figure_line(f"  {d.dataset} / {tag_label(t.tag)}", t) for t in tags if t.dataset == d.dataset)
    return lines


def _figure_line(label: str, d: DatasetAcceptance) -> str:
    alts = ", ".join(f"{n} {v:.3f}" for n, v in d.alternatives.items())
    return f"  {label}: {d.acceptance_length:.3f}{_ci(d.ci95)} over {d.prompts} prompts" + (f" ({alts})" if alts else "")


def _ci(ci: Sequence[float] | None) -> str:
    return f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
