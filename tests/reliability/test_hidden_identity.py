"""The hidden-state set has a checked identity (issue 21 items 4, 5, 6, 9, 18, and weight repeats).

- item 4: a re-merge with a smaller ``merge.max_seq_len`` changes rows; extract redoes exactly those (the
  index records the ids/mask digest), and redoes records without digests (older draftgen);
- item 5: a resume with another target (same shape) is refused naming both, before any write, also when
  only index parts exist (identity.json is written before the first sample);
- item 6: one writer per destination: two real ``draftgen extract`` processes on one output, one refused in
  one line naming the holder; on moto S3 the owner file ``.lock.json`` (live / stale / dead holder);
- item 9: a state file changed after extraction is refused by every read (HiddenSet, export-hidden) and
  redone by extract;
- item 18: two index parts listing one sample (a re-run task): done(), the manifest and the report count it
  once; the driver loop counts a re-reported batch once (a real Ray actor killed mid-run:
  tests/integration/test_extract_ray.py);
- repeats: ``x#rep1`` (dataset weight > 1) is extracted once and its manifest entry names ``x``'s file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from _common_helpers import config_dict, moto_s3, write_config
from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.config import load_config
from draftgen.errors import InputError, RunDirError
from draftgen.hidden.format import HiddenStore, open_hidden
from draftgen.phases.extract.run import run_extract

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("target-a"), layers=8, hidden=32, seed=0)


@pytest.fixture(scope="module")
def model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("target-b"), layers=8, hidden=32, seed=1)


@pytest.fixture(scope="module")
def run_cfg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_merged_run(tmp_path_factory.mktemp("run"), n_chat=5, n_code=4)


def _cfg(run_cfg: Path, model: Path, out: Path, name: str, **hidden: object) -> Path:
    keys: dict[str, object] = {"teacher_min_margin": None, "teacher_fraction": 0.0, **hidden}
    return with_hidden(run_cfg, name, model=str(model), output=str(out), **keys)


def _extract(cfg_path: Path, **kw: object) -> tuple[object, list[str]]:
    lines: list[str] = []
    rep = run_extract(load_config(cfg_path), echo=lines.append, **kw)  # type: ignore[arg-type]
    return rep, lines


def _index_lines(out: Path) -> list[str]:
    return [ln for p in sorted((out / "index").glob("part-*.jsonl")) for ln in p.read_text().splitlines() if ln]


def test_item04_a_changed_merged_row_is_redone_and_counted(model_a: Path, run_cfg: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_cfg.parent / "run", run)
    data = yaml.safe_load(run_cfg.read_text())
    data["run_dir"] = str(run)
    base = write_config(tmp_path, data, "cfg.yaml")
    out = tmp_path / "h"
    cfg_path = _cfg(base, model_a, out, "cfg-x.yaml")
    rep, _ = _extract(cfg_path)
    before = {sid: ids for sid, ids, _ in merged_rows(run)}
    lengths = sorted(len(v) for v in before.values())
    cap = lengths[len(lengths) // 2]
    data["merge"] = {**(data.get("merge") or {}), "max_seq_len": cap}
    write_config(tmp_path, data, "cfg.yaml")
    from draftgen.phases.merge.run import run_merge

    run_merge(load_config(base), echo=lambda s: None)
    after = {sid: (ids, mask) for sid, ids, mask in merged_rows(run)}
    changed = sum(1 for sid, (ids, _) in after.items() if before.get(sid) != ids)
    assert changed > 0
    cfg_path = _cfg(base, model_a, out, "cfg-x.yaml")
    rep, lines = _extract(cfg_path)
    assert rep.replaced == changed and rep.extracted == changed  # type: ignore[attr-defined]
    assert any(f"redoing {changed} stored samples" in ln and "merged row changed" in ln for ln in lines), lines
    hs = open_hidden(str(out))
    assert len(hs) == len(after)
    for e, s in zip(hs.manifest.samples, hs.samples(), strict=True):
        ids, mask = after[e.sample_id]
        assert s.input_ids.tolist() == ids and s.loss_mask.tolist() == mask
    # records written before the digests existed: redone, and said so
    for p in (out / "index").glob("part-*.jsonl"):
        p.write_text("".join(ln.replace('"row_sha256"', '"old_row"') + "\n" for ln in p.read_text().splitlines()))
    (out / "manifest.json").unlink()
    rep, lines = _extract(cfg_path)
    assert rep.replaced == len(after) and rep.extracted == len(after)  # type: ignore[attr-defined]
    assert any("older draftgen" in ln for ln in lines), lines


def test_item05_a_resume_with_another_target_is_refused_before_any_write(model_a: Path, model_b: Path,
                                                                          run_cfg: Path, tmp_path: Path) -> None:
    out = tmp_path / "h"
    rep, _ = _extract(_cfg(run_cfg, model_a, out, "cfg-a5.yaml"), limit=5)
    man = open_hidden(str(out)).manifest
    assert man.target.config_sha256 == hashlib.sha256((model_a / "config.json").read_bytes()).hexdigest()
    assert (out / "identity.json").is_file()
    parts = sorted((out / "index").glob("*"))
    cfg_b = _cfg(run_cfg, model_b, out, "cfg-b5.yaml")
    with pytest.raises(RunDirError, match=rf"extracted from {model_a}.*not {model_b}"):
        _extract(cfg_b)
    (out / "manifest.json").unlink()  # only index parts (and identity.json) left: still refused
    with pytest.raises(RunDirError, match="extracted from"):
        _extract(cfg_b)
    assert sorted((out / "index").glob("*")) == parts and not (out / "manifest.json").exists()
    rep, _ = _extract(_cfg(run_cfg, model_b, tmp_path / "new", "cfg-b5n.yaml"), limit=2)  # a new destination
    assert rep.extracted == 2  # type: ignore[attr-defined]
    rep, _ = _extract(_cfg(run_cfg, model_a, out, "cfg-a5.yaml"))  # the same target resumes
    assert rep.done_before == 5  # type: ignore[attr-defined]


def test_item06_two_extract_processes_on_one_output_one_is_refused(model_a: Path, run_cfg: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "h"
    cfgs = []
    for i in (1, 2):
        run = tmp_path / f"run{i}"
        shutil.copytree(run_cfg.parent / "run", run)
        data = yaml.safe_load(run_cfg.read_text())
        data["run_dir"] = str(run)
        base = write_config(tmp_path, data, f"cfg{i}.yaml")
        cfgs.append(_cfg(base, model_a, out, f"cfg{i}-x.yaml", teacher_fraction=1.0))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-m", "draftgen.cli", "extract", str(c)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=env, text=True) for c in cfgs]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(c == 0 for c in codes) == [False, True], (codes, outs)
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    msg = [ln for ln in outs[loser].strip().splitlines() if ln.strip()]
    assert len(msg) == 1 and "is writing this hidden-state destination" in msg[0], outs[loser]
    assert f"pid {procs[winner].pid}" in msg[0] and f"run{winner + 1}" in msg[0], msg
    hs = open_hidden(str(out))
    assert hs.manifest.complete and len({e.sample_id for e in hs.manifest.samples}) == len(hs)
    assert not (out / ".lock.json").exists()  # released


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_s3(tmp_path_factory.mktemp("moto"), "locks", "testing") as url:
        yield url


def test_item06_s3_owner_file_one_live_holder(s3: str) -> None:
    from draftgen.hidden.lock import LOCK_STALE_S, destination_lock, read_holder
    from draftgen.records import HiddenLockHolder
    from draftgen.store import encode_json

    store = HiddenStore("s3://locks/set", {"endpoint_url": s3})
    with destination_lock(store, "/runs/one") as refresh:
        refresh()
        holder = read_holder(store)
        assert holder is not None and holder.run_dir == "/runs/one" and holder.pid == os.getpid()
        other = HiddenStore("s3://locks/set", {"endpoint_url": s3})
        with (pytest.raises(RunDirError, match=r"run /runs/one .*pid \d+.* is writing this hidden-state destination"),
              destination_lock(other, "/runs/two")):
            pass
    assert read_holder(store) is None  # released
    now = time.time()
    for stale in (HiddenLockHolder(host="elsewhere", pid=1, run_dir="/old", since=now - 2 * LOCK_STALE_S,
                                   refreshed=now - LOCK_STALE_S - 5, token="t1"),
                  HiddenLockHolder(host=socket.gethostname(), pid=_dead_pid(), run_dir="/dead", since=now,
                                   refreshed=now, token="t2")):
        store.fs.pipe_file(store.path(".lock.json"), encode_json(stale))
        with destination_lock(store, "/runs/three"):
            held = read_holder(store)
            assert held is not None and held.run_dir == "/runs/three"
    live = HiddenLockHolder(host="elsewhere", pid=1, run_dir="/live", since=now, refreshed=now, token="t3")
    store.fs.pipe_file(store.path(".lock.json"), encode_json(live))
    with pytest.raises(RunDirError, match="run /live"), destination_lock(store, "/runs/four"):
        pass


def test_item06_local_refusal_names_the_holder_even_before_it_has_written_its_name(tmp_path: Path) -> None:
    """The holder writes ``.lock.json`` just after taking the flock: a writer refused in between waits for the
    name (CI once read the file in that gap); an old file left by a dead holder, or an hour-old one of a live
    local holder (the flock needs no refresh), is read for what it is."""
    import fcntl
    import threading

    from draftgen.hidden.lock import LOCK_STALE_S, destination_lock
    from draftgen.records import HiddenLockHolder
    from draftgen.store import encode_json

    store = HiddenStore(str(tmp_path / "h"))
    (tmp_path / "h").mkdir()
    now = time.time()
    (tmp_path / "h" / ".lock.json").write_bytes(encode_json(HiddenLockHolder(
        host=socket.gethostname(), pid=_dead_pid(), run_dir="/dead", since=now, refreshed=now, token="t0")))
    with open(tmp_path / "h" / ".lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, not yet named: the dead one's file is there
        old = now - 2 * LOCK_STALE_S
        late = HiddenLockHolder(host=socket.gethostname(), pid=os.getpid(), run_dir="/runs/long", since=old,
                                refreshed=old, token="t1")
        timer = threading.Timer(0.5, lambda: (tmp_path / "h" / ".lock.json").write_bytes(encode_json(late)))
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(RunDirError, match=rf"run /runs/long \(host .*pid {os.getpid()},"), \
                destination_lock(store, "/runs/two"):
            pass
        timer.join()
        assert 0.4 < time.monotonic() - t0 < 2.0
    (tmp_path / "h" / ".lock.json").unlink()
    with open(tmp_path / "h" / ".lock", "a+b") as fh:  # never named: "another draftgen extract", after the wait
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirError, match="another draftgen extract is writing"), \
                destination_lock(store, "/runs/three"):
            pass


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_item09_a_changed_state_file_is_refused_on_read_and_redone(model_a: Path, run_cfg: Path,
                                                                    tmp_path: Path) -> None:
    from draftgen.hidden.exports import export_hidden

    out = tmp_path / "h"
    cfg_path = _cfg(run_cfg, model_a, out, "cfg-9.yaml")
    _extract(cfg_path)
    entry = open_hidden(str(out)).manifest.samples[0]
    path = out / entry.file
    data = bytearray(path.read_bytes())
    data[-4:] = b"\x7f\x7f\x7f\x7f"  # bf16 3.39e38, same size
    path.write_bytes(bytes(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(InputError, match=rf"{entry.file}: changed after extraction.*rerun draftgen extract"):
        list(open_hidden(str(out)).samples())
    with pytest.raises(InputError, match="changed after extraction"):
        export_hidden(str(out), ["speculators"], tmp_path / "exp", hidden=str(out))
    rep, lines = _extract(cfg_path)
    assert rep.replaced == 1 and rep.extracted == 1  # type: ignore[attr-defined]
    assert any("file changed after extraction" in ln for ln in lines), lines
    assert all(float(s.aux.abs().max()) < 1e30 for s in open_hidden(str(out)).samples())


def test_item18_a_sample_listed_twice_counts_once(model_a: Path, run_cfg: Path, tmp_path: Path) -> None:
    out = tmp_path / "h"
    cfg_path = _cfg(run_cfg, model_a, out, "cfg-18.yaml", max_flagged_fraction=1.0)
    rep, _ = _extract(cfg_path)
    n = rep.samples  # type: ignore[attr-defined]
    first = sorted((out / "index").glob("part-*.jsonl"))[0]
    again = [ln.replace('"length"', '"failed":["rerun"],"length"', 1) for ln in first.read_text().splitlines()]
    # a re-run task's later part lists the same samples again (here with a visible difference): the last wins
    (out / "index" / "part-99991231T235959-deadbeef.jsonl").write_text("".join(ln + "\n" for ln in again))
    assert len(_index_lines(out)) == n + len(again)
    done = HiddenStore(str(out)).done()
    assert len(done) == n and sum(1 for r in done.values() if r.failed == ["rerun"]) == len(again)
    (out / "manifest.json").unlink()
    rep, _ = _extract(cfg_path)
    assert rep.extracted == 0 and rep.done_before == n and rep.replaced == 0  # type: ignore[attr-defined]
    m = open_hidden(str(out)).manifest
    ids = [e.sample_id for e in m.samples]
    assert len(ids) == len(set(ids)) == m.counts.samples == n and m.counts.flagged == len(again)


def test_item18_the_driver_counts_a_retried_task_once() -> None:
    """The one driver loop over an executor that reports a re-run task's batches again (as Ray does after
    an actor is killed): each sample counted once, first record kept, tokens and bytes as reported."""
    import numpy as np

    from draftgen.phases.extract.run import drive
    from draftgen.phases.extract.worker import BatchResult
    from draftgen.records import HiddenIndexRecord
    from draftgen.target import ExtractRow, TargetInfo
    from draftgen.target.layers import LayerIds

    info = TargetInfo(name="t", revision=None, num_layers=8, hidden_size=4, vocab_size=10, norm_eps=1e-6,
                      norm_weight=torch.ones(4), layers=LayerIds(aux=(2, 4, 5), final=8))
    pending = [ExtractRow(sample_id=f"s{i}", input_ids=np.arange(3, dtype=np.int64),
                          loss_mask=np.ones(3, dtype=np.uint8)) for i in range(3)]

    def result(*sids: str, worker: str = "a") -> BatchResult:
        return BatchResult(records=[HiddenIndexRecord(sample_id=s, file=f"states/{s}", length=3, n_loss=3)
                                    for s in sids], written=10, began=1.0, ended=2.0, worker=worker)

    class Replaying:
        label, unit, timings = " (ray)", "actor", {"ray_init": 0.5}

        def results(self, batches: object) -> Iterator[BatchResult]:
            yield from (result("s0"), result("s1"), result("s1", worker="b"), result("s2", "s0", worker="b"))

        def target(self) -> TargetInfo:
            return info

    lines: list[str] = []
    done: dict[str, HiddenIndexRecord] = {}
    tally = drive(Replaying(), [], pending, done, lines.append, total=3, done_before=0)  # type: ignore[arg-type]
    assert tally.extracted == 3 and tally.tokens == 9 and sorted(done) == ["s0", "s1", "s2"]
    assert tally.written == 40 and tally.per_worker == {"a": 2, "b": 1}
    assert [ln for ln in lines if " actor " in ln] == ["extract (ray): actor a: 2 samples",
                                                       "extract (ray): actor b: 1 samples"]


def test_weight_repeats_are_extracted_once_and_reference_their_base(model_a: Path, tmp_path: Path) -> None:
    from draftgen.phases.pipeline import run_pipeline

    data = config_dict(tmp_path, [{"name": "chat", "path": "bundled:chat", "max_samples": 4, "weight": 2.0}],
                       endpoint={"kind": "emulator", "emulator": {"scenario": "fast", "seed": 0}},
                       partitions={"short": {"concurrency": 4, "max_tokens": 24},
                                   "long": {"concurrency": 2, "max_tokens": 24}},
                       progress="off", hidden_states={})
    base = write_config(tmp_path, data)
    assert run_pipeline(load_config(base), argv=["draftgen", "run"], echo=lambda s: None).exit_code == 0
    rows = merged_rows(tmp_path / "run")
    repeats = [sid for sid, _, _ in rows if "#rep" in sid]
    assert repeats
    out = tmp_path / "h"
    rep, _ = _extract(_cfg(base, model_a, out, "cfg-rep.yaml"))
    assert rep.extracted == len(rows) - len(repeats)  # type: ignore[attr-defined]
    assert len(list((out / "states").rglob("*.safetensors"))) == len(rows) - len(repeats)
    hs = open_hidden(str(out))
    by_id = {e.sample_id: e for e in hs.manifest.samples}
    assert [e.sample_id for e in hs.manifest.samples] == [r[0] for r in rows] and hs.manifest.complete
    for sid in repeats:
        assert by_id[sid].file == by_id[sid.split("#rep")[0]].file
    got = list(hs.samples())
    assert len(got) == len(rows)
    assert all(s.input_ids.tolist() == ids for s, (_, ids, _) in zip(got, rows, strict=True))
