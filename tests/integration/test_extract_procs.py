"""``hidden_states.devices``: ``draftgen extract`` without Ray, one spawned process per device (here two on the CPU).

Two processes give the SAME files as one process, bitwise (they run the very batches one process runs, one
sample each here: see test_extract_resume.py), both work, each sample is listed once, the manifest is in merged
order, a rerun extracts nothing; a partial run then the processes complete the rest; bad devices and a process
that fails are one-line errors. Ray is not involved.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.config import load_config
from draftgen.errors import ConfigError, DraftgenError
from draftgen.hidden.format import open_hidden
from draftgen.phases.extract.run import run_extract

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

Setup = tuple[Path, Path, dict[str, Any]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    model = build_tiny_model(tmp_path_factory.mktemp("target"), layers=8, hidden=32)
    run_cfg = make_merged_run(tmp_path_factory.mktemp("run"))
    shortest = min(len(r[1]) for r in merged_rows(run_cfg.parent / "run"))
    common = dict(model=str(model), device="cpu", teacher_fraction=1.0, teacher_min_margin=None,
                  batch_tokens=shortest - 1)  # one sample per batch
    return model, run_cfg, common


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "states").rglob("*")) if p.is_file()}


def index_lines(root: Path) -> Counter[str]:
    c: Counter[str] = Counter()
    for part in (root / "index").glob("part-*.jsonl"):
        c.update(json.loads(ln)["sample_id"] for ln in part.read_text().splitlines() if ln.strip())
    return c


def manifest(root: Path) -> dict[str, Any]:
    m: dict[str, Any] = json.loads((root / "manifest.json").read_text())
    m.pop("throughput_tokens_per_s", None)
    return m


def test_two_processes_write_the_same_files_as_one_process(setup: Setup) -> None:
    _, run_cfg, common = setup
    rows = merged_rows(run_cfg.parent / "run")
    ref, out = run_cfg.parent / "h-one", run_cfg.parent / "h-procs"
    run_extract(load_config(with_hidden(run_cfg, "cfg-one.yaml", output=str(ref), **common)), echo=lambda s: None)
    cfg = load_config(with_hidden(run_cfg, "cfg-procs.yaml", output=str(out), devices=["cpu", "cpu"], **common))
    lines: list[str] = []
    rep = run_extract(cfg, echo=lines.append)
    assert rep.extracted == len(rows) and rep.done_before == 0 and rep.complete and rep.flagged == 0
    assert files(out) == files(ref) and files(out)
    assert manifest(out) == manifest(ref)
    assert [e.sample_id for e in open_hidden(str(out)).manifest.samples] == [r[0] for r in rows]
    assert index_lines(out) == Counter({r[0]: 1 for r in rows})
    per = {ln.split("process ")[1].rsplit(": ", 1)[0]: int(ln.rsplit(": ", 1)[1].split()[0])
           for ln in lines if "extract (processes): process " in ln}
    assert len(per) == 2 and all(n > 0 for n in per.values()) and sum(per.values()) == len(rows), lines
    again = run_extract(cfg, echo=lambda s: None)
    assert again.extracted == 0 and again.done_before == len(rows)
    assert index_lines(out) == Counter({r[0]: 1 for r in rows})


def test_partial_run_then_processes_complete_the_rest(setup: Setup, tmp_path: Path) -> None:
    _, run_cfg, common = setup
    rows = merged_rows(run_cfg.parent / "run")
    out = tmp_path / "h"
    one = load_config(with_hidden(run_cfg, "cfg-part.yaml", output=str(out), **common))
    assert run_extract(one, limit=3, echo=lambda s: None).extracted == 3
    cfg = load_config(with_hidden(run_cfg, "cfg-rest.yaml", output=str(out), devices=["cpu", "cpu"], **common))
    rep = run_extract(cfg, echo=lambda s: None)
    assert rep.done_before == 3 and rep.extracted == len(rows) - 3 and rep.complete
    assert index_lines(out) == Counter({r[0]: 1 for r in rows})


def test_bad_devices_and_a_failing_process_are_one_line_errors(setup: Setup, tmp_path: Path) -> None:
    _, run_cfg, common = setup
    bad = load_config(with_hidden(run_cfg, "cfg-bad.yaml", output=str(tmp_path / "b"), devices=["gpu0", "cpu"],
                                  **common))
    with pytest.raises(ConfigError, match=r"hidden_states.devices: 'gpu0'"):
        run_extract(bad, echo=lambda s: None)
    nomodel = load_config(with_hidden(run_cfg, "cfg-nomodel.yaml", output=str(tmp_path / "n"),
                                      devices=["cpu", "cpu"], **{**common, "model": str(tmp_path / "missing")}))
    with pytest.raises(DraftgenError) as ei:
        run_extract(nomodel, echo=lambda s: None)
    assert "\n" not in str(ei.value) and "missing" in str(ei.value)
    assert not (tmp_path / "n" / "states").exists()
