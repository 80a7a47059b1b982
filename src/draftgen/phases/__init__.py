"""The phase table of ``draftgen run``: every phase with its inputs, fingerprint, output and outcome.

A ``Phase`` record says what ``pipeline.run_pipeline`` needs to know of one phase, and nothing about its
work:

- ``run``: an adapter ``(PhaseContext) -> PhaseOutcome`` that calls the phase's ``run_<phase>`` and turns
  its report into a ``PhaseOutcome`` (an exit code, a message, and what the loop does next);
- ``inputs``: the files whose size and mtime feed its fingerprint, ``digests``: those whose content does,
  ``config``: the config sections in it (``config_hash`` and the dataset names always are);
- ``output``: the path whose existence means "done"; with ``skippable``, a phase whose fingerprint is
  the one ``pipeline.json`` recorded and whose output exists is skipped (``up_to_date`` is printed, and
  ``when_current`` gives the outcome of the output already there);
- ``final``: the phase runs last, also when an outcome ended the loop early (``then="report"``);
- ``spends``: the phase may cost money; before the first such phase the pipeline shows the plan and,
  above ``plan.confirm_above_usd``, asks before going on (``pipeline``);
- ``enabled``: a predicate on the config; a phase it rejects is left out of the run entirely (``extract``
  runs only with ``hidden_states.extract: true``).

``PHASES`` is the default table: prepare → generate → audit → merge → [extract] → report. Adding a phase is its own
module plus one line, ``register_phase(Phase(...), after="merge")`` (a plugin, a test); a test may copy
the table (``PHASES.copy()``) and pass its copy to ``run_pipeline(phases=...)`` instead.

Layering: ``pipeline`` imports this module; the adapters import their phase module when they run, so
importing the table loads no phase (nor the emulator), and no phase module imports this one or pipeline.
Nothing here reads or writes a file, except what the adapters' phases do and ``when_current`` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from draftgen.config import RunConfig
from draftgen.errors import EXIT_FAILURES, EXIT_INTERRUPTED, EXIT_OK, DraftgenError, ThresholdBroken
from draftgen.rundir import RunDir

if TYPE_CHECKING:
    from draftgen.tokens import Profile

__all__ = [
    "PHASES",
    "Phase",
    "PhaseContext",
    "PhaseOutcome",
    "PhaseTable",
    "RunOptions",
    "dataset_logs",
    "register_phase",
    "unregister_phase",
]

Echo = Callable[[str], object]
Then = Literal["continue", "report", "stop"]


@dataclass(frozen=True)
class PhaseOutcome:
    """What one phase's run means for the pipeline.

    ``exit_code``: non-zero replaces the run's exit code and ``message`` (a later problem wins; zero
    leaves them). ``then``: ``continue`` with the next phase, ``report`` (skip to the final phases), or
    ``stop`` (end at once, no report: Ctrl-C). ``stale_after``: the outputs of the phases after this one
    no longer stand (their marks in ``pipeline.json`` are dropped, so they run again next time).
    ``path``: the file the user should open, named last (the report page).
    """

    exit_code: int = EXIT_OK
    message: str | None = None
    then: Then = "continue"
    stale_after: bool = False
    path: Path | None = None


@dataclass(frozen=True)
class RunOptions:
    """The ``draftgen run`` flags a phase may need (generate's selection, argv, --force)."""

    argv: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    partition: str = "all"
    base_url_flag: str | None = None
    force: bool = False


@dataclass(frozen=True)
class PhaseContext:
    """What a phase adapter gets: the config, the run directory (held by the pipeline's writer lock), the
    profile loaded once for the whole run, the run's flags and the echo."""

    cfg: RunConfig
    rd: RunDir
    profile: Profile
    options: RunOptions
    echo: Echo


def dataset_logs(cfg: RunConfig, rd: RunDir) -> list[Path]:
    """Each dataset's raw log and prepared prompts: the inputs of every phase that reads the responses."""
    return [p for d in cfg.datasets for p in (rd.raw(d.name), rd.prepared(d.name))]


def _no_paths(cfg: RunConfig, rd: RunDir) -> list[Path]:
    return []


@dataclass(frozen=True)
class Phase:
    """One row of the phase table (see the module docstring)."""

    name: str
    run: Callable[[PhaseContext], PhaseOutcome]
    inputs: Callable[[RunConfig, RunDir], Sequence[Path]] = _no_paths
    digests: Callable[[RunConfig, RunDir], Sequence[Path]] = _no_paths
    config: tuple[str, ...] = ()
    output: Callable[[RunDir], Path] | None = None
    skippable: bool = False
    up_to_date: str | None = None
    when_current: Callable[[PhaseContext], PhaseOutcome] | None = None
    final: bool = False
    spends: bool = False
    enabled: Callable[[RunConfig], bool] | None = None

    def __post_init__(self) -> None:
        if self.skippable and self.output is None:
            raise DraftgenError(f"phase {self.name!r}: a skippable phase needs an output (its 'done' marker)")


class PhaseTable:
    """The phases in run order. Final phases stay last: a phase registered without a place goes before
    the first final one."""

    def __init__(self, phases: Sequence[Phase] = ()) -> None:
        self._phases: list[Phase] = []
        for p in phases:  # in the order given
            self.register(p, after=self._phases[-1].name if self._phases else None)

    def __iter__(self) -> Iterator[Phase]:
        return iter(list(self._phases))

    def __len__(self) -> int:
        return len(self._phases)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self._phases]

    def copy(self) -> PhaseTable:
        return PhaseTable(self._phases)

    def after(self, name: str) -> list[Phase]:
        """The phases after ``name``, in order."""
        return self._phases[self.names.index(name) + 1:]

    def register(self, phase: Phase, *, after: str | None = None, before: str | None = None) -> Phase:
        """Add ``phase`` after ``after`` (or before ``before``; default: before the final phases). A name
        already taken, or a place that is not in the table, is a DraftgenError."""
        if phase.name in self.names:
            raise DraftgenError(f"phase {phase.name!r} is already registered; unregister it first")
        for where in (after, before):
            if where is not None and where not in self.names:
                raise DraftgenError(f"phase {where!r} is not registered (phases: {', '.join(self.names)})")
        if after is not None:
            at = self.names.index(after) + 1
        elif before is not None:
            at = self.names.index(before)
        else:
            at = next((i for i, p in enumerate(self._phases) if p.final), len(self._phases))
        self._phases.insert(at, phase)
        return phase

    def unregister(self, name: str) -> None:
        """Remove the phase ``name`` (nothing when it is not registered)."""
        self._phases = [p for p in self._phases if p.name != name]


# -- the default phases' adapters (each imports its phase module when it runs) ---------------------------


def _prepare(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.phases.prepare import run_prepare

    run_prepare(ctx.cfg, echo=ctx.echo, profile=ctx.profile)
    return PhaseOutcome()


def _generate(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.phases.generate import GenerateOptions, run_generate

    o = ctx.options
    gen = run_generate(ctx.cfg, GenerateOptions(datasets=list(o.datasets), partition=o.partition, argv=list(o.argv),
                                                base_url_flag=o.base_url_flag, force=o.force),
                       echo=ctx.echo, profile=ctx.profile)
    usable = sum(d.done_before + d.done for d in gen.datasets)
    if gen.exit_code == EXIT_INTERRUPTED:
        return PhaseOutcome(EXIT_INTERRUPTED, gen.message, then="stop")
    if gen.exit_code not in (EXIT_OK, EXIT_FAILURES) or not usable:
        message = gen.message or "generate produced no usable record"
        ctx.echo(f"generate {'stopped early' if gen.exit_code != EXIT_FAILURES else 'finished'} ({message})"
                 + ("" if usable else "; nothing usable to merge") + "; skipping audit and merge, writing the report")
        return PhaseOutcome(gen.exit_code or EXIT_FAILURES, message, then="report")
    # Some samples failing (exit 4) is no early stop: the phases after run over what is done.
    return PhaseOutcome(gen.exit_code, gen.message if gen.exit_code else None)


def _audit_verdict(ctx: PhaseContext, broken: list[str]) -> PhaseOutcome:
    if not broken:
        return PhaseOutcome()
    message = "audit thresholds broken: " + "; ".join(broken)
    ctx.echo(f"{message}; merge skipped (fix the data or relax the audit thresholds)")
    return PhaseOutcome(ThresholdBroken.exit_code, message, then="report", stale_after=True)


def _audit(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.phases.audit.run import run_audit

    try:
        audit = run_audit(ctx.cfg, echo=ctx.echo, force=ctx.options.force, profile=ctx.profile)
        broken = list(audit.thresholds_broken)
    except ThresholdBroken as exc:
        broken = [str(exc).splitlines()[0] if str(exc) else "audit threshold broken"]
    return _audit_verdict(ctx, broken)


def _audit_current(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.records import AuditReport
    from draftgen.store import read_json

    return _audit_verdict(ctx, read_json(ctx.rd.audit_json, AuditReport).thresholds_broken)


def _audit_inputs(cfg: RunConfig, rd: RunDir) -> list[Path]:
    ref = cfg.path(cfg.audit.reference) if cfg.audit.reference else rd.ground_truth
    return [*dataset_logs(cfg, rd), ref]


def _merge(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.phases.merge import run_merge

    run_merge(ctx.cfg, echo=ctx.echo, force=ctx.options.force, profile=ctx.profile)
    return PhaseOutcome()


def _extract(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.phases.extract.run import run_extract

    try:
        run_extract(ctx.cfg, rd=ctx.rd, echo=ctx.echo)
    except ThresholdBroken as exc:
        message = str(exc).splitlines()[0] if str(exc) else "extract checks failed"
        ctx.echo(message)
        return PhaseOutcome(ThresholdBroken.exit_code, message)
    return PhaseOutcome()


def _report(ctx: PhaseContext) -> PhaseOutcome:
    from draftgen.phases.report.html import run_report

    return PhaseOutcome(path=run_report(ctx.cfg, profile=ctx.profile))


def _audit_json(cfg: RunConfig, rd: RunDir) -> list[Path]:
    return [rd.audit_json]


PHASES = PhaseTable([
    Phase("prepare", _prepare),  # resumable on its own (prepare's stats.json fingerprints)
    Phase("generate", _generate, spends=True),  # resumes by sample_id
    Phase("audit", _audit, inputs=_audit_inputs, config=("audit",), output=lambda rd: rd.audit_json,
          skippable=True, up_to_date="audit: up to date (no new responses since the last audit)",
          when_current=_audit_current),
    Phase("merge", _merge, inputs=dataset_logs, digests=_audit_json, config=("merge", "datasets"),
          output=lambda rd: rd.merged_manifest, skippable=True, up_to_date="merge: up to date"),
    # resumes by sample_id on its own (hidden/ index parts); off unless hidden_states.extract
    Phase("extract", _extract, enabled=lambda cfg: cfg.hidden_states.extract),
    Phase("report", _report, final=True),
])


def register_phase(phase: Phase, *, after: str | None = None, before: str | None = None) -> Phase:
    """Add ``phase`` to the default table (``PhaseTable.register``); returns it."""
    return PHASES.register(phase, after=after, before=before)


def unregister_phase(name: str) -> None:
    """Remove ``name`` from the default table."""
    PHASES.unregister(name)
