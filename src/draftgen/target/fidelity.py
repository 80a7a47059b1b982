"""Provider fidelity (``draftgen extract``, and ``train --online`` before it trains): which rows are measured, and
how well the target agrees with each provider's completions.

A provider stands in for the local target (a hosted INT4 copy, say); this measures whether its text is what the
target would write. Each measured sample's figures come from the worker (``target.checks.check_fidelity``: the
stored final state through the target's final norm and head at ``teacher_positions`` evenly spaced completion
positions, no second forward): the mean log p of the completion ids and the share of positions where the id the
provider emitted is the target's top-1 (``records.FidelityResult`` in the sample's index record). Here:

- ``choose(rows, providers, n)``: the rows measured besides the teacher-checked ones: of each provider's rows
  (``target.rows.read_merged_providers``; rows without one form the provider ``UNKNOWN``), the ``n``
  (``hidden_states.fidelity_samples``) with the smallest sha256(sample_id): the same rows on every run;
- ``summarize(held, providers, hs)`` -> ``records.HiddenFidelity`` (``summarize_results`` from each measured
  sample's ``FidelityResult``, the form ``train --online`` measures them in): per provider, over its measured samples, the
  mean log-prob and the top-1 agreement pooled over their positions (Σ value × positions / Σ positions), each
  with a 95% percentile bootstrap interval over the samples (``BOOT_REPS`` resamples with replacement, seeded
  by the provider's name); the best provider: the highest top-1 among those with at least ``MIN_SAMPLES``
  measured samples; each provider's gap, best − it, for both figures, its interval from the two providers'
  resamples (their samples are independent). **Flagged**: the provider and the best both have at least
  ``MIN_SAMPLES`` measured samples and the 2.5th percentile of the top-1 gap is above
  ``hidden_states.fidelity_margin``, i.e. its whole 95% interval lies above the margin. With
  ``hidden_states.fidelity_action: exclude`` a flagged provider's row ids (repeats included) are listed in
  ``ProviderFidelity.excluded_sample_ids``: ``hidden.stream.Source`` leaves them out of training;
The table extract prints (and status shows) is ``runview.chain.fidelity_lines``.

Pure computation (numpy on use); reads and writes nothing.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from draftgen.hidden.format import require
from draftgen.records import HiddenFidelity, ProviderFidelity

if TYPE_CHECKING:
    import numpy as np

    from draftgen.config.hidden import HiddenStatesConfig
    from draftgen.records import FidelityResult, HiddenIndexRecord
    from draftgen.target import ExtractRow

__all__ = ["BOOT_REPS", "MIN_SAMPLES", "UNKNOWN", "choose", "summarize", "summarize_results"]

BOOT_REPS = 2000
#: fewer measured samples than this: no interval is trusted enough to flag the provider (or to make it the best)
MIN_SAMPLES = 5
#: the provider of a merged row whose record named none
UNKNOWN = "(unknown)"
_CHUNK = 1 << 22  # resampled values held at once (BOOT_REPS x samples is drawn in slices of this size)


def _rank(sample_id: str) -> bytes:
    return hashlib.sha256(sample_id.encode()).digest()


def choose(rows: Iterable[ExtractRow], providers: Mapping[str, str], n: int) -> set[str]:
    """The sample ids of ``rows`` measured for fidelity (besides the teacher-checked ones): of each provider's
    rows, the ``n`` with the smallest sha256(sample_id)."""
    if n <= 0:
        return set()
    by: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by[providers.get(r.sample_id) or UNKNOWN].append(r.sample_id)
    return {sid for ids in by.values() for sid in sorted(ids, key=_rank)[:n]}


class _Measured:
    """One provider's measured samples: per-sample mean log-prob, top-1 share and positions."""

    def __init__(self) -> None:
        self.lp: list[float] = []
        self.top: list[float] = []
        self.n: list[int] = []

    def pooled(self) -> tuple[float, float]:
        total = sum(self.n)
        return (sum(a * w for a, w in zip(self.lp, self.n, strict=True)) / total,
                sum(a * w for a, w in zip(self.top, self.n, strict=True)) / total)

    def resampled(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``BOOT_REPS`` resamples of the samples (with replacement): their pooled log-prob and top-1."""
        np = require("numpy")
        lp, top, n = np.asarray(self.lp), np.asarray(self.top), np.asarray(self.n, dtype=np.float64)
        rng = np.random.default_rng(seed)
        k = len(n)
        out_lp, out_top = np.empty(BOOT_REPS), np.empty(BOOT_REPS)
        step = max(1, _CHUNK // k)
        for s in range(0, BOOT_REPS, step):
            idx = rng.integers(0, k, size=(min(step, BOOT_REPS - s), k))
            w = n[idx]
            total = w.sum(axis=1)
            out_lp[s:s + len(idx)] = (lp[idx] * w).sum(axis=1) / total
            out_top[s:s + len(idx)] = (top[idx] * w).sum(axis=1) / total
        return out_lp, out_top


def _ci(values: np.ndarray) -> list[float]:
    np = require("numpy")
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [round(float(lo), 4), round(float(hi), 4)]


def _measured(held: Mapping[str, HiddenIndexRecord]) -> dict[str, FidelityResult]:
    """The measured samples of the set's rows (a repeat shares its base's record and file: counted once)."""
    out: dict[str, FidelityResult] = {}
    seen: set[str] = set()
    for sid, rec in held.items():
        if rec.fidelity is not None and rec.file not in seen:
            seen.add(rec.file)
            out[sid] = rec.fidelity
    return out


def summarize(held: Mapping[str, HiddenIndexRecord], providers: Mapping[str, str],
              hs: HiddenStatesConfig) -> HiddenFidelity | None:
    """Each provider's figures and the flag (see the module docstring) over the set's rows ``held`` (row id ->
    its index record, repeats included); None when no sample was measured."""
    return summarize_results(_measured(held), held, providers, hs)


def summarize_results(results: Mapping[str, FidelityResult], row_ids: Iterable[str], providers: Mapping[str, str],
                      hs: HiddenStatesConfig) -> HiddenFidelity | None:
    """Each provider's figures and the flag (see the module docstring) from the measured samples ``results``
    (row id -> its figures) over all the rows ``row_ids`` (``providers``: row id -> provider; ``UNKNOWN`` where
    none); None when no sample was measured."""
    by: dict[str, list[str]] = defaultdict(list)
    for sid in row_ids:
        by[providers.get(sid) or UNKNOWN].append(sid)
    measured: dict[str, _Measured] = defaultdict(_Measured)
    for sid, f in results.items():
        if f.positions:
            m = measured[providers.get(sid) or UNKNOWN]
            m.lp.append(f.logprob_mean)
            m.top.append(f.top1)
            m.n.append(f.positions)
    if not measured:
        return None
    boot = {p: m.resampled(zlib.crc32(p.encode())) for p, m in measured.items() if len(m.n) > 1}
    figures = {p: m.pooled() for p, m in measured.items()}
    trusted = [p for p, m in measured.items() if len(m.n) >= MIN_SAMPLES] or list(measured)
    best = max(sorted(trusted), key=lambda p: figures[p][1])
    out: list[ProviderFidelity] = []
    for p, m in measured.items():
        lp, top = figures[p]
        pf = ProviderFidelity(provider=p, rows=len(by[p]), samples=len(m.n), positions=sum(m.n),
                              logprob_mean=round(lp, 4), top1=round(top, 4),
                              top1_gap=round(figures[best][1] - top, 4), logprob_gap=round(figures[best][0] - lp, 4))
        if p in boot:
            pf.logprob_ci95, pf.top1_ci95 = _ci(boot[p][0]), _ci(boot[p][1])
        if p != best and p in boot and best in boot:
            pf.top1_gap_ci95 = _ci(boot[best][1] - boot[p][1])
            pf.logprob_gap_ci95 = _ci(boot[best][0] - boot[p][0])
            pf.flagged = (len(m.n) >= MIN_SAMPLES and len(measured[best].n) >= MIN_SAMPLES
                          and pf.top1_gap_ci95[0] > hs.fidelity_margin)
        if pf.flagged and hs.fidelity_action == "exclude":
            pf.excluded_sample_ids = sorted(by[p])
        out.append(pf)
    out.sort(key=lambda pf: (-pf.top1, pf.provider))
    return HiddenFidelity(providers=out, best=best, margin=hs.fidelity_margin, action=hs.fidelity_action)
