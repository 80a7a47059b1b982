"""The run directory has one owner: no module but ``rundir/__init__.py`` spells a file or folder name of its layout.

An AST scan of every ``src/draftgen/**/*.py`` except ``rundir/__init__.py`` (``rundir.claim`` included). The guarded names come from
``rundir.LAYOUT_FILES`` and ``rundir.LAYOUT_DIRS`` (built from the constants ``RunDir`` joins), so a name
added to the layout is guarded at once. Flagged:

- a string equal to a layout file name (``"raw_responses.jsonl"``), anywhere;
- a layout folder name used as a path part: an operand of ``/``, an argument of ``Path(...)`` or
  ``.joinpath(...)``, or an element of a literal tuple a loop walks when the loop variable is joined
  with ``/`` (``for sub in ("raw", ...): root / sub``);
  elsewhere such words are ordinary (``"train"`` is a split, ``"audit"`` a command);
- a path-shaped string (a ``/`` and no blank) one of whose parts is a layout name (``"audit/audit.json"``,
  f-string pieces such as ``f"{root}/merged"``); prose that mentions a path is left alone.

Docstrings (a string expression that opens a module, class or function) may mention any name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from draftgen import rundir

LAYOUT = Path(rundir.__file__).resolve()  # rundir/__init__.py, the one module that spells them
SRC = LAYOUT.parent.parent
FILES = rundir.LAYOUT_FILES
DIRS = rundir.LAYOUT_DIRS
NAMES = rundir.LAYOUT_NAMES


def _docstrings(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _path_parts(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand as a path part (see the module docstring)."""
    out: set[int] = set()
    nodes = list(ast.walk(tree))  # one walk, reused below (a walk per node made the scan quadratic)

    def add(node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(id(node))

    div: set[int] = set()  # ids of the operands of every ``/``
    for node in nodes:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            add(node.left)
            add(node.right)
            div.update((id(node.left), id(node.right)))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("Path", "PurePath", "joinpath"):
                for a in node.args:
                    add(a)
    # A literal tuple a loop walks, whose loop variable is then joined as a path part.
    joined = {id(n) for n in nodes if isinstance(n, ast.Name) and id(n) in div}
    for node in nodes:
        loops: list[tuple[ast.expr, ast.expr, list[ast.AST]]] = []
        if isinstance(node, ast.For | ast.AsyncFor):
            loops.append((node.target, node.iter, list(node.body)))
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            scope: list[ast.AST] = [node]
            loops += [(g.target, g.iter, scope) for g in node.generators]
        for target, it, body in loops:
            if not (isinstance(target, ast.Name) and isinstance(it, ast.Tuple | ast.List)):
                continue
            if any(isinstance(n, ast.Name) and n.id == target.id and id(n) in joined for b in body for n in ast.walk(b)):
                for e in it.elts:
                    add(e)
    return out


def layout_literals(source: str, filename: str) -> Iterator[tuple[int, str]]:
    """(line, string) of every spelling of a layout name in ``source`` (see the module docstring)."""
    tree = ast.parse(source, filename)
    docs = _docstrings(tree)
    parts = _path_parts(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
            continue
        s = node.value
        path_shaped = "/" in s and not any(c.isspace() for c in s)
        if s in FILES or (s in DIRS and id(node) in parts) or (path_shaped and any(p in NAMES for p in s.split("/"))):
            yield node.lineno, s


def _scan() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == LAYOUT:
            continue
        rel = path.relative_to(SRC.parent)
        for line, s in layout_literals(path.read_text(encoding="utf-8"), str(path)):
            found.append(f"{rel}:{line}: {s!r}")
    return found


def test_no_layout_name_outside_rundir() -> None:
    found = _scan()
    assert not found, ("run-directory names spelled outside rundir/__init__.py (use a RunDir property instead):\n  "
                       + "\n  ".join(found))


def test_the_guard_catches_each_form() -> None:
    src = '''"""Docstrings may say raw/<dataset>/raw_responses.jsonl and "stats.json"."""
import pathlib
def f(root, name, split):
    """Or audit.json."""
    a = root / "raw" / name / "raw_responses.jsonl"
    b = root.joinpath("emulator")
    c = pathlib.Path("merged")
    d = [root / sub for sub in ("prepared", "raw")]
    e = f"{root}/audit/audit.json"
    ok = (split == "train", "audit", f"see {root} for raw_responses.jsonl files")
    for k in ("train", "merged"):
        print(k)
    return a, b, c, d, e, ok
'''
    got = sorted(s for _, s in layout_literals(src, "x.py"))
    assert got == sorted(["raw", "raw_responses.jsonl", "emulator", "merged", "prepared", "raw", "/audit/audit.json"])


def test_the_guarded_names_come_from_rundir() -> None:
    rd = rundir.RunDir(Path("/r"))
    spelled = [rd.marker, rd.lock, rd.pipeline, rd.report_html, rd.attempts, rd.health, rd.prepared("d"),
               rd.prepared_stats("d"), rd.raw("d"), rd.failures("d"), rd.replaced("d"), rd.audit_json, rd.dataset_card,
               rd.merged_manifest, rd.merged_stats, rd.ground_truth, rd.pilot, rd.hidden, rd.train, rd.exports,
               rd.train_inputs, rd.train_vocab, rd.train_checkpoints, rd.train_drafter, rd.train_eagle,
               rd.train_log, rd.train_speculators_log, rd.train_report, rd.accept_json, rd.hidden_exports,
               rd.batch_journal, rd.train_online, rd.train_online_report]
    spelled += [Path('/r/hidden') / rundir.HiddenLayout.states, Path('/r/hidden') / rundir.HiddenLayout.index,
                Path('/r/hidden') / rundir.HiddenLayout.marker]
    spelled += [rd.train_handover, rd.train_connector_claims]
    spelled += [rd.train_previous]
    spelled += [rd.settlements]
    spelled += [rd.progress]
    spelled += [rd.probe]
    spelled += [rd.rounds, rd.train_draft_lm]
    names = {part for p in spelled for part in p.relative_to("/r").parts} - {"d"}
    assert names == set(rundir.LAYOUT_NAMES)
    # A pilot is a run directory of its own.
    assert rundir.RunDir(rd.pilot).raw("d") == Path("/r/plan/pilot/raw/d/raw_responses.jsonl")
