"""``draftgen run CONFIG``: the phases of ``phases.PHASES`` in order (prepare → generate → audit → merge →
report), resuming where it stopped.

The loop knows no phase by name: each is a row of the phase table (``phases.Phase``, a ``Registry`` of
them) whose adapter it calls with a ``PhaseContext``, and which says, through the ``PhaseOutcome`` the
adapter returns, whether the run goes on, skips to the final phases (the report), or
stops. Every phase is resumable on its own: ``prepare`` is a no-op when its fingerprint matches,
``generate`` skips samples already in the raw logs, and ``audit`` and ``merge`` rebuild their outputs
from the raw logs. So a rerun after a crash or Ctrl-C simply runs the phases again. To avoid redoing
finished work, ``pipeline.json`` in the run directory records, per skippable phase, a fingerprint of its
inputs (config hash, its config sections, the dataset names, the size and mtime of its input files and
the content of its digested ones): such a phase is skipped when its output exists and the fingerprint is
unchanged.

The whole run holds the run directory's writer lock (``rundir.claim.writer``); each phase re-enters it. The
target's profile is loaded once here and handed to every phase.

Outcomes (exit codes in ``errors``), as the default phases return them: generate stopping early (budget,
auth, interrupt) ends the pipeline after writing the report (Ctrl-C ends it at once); when the run holds
no usable record at all (every request failed), audit and merge are skipped too. Some samples failing is
not an early stop: audit and merge run over what is done, and the run exits 4 (finished with failures).
A broken audit threshold skips merge (the data failed a gate the user set), still writes the report, and
exits 3. The report's path is printed last.

The plan before spending: before the first phase that spends (``Phase.spends``: generate) runs, the
pipeline prints ``plan.estimate_plan``'s estimate of what remains (tokens, dollars, time; no pilot) and
decides (``spend_question``): a backend that costs nothing (self-hosted servers, the emulator) or an
estimate of unknown cost or at most ``plan.confirm_above_usd`` goes on; above it, ``yes`` goes on,
else the ``confirm`` callback (the CLI's prompt on a terminal) is asked. A no ends the run before
anything is sent: exit 1 (``EXIT_ERROR``), one line, no report. No callback (stdin is not a terminal)
and no ``yes``: a ConfigError (exit 2) saying to pass ``--yes``, again before anything is sent.
``dry_run`` stops after the plan with exit 0 (only prepare has written).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from draftgen.config import RunConfig, config_hash
from draftgen.errors import EXIT_ERROR, ConfigError
from draftgen.fmt import fmt_usd
from draftgen.phases import PHASES, Echo, Phase, PhaseContext, PhaseOutcome, PhaseTable, RunOptions
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.store import atomic_write_json, read_json

__all__ = ["Confirm", "PhaseMark", "PipelineReport", "PipelineState", "fingerprint", "run_pipeline",
           "spend_question", "spends_money"]

#: Asks the user a yes/no question (the CLI's prompt); True: go on.
Confirm = Callable[[str], bool]


class PhaseMark(msgspec.Struct, kw_only=True):
    fingerprint: str
    finished_at: float


class PipelineState(msgspec.Struct, kw_only=True):
    """pipeline.json: the inputs each finished phase saw."""

    phases: dict[str, PhaseMark] = msgspec.field(default_factory=dict)


class PipelineReport(msgspec.Struct, kw_only=True):
    exit_code: int = 0
    report_path: str | None = None
    phases_run: list[str] = msgspec.field(default_factory=list)
    phases_skipped: list[str] = msgspec.field(default_factory=list)
    message: str | None = None


def fingerprint(phase: Phase, cfg: RunConfig, rd: RunDir) -> str:
    """What ``phase`` would see now: the config hash, its config sections, the dataset names, the size and
    mtime of its inputs and the content of its digests (a missing file counts as missing)."""
    h = hashlib.sha256()
    h.update(config_hash(cfg).encode())
    for section in phase.config:
        h.update(msgspec.json.encode(getattr(cfg, section)))
    h.update(msgspec.json.encode([d.name for d in cfg.datasets]))
    for path in phase.inputs(cfg, rd):
        try:
            st = path.stat()
            h.update(f"{_label(path, rd)}:{st.st_size}:{st.st_mtime_ns}".encode())
        except FileNotFoundError:
            h.update(f"{_label(path, rd)}:-".encode())
    for path in phase.digests(cfg, rd):
        h.update(f"{_label(path, rd)}:".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b"-")
    return h.hexdigest()[:24]


def _label(path: Path, rd: RunDir) -> str:
    return str(path.relative_to(rd.root)) if path.is_relative_to(rd.root) else str(path)


class _State:
    def __init__(self, rd: RunDir) -> None:
        self.path = rd.pipeline
        self.state = read_json(self.path, PipelineState) if self.path.is_file() else PipelineState()

    def current(self, phase: str, fingerprint: str, output: Path) -> bool:
        mark = self.state.phases.get(phase)
        return mark is not None and mark.fingerprint == fingerprint and output.exists()

    def mark(self, phase: str, fingerprint: str) -> None:
        self.state.phases[phase] = PhaseMark(fingerprint=fingerprint, finished_at=round(time.time(), 3))
        atomic_write_json(self.path, self.state)

    def forget(self, phase: str) -> None:
        if self.state.phases.pop(phase, None) is not None:
            atomic_write_json(self.path, self.state)


def _banner(echo: Echo, phase: str) -> None:
    echo(f"── {phase} " + "─" * max(0, 60 - len(phase)))


def run_pipeline(
    cfg: RunConfig,
    *,
    argv: list[str],
    datasets: list[str] | None = None,
    partition: str = "all",
    base_url_flag: str | None = None,
    force: bool = False,
    echo: Echo = print,
    phases: PhaseTable | None = None,
    yes: bool = False,
    dry_run: bool = False,
    confirm: Confirm | None = None,
) -> PipelineReport:
    """Run every phase in order (see the module docstring); returns the exit code and the report's path.
    ``phases``: the table to run (default: ``phases.PHASES``). ``yes``: spend without asking;
    ``dry_run``: stop after the plan; ``confirm``: how to ask (None: there is no one to ask)."""
    from draftgen.tokens import profile_from_config

    options = RunOptions(argv=list(argv), datasets=list(datasets or []), partition=partition,
                         base_url_flag=base_url_flag, force=force)
    with writer(cfg, "run", argv=argv, force=force) as rd:
        ctx = PhaseContext(cfg=cfg, rd=rd, profile=profile_from_config(cfg), options=options, echo=echo)
        return _run(ctx, phases if phases is not None else PHASES, _Gate(yes=yes, dry_run=dry_run, confirm=confirm))


def spends_money(cfg: RunConfig) -> bool:
    """Whether requests to ``cfg``'s backend cost real money: not a self-hosted server's, not an
    emulator's (``play_money``: it charges only its play credits)."""
    from draftgen.backends import capabilities

    caps = capabilities(cfg.endpoint.kind)
    return not (caps.self_hosted or caps.play_money)


def spend_question(cfg: RunConfig, expected_usd: float | None) -> str | None:
    """The question to ask before spending ``expected_usd``, or None when there is nothing to ask: a
    backend that costs nothing, a cost not known, or one at most ``plan.confirm_above_usd``."""
    limit = cfg.plan.confirm_above_usd
    if not spends_money(cfg) or expected_usd is None or expected_usd <= limit:
        return None
    return (f"The plan expects about {fmt_usd(expected_usd)} of spend, over plan.confirm_above_usd "
            f"({fmt_usd(limit)}). Generate?")


@dataclass(frozen=True)
class _Gate:
    """``run``'s flags for the plan before spending (see the module docstring)."""

    yes: bool = False
    dry_run: bool = False
    confirm: Confirm | None = None


def _plan_gate(ctx: PhaseContext, gate: _Gate) -> PhaseOutcome | None:
    """Show the plan, then None (go on) or the outcome that ends the run before anything is spent."""
    from draftgen.phases.plan.run import estimate_plan

    cfg, echo = ctx.cfg, ctx.echo
    _banner(echo, "plan")
    rep = estimate_plan(cfg, echo=echo, profile=ctx.profile, datasets=ctx.options.datasets or None)
    if gate.dry_run:
        echo("dry run: stopped after the plan; nothing was sent")
        return PhaseOutcome(then="stop")
    question = spend_question(cfg, rep.expected_cost_usd)
    if question is None or gate.yes:
        return None
    if gate.confirm is None:
        raise ConfigError(f"the plan expects about {fmt_usd(rep.expected_cost_usd)}, over "
                          f"plan.confirm_above_usd ({fmt_usd(cfg.plan.confirm_above_usd)}), and stdin is not a "
                          "terminal to ask on; pass --yes to run anyway (or raise plan.confirm_above_usd)")
    if gate.confirm(question):
        return None
    message = "not confirmed; nothing was sent (pass --yes to skip the question)"
    echo(message)
    return PhaseOutcome(EXIT_ERROR, message, then="stop")


def _run(ctx: PhaseContext, table: PhaseTable, gate: _Gate | None = None) -> PipelineReport:
    cfg, rd, echo = ctx.cfg, ctx.rd, ctx.echo
    gate = gate if gate is not None else _Gate()
    state = _State(rd)
    rep = PipelineReport()
    ending = False  # an outcome said "report": only the final phases are left
    planned = False  # the plan is shown once, before the first phase that spends
    for phase in table:
        if phase.enabled is not None and not phase.enabled(cfg):
            continue
        if ending and not phase.final:
            continue
        if phase.spends and not planned:
            planned = True
            stop = _plan_gate(ctx, gate)
            if stop is not None:
                rep.exit_code, rep.message = stop.exit_code, stop.message
                return rep
        _banner(echo, phase.name)
        fp = fingerprint(phase, cfg, rd) if phase.skippable else None
        if fp is not None and phase.output is not None and state.current(phase.name, fp, phase.output(rd)) \
                and (phase.refused is None or phase.refused(rd) is None):
            echo(phase.up_to_date or f"{phase.name}: up to date")
            rep.phases_skipped.append(phase.name)
            current = phase.current()
            outcome = current(ctx) if current is not None else PhaseOutcome()
        else:
            outcome = phase.adapter()(ctx)
            if fp is not None:
                state.mark(phase.name, fp)
            rep.phases_run.append(phase.name)
        if outcome.exit_code:
            rep.exit_code, rep.message = outcome.exit_code, outcome.message
        if outcome.path is not None:
            rep.report_path = str(outcome.path)
        if outcome.stale_after:
            for later in table.after(phase.name):
                state.forget(later.name)
        if outcome.then == "stop":
            return rep
        ending = ending or outcome.then == "report"
    if rep.message:
        echo(f"finished with problems: {rep.message}")
    if rep.report_path is not None:
        echo(f"report: {rep.report_path}")
    return rep
