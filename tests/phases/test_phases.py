"""The one phase signature and the phase table.

Every phase entry point, the table's and the commands' outside it, is ``run_<phase>(cfg, *, echo=print,
profile=None, force=False, ...) -> <Phase>Report``; ``Echo`` is defined once (``draftgen.phases``); the
table is a ``Registry`` of ``Phase`` records whose adapters are named lazily, so importing it (or the
pipeline) loads no phase module, and it keeps its order (``after=``/``before=``, final phases last).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import draftgen
from draftgen.errors import ConfigError
from draftgen.phases import PHASES, Phase, PhaseContext, PhaseOutcome, PhaseTable
from draftgen.registry import Registry

SRC = Path(draftgen.__file__).parent

#: The commands whose entry point is not a row of the table (status is no phase: it reads a run directory
#: that may have no config, so it takes a path; see ``phases.status.run.run_status``).
COMMANDS = {
    "plan": "draftgen.phases.plan.run:run_plan",
    "probe": "draftgen.phases.probe.run:run_probe",
    "import": "draftgen.phases.importer.run:run_import",
    "accept": "draftgen.phases.accept.run:run_accept",
    "train": "draftgen.phases.train.run:run_train",
    "report": "draftgen.phases.report.run:run_report",
}


def _module_of(phase: Phase) -> ModuleType:
    """The module of the phase's adapter (the built-ins: the module of its ``run_<phase>``)."""
    run = phase.run
    return importlib.import_module(run.partition(":")[0] if isinstance(run, str) else run.__module__)


def _entry(target: str) -> tuple[Callable[..., Any], ModuleType]:
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr), mod


def _check_signature(fn: Callable[..., Any], module: ModuleType) -> None:
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    name = fn.__name__
    assert params[0].name == "cfg" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:]), f"{name}: inputs after cfg are keyword-only"
    assert [p.name for p in params[1:4]] == ["echo", "profile", "force"], f"{name}: echo, profile, force come first"
    kw = sig.parameters
    assert kw["echo"].default is print and kw["profile"].default is None and kw["force"].default is False, name
    assert kw["echo"].annotation == "Echo" and kw["profile"].annotation == "Profile | None", name
    ret = sig.return_annotation
    assert isinstance(ret, str) and ret.endswith("Report"), f"{name} returns {ret!r}, not a *Report"
    cls = getattr(module, ret)  # the report type is importable from the phase's module
    assert isinstance(cls, type) and cls.__name__ == ret, name


def test_the_table_holds_the_default_phases_in_run_order() -> None:
    assert isinstance(PHASES, Registry)
    assert PHASES.names() == ["prepare", "generate", "audit", "merge", "extract", "train", "accept", "report"]
    assert [p.name for p in PHASES if p.final] == ["report"]
    assert all(isinstance(p.run, str) for p in PHASES)  # named, not imported: importing the table loads none
    assert all(PHASES.docs()[n] for n in PHASES.names())


@pytest.mark.parametrize("name", PHASES.names())
def test_every_phase_of_the_table_has_the_one_signature(name: str) -> None:
    phase = PHASES.get(name)
    module = _module_of(phase)
    adapter = phase.adapter()
    assert adapter.__module__ == module.__name__
    current = phase.current()
    assert current is None or current.__module__ == module.__name__
    _check_signature(getattr(module, f"run_{name}"), module)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_outside_the_table_has_the_one_signature(command: str) -> None:
    fn, module = _entry(COMMANDS[command])
    _check_signature(fn, module)


def test_echo_is_defined_once() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "Echo" for t in targets):
                found.append(path.relative_to(SRC).as_posix())
    assert found == ["phases/__init__.py"]


def test_importing_the_table_and_the_pipeline_loads_no_phase_module() -> None:
    code = ("import sys, draftgen.phases.pipeline; "
            "print(sorted(m for m in sys.modules if m.startswith('draftgen.phases.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['draftgen.phases.pipeline']"


def _toy(name: str, **kw: Any) -> Phase:
    def run(ctx: PhaseContext) -> PhaseOutcome:
        return PhaseOutcome()

    return Phase(name, run, **kw)


def test_the_order_of_a_table() -> None:
    table = PHASES.copy()
    table.add(_toy("first"), before="prepare")
    table.add(_toy("late"))  # no place: before the final phases
    table.register("also", _toy("also"))  # the Registry call places it the same way
    table.add(_toy("tail", final=True), after="report")
    assert table.names() == ["first", "prepare", "generate", "audit", "merge", "extract", "train", "accept",
                             "late", "also", "report", "tail"]
    assert [p.name for p in table.after("also")] == ["report", "tail"]
    table.register("merge", _toy("merge"), replace=True)  # in place
    assert table.names()[4] == "merge" and table.get("merge").run != PHASES.get("merge").run
    table.unregister("late")
    assert "late" not in table and len(table) == 11
    assert PHASES.names() == ["prepare", "generate", "audit", "merge", "extract", "train", "accept",
                              "report"]  # a copy


def test_a_lazy_adapter_resolves_to_its_function() -> None:
    phase = Phase("toy", "draftgen.phases.merge.run:phase_run")
    from draftgen.phases.merge.run import phase_run

    assert phase.adapter() is phase_run and phase.current() is None


def test_table_mistakes_are_config_errors_naming_the_phase() -> None:
    table = PhaseTable([_toy("a"), _toy("b", final=True)])
    with pytest.raises(ConfigError, match="'a' is already registered"):
        table.add(_toy("a"))
    with pytest.raises(ConfigError, match=r"'nowhere' is not registered \(phases: a, b\)"):
        table.add(_toy("c"), after="nowhere")
    with pytest.raises(ConfigError, match="'c' is not registered"):
        table.unregister("c")
    with pytest.raises(ConfigError, match="a Phase record named 'd'"):
        table.register("d", _toy("e"))
    with pytest.raises(ConfigError, match="a Phase record named 'd'"):
        table.register("d", "draftgen.phases.merge.run:phase_run")
    with pytest.raises(ConfigError, match="is no 'module:attr'"):
        Phase("x", "draftgen.phases.merge.run.phase_run")
    with pytest.raises(ConfigError, match="needs an output"):
        _toy("x", skippable=True)
    assert table.names() == ["a", "b"]
