"""draftgen owns its hidden sets and export folders, and only them: a destination is draftgen's once it holds
its marker; nothing is deleted or overwritten that draftgen did not write (issue 21, items 2, 3 and 19).

Each case hashes every file before and after each command and requires the bytes of every file draftgen did
not write to be unchanged. Before this change ``export-hidden --out`` into a user's folder deleted its
``hidden_states/hs_*.safetensors`` and overwrote ``export.json``, ``token_freq.pt``, ``<id>.pt`` and
``rows_0-2000/data_0.ckpt`` (exit 0); ``extract --output`` deleted every ``.*.tmp`` under ``states/`` and
``index/`` before it refused the folder; and a death inside an export write left a ``.tmp`` no rerun removed.

A real hidden set: the tiny seeded Qwen3 target of ``_extract_helpers`` over random ids
(``_hidden_export_helpers.make_hidden_set``); the extract cases run a small merged emulator run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from _extract_helpers import build_tiny_model, make_merged_run, with_hidden
from _hidden_export_helpers import make_hidden_set
from draftgen.cli import cli
from draftgen.errors import RunDirError
from draftgen.hidden.exports import (
    EXPORT_JOURNAL,
    EXPORT_MARKER,
    EXPORT_REPORT,
    SAMPLE_IDS,
    export_hidden,
    modelopt_name,
)
from draftgen.hidden.format import HiddenStore, is_temp, temp_name
from draftgen.records import HiddenExportReport, HiddenOwnerMarker
from draftgen.rundir import HiddenLayout
from draftgen.store import read_json

FOREIGN = b"not draftgen's: keep me byte for byte\n"
FIX = "new or empty folder"


def tree(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (dot files included), by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def plant(root: Path, rels: list[str]) -> dict[str, str]:
    """Foreign files (distinct bytes each) under ``root``; returns their hashes."""
    for rel in rels:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(FOREIGN + rel.encode())
    return {rel: hashlib.sha256(FOREIGN + rel.encode()).hexdigest() for rel in rels}


def assert_kept(root: Path, foreign: dict[str, str]) -> None:
    now = tree(root)
    for rel, digest in foreign.items():
        assert now.get(rel) == digest, f"{rel}: a file draftgen did not write was changed or removed"


def marker(path: Path) -> HiddenOwnerMarker:
    return read_json(path, HiddenOwnerMarker)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The target folder, a 5-sample set A, a 3-sample set B (the first 3 sample ids of A) and a config
    naming the target and set A."""
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("own")
    model = build_tiny_model(root / "target", layers=8, hidden=32)
    a, rows_a = make_hidden_set(model, root / "set-a", n=5, dtype="fp32")
    b, _ = make_hidden_set(model, root / "set-b", n=3, dtype="fp32", seed=1)
    cfg = write_config(root, config_dict(root, hidden_states={"model": str(model), "output": str(a)}))
    return {"model": model, "a": a, "b": b, "cfg": cfg, "ids": [r[0] for r in rows_a]}


def cli_export(cfg: Path, kind: str, out: Path) -> Any:
    return CliRunner().invoke(cli, ["export-hidden", str(cfg), "--format", kind, "--out", str(out)])


def one_line_refusal(output: str, folder: Path) -> None:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(folder) in lines[0] and FIX in lines[0] and "Traceback" not in output, output


# -- item 2: export-hidden into a folder draftgen did not make ---------------------------------------------


def test_item02_export_into_foreign_folder_refused(sets: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "mine"
    rel_pt = f"{modelopt_name(sets['ids'][0])}.pt"
    foreign = plant(out, ["hidden_states/hs_0.safetensors", "hidden_states/hs_99.safetensors", EXPORT_REPORT,
                          SAMPLE_IDS, "data-00000-of-00001.arrow", "state.json", "dataset_info.json",
                          "token_freq.pt", rel_pt, "rows_0-2000/data_0.ckpt", "notes.txt",
                          "hidden_states/" + temp_name("hs_1.safetensors"), temp_name("export.json")])
    before = tree(out)
    for kind in ("speculators", "specforge", "modelopt"):
        res = cli_export(sets["cfg"], kind, out)
        assert res.exit_code == 1, res.output
        one_line_refusal(res.output, out)
        assert tree(out) == before  # nothing deleted, nothing written (no marker either)
    assert_kept(out, foreign)
    assert not (out / EXPORT_MARKER).exists()


def test_export_into_a_new_or_empty_folder_writes_the_marker(sets: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    died = tmp_path / "died" / temp_name(EXPORT_MARKER)  # a death while the marker itself was written
    died.parent.mkdir()
    died.write_bytes(b"{")
    for out in (tmp_path / "new" / "deeper", tmp_path / "empty", died.parent):
        res = cli_export(sets["cfg"], "speculators", out)
        assert res.exit_code == 0, res.output
        m = marker(out / EXPORT_MARKER)
        assert m.kind == "hidden-export" and not m.adopted and m.draftgen_version and m.created_at > 0
        rep = read_json(out / EXPORT_REPORT, HiddenExportReport)
        assert set(tree(out)) == set(rep.files) | {EXPORT_MARKER}  # the listing is complete and exact
        assert not (out / EXPORT_JOURNAL).exists()


def test_foreign_file_in_owned_export_folder_survives(sets: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "sp"
    export_hidden(str(sets["a"]), ["speculators"], out)
    foreign = plant(out, ["notes.txt", "hidden_states/hs_99.safetensors", "sub/hs_0.safetensors",
                          "hidden_states/.keep.tmp"])
    ours = read_json(out / EXPORT_REPORT, HiddenExportReport).files
    # include_flagged changes the export's identity: a real re-export, not "up to date"
    rep = export_hidden(str(sets["a"]), ["speculators"], out, include_flagged=True)[0]
    assert rep.include_flagged and sorted(rep.files) == sorted(ours)
    assert_kept(out, foreign)
    assert set(tree(out)) == set(rep.files) | {EXPORT_MARKER} | set(foreign)


def test_reexport_removes_only_the_previous_listing(sets: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "mo"
    first = export_hidden(str(sets["a"]), ["modelopt"], out, target_dir=sets["model"])[0]
    foreign = plant(out, ["mine.pt", "deep/er/file.bin"])
    second = export_hidden(str(sets["b"]), ["modelopt"], out, target_dir=sets["model"])[0]
    assert first.samples == 5 and second.samples == 3
    gone = set(first.files) - set(second.files)
    assert {f"{modelopt_name(s)}.pt" for s in sets["ids"][3:]} <= gone
    assert not any((out / rel).exists() for rel in gone)
    assert_kept(out, foreign)
    assert set(tree(out)) == set(second.files) | {EXPORT_MARKER} | set(foreign)


def test_owned_folder_never_overwrites_a_file_it_did_not_write(sets: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "mo"
    export_hidden(str(sets["b"]), ["modelopt"], out, target_dir=sets["model"])
    clash = f"{modelopt_name(sets['ids'][4])}.pt"  # a name the 5-sample export writes, not the 3-sample one
    foreign = plant(out, [clash])
    with pytest.raises(RunDirError, match="did not write"):
        export_hidden(str(sets["a"]), ["modelopt"], out, target_dir=sets["model"])
    assert_kept(out, foreign)
    (out / clash).unlink()  # moved away: the rerun finishes, and removes what the refused run wrote
    rep = export_hidden(str(sets["a"]), ["modelopt"], out, target_dir=sets["model"])[0]
    assert rep.samples == 5 and set(tree(out)) == set(rep.files) | {EXPORT_MARKER}


def test_markerless_old_export_is_adopted(sets: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "old"
    rep = export_hidden(str(sets["a"]), ["speculators"], out)[0]
    # as an export made before this change: no marker, an export.json with no file listing
    (out / EXPORT_MARKER).unlink()
    legacy = msgspec.structs.replace(rep, files=[])
    (out / EXPORT_REPORT).write_bytes(msgspec.json.encode(legacy))
    foreign = plant(out, ["notes.txt"])
    again = export_hidden(str(sets["a"]), ["speculators"], out, echo=lambda s: None)[0]  # up to date
    assert again.samples == 5 and marker(out / EXPORT_MARKER).adopted
    (out / EXPORT_MARKER).unlink()
    newer = export_hidden(str(sets["b"]), ["speculators"], out)[0]  # a smaller set: hs_3, hs_4 must go
    assert marker(out / EXPORT_MARKER).adopted
    assert not (out / "hidden_states" / "hs_3.safetensors").exists()
    assert not (out / "hidden_states" / "hs_4.safetensors").exists()
    assert_kept(out, foreign)
    assert set(tree(out)) == set(newer.files) | {EXPORT_MARKER} | set(foreign)


# -- item 19: a death inside an export write ---------------------------------------------------------------

DIE_ON_THIRD_SAMPLE = """
import os, signal, sys
from draftgen.hidden.exports import export_hidden
real, calls = os.fsync, []
def dying(fd):
    calls.append(fd)
    if len(calls) == 3:  # the marker, hs_0, then mid-write of hs_1: its temp file is on disk, then SIGKILL
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fd)
os.fsync = dying
export_hidden(sys.argv[1], ["speculators"], sys.argv[2])
"""


def test_item19_export_temp_removed_on_rerun(sets: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "sp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    died = subprocess.run([sys.executable, "-c", DIE_ON_THIRD_SAMPLE, str(sets["a"]), str(out)], env=env,
                          capture_output=True, timeout=300, check=False)
    assert died.returncode == -9, died.stderr[-2000:]
    temps = [p for p in out.rglob("*") if is_temp(p.name)]
    assert temps and (out / EXPORT_MARKER).is_file() and not (out / EXPORT_REPORT).exists()
    foreign = plant(out, ["notes.txt", "hidden_states/mine.safetensors"])
    res = subprocess.run([sys.executable, "-m", "draftgen.cli", "export-hidden", str(sets["cfg"]), "--format",
                          "speculators", "--out", str(out)], env=env, capture_output=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not [p for p in out.rglob("*") if is_temp(p.name)] and not (out / EXPORT_JOURNAL).exists()
    rep = read_json(out / EXPORT_REPORT, HiddenExportReport)
    assert rep.samples == 5
    assert_kept(out, foreign)
    assert set(tree(out)) == set(rep.files) | {EXPORT_MARKER} | set(foreign)


# -- item 3: extract --output into a folder draftgen did not make ------------------------------------------


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory, sets: dict[str, Any]) -> Path:
    run_cfg = make_merged_run(tmp_path_factory.mktemp("ext"), n_chat=2, n_code=1, max_tokens=16)
    return with_hidden(run_cfg, "cfg-h.yaml", model=str(sets["model"]), teacher_fraction=0.0)


def test_item03_extract_foreign_output_keeps_tmp_files(merged: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    foreign = plant(out, ["README.md", "states/.a.tmp", "states/" + temp_name("x.safetensors"),
                          "states/ab/.b.0123456789abcdef.tmp", "index/" + temp_name("part-1.jsonl"),
                          temp_name("manifest.json")])
    before = tree(out)
    res = CliRunner().invoke(cli, ["extract", str(merged), "--output", str(out)])
    assert res.exit_code == 1, res.output
    one_line_refusal(res.output, out)
    assert tree(out) == before
    assert_kept(out, foreign)


def test_extract_claims_new_output_and_adopts_a_markerless_set(merged: Path, tmp_path: Path) -> None:
    out = tmp_path / "h"
    res = CliRunner().invoke(cli, ["extract", str(merged), "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert marker(out / HiddenLayout.marker).kind == "hidden-set"
    # as a set made before this change: no marker; a killed writer's temp, and files that are not temps
    (out / HiddenLayout.marker).unlink()
    leftover = out / "states" / temp_name("y.safetensors")
    leftover.write_bytes(b"half")
    foreign = plant(out, ["states/.keep.tmp", "index/notes.txt", "states/.z.nothex.tmp"])
    again = CliRunner().invoke(cli, ["extract", str(merged), "--output", str(out)])
    assert again.exit_code == 0 and "up to date" in again.output, again.output
    assert marker(out / HiddenLayout.marker).adopted and not leftover.exists()
    assert_kept(out, foreign)


def test_object_store_destination_refused_or_claimed_through_its_put() -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file("/own-test/foreign/data.bin", FOREIGN)
    with pytest.raises(RunDirError, match=FIX):
        HiddenStore("memory://own-test/foreign").claim()
    assert fs.cat_file("/own-test/foreign/data.bin") == FOREIGN
    assert not fs.exists(f"/own-test/foreign/{HiddenLayout.marker}")
    fresh = HiddenStore("memory://own-test/fresh")
    fresh.claim()
    assert fresh.owned() and msgspec.json.decode(fs.cat_file(f"/own-test/fresh/{HiddenLayout.marker}"),
                                                 type=HiddenOwnerMarker).kind == "hidden-set"
    fresh.claim()  # its own: accepted again
