"""Resume after kill -9: a real ``draftgen extract`` subprocess killed with SIGKILL at several moments (first
sample file published, a few index parts, most of them), then rerun to the end; every file must be
bitwise equal to an uninterrupted run's, each sample listed once, no temp file left, nothing lost.

Batches hold one sample (``batch_tokens`` below the shortest row), so every capture has the same shapes
in every run and the tensors are bitwise reproducible on CPU (one thread).

Issue 31 item 14: a rerun over a set an older draftgen left with a sample listed twice, and with a sample to
redo, leaves the index listing each sample once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.hidden.format import HiddenStore, open_hidden

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model = build_tiny_model(tmp_path_factory.mktemp("target"), layers=8, hidden=32)
    return model, make_merged_run(tmp_path_factory.mktemp("run"), n_chat=10, n_code=6)


def extract(cfg: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "draftgen.cli", "extract", str(cfg)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "states").rglob("*")) if p.is_file()}


def count(root: Path, sub: str, suffix: str) -> int:
    d = root / sub
    return sum(1 for p in d.rglob(f"*{suffix}") if not p.name.startswith(".")) if d.is_dir() else 0


def kill_when(proc: subprocess.Popen[bytes], ready: object, timeout: float = 120.0) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` is true; False when it ended first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        if ready():  # type: ignore[operator]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("extract neither reached the kill point nor ended")


def test_kill9_at_several_moments_then_rerun_equals_an_uninterrupted_run(setup: tuple[Path, Path]) -> None:
    model, run_cfg = setup
    rows = merged_rows(run_cfg.parent / "run")
    shortest = min(len(r[1]) for r in rows)
    common = dict(model=str(model), teacher_fraction=1.0, teacher_min_margin=None, batch_tokens=shortest - 1)
    ref_dir, out = run_cfg.parent / "h-ref", run_cfg.parent / "h-killed"
    ref_cfg = with_hidden(run_cfg, "cfg-ref.yaml", output=str(ref_dir), **common)
    cfg = with_hidden(run_cfg, "cfg-kill.yaml", output=str(out), **common)
    p = extract(ref_cfg)
    assert p.wait(timeout=300) == 0, p.stdout.read() if p.stdout else ""

    kills = 0
    for ready in (lambda: count(out, "states", ".safetensors") >= 1,  # a file published, maybe not indexed
                  lambda: count(out, "index", ".jsonl") >= 3,
                  lambda: count(out, "index", ".jsonl") >= len(rows) - 3):
        kills += kill_when(extract(cfg), ready)
        if (out / "manifest.json").exists():  # the manifest comes last, only when all is done (a loaded machine
            assert set(HiddenStore(str(out)).done()) == {r[0] for r in rows}  # may let the run end first)
    assert kills >= 2  # the kills landed mid-run (the first two points come early)
    finished = (out / "manifest.json").exists()
    p = extract(cfg)
    output = p.communicate(timeout=300)[0].decode()
    assert p.returncode == 0, output
    assert ("up to date" if finished else "done before") in output, output

    ref, got = open_hidden(str(ref_dir)), open_hidden(str(out))
    assert [e.sample_id for e in got.manifest.samples] == [r[0] for r in rows]  # each once, merged order
    assert got.manifest.complete and got.manifest.counts.samples == len(rows)
    assert files(out) == files(ref_dir)  # bitwise: same files, same bytes, no temp file left
    assert not [p for p in out.rglob(".*.tmp")]
    done = HiddenStore(str(out)).done()
    assert set(done) == {r[0] for r in rows}
    for a, b in zip(ref.samples(), got.samples(), strict=True):
        assert a.sample_id == b.sample_id and a.aux.equal(b.aux) and a.final.equal(b.final)


def test_a_rerun_leaves_each_sample_listed_once(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 31 item 14: the index never lists a sample twice. A set an older draftgen left with a re-run
    task's second listing (a later, time-named part repeating the first part's samples, visibly), and one
    sample's file changed after extraction: the rerun redoes that sample, and before it writes, the earlier
    records go (the last listing won, and still does), as does the changed sample's old record."""
    import json

    from draftgen.config import load_config
    from draftgen.phases.extract.run import run_extract

    model, run_cfg = setup
    rows = merged_rows(run_cfg.parent / "run")
    out = tmp_path / "h"
    cfg = with_hidden(run_cfg, "cfg-once.yaml", output=str(out), model=str(model), teacher_fraction=0.0,
                      teacher_min_margin=None, max_flagged_fraction=1.0,
                      batch_tokens=3 * max(len(r[1]) for r in rows))  # a few samples per batch, several parts
    run_extract(load_config(cfg), echo=lambda s: None)
    first = sorted((out / "index").glob("part-*.jsonl"))[0]
    twice = [json.loads(ln)["sample_id"] for ln in first.read_text().splitlines()]
    again = [ln.replace('"length"', '"failed":["rerun"],"length"', 1) for ln in first.read_text().splitlines()]
    (out / "index" / "part-99991231T235959-deadbeef.jsonl").write_text("".join(ln + "\n" for ln in again))
    changed = next(r[0] for r in rows if r[0] not in twice)
    path = out / HiddenStore(str(out)).done()[changed].file
    path.write_bytes(path.read_bytes()[:-4] + b"\x7f\x7f\x7f\x7f")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (out / "manifest.json").unlink()

    lines: list[str] = []
    rep = run_extract(load_config(cfg), echo=lines.append)
    assert rep.extracted == 1 and rep.replaced == 1 and rep.complete
    assert any(f"removed {len(twice) + 1} record(s)" in ln for ln in lines), lines
    listed = [json.loads(ln) for p in (out / "index").glob("part-*.jsonl") for ln in p.read_text().splitlines()]
    assert sorted(r["sample_id"] for r in listed) == sorted(r[0] for r in rows)  # each sample once
    assert {r["sample_id"] for r in listed if r.get("failed") == ["rerun"]} == set(twice)  # the last listing
    m = open_hidden(str(out)).manifest
    assert [e.sample_id for e in m.samples] == [r[0] for r in rows] and m.counts.flagged == len(twice)
