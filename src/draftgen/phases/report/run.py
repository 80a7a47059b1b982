"""``draftgen report CONFIG``: the report phase, ``run_report``: the run's metrics → ``report.html``.

Reads the run directory through ``runview.metrics.compute_metrics`` (so the page shows exactly what ``status``
would), the chain's files through ``runview.chain.read_chain`` (the hidden set at ``hidden_states.output``
when that is a local path, else the run's ``hidden/``; train/train.json; accept/; merged/stats.json) and the
rounds of generation through ``runview.loop.round_rows``, loads the profile for the token views (the sample
viewer and the audit's mismatch chips; left out, with a note, when it does not load), has ``html.render_html``
build the page, and writes ``<run_dir>/report.html`` (or ``output``) atomically under the run directory's
writer lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftgen.config import RunConfig
from draftgen.hidden.stream import hidden_url
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.phases.report.html import SampleView, example_rows, render_html, sample_view
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.runview.chain import read_chain
from draftgen.runview.loop import round_rows
from draftgen.runview.metrics import compute_metrics
from draftgen.store import atomic_write_bytes

if TYPE_CHECKING:
    from draftgen.tokens import Profile

__all__ = ["ReportReport", "phase_run", "run_report"]


@dataclass(frozen=True)
class ReportReport:
    """What ``run_report`` wrote: the page's ``path``, and the ``notes`` the page shows (parts left out)."""

    path: Path
    notes: list[str] = field(default_factory=list)


def run_report(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
               output: Path | None = None) -> ReportReport:
    """Compute the run's metrics and write the page (under the run directory's writer lock); echoes and
    returns its path. ``profile``: the already loaded profile of ``cfg.model`` for the token views
    (default: loaded here when the page has token views; a profile that does not load leaves them out).
    ``force``: hold a run directory made with another target (``rundir.claim.writer``). ``output``: where to
    write the page (default ``<run_dir>/report.html``)."""
    with writer(cfg, "report", force=force) as rd:
        return _report(cfg, rd, output, echo, profile)


def _report(cfg: RunConfig, rd: RunDir, output: Path | None, echo: Echo, loaded: Profile | None) -> ReportReport:
    run_dir = cfg.run_path
    out = output if output is not None else rd.report_html
    m = compute_metrics(run_dir, [d.name for d in cfg.datasets])
    # The page marks the run reported when it lands where compute_metrics looks for it.
    if out.resolve() == rd.report_html.resolve():
        m.phases["reported"] = True
    settings = {
        "model": m.model or cfg.model.id,
        "profile": cfg.model.profile,
        "endpoint": m.endpoint or cfg.endpoint.kind,
        "run directory": str(run_dir),
        "config hash": m.config_hash or "–",
    }
    notes: list[str] = []
    sample: SampleView | None = None
    profile: Profile | None = None
    wants_tokens = m.phases.get("merged") or (m.audit is not None and (m.audit.overall.examples
                                                                        or any(a.examples for a in m.audit.datasets)))
    if wants_tokens and loaded is not None:
        profile = loaded
    elif wants_tokens:
        try:
            from draftgen.tokens import profile_from_config

            profile = profile_from_config(cfg)
        except Exception as exc:  # the page is still worth writing without the tokenizer
            notes.append(f"token views left out: the profile tokenizer did not load ({exc})")
    if profile is not None and m.phases.get("merged"):
        try:
            sample = sample_view(run_dir, m, profile)
        except Exception as exc:  # a sample viewer must never cost the report
            notes.append(f"sample viewer left out: {exc}")
    examples = example_rows(run_dir, m, profile)
    hidden = hidden_url(cfg)
    chain = read_chain(run_dir, Path(hidden) if "://" not in hidden else None)
    rounds = round_rows(run_dir, [d.name for d in m.datasets], m.merged,
                        first=[(d.name, d.prepared or 0, d.done) for d in m.datasets])
    page = render_html(m, title=f"draftgen report · {run_dir.name}", generated_at=time.time(), settings=settings,
                       sample=sample, examples=examples, notes=notes, chain=chain, rounds=rounds)
    atomic_write_bytes(out, page.encode("utf-8"))
    echo(f"report: {out}")
    return ReportReport(path=out, notes=notes)


def _quiet(line: str) -> None:
    """The report phase's echo in ``draftgen run``: the pipeline names the page itself, last."""


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``report`` row of ``phases.PHASES`` (final: it also runs after an early stop)."""
    rep = run_report(ctx.cfg, echo=_quiet, profile=ctx.profile, force=ctx.options.force)
    return PhaseOutcome(path=rep.path)
