"""The phase table of ``draftgen run``: every phase with its inputs, fingerprint, output and outcome.

A ``Phase`` record says what ``pipeline.run_pipeline`` needs to know of one phase, and nothing about its
work:

- ``run``: an adapter ``(PhaseContext) -> PhaseOutcome`` that calls the phase's ``run_<phase>`` and turns
  its report into a ``PhaseOutcome`` (an exit code, a message, and what the loop does next); a callable,
  or its lazy ``"module:attr"`` name (the built-ins: ``phase_run`` in the ``run`` module of the phase's
  package);
- ``inputs``: the files whose size and mtime feed its fingerprint, ``digests``: those whose content does,
  ``config``: the config sections in it (``config_hash`` and the dataset names always are);
- ``output``: the path whose existence means "done" (``draftgen status`` reads it); with ``skippable``,
  a phase whose fingerprint is the one ``pipeline.json`` recorded and whose output exists is skipped
  (``up_to_date`` is printed, and ``when_current``, a callable or ``"module:attr"`` too, gives the outcome
  of the output already there);
- ``refused``: why an output that exists is not done all the same (train: a ``train.json`` whose drafter
  was refused and not published), or None; such a phase is never skipped, and ``status`` shows it not done;
- ``final``: the phase runs last, also when an outcome ended the loop early (``then="report"``);
- ``spends``: the phase may cost money; before the first such phase the pipeline shows the plan and,
  above ``plan.confirm_above_usd``, asks before going on (``pipeline``);
- ``enabled``: a predicate on the config; a phase it rejects is left out of the run entirely (``extract``
  runs only with ``hidden_states.extract: true``, ``train`` with ``train.enabled``, ``accept`` with
  ``accept.enabled``);
- ``doc``: its one-line description (``PHASES.docs()``).

``PHASES`` is the default table, a ``registry.Registry`` of ``Phase`` records in run order: prepare →
generate → audit → merge → [extract] → [train] → [accept] → report (the bracketed ones only when
enabled). ``draftgen status`` lists the same rows, in the same order (``phases.status.run``). Adding a phase
is its own package plus one line, ``register_phase(Phase(...), after="merge")`` (a plugin, a test); a test
may copy the table (``PHASES.copy()``) and pass its copy to ``run_pipeline(phases=...)`` instead.

The one phase signature: every phase's entry point is ``run_<phase>(cfg, *, echo=print, profile=None,
force=False, ...) -> <Phase>Report``, its own inputs keyword-only after those (``tests/phases/test_phases.py``
checks it). ``Echo``, the type of ``echo``, is defined here, once.

Layering: this module imports no phase module (the adapters are named, not imported), so importing the
table loads no phase (nor the emulator); the phase modules import this one for ``Echo``, ``PhaseContext``
and ``PhaseOutcome``, and ``pipeline`` imports it for the table. Nothing here reads or writes a file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from draftgen.config import RunConfig
from draftgen.errors import EXIT_OK, ConfigError, InputError
from draftgen.registry import Registry
from draftgen.rundir import HiddenLayout, RunDir

if TYPE_CHECKING:
    from draftgen.tokens import Profile

__all__ = [
    "PHASES",
    "Echo",
    "Phase",
    "PhaseContext",
    "PhaseOutcome",
    "PhaseTable",
    "RunOptions",
    "dataset_logs",
    "register_phase",
    "unregister_phase",
]

#: Where a phase's progress lines go: ``print``, ``click.echo``, a test's ``list.append``.
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


Adapter = Callable[[PhaseContext], PhaseOutcome]


def _resolve(target: Adapter | str) -> Adapter:
    """An adapter, or the one its ``"module:attr"`` names (imported now; Python caches the module)."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    fn: Adapter = getattr(importlib.import_module(module), attr)
    return fn


@dataclass(frozen=True)
class Phase:
    """One row of the phase table (see the module docstring)."""

    name: str
    run: Adapter | str
    inputs: Callable[[RunConfig, RunDir], Sequence[Path]] = _no_paths
    digests: Callable[[RunConfig, RunDir], Sequence[Path]] = _no_paths
    config: tuple[str, ...] = ()
    output: Callable[[RunDir], Path] | None = None
    refused: Callable[[RunDir], str | None] | None = None
    skippable: bool = False
    up_to_date: str | None = None
    when_current: Adapter | str | None = None
    final: bool = False
    spends: bool = False
    enabled: Callable[[RunConfig], bool] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.skippable and self.output is None:
            raise ConfigError(f"phase {self.name!r}: a skippable phase needs an output (its 'done' marker)")
        for target in (self.run, self.when_current):
            if isinstance(target, str) and ":" not in target:
                raise ConfigError(f"phase {self.name!r}: adapter {target!r} is no 'module:attr'")

    def adapter(self) -> Adapter:
        """``run`` as a callable (a lazy name is imported now)."""
        return _resolve(self.run)

    def current(self) -> Adapter | None:
        """``when_current`` as a callable, or None."""
        return None if self.when_current is None else _resolve(self.when_current)


class PhaseTable(Registry[Phase]):
    """The phases in run order: a ``Registry`` of ``Phase`` records (never lazy ones: the order needs
    ``final``). Final phases stay last: a phase added without a place goes before the first final one."""

    def __init__(self, phases: Sequence[Phase] = ()) -> None:
        super().__init__("phases", "phase")
        for p in phases:  # in the order given
            self.add(p, after=self.names()[-1] if len(self) else None)

    def __iter__(self) -> Iterator[Phase]:
        return iter([self.get(n) for n in self.names()])

    def copy(self) -> PhaseTable:
        return PhaseTable(list(self))

    def after(self, name: str) -> list[Phase]:
        """The phases after ``name``, in order."""
        return list(self)[self.names().index(name) + 1:]

    def register(self, name: str, target: Phase | str, *, doc: str = "", replace: bool = False) -> None:
        """``Registry.register`` for a ``Phase`` named ``name``: placed as ``add`` places it, or, with
        ``replace``, where the one it replaces was."""
        if isinstance(target, str) or target.name != name:
            raise ConfigError(f"phases: register a Phase record named {name!r} (register_phase(Phase(...)))")
        if replace and name in self:
            at = self.names().index(name)
            super().unregister(name)
            self._insert(target, at, doc or target.doc)
            return
        self.add(target, doc=doc)

    def add(self, phase: Phase, *, after: str | None = None, before: str | None = None, doc: str = "") -> Phase:
        """Add ``phase`` after ``after`` (or before ``before``; default: before the final phases). A name
        already taken, or a place that is not in the table, is a ConfigError."""
        names = self.names()
        if phase.name in names:
            raise ConfigError(f"phases: phase {phase.name!r} is already registered; unregister it first")
        for where in (after, before):
            if where is not None and where not in names:
                raise ConfigError(f"phases: phase {where!r} is not registered (phases: {', '.join(names)})")
        if after is not None:
            at = names.index(after) + 1
        elif before is not None:
            at = names.index(before)
        else:
            at = next((i for i, p in enumerate(self) if p.final), len(names))
        self._insert(phase, at, doc or phase.doc)
        return phase

    def _insert(self, phase: Phase, at: int, doc: str) -> None:
        # The registry keeps registration order: take the tail off, add the phase, put the tail back.
        docs = self.docs()
        tail = [(n, self.get(n), docs[n]) for n in self.names()[at:]]
        for n, _, _ in tail:
            super().unregister(n)
        super().register(phase.name, phase, doc=doc)
        for n, p, d in tail:
            super().register(n, p, doc=d)


def _audit_inputs(cfg: RunConfig, rd: RunDir) -> list[Path]:
    ref = cfg.path(cfg.audit.reference) if cfg.audit.reference else rd.ground_truth
    return [*dataset_logs(cfg, rd), ref]


def _audit_json(cfg: RunConfig, rd: RunDir) -> list[Path]:
    return [rd.audit_json]


def _train_inputs(cfg: RunConfig, rd: RunDir) -> list[Path]:
    """The manifest of the hidden set train reads (``hidden.stream.hidden_url``: ``train.hidden``, else
    ``hidden_states.output``, else ``hidden/``), when it is a local one (an object store's is not looked at:
    output and config decide); online (``train.online``), the merged manifest (the rows it trains on)."""
    from draftgen.hidden.stream import hidden_url

    if cfg.train.online:
        return [rd.merged_manifest]
    url = hidden_url(cfg, cfg.train.hidden)
    return [] if "://" in url else [Path(url) / HiddenLayout.manifest]


def _train_refused(rd: RunDir) -> str | None:
    """Why train/train.json is no done train: its run's drafter was refused and not published."""
    from draftgen.records import TrainReport
    from draftgen.store import read_json

    path = rd.train_report
    if not path.is_file():
        return None
    try:
        report = read_json(path, TrainReport)
    except InputError:
        return "train.json unreadable"
    return None if report.exit_code == EXIT_OK else "drafter refused, not published"


def _accept_inputs(cfg: RunConfig, rd: RunDir) -> list[Path]:
    """The drafter's checkpoint files (``accept.drafter``, else ``train/drafter``) and the merged manifest
    (which prompts are held out)."""
    drafter = cfg.path(cfg.accept.drafter) if cfg.accept.drafter else rd.train_drafter
    return [drafter / "config.json", drafter / "model.safetensors", rd.merged_manifest]


# The built-in phases; each adapter is ``phase_run`` in ``phases.<phase>.run``, beside its ``run_<phase>``.
PHASES = PhaseTable([
    Phase("prepare", "draftgen.phases.prepare.run:phase_run",  # resumable on its own (stats.json fingerprints)
          doc="normalise the prompt datasets into prepared/"),
    Phase("generate", "draftgen.phases.generate.run:phase_run", spends=True,  # resumes by sample_id
          doc="send the prepared prompts; raw responses with exact token ids"),
    Phase("audit", "draftgen.phases.audit.run:phase_run", inputs=_audit_inputs, config=("audit",),
          output=lambda rd: rd.audit_json, skippable=True,
          up_to_date="audit: up to date (no new responses since the last audit)",
          when_current="draftgen.phases.audit.run:phase_current", doc="check the reconstructed ids"),
    Phase("merge", "draftgen.phases.merge.run:phase_run", inputs=dataset_logs, digests=_audit_json,
          config=("merge", "datasets"), output=lambda rd: rd.merged_manifest, skippable=True,
          up_to_date="merge: up to date", doc="filter, dedupe, split into merged/ plus exports"),
    # resumes by sample_id on its own (hidden/ index parts); off unless hidden_states.extract. Its output
    # (the manifest, written last) is status's "done" marker only: the phase is not skippable.
    Phase("extract", "draftgen.phases.extract.run:phase_run", enabled=lambda cfg: cfg.hidden_states.extract,
          output=lambda rd: rd.hidden / HiddenLayout.manifest,
          doc="capture the target's hidden states into hidden/"),
    # skipped while the hidden set, the train section and train/train.json (written last) stand; a rerun
    # after more extraction resumes from the last checkpoint. Off unless train.enabled.
    Phase("train", "draftgen.phases.train.run:phase_run", inputs=_train_inputs, config=("train",),
          output=lambda rd: rd.train_report, refused=_train_refused, skippable=True,
          enabled=lambda cfg: cfg.train.enabled,
          up_to_date="train: up to date (its inputs and the train section are those of train/train.json)",
          doc="train a drafter (train.algorithm) with speculators into train/, from hidden/ or online"),
    # skipped while the drafter's files, the merged set and the accept/endpoint sections stand (a newly
    # trained drafter is measured again). Off unless accept.enabled.
    Phase("accept", "draftgen.phases.accept.run:phase_run", inputs=_accept_inputs, config=("accept", "endpoint"),
          output=lambda rd: rd.accept_json, skippable=True, enabled=lambda cfg: cfg.accept.enabled,
          up_to_date="accept: up to date (the drafter and the held-out prompts are those measured)",
          doc="measure the served drafter's acceptance into accept/"),
    Phase("report", "draftgen.phases.report.run:phase_run", final=True, output=lambda rd: rd.report_html,
          doc="write report.html"),  # always written again; the output is status's "done" marker
])


def register_phase(phase: Phase, *, after: str | None = None, before: str | None = None) -> Phase:
    """Add ``phase`` to the default table (``PhaseTable.add``); returns it."""
    return PHASES.add(phase, after=after, before=before)


def unregister_phase(name: str) -> None:
    """Remove ``name`` from the default table (a name not registered is a ConfigError)."""
    PHASES.unregister(name)
