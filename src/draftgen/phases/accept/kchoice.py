"""Which k to serve, from what ``draftgen accept`` measured: the served drafter's acceptance length at every
k' up to its own k, the expected speedup of serving it at k' at each concurrency, the k recommended, and the
concurrencies where it is expected to slow serving down.

Input: an ``AcceptReport`` as ``accept.run`` assembles it (the per-prompt counters ``per_prompt``, the pass's
``acceptance``, ``k``, and with ``--baseline-url`` the measured ``speedup``) and the ``accept`` config section.
Output: a ``records.KChoice`` (the report's ``k_choice``) and its console lines (``k_lines``). Pure
computation; no I/O.

Acceptance length at k'. vLLM counts, per position i of a draft, the drafts whose token i was accepted.
Verification stops at the first rejected token, so position i is accepted only when every position before
it is (the chain assumption), and a drafter proposing only its first k' tokens would have had the same ones
accepted. Per prompt p (its drafts D_p, its accepted tokens A_p):

    AL_p(k') = 1 + Σ_{i<k'} accepted_per_pos_p[i] / D_p

Pooled over the prompts, an AL is tokens over steps. A prompt's tokens T_p = D_p + A_p (what its steps
produced; greedy verification writes the same text at any k) take T_p / AL_p(k') steps at k', not D_p: a
prompt the drafter does well on takes fewer steps at the served k than at a smaller k', so pooling the
counts as measured would weigh it too little and bias AL(k') low (by 0.08 at k' = 1 on the CPU chain's
24-epoch drafter). Hence

    AL(k') = Σ_p T_p / Σ_p (T_p / AL_p(k'))                      (AL(k) is the measured AL)

Within a prompt the steps are taken to be alike (its acceptance does not vary along its text). The 95%
interval is ``figures``' percentile bootstrap over the prompts (the same seeded resamples, so a report's
intervals are reproducible, and the one at the served k is the drafter's own). Without per-prompt
per-position counts the pass's ``per_position`` gives ``1 + Σ_{i<k'} per_position[i]``, unweighted and
without intervals; without any (SGLang's ``meta_info``) only the served k is known.

Cost model, in target decode steps (one memory-bound forward of the target = 1). At concurrency c (sequences
in flight), a step of n tokens costs ``max(1, n / S)``: the weights are read once until the step's tokens
saturate the accelerator (S: ``accept.saturation_tokens``). A plain decode step holds c tokens; a speculative
step verifies k'+1 tokens per sequence and runs k' draft steps of ``d`` each (``accept.draft_step_cost``,
one small model's memory-bound step), and yields AL(k') tokens per sequence:

    t0(c)          = max(1, c / S)
    t(k', c)       = max(1, c (k'+1) / S) + k' d
    speedup(k', c) = AL(k') t0(c) / t(k', c)

Calibration: with a measured speedup m at the served k and the concurrency it was measured at, c_m (the
``--baseline-url`` pass), d is the one free parameter, fitted so that the model gives m there:
d = (AL(k) t0(c_m) / m − max(1, c_m (k+1) / S)) / k (0 when m is above what free draft steps give, said in a
note); the other k' and concurrencies use it.

Recommendation: at each concurrency of ``accept.concurrencies`` the k' of the largest expected speedup (the
smaller on a tie); the one recommended is that at ``accept.concurrency`` when it is listed, else at the
smallest listed. Each concurrency where the recommended k is expected below 1× gets a warning, naming the
better k there or saying to serve without the drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftgen.config.accept import AcceptConfig
from draftgen.phases.accept.figures import Series, interval, resamples
from draftgen.records import AcceptanceFigures, AcceptReport, KChoice, KFigures, PromptAcceptance

__all__ = ["CostModel", "acceptance_by_k", "calibrate", "k_choice", "k_lines"]


@dataclass(frozen=True)
class CostModel:
    """The roofline of the module docstring: step costs in target decode steps."""

    draft_step_cost: float
    saturation_tokens: int

    def step(self, tokens: float) -> float:
        """A target step over ``tokens`` tokens: 1 while memory-bound, then proportional to the tokens."""
        return max(1.0, tokens / self.saturation_tokens)

    def speculative(self, k: int, concurrency: int) -> float:
        """t(k, c): verify k+1 tokens per sequence, and k draft steps."""
        return self.step(concurrency * (k + 1)) + k * self.draft_step_cost

    def speedup(self, al: float, k: int, concurrency: int) -> float:
        """AL(k) t0(c) / t(k, c)."""
        return al * self.step(concurrency) / self.speculative(k, concurrency)


def calibrate(al: float, k: int, concurrency: int, measured: float, saturation_tokens: int) -> float:
    """The draft step cost at which the model's speedup at ``k`` and ``concurrency`` is ``measured``
    (negative when ``measured`` is above what free draft steps give)."""
    free = CostModel(0.0, saturation_tokens)
    return (al * free.step(concurrency) / measured - free.speculative(k, concurrency)) / k


def acceptance_by_k(rows: Sequence[PromptAcceptance], acceptance: AcceptanceFigures,
                    k: int | None) -> tuple[list[KFigures], list[str]]:
    """AL(k') for k' = 1.. the served k (or the positions counted), with intervals when every prompt that made
    drafts has its per-position counts; and the notes saying what is missing."""
    drafted = [r for r in rows if r.drafts > 0]
    if drafted and all(r.accepted_per_pos for r in drafted):
        positions = max(len(r.accepted_per_pos) for r in drafted)
        top = positions if k is None else min(k, positions)
        rs = resamples(range(len(rows)))
        out = []
        for j in range(1, top + 1):
            s = _served_at(rows, j)
            out.append(KFigures(k=j, acceptance_length=round(s.al(), 4), ci95=interval(s, rs)))
        return out, _short(positions, k)
    if acceptance.per_position:
        positions = len(acceptance.per_position)
        top = positions if k is None else min(k, positions)
        out = [KFigures(k=j, acceptance_length=round(1.0 + sum(acceptance.per_position[:j]), 4))
               for j in range(1, top + 1)]
        return out, ["per-prompt per-position counts unknown: the acceptance by k has no intervals",
                     *_short(positions, k)]
    if k is None:
        return [], []
    return [KFigures(k=k, acceptance_length=round(acceptance.acceptance_length, 4), ci95=acceptance.ci95)], [
        f"the server gave no per-position counts ({acceptance.source}): the acceptance below k={k} is unknown"]


def _served_at(rows: Sequence[PromptAcceptance], j: int) -> Series:
    """The prompts' counters as serving at k' = ``j`` would have made them (the module docstring): each
    prompt's tokens T_p in T_p / AL_p(j) steps, so that ``Series.al`` is Σ T_p / Σ steps."""
    steps: list[float] = []
    accepted: list[float] = []
    for r in rows:
        tokens = r.drafts + r.accepted
        n = tokens / (1.0 + sum(r.accepted_per_pos[:j]) / r.drafts) if r.drafts > 0 else 0.0
        steps.append(n)
        accepted.append(tokens - n)
    return Series(f"k={j}", accepted, steps)


def _short(positions: int, k: int | None) -> list[str]:
    if k is None or positions >= k:
        return []
    return [f"the server counted {positions} positions of the drafter's k={k}: figures up to k={positions}"]


def _model(by_k: Sequence[KFigures], served: int, cfg: AcceptConfig, measured: float | None,
           concurrency: int) -> tuple[CostModel, bool, list[str]]:
    """The cost model, whether it was calibrated (to the measured speedup, when there is one and the served
    k's AL is known), and the note saying which."""
    s = cfg.saturation_tokens
    at = next((f for f in by_k if f.k == served), None)
    if measured is None or measured <= 0 or at is None:
        return CostModel(cfg.draft_step_cost, s), False, [
            f"expected speedups from the cost model (docs/train.md), not measured: a target step of n tokens costs "
            f"max(1, n/{s}) decode steps, a draft step {cfg.draft_step_cost:g} of one (accept.saturation_tokens, "
            "accept.draft_step_cost); --baseline-url calibrates it"]
    d = calibrate(at.acceptance_length, served, concurrency, measured, s)
    line = (f"expected speedups from the cost model calibrated on the measured ×{measured:.3f} at k={served}, "
            f"concurrency {concurrency} (tokens/s with and without the drafter): draft_step_cost {max(d, 0.0):.4f} "
            f"fitted, saturation_tokens {s}")
    if d < 0:
        ceiling = CostModel(0.0, s).speedup(at.acceptance_length, served, concurrency)
        line += (f"; the measured speedup is above the model's ×{ceiling:.3f} with free draft steps, so "
                 "draft_step_cost is 0 and the other figures are likely underestimates (accept.saturation_tokens "
                 "may be too low for this accelerator)")
    return CostModel(round(max(d, 0.0), 4), s), True, [line]


def _warning(c: int, k: int, s: float, best_k: int, best: float) -> str:
    if best < 1.0:
        return (f"at concurrency {c} the drafter is expected to slow serving to {s:.2f}× at k={k} (at best "
                f"{best:.2f}× at k={best_k}): serve without it at that concurrency")
    return (f"at concurrency {c} the drafter is expected to slow serving to {s:.2f}× at k={k}: serve k={best_k} "
            f"there (×{best:.2f})")


def k_choice(rep: AcceptReport, cfg: AcceptConfig, *, measured_concurrency: int) -> KChoice | None:
    """The report's ``k_choice``: the figures by k, the speedups per ``accept.concurrencies`` (calibrated on
    ``rep.speedup``, measured at ``measured_concurrency`` sequences in flight, when there is one), the
    recommendation and the slow-down warnings; None when neither k nor per-position counts are known."""
    by_k, notes = acceptance_by_k(rep.per_prompt, rep.acceptance, rep.k)
    if not by_k:
        return None
    served = rep.k if rep.k is not None else by_k[-1].k
    concs = sorted(set(cfg.concurrencies))
    measured = rep.speedup if rep.baseline is not None else None
    model, calibrated, model_notes = _model(by_k, served, cfg, measured, measured_concurrency)
    for f in by_k:
        f.speedup = {c: round(model.speedup(f.acceptance_length, f.k, c), 3) for c in concs}
    best = {c: _best(by_k, c) for c in concs}
    at = cfg.concurrency if cfg.concurrency in concs else concs[0]
    k = best[at].k
    figures = next(f for f in by_k if f.k == k)
    slower = [c for c in concs if figures.speedup[c] < 1.0]
    warnings = [_warning(c, k, figures.speedup[c], best[c].k, best[c].speedup[c]) for c in slower]
    return KChoice(served_k=served, concurrencies=concs, by_k=by_k, draft_step_cost=model.draft_step_cost,
                   saturation_tokens=model.saturation_tokens, calibrated=calibrated,
                   measured_concurrency=measured_concurrency if calibrated else None,
                   measured_speedup=measured if calibrated else None, best_k={c: f.k for c, f in best.items()},
                   recommended_k=k, recommended_at=at, slower_at=slower, notes=notes + model_notes,
                   warnings=warnings)


def _best(by_k: Sequence[KFigures], concurrency: int) -> KFigures:
    """The figures of the largest expected speedup at ``concurrency`` (the smaller k on a tie)."""
    return max(by_k, key=lambda f: (f.speedup[concurrency], -f.k))


def k_lines(rep: AcceptReport) -> list[str]:
    """The console lines of ``rep.k_choice``: a table of k, AL [95% interval] and the expected speedup at each
    concurrency, the recommendation, the notes and the slow-down warnings (none without a ``k_choice``)."""
    kc = rep.k_choice
    if kc is None:
        return []
    lines = ["by k (acceptance length [95% interval]; expected speedup at each concurrency c):",
             f"  {'k':>4}  {'acceptance length':<24}" + "".join(f"{'c=' + str(c):>8}" for c in kc.concurrencies)]
    for f in kc.by_k:
        al = f"{f.acceptance_length:.3f}" + (f" [{f.ci95[0]:.3f}, {f.ci95[1]:.3f}]" if f.ci95 else "")
        mark = "*" if f.k == kc.recommended_k else " "
        lines.append(f"  {mark}{f.k:>3}  {al:<24}" + "".join(f"{f.speedup[c]:>7.2f}×" for c in kc.concurrencies))
    if kc.recommended_k is not None and kc.recommended_at is not None:
        rec = next(f for f in kc.by_k if f.k == kc.recommended_k)
        lines.append(f"recommended: k={kc.recommended_k} at concurrency {kc.recommended_at} "
                     f"(×{rec.speedup[kc.recommended_at]:.2f} expected; served k={kc.served_k})")
    lines.extend(f"note: {n}" for n in kc.notes)
    lines.extend(f"warning: {w}" for w in kc.warnings)
    return lines
