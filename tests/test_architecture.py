"""The architecture, enforced: no import cycle, no upward or sideways import between packages, no private
name imported across modules; and the tests mirror the tree (``tests/<package>/``).

An AST scan of ``src/draftgen`` (nothing is imported). What counts as an import: every ``import`` and
``from ... import`` statement, at module level or inside a function (a lazy import is still a dependency),
except those under ``if TYPE_CHECKING:`` (annotations only); and a ``"draftgen.mod:attr"`` string (a
lazy ``Registry`` entry, imported on first use). Importing a package's own ancestor (``draftgen.phases``
from ``draftgen.phases.extract.run``) is not an edge: Python has loaded it before the child anyway.

The layers, bottom first (``LAYERS``; docs/architecture.md shows the same table, and a test here keeps the
two equal). A module belongs to the longest entry that prefixes its dotted path below ``draftgen``, so a new
module inside a listed package needs no edit here. A package imports only from packages in LOWER layers;
two packages of one layer never import each other. Within a package anything goes, except a cycle.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "draftgen"
DOC = ROOT / "docs" / "architecture.md"

# Bottom first. Keep docs/architecture.md's "Layers" block equal (test_the_doc_shows_the_same_layers).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "fmt"),  # leaves: the standard library only
    ("secrets", "registry", "records"),  # records: typed rows, no I/O
    ("store", "config"),  # store: the only JSON codec; config: typed sections
    ("rundir", "provenance"),  # every path of a run directory, the lock, run.json; a record's provenance check
    ("tokens", "datasets", "hidden", "drafter"),
    ("backends", "exporters"),
    ("engine", "emulator", "runview"),  # the emulator never imports the engine; runview: a run read as numbers
    ("target",),  # the target model, reached and checked: capture backends, checks, layers, merged rows
    (  # the pipeline's phases, one package each: no door between two of them (PHASE_PACKAGES)
        "phases.prepare",
        "phases.generate",
        "phases.audit",
        "phases.merge",
        "phases.extract",
        "phases.train",
        "phases.accept",
        "phases.report",
    ),
    ("phases.plan", "phases.status", "phases.probe", "phases.importer", "extensions"),  # commands across phases
    ("phases",),  # the phase table and the pipeline (which runs plan's gate)
    ("cli",),
    ("docgen",),  # renders docs/cli.md from the cli: the only importer of cli
)

#: the pipeline's phase packages (their layer above): a module of one never imports another, lazily or by a
#: registry string (``test_no_phase_imports_another_phase``, independent of the layer table)
PHASE_PACKAGES = next(group for group in LAYERS if "phases.generate" in group)

# (importing module, imported module) pairs let through, each with the reason. Keep it empty.
ALLOWED: dict[tuple[str, str], str] = {}

# ``from x import _name`` across modules let through: (importing module, imported module, name) → why.
PRIVATE_ALLOWED: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    src: str  # importing module, dotted
    dst: str  # imported module, dotted
    where: str  # file:line of the import
    names: tuple[str, ...] = ()  # the names of a ``from`` import


def modules(root: Path) -> dict[str, Path]:
    """Dotted name → file; a package's ``__init__`` is the package's name."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            for stmt in n.body:
                skip.update(id(m) for m in ast.walk(stmt))
    return skip


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def edges(root: Path, base: Path | None = None) -> list[Edge]:
    """Every runtime import between two modules of the package at ``root`` (see the module docstring);
    files are named relative to ``base`` (default: the folder holding the package)."""
    mods = modules(root)
    base = root.parent if base is None else base
    out: list[Edge] = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_nodes(tree)
        is_pkg = path.name == "__init__.py"
        registry_string = re.compile(rf"({re.escape(root.name)}(?:\.\w+)+):\w+")
        for n in ast.walk(tree):
            if id(n) in skip:
                continue
            targets: list[tuple[str, tuple[str, ...]]] = []
            if isinstance(n, ast.Import):
                targets = [(a.name, ()) for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                frm = n.module or ""
                if n.level:
                    parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    parts = parts[: len(parts) - (n.level - 1)]
                    frm = ".".join([*parts, *([n.module] if n.module else [])])
                names = tuple(a.name for a in n.names)
                targets = [(frm, names)] + [(f"{frm}.{a}", ()) for a in names]
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                targets = [(m.group(1), ()) for m in [registry_string.fullmatch(n.value)] if m]
            for name, imported in targets:
                dst = _owner(name, mods)
                if dst is None or dst == mod or mod.startswith(dst + "."):
                    continue  # outside the package, itself, or its own ancestor
                out.append(Edge(mod, dst, f"{path.relative_to(base)}:{getattr(n, 'lineno', 0)}", imported))
    return out


def cycles(found: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in found:
        graph[e.src].add(e.dst)
        graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def layer_of(mod: str, pkg: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> tuple[str, int] | None:
    """The table entry a module belongs to (the longest prefix of its path below the package) and its layer."""
    rel = mod[len(pkg) + 1:] if mod.startswith(pkg + ".") else ""
    best: tuple[str, int] | None = None
    for i, group in enumerate(layers):
        for entry in group:
            if (rel == entry or rel.startswith(entry + ".")) and (best is None or len(entry) > len(best[0])):
                best = (entry, i)
    return best


def layer_violations(found: list[Edge], root: Path, layers: tuple[tuple[str, ...], ...] = LAYERS,
                     allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """One line per import that points up or sideways, or from a module the table does not place."""
    allowed = ALLOWED if allowed is None else allowed
    pkg = root.name
    bad: list[str] = []
    for e in found:
        if (e.src, e.dst) in allowed:
            continue
        a, b = layer_of(e.src, pkg, layers), layer_of(e.dst, pkg, layers)
        if a is None or b is None:
            who = e.src if a is None else e.dst
            bad.append(f"{e.where}: {e.src} → {e.dst}: {who} is in no layer; add its package to LAYERS "
                       "(tests/test_architecture.py and docs/architecture.md)")
        elif a[0] != b[0] and b[1] >= a[1]:
            how = "upward" if b[1] > a[1] else "sideways (one layer)"
            bad.append(f"{e.where}: {e.src} → {e.dst}: {how} import: {a[0]} (layer {a[1]}) may import only "
                       f"from layers below {a[1]}, and {b[0]} is layer {b[1]}")
    return sorted(set(bad))


def private_imports(found: list[Edge], allowed: dict[tuple[str, str, str], str] | None = None) -> list[str]:
    """``from draftgen.x import _name`` in another module: private names stay in their module."""
    allowed = PRIVATE_ALLOWED if allowed is None else allowed
    return sorted({f"{e.where}: {e.src} imports {n} from {e.dst}: a private name; make it public "
                   "(or move it where both can import it)"
                   for e in found for n in e.names
                   if n.startswith("_") and not n.startswith("__") and (e.src, e.dst, n) not in allowed})


def _cycle_report(found: list[Edge], comps: list[list[str]]) -> list[str]:
    lines = []
    for comp in comps:
        members = set(comp)
        inner = sorted({f"    {e.where}: {e.src} → {e.dst}" for e in found
                        if e.src in members and e.dst in members})
        lines.append("cycle: " + " ↔ ".join(comp) + "\n" + "\n".join(inner))
    return lines


# -- the rules, on draftgen

@pytest.fixture(scope="module")
def found() -> list[Edge]:
    return edges(SRC, ROOT)


def test_no_import_cycle(found: list[Edge]) -> None:
    comps = cycles(found)
    assert not comps, ("import cycles (lazy imports count; move what both need into a module below both):\n"
                       + "\n".join(_cycle_report(found, comps)))


def test_no_upward_or_sideways_import(found: list[Edge]) -> None:
    bad = layer_violations(found, SRC)
    assert not bad, "imports against the layers (docs/architecture.md, Layers):\n" + "\n".join(bad)


def test_no_private_name_imported_across_modules(found: list[Edge]) -> None:
    bad = private_imports(found)
    assert not bad, "\n".join(bad)


def test_every_module_has_a_layer() -> None:
    pkg = SRC.name
    loose = [m for m in modules(SRC) if m != pkg and layer_of(m, pkg) is None]
    assert not loose, f"modules in no layer (add their package to LAYERS and docs/architecture.md): {loose}"


def _phase_package(mod: str) -> str | None:
    """``phases.<name>`` of a module inside a package of ``phases/``, else None."""
    parts = mod.split(".")
    return ".".join(parts[1:3]) if len(parts) >= 3 and parts[1] == "phases" else None


def test_no_phase_imports_another_phase(found: list[Edge]) -> None:
    """A module of a phase package imports no other phase package (lazy imports and registry strings count):
    what two phases share lives a floor below (target, runview, hidden, fmt, ...)."""
    phases = {f"{SRC.name}.{p}" for p in PHASE_PACKAGES}
    bad = sorted({f"{e.where}: {e.src} → {e.dst}" for e in found
                  if (a := _phase_package(e.src)) and (b := _phase_package(e.dst)) and a != b
                  and f"{SRC.name}.{a}" in phases})
    assert not bad, "a phase imports another phase (move what both need a floor down):\n" + "\n".join(bad)


def test_every_package_of_phases_is_on_a_layer_and_no_module_is_loose() -> None:
    """``phases/`` holds the table (``__init__``), the pipeline and packages; each package has its own entry in
    LAYERS (a new phase is listed, not let through by its parent's entry)."""
    folder = SRC / "phases"
    loose = sorted(p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "pipeline.py"))
    assert not loose, f"loose modules in phases/ (fold each into its phase's package): {loose}"
    listed = {entry for group in LAYERS for entry in group}
    unlisted = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file()
                      and f"phases.{p.name}" not in listed)
    assert not unlisted, f"phase packages with no line of their own in LAYERS: {unlisted}"


def test_the_root_package_imports_nothing(found: list[Edge]) -> None:
    """``import draftgen`` stays free: the root ``__init__`` imports no module of its own."""
    assert [e.dst for e in found if e.src == SRC.name] == []


def test_allowances_are_still_needed(found: list[Edge]) -> None:
    present = {(e.src, e.dst) for e in found}
    names = {(e.src, e.dst, n) for e in found for n in e.names}
    stale = [k for k in ALLOWED if k not in present] + [k for k in PRIVATE_ALLOWED if k not in names]
    assert not stale, f"ALLOWED / PRIVATE_ALLOWED list imports that are gone; drop them: {stale}"


def test_the_doc_shows_the_same_layers() -> None:
    """docs/architecture.md's Layers block lists LAYERS top first, one line per layer: ``N  a, b, c``."""
    text = DOC.read_text()
    block = text.split("<!-- layers -->", 2)
    assert len(block) == 3, f"{DOC}: no <!-- layers --> ... <!-- layers --> block"
    doc = {}
    for line in block[1].splitlines():
        m = re.match(r"\s*(\d+)\s{2,}(\S.*?)\s*(?:#.*)?$", line)
        if m:
            doc[int(m.group(1))] = tuple(s.strip() for s in m.group(2).split(","))
    assert doc == dict(enumerate(LAYERS)), f"{DOC}: the Layers block differs from tests/test_architecture.py LAYERS"


# -- the scanner itself, on a small package: each rule fires, with the file and line

def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return pkg


CROSS_MODULE_TESTS = ("integration", "reliability")  # packages of their own: whole commands, hostile peers


def mirror_problems(tests: Path, src: Path) -> list[str]:
    """The tests mirror the tree: each folder of ``tests`` (bar the cross-module ones) names a package of
    ``src`` at the same path and has no ``__init__.py`` (``tests/datasets`` as a package would hide HF's
    ``datasets``); so pytest imports those test files by name, and no two may share one."""
    bad: list[str] = []
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests)
        if rel.parts[0] in CROSS_MODULE_TESTS:
            continue
        if rel.name in seen:
            bad.append(f"{tests.name}/{rel}: named as {tests.name}/{seen[rel.name]}; rename one "
                       "(pytest imports both by name)")
        seen.setdefault(rel.name, rel)
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(tests)
        if rel.parts[0] in CROSS_MODULE_TESTS or any(part.startswith((".", "__")) for part in rel.parts):
            continue
        if not (src / rel / "__init__.py").is_file():
            bad.append(f"{tests.name}/{rel}/: no package {src.name}/{rel}/; a folder of tests mirrors the "
                       "package it tests")
        if (folder / "__init__.py").exists():
            bad.append(f"{tests.name}/{rel}/__init__.py: remove it; a folder mirroring a package is not a "
                       "package")
    return bad


def test_the_tests_mirror_the_tree() -> None:
    assert mirror_problems(ROOT / "tests", SRC) == []


def test_the_mirror_check_finds_a_stray_folder_a_package_and_a_repeated_name(tmp_path: Path) -> None:
    pkg = _write(tmp_path, {"__init__.py": "", "engine/__init__.py": ""})
    suite = tmp_path / "suite"
    for rel in ("engine/test_a.py", "engine/__init__.py", "nowhere/test_b.py", "test_a.py",
                "integration/test_b.py"):
        (suite / rel).parent.mkdir(parents=True, exist_ok=True)
        (suite / rel).write_text("")
    assert mirror_problems(suite, pkg) == [
        "suite/test_a.py: named as suite/engine/test_a.py; rename one (pytest imports both by name)",
        "suite/engine/__init__.py: remove it; a folder mirroring a package is not a package",
        "suite/nowhere/: no package pkg/nowhere/; a folder of tests mirrors the package it tests"]


def test_the_scanner_finds_a_lazy_cycle_an_upward_import_and_a_private_name(tmp_path: Path) -> None:
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from pkg.high import g\n    return g\n",
        "high.py": "from pkg import low\nfrom pkg.low import _secret\n",
        "side.py": "import pkg.peer\n",
        "peer.py": "",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import g\n",
        "reg.py": "TABLE = {'x': 'pkg.high:g'}\n",
    })
    found = edges(pkg)
    assert cycles(found) == [["pkg.high", "pkg.low"]]
    assert not [e for e in found if e.src == "pkg.typed"]  # TYPE_CHECKING imports are annotations only
    assert [(e.dst, e.where) for e in found if e.src == "pkg.reg"] == [("pkg.high", "pkg/reg.py:1")]  # a registry string
    layers = (("low", "typed", "reg"), ("high",), ("side", "peer"))
    bad = layer_violations(found, pkg, layers, allowed={})
    assert any("low.py:2: pkg.low → pkg.high: upward import: low (layer 0)" in b for b in bad), bad
    assert any("side.py:1: pkg.side → pkg.peer: sideways (one layer)" in b for b in bad), bad
    assert any("reg.py:1: pkg.reg → pkg.high: upward" in b for b in bad), bad
    assert layer_violations(found, pkg, layers, allowed={("pkg.low", "pkg.high"): "test", ("pkg.side", "pkg.peer"): "t",
                                                        ("pkg.reg", "pkg.high"): "t"}) == []
    assert private_imports(found, allowed={}) == [
        "pkg/high.py:2: pkg.high imports _secret from pkg.low: a private name; make it public "
        "(or move it where both can import it)"]
