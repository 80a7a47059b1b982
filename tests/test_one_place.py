"""One shape per idea, enforced where issue 32 put each idea in one place (an AST scan of ``src/draftgen``,
nothing imported but the scanner of tests/test_architecture.py):

- merged Parquet is read in one module (``exporters.parquet``: ``read_merged``); only the prompt sources
  (``datasets``) read other Parquet files;
- the merge manifest's ``layout`` rooting rule is read in one place (``rundir.RunDir.merged_listed``);
- speculators' inputs (the Arrow dataset, ``token_freq.pt``) have one writer (``hidden.speculators``);
- the train phase has one door (one ``def run_train``), and nothing under ``phases/train`` or
  ``phases/extract`` imports the emulator (the servers' harness is ``backends.serve``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_architecture import SRC, edges, modules


def _trees() -> dict[str, ast.AST]:
    return {mod: ast.parse(path.read_text(), str(path)) for mod, path in modules(SRC).items()}


def _where(mod: str, node: ast.AST) -> str:
    return f"{mod}:{getattr(node, 'lineno', 0)}"


def test_merged_parquet_is_read_in_one_module() -> None:
    found = []
    for mod, tree in _trees().items():
        for n in ast.walk(tree):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module or ""] if isinstance(n, ast.ImportFrom) else \
                [n.value] if isinstance(n, ast.Constant) and isinstance(n.value, str) else []
            if any(x == "pyarrow.parquet" for x in names) or (isinstance(n, ast.ImportFrom) and n.module == "pyarrow"
                                                              and any(a.name == "parquet" for a in n.names)):
                found.append(_where(mod, n))
    readers = {w.split(":")[0] for w in found}
    assert readers <= {"draftgen.exporters.parquet", "draftgen.datasets.sources"}, found


def test_the_merge_manifest_layout_rule_is_read_in_one_place() -> None:
    reads = [_where(mod, n) for mod, tree in _trees().items() for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr == "layout" and isinstance(n.ctx, ast.Load)]
    assert [w.split(":")[0] for w in reads] == ["draftgen.rundir"], reads


def test_speculators_inputs_have_one_writer() -> None:
    dataset_writes = [_where(mod, n) for mod, tree in _trees().items() for n in ast.walk(tree)
                      if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "save_to_disk"]
    freq_names = [_where(mod, n) for mod, tree in _trees().items() for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value == "token_freq.pt"]
    assert {w.split(":")[0] for w in dataset_writes + freq_names} == {"draftgen.hidden.speculators"}, \
        (dataset_writes, freq_names)


def test_the_train_phase_has_one_door_and_no_emulator_behind_it() -> None:
    doors = [_where(mod, n) for mod, tree in _trees().items() for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef) and n.name == "run_train"]
    assert [w.split(":")[0] for w in doors] == ["draftgen.phases.train.run"], doors
    into_emulator = [e.where for e in edges(SRC) if e.src.startswith(("draftgen.phases.train", "draftgen.phases.extract"))
                     and e.dst.startswith("draftgen.emulator")]
    assert into_emulator == []
    assert Path(SRC / "backends" / "serve.py").is_file()
