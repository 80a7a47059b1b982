"""The drafter chain's results read as numbers: the hidden set, the trained drafter and its acceptance, for
report.html's extract, train and accept sections and ``status``'s accept row.

Reads (each when it is there; nothing else):

    <hidden>/manifest.json          ``HiddenManifest``  what was extracted (the run's ``hidden/`` by default)
    train/train.json                ``TrainReport``     what ``draftgen train`` published
    accept/acceptance.json          ``AcceptReport``    the run's latest: its own drafter over the configured prompts
    accept/<drafter key>/<pass>.json ``AcceptReport``   every pass (drafter, server, prompt set), none overwritten
    accept/<key>/<pass>.prompts.jsonl ``PromptAcceptance`` the latest's prompts (``loop.acceptance_by_length``)
    merged/stats.json               ``MergeStats``      each dataset's supervised tokens (with merged/manifest.json)

``ChainView.by_length``: the latest's acceptance per dataset and prompt-length bucket beside each dataset's
share of the merged supervised tokens (``loop.acceptance_by_length``). ``verdict`` is the one sentence that
says whether a drafter beat the no-model drafters (copy-last, lookup) on its held-out prompts and by how much;
``accept`` prints it, tiny-chain ends with it, the report shows it.
``fidelity_lines``: the hidden set's provider fidelity (``HiddenFidelity``, the manifest's ``checks.fidelity``) as
the table extract prints and status shows (``read_fidelity``: the run's own set, or what online training
measured).
Writes nothing; imports no phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from draftgen.errors import InputError
from draftgen.records import (
    AcceptReport,
    AlternativeFigures,
    Comparison,
    HiddenFidelity,
    HiddenManifest,
    MergeStats,
    TrainReport,
)
from draftgen.rundir import HiddenLayout, RunDir
from draftgen.runview.loop import AcceptanceByLength, acceptance_by_length
from draftgen.store import read_json

__all__ = ["NO_MODEL", "NO_MODEL_NAMES", "AcceptPass", "ChainView", "accept_line", "accept_status", "beats", "fidelity_lines",
           "read_chain", "read_fidelity", "verdict"]

T = TypeVar("T")

#: the comparison against the better of the no-model drafters in each resample (``phases.accept.figures``)
NO_MODEL = "no-model"
#: the drafters with no model (``drafter.baselines.NO_MODEL``); the draft LM is replayed too, but it is a model
NO_MODEL_NAMES = ("copy-last", "lookup")


class AcceptPass(msgspec.Struct, kw_only=True):
    """One pass's file under ``accept/``, in short (the report's list of passes)."""

    path: str  # relative to the run directory
    drafter: str
    server: str
    prompts: int
    acceptance_length: float
    ci95: list[float] | None = None
    created_at: float = 0.0
    latest: bool = False  # the same figures as accept/acceptance.json


class ChainView(msgspec.Struct, kw_only=True):
    """What the run directory holds of the chain after merge (each None when not there), and the notes on
    files that did not read."""

    hidden: HiddenManifest | None = None
    hidden_path: str | None = None
    train: TrainReport | None = None
    accept: AcceptReport | None = None
    by_length: AcceptanceByLength | None = None  # the latest's acceptance per dataset and prompt length
    passes: list[AcceptPass] = msgspec.field(default_factory=list)
    drafters: int = 0  # distinct drafters measured (folders under accept/)
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.hidden is None and self.train is None and self.accept is None and not self.passes


def _read(path: Path, kind: type[T], notes: list[str]) -> T | None:
    if not path.is_file():
        return None
    try:
        return read_json(path, kind)
    except InputError as exc:  # one unreadable file costs its section, with a note, not the page
        notes.append(str(exc))
        return None


def read_chain(run_dir: Path, hidden: Path | None = None) -> ChainView:
    """The chain's files of ``run_dir`` (``hidden``: the hidden set's folder, default the run's ``hidden/``)."""
    rd = RunDir(run_dir)
    out = ChainView()
    folder = hidden if hidden is not None else rd.hidden
    out.hidden = _read(folder / HiddenLayout.manifest, HiddenManifest, out.notes)
    out.hidden_path = str(folder) if out.hidden is not None else None
    out.train = _read(rd.train_report, TrainReport, out.notes)
    out.accept = _read(rd.accept_json, AcceptReport, out.notes)
    if out.accept is not None:
        # stats.json counts once merge finished (its manifest, written last, is there), as in metrics
        merged = _read(rd.merged_stats, MergeStats, out.notes) if rd.merged_manifest.is_file() else None
        out.by_length = acceptance_by_length(run_dir, out.accept, merged)
    for path in rd.accept_reports():
        rep = _read(path, AcceptReport, out.notes)
        if rep is None:
            continue
        a = rep.acceptance
        out.passes.append(AcceptPass(path=str(path.relative_to(rd.root)), drafter=rep.drafter, server=rep.server,
                                     prompts=rep.prompts, acceptance_length=a.acceptance_length, ci95=a.ci95,
                                     created_at=rep.created_at, latest=rep == out.accept))
    out.passes.sort(key=lambda p: p.created_at)
    out.drafters = len({Path(p.path).parent for p in out.passes})
    return out


def _ci(ci: Sequence[float] | None, signed: bool = False) -> str:
    if not ci:
        return ""
    return f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if signed else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def _best_no_model(alternatives: Sequence[AlternativeFigures]) -> AlternativeFigures | None:
    replayed = [a for a in alternatives if a.how == "replay" and a.name in NO_MODEL_NAMES]
    return max(replayed, key=lambda a: a.acceptance_length) if replayed else None


def _no_model(rep: AcceptReport) -> Comparison | None:
    return next((x for x in rep.comparisons if x.versus == NO_MODEL), None)


def beats(rep: AcceptReport) -> bool | None:
    """The drafter beat the no-model drafters: the 95% interval of drafter − max(copy-last, lookup) is above 0
    (None: the report has no such comparison)."""
    c = _no_model(rep)
    return None if c is None else c.ci95[0] > 0


def verdict(rep: AcceptReport, who: str = "the drafter") -> str | None:
    """One plain sentence: did ``who`` beat the no-model drafters on the report's prompts (``beats``), and by
    how much; None when the report has no such comparison (per-prompt counters unknown, or no copy-last /
    lookup figures)."""
    c = _no_model(rep)
    best = _best_no_model(rep.alternatives)
    if c is None or best is None:
        return None
    lo, hi = c.ci95
    a = rep.acceptance
    figures = (f"acceptance length {a.acceptance_length:.3f}{_ci(a.ci95)} against {best.acceptance_length:.3f} "
               f"for {best.name}, the better no-model drafter, over {rep.prompts} held-out prompts")
    by = f"{c.difference:+.3f} (95% interval {lo:+.3f} to {hi:+.3f})"
    if lo > 0:
        return f"{who[0].upper()}{who[1:]} beats the no-model drafters by {by}: {figures}."
    if hi < 0:
        return f"{who[0].upper()}{who[1:]} does not beat the no-model drafters; it is behind by {by}: {figures}."
    return (f"{who[0].upper()}{who[1:]} does not beat the no-model drafters: the difference, {by}, may be 0: "
            f"{figures}.")


def accept_line(rep: AcceptReport) -> str:
    """The latest acceptance in one line (``status``'s accept row): AL with its interval, the prompts and the
    server, the difference to the better no-model drafter with its interval, and the k recommended with the
    concurrencies where it is expected to slow serving down (``k_choice``)."""
    a = rep.acceptance
    line = f"AL {a.acceptance_length:.3f}{_ci(a.ci95)} over {rep.prompts} prompts ({rep.server})"
    c = _no_model(rep)
    if c is not None:
        line += f", {c.difference:+.3f}{_ci(c.ci95, signed=True)} over max(copy-last, lookup)"
    kc = rep.k_choice
    if kc is not None and kc.recommended_k is not None:
        line += f", k={kc.recommended_k} recommended at concurrency {kc.recommended_at}"
        if kc.slower_at:
            line += f" (slower than without the drafter at concurrency {', '.join(map(str, kc.slower_at))})"
    return line


def accept_status(run_dir: Path) -> str | None:
    """``status``'s note on a done accept row: the latest (``accept_line``), and how many drafters and passes
    ``accept/`` holds when more than one."""
    view = read_chain(run_dir)
    parts = [accept_line(view.accept)] if view.accept is not None else []
    if len(view.passes) > 1:
        parts.append(f"{view.drafters} drafter{'s' if view.drafters > 1 else ''} measured "
                     f"({len(view.passes)} passes)")
    return "; ".join(parts) or None


def _cell(value: float, ci: Sequence[float] | None, signed: bool = False) -> str:
    return (f"{value:+.3f}" if signed else f"{value:.3f}") + _ci(ci, signed)


def fidelity_lines(fid: HiddenFidelity) -> list[str]:
    """The per-provider table (one line each, the best first) and a line per flagged provider."""
    lines = [f"provider fidelity (target's top-1 agreement and mean log p of the completion ids, 95% intervals over "
             f"samples; flagged: best − it above {fid.margin:g} in top-1):"]
    for p in fid.providers:
        gap = "best" if p.provider == fid.best else f"gap {_cell(p.top1_gap, p.top1_gap_ci95, signed=True)}"
        lines.append(f"  {p.provider}: {p.samples:,} samples of {p.rows:,} rows, {p.positions:,} positions; "
                     f"top-1 {_cell(p.top1, p.top1_ci95)}, log p {_cell(p.logprob_mean, p.logprob_ci95)}; {gap}"
                     + ("  FLAGGED" if p.flagged else ""))
    for p in fid.providers:
        if p.flagged:
            what = (f"its {len(p.excluded_sample_ids):,} rows are left out of training (fidelity_action: exclude)"
                    if p.excluded_sample_ids else "set hidden_states.fidelity_action: exclude to leave its rows out "
                    "of training")
            lines.append(f"warning: provider {p.provider} agrees with the target significantly less than "
                         f"{fid.best} (top-1 {p.top1:.3f} against {p.top1 + p.top1_gap:.3f}); {what}")
    return lines


def read_fidelity(run_dir: Path) -> HiddenFidelity | None:
    """The provider-fidelity figures of the run's hidden set (``hidden/manifest.json``), else those online
    training measured (``train/train.json``'s ``online.fidelity``); None without either."""
    notes: list[str] = []
    rd = RunDir(run_dir)
    m = _read(rd.hidden / HiddenLayout.manifest, HiddenManifest, notes)
    if m is not None and m.checks.fidelity is not None:
        return m.checks.fidelity
    t = _read(rd.train_report, TrainReport, notes)
    return t.online.fidelity if t is not None and t.online is not None else None

