"""``hidden_states.ray``: ``draftgen extract`` on a real Ray Data actor pool (CPU, 2 actors, 2 CPUs).

Two actors give the SAME files as one process: bitwise, since the pool runs the very batches one process
runs (here one sample each: see test_extract_resume.py for why that makes captures bitwise reproducible),
and both actors work. The manifest lists the merged order. A rerun extracts nothing and lists nothing twice
(also with the manifest gone: the actors are not even needed then, one Ray task describes the target). A
partial run (``limit``) then a Ray run completes the rest with no duplicates. A DraftgenError raised inside
an actor comes back with its class and message. The first test lets draftgen start and shut down its own
Ray; the rest share one ``ray.init(num_cpus=2)``; both leave no raylet/gcs_server of this process behind.
Issue 21 item 18 and issue 31 item 14: one actor's process killed mid-run (SIGKILL): Ray restarts it and
re-runs its tasks, and the set still equals the clean run, each sample listed once by the manifest, ``done()``
and the index; the same retry replayed through the actor class itself lists each sample once too.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.config import load_config
from draftgen.errors import ConfigError, RunDirError
from draftgen.hidden.format import HiddenStore, open_hidden
from draftgen.phases.extract.run import ExtractReport, run_extract

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
torch.set_num_threads(1)
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

Setup = tuple[Path, Path, dict[str, Any]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    model = build_tiny_model(tmp_path_factory.mktemp("target"), layers=8, hidden=32)
    run_cfg = make_merged_run(tmp_path_factory.mktemp("run"))
    shortest = min(len(r[1]) for r in merged_rows(run_cfg.parent / "run"))
    common = dict(model=str(model), device="cpu", teacher_fraction=1.0, teacher_min_margin=None,
                  batch_tokens=shortest - 1)  # one sample per batch
    return model, run_cfg, common


@pytest.fixture(scope="module")
def reference(setup: Setup) -> Path:
    """One process, no Ray."""
    _, run_cfg, common = setup
    out = run_cfg.parent / "h-ref"
    run_extract(load_config(with_hidden(run_cfg, "cfg-ref.yaml", output=str(out), **common)), echo=lambda s: None)
    return out


def ray_children() -> list[int]:
    """raylet / gcs_server processes this test process started (alive, not zombies)."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            status = dict(ln.split(":\t", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":\t" in ln)
        except OSError:
            continue
        if comm in ("raylet", "gcs_server") and int(status["PPid"]) == me and not status["State"].startswith("Z"):
            out.append(int(pid))
    return out


def wait_no_ray_children(timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while ray_children() and time.monotonic() < end:
        time.sleep(0.2)
    assert not ray_children(), "Ray processes left behind"


@pytest.fixture(autouse=True)
def print_stays_the_builtin() -> Iterator[None]:
    """Ray Data's progress bars must not replace this process's print (later tests compare defaults to it)."""
    import builtins

    before = builtins.print
    yield
    assert builtins.print is before, "extract on Ray replaced builtins.print"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    t = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    print(f"ray.init: {time.monotonic() - t:.1f} s", file=sys.stderr)
    try:
        assert ray_children()  # the leftover check below sees them while they run
        yield
    finally:
        ray.shutdown()
        wait_no_ray_children()


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "states").rglob("*")) if p.is_file()}


def index_lines(root: Path) -> Counter[str]:
    """sample_id → how many index lines list it (over all parts)."""
    import json

    c: Counter[str] = Counter()
    for part in (root / "index").glob("part-*.jsonl"):
        c.update(json.loads(ln)["sample_id"] for ln in part.read_text().splitlines() if ln.strip())
    return c


def ray_extract(setup: Setup, name: str, out: Path, **more: Any) -> tuple[ExtractReport, list[str]]:
    _, run_cfg, common = setup
    cfg = load_config(with_hidden(run_cfg, name, output=str(out), ray=True, workers=2, num_cpus_per_worker=1,
                                  **{**common, **more}))
    lines: list[str] = []
    t = time.monotonic()
    rep = run_extract(cfg, echo=lines.append)
    print(f"{name}: {time.monotonic() - t:.1f} s, timings {rep.timings}", file=sys.stderr)
    return rep, lines


def same_manifest(a: Path, b: Path) -> None:
    import json

    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("throughput_tokens_per_s", None)
    assert ma == mb


def test_missing_ray_and_bad_settings_are_one_line_config_errors(setup: Setup, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from draftgen.phases.extract.ray_pool import validate_ray_settings

    _, run_cfg, common = setup
    cfg = load_config(with_hidden(run_cfg, "cfg-noray.yaml", output=str(tmp_path / "h"), ray=True, **common))
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError
    with pytest.raises(ConfigError, match=r"pip install 'draftgen\[ray\]'"):
        run_extract(cfg, echo=lambda s: None)
    for bad, msg in (({"workers": 0}, "hidden_states.workers"), ({"backend": "vllm"}, "hidden_states.ray"),
                     ({"device": "cuda"}, "num_gpus_per_worker")):
        with pytest.raises(ConfigError, match=msg):
            validate_ray_settings(load_config(with_hidden(run_cfg, "cfg-bad.yaml", ray=True, **{**common, **bad})))

    # `draftgen extract --workers N` is hidden_states.ray + .workers: the missing-ray error proves it took the Ray path
    from click.testing import CliRunner

    from draftgen.cli import cli

    plain = with_hidden(run_cfg, "cfg-cli.yaml", output=str(tmp_path / "h2"), **common)
    res = CliRunner().invoke(cli, ["extract", str(plain), "--workers", "2"])
    assert res.exit_code != 0 and "pip install 'draftgen[ray]'" in res.output and "Traceback" not in res.output


def test_two_actors_write_the_same_files_as_one_process(setup: Setup, reference: Path) -> None:
    """draftgen starts its own Ray here, and shuts it down."""
    _, run_cfg, _ = setup
    assert not ray.is_initialized()
    rows = merged_rows(run_cfg.parent / "run")
    out = run_cfg.parent / "h-ray"
    rep, lines = ray_extract(setup, "cfg-ray.yaml", out)
    assert not ray.is_initialized()
    wait_no_ray_children()
    assert rep.extracted == len(rows) and rep.done_before == 0 and rep.complete and rep.flagged == 0
    assert files(out) == files(reference)  # same names, same bytes
    same_manifest(out, reference)  # merged order, same target description (norm sha), counts, checks
    assert [e.sample_id for e in open_hidden(str(out)).manifest.samples] == [r[0] for r in rows]
    assert index_lines(out) == Counter({r[0]: 1 for r in rows})
    assert len(list((out / "index").glob("part-*.jsonl"))) == len(rows)  # one part per batch, per actor
    actors = {ln.split("actor ")[1].split(":")[1]: int(ln.rsplit(": ", 1)[1].split()[0])
              for ln in lines if ln.startswith("extract (ray): actor ")}
    assert len(actors) == 2 and all(n > 0 for n in actors.values()) and sum(actors.values()) == len(rows), lines
    assert rep.timings["ray_init"] > 0 and rep.timings["first_result"] > 0 and rep.timings["capture"] > 0 and rep.bytes_written > 0
    assert not list(out.rglob(".*.tmp"))


@pytest.mark.usefixtures("ray_cluster")
def test_rerun_extracts_nothing_and_duplicates_nothing(setup: Setup, reference: Path) -> None:
    _, run_cfg, _ = setup
    rows = merged_rows(run_cfg.parent / "run")
    out = run_cfg.parent / "h-ray"  # the previous test's
    before = files(out)
    rep, lines = ray_extract(setup, "cfg-ray.yaml", out)
    assert rep.extracted == 0 and rep.done_before == len(rows) and any("up to date" in ln for ln in lines)
    (out / "manifest.json").unlink()  # killed after the last index part, before the manifest
    rep, _ = ray_extract(setup, "cfg-ray.yaml", out)
    assert rep.extracted == 0 and rep.complete
    same_manifest(out, reference)
    assert files(out) == before and index_lines(out) == Counter({r[0]: 1 for r in rows})
    assert ray.is_initialized()  # a Ray draftgen did not start is left running


@pytest.mark.usefixtures("ray_cluster")
def test_partial_run_then_ray_completes_the_rest(setup: Setup, reference: Path) -> None:
    _, run_cfg, common = setup
    rows = merged_rows(run_cfg.parent / "run")
    out = run_cfg.parent / "h-part"
    part = load_config(with_hidden(run_cfg, "cfg-part.yaml", output=str(out), **common))
    assert run_extract(part, limit=4, echo=lambda s: None).extracted == 4  # one process, no Ray
    rep, _ = ray_extract(setup, "cfg-part-ray.yaml", out)
    assert rep.done_before == 4 and rep.extracted == len(rows) - 4 and rep.complete
    assert files(out) == files(reference)
    same_manifest(out, reference)
    assert index_lines(out) == Counter({r[0]: 1 for r in rows})
    assert set(HiddenStore(str(out)).done()) == {r[0] for r in rows}


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def ray_actor_pids() -> set[int]:
    """This test process's extract actors now: processes below it (its Ray's raylet starts them) that Ray
    titles ``ray::MapWorker(MapBatches(PoolWorker))…``; another process's Ray is never looked at."""
    me, out = os.getpid(), set()
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"MapBatches(PoolWorker)" not in cmd:
            continue
        up = pid
        while up > 1 and up != me:
            up = _parent(up)
        if up == me:
            out.add(pid)
    return out


@pytest.mark.usefixtures("ray_cluster")
def test_item18_a_ray_worker_killed_mid_run_lists_each_sample_once(setup: Setup, reference: Path) -> None:
    """Issue 21 item 18 with a real worker killed: at the first progress line one actor's process gets
    SIGKILL; Ray restarts the actor and re-runs its tasks (a new pid does them); the set equals a clean run,
    byte for byte, and the manifest, ``done()`` and the report list each sample once."""
    _, run_cfg, _ = setup
    rows = merged_rows(run_cfg.parent / "run")
    # When the victim held no queued task (the other actor took them all) no task is re-run and the attempt
    # proves nothing about item 18: it is run again into a new folder, at most three times.
    for attempt in range(3):
        out = run_cfg.parent / f"h-kill{attempt}"
        killed, alive, lines, per_actor = _kill_one_actor_run(setup, run_cfg, out)
        assert len(killed) == 1 and len(alive) == 2, lines
        assert sum(per_actor.values()) == len(rows)  # each sample counted once, whoever wrote it
        assert files(out) == files(reference)
        same_manifest(out, reference)
        ids = [e.sample_id for e in open_hidden(str(out)).manifest.samples]
        assert ids == [r[0] for r in rows]  # each once, merged order
        assert sorted(HiddenStore(str(out)).done()) == sorted(ids)
        assert index_lines(out) == Counter(dict.fromkeys(ids, 1))  # a re-run task replaces its own index part
        if set(per_actor) - alive:
            break
    assert set(per_actor) - alive, f"no restarted actor re-ran the killed one's tasks in 3 attempts: {lines}"
    print(f"attempt {attempt + 1}: killed {killed[0]}; per actor {per_actor}; index lines listing a sample twice: "
          f"{sum(1 for n in index_lines(out).values() if n > 1)}", file=sys.stderr)


def test_item14_a_retried_task_lists_each_sample_once(setup: Setup, tmp_path: Path) -> None:
    """Issue 31 item 14 (2 actors, one killed: two sample ids listed twice), its path without a kill: Ray
    retries a killed actor's task (one block of several batches) on a restarted actor, after the dead one had
    published and indexed the block's first batches. Here the actor class itself runs both attempts, in this
    process (a real kill is above; whether the victim held a task is up to Ray's scheduling): the retry writes
    the same batches again, and the index still lists each sample once; a rerun finds the set done."""
    import numpy as np

    from draftgen.phases.extract.batches import split_batches
    from draftgen.phases.extract.worker import PoolWorker, decode_result, encode_batch
    from draftgen.rundir import RunDir
    from draftgen.target.rows import read_merged_rows

    _, run_cfg, common = setup
    out = tmp_path / "h"
    longest = max(len(r[1]) for r in merged_rows(run_cfg.parent / "run"))
    more = {**common, "teacher_fraction": 0.5, "batch_tokens": 3 * longest}  # batches of 3, half in the lane
    cfg = load_config(with_hidden(run_cfg, "cfg-retry.yaml", output=str(out), **more))
    rows = read_merged_rows(RunDir(cfg.run_path))
    batches = [encode_batch(b) for b in split_batches(rows, cfg.hidden_states.batch_tokens)]
    assert len(batches) >= 3
    HiddenStore(str(out)).claim()
    dead = PoolWorker(cfg, str(out), {}, {})  # the first attempt: two batches done, then its actor is killed
    first = [decode_result(r) for r in dead({"payload": np.array(batches[:2], dtype=object)})["result"]]
    assert first and not any(r.error for r in first)
    indexed = set(index_lines(out))
    assert indexed and not any(n > 1 for n in index_lines(out).values())
    retry = PoolWorker(cfg, str(out), {}, {})  # Ray re-runs the whole block on the restarted actor
    again = [decode_result(r) for r in retry({"payload": np.array(batches, dtype=object)})["result"]]
    assert not any(r.error for r in again) and indexed <= {rec.sample_id for r in again for rec in r.records}
    assert index_lines(out) == Counter({r.sample_id: 1 for r in rows})
    rep = run_extract(cfg, echo=lambda s: None)
    assert rep.extracted == 0 and rep.done_before == len(rows) and rep.complete
    assert index_lines(out) == Counter({r.sample_id: 1 for r in rows})


def _kill_one_actor_run(setup: Setup, run_cfg: Path, out: Path) -> tuple[list[int], set[int], list[str], dict[int, int]]:
    """One extract on 2 actors where one actor's process gets SIGKILL at the first progress line: the killed
    pids, the pids alive then, the lines, and samples per actor pid."""
    import signal

    killed: list[int] = []
    alive: set[int] = set()
    lines: list[str] = []

    def echo(line: str) -> None:
        lines.append(line)
        if not killed and line.startswith("extract (ray): 1/"):  # the first result is in: the rest is queued
            alive.update(ray_actor_pids())
            victim = min(alive)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    cfg = load_config(with_hidden(run_cfg, f"cfg-{out.name}.yaml", output=str(out), ray=True, workers=2,
                                  num_cpus_per_worker=1, **setup[2]))
    rep = run_extract(cfg, echo=echo)
    assert rep.extracted == len(merged_rows(run_cfg.parent / "run")) and rep.complete
    per_actor = {int(ln.split("actor ")[1].split(":")[1]): int(ln.rsplit(": ", 1)[1].split()[0])
                 for ln in lines if ln.startswith("extract (ray): actor ")}
    return killed, alive, lines, per_actor


def test_an_error_inside_an_actor_comes_back_as_itself(setup: Setup, tmp_path: Path) -> None:
    """The actor class itself, in this process (a pool would add only its start-up time): samples written
    with other layer ids and no manifest yet; the check that needs the target runs in the actor, which
    hands the RunDirError back as a result; the driver raises that class with that message."""
    import numpy as np

    from draftgen.phases.extract.worker import PoolWorker, decode_result, encode_batch, error_class
    from draftgen.target import ExtractRow

    _, run_cfg, common = setup
    out = tmp_path / "h"
    run_extract(load_config(with_hidden(run_cfg, "cfg-e1.yaml", output=str(out), **common)), limit=2,
                echo=lambda s: None)
    (out / "manifest.json").unlink()
    done = HiddenStore(str(out)).done()
    cfg = load_config(with_hidden(run_cfg, "cfg-e2.yaml", output=str(out), ray=True, **{**common, "layer_ids": [2, 3]}))
    actor = PoolWorker(cfg, str(out), {}, dict([next(iter(done.items()))]))
    sid, ids, mask = merged_rows(run_cfg.parent / "run")[-1]
    row = ExtractRow(sample_id=sid, input_ids=np.asarray(ids, dtype=np.int64), loss_mask=np.asarray(mask, dtype=np.uint8))
    res = [decode_result(r) for r in actor({"payload": np.array([encode_batch([row])], dtype=object)})["result"]]
    assert [r.error_class for r in res] == ["RunDirError"] and "aux width" in res[0].error and not res[0].records
    assert error_class("RunDirError") is RunDirError and error_class("KeyError").__name__ == "DraftgenError"
    assert index_lines(out).total() == 2  # the refused actor wrote nothing
