"""``draftgen train --online`` on many processes (issue 25 items 1 and 4), all on a CPU.

A merged run from the emulator pipeline and a tiny Qwen3 target served by ``draftgen emulate --model`` in
extract mode (vLLM's protocol: connector files, ``prompt_logprobs``). The server is made to write NaN states
for every 4th sample (``--extract-fault nan_every_4``): the preflight passes (its rows come first), then the
checking proxy excludes each bad sample, which speculators leaves out of its batch; the run counts them.
Training is EAGLE-3.1 under torchrun with two processes (gloo), both taking samples through the one proxy;
no hidden state is stored; a second run resumes from the last complete checkpoint, setting aside one that
was never completed; the drafter is served by ``draftgen emulate --drafter`` and measured by ``accept``. A
server whose final state is taken after the norm is stopped by the preflight, named with the check.
(speculators' own online client reading the emulator directly: tests/phases/train/test_train_algorithms.py.)

Sizes are the smallest that exercise each path (ten rows, one epoch, then one more); the CPU time is mostly
speculators' start-up in each of the two processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run, merged_rows  # noqa: E402
from _hidden_export_helpers import speculators_python  # noqa: E402
from _hostile_extract import ExtractMITM  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, RunningModelServer, start_in_thread  # noqa: E402
from draftgen.errors import DraftgenError, ThresholdBroken  # noqa: E402
from draftgen.phases.train.launch import COMPLETE  # noqa: E402
from draftgen.phases.train.online import MAX_FILES  # noqa: E402
from draftgen.phases.train.run import run_train  # noqa: E402
from draftgen.records import TrainLogRecord, TrainReport  # noqa: E402
from draftgen.rundir import MARKER, RunDir  # noqa: E402
from draftgen.store import iter_jsonl, read_json  # noqa: E402
from draftgen.target.checks import teacher_selected  # noqa: E402
from draftgen.target.connector import ConnectorFolder  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    torch.set_num_threads(1)
    speculators_python()
    tmp = tmp_path_factory.mktemp("online")
    target = build_tiny_model(tmp / "target", layers=8, hidden=32)
    cfg_path = make_merged_run(tmp, n_chat=6, n_code=4, max_tokens=24, held_out=2)
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=1, extract_dir=str(tmp / "hs"),
                                            extract_fault="nan_every_4")) as srv, \
            start_in_thread(ModelServerOptions(model=str(target), port=0, threads=1,
                                               extract_dir=str(tmp / "hs"))) as clean:
        yield {"tmp": tmp, "target": target, "cfg": cfg_path, "server": srv, "clean": clean}


def _config(s: dict[str, Any], server: RunningModelServer, name: str, **train: Any) -> Path:
    data = yaml.safe_load(s["cfg"].read_text())
    data["hidden_states"] = {"model": str(s["target"]), "base_urls": [server.root_url],
                             "connector_dir": str(s["tmp"] / "hs"), "teacher_fraction": 1.0,
                             "teacher_min_margin": None, "max_flagged_fraction": 1.0}
    data["train"] = {"speculators": str(speculators_python()), "algorithm": "eagle3.1", "draft_vocab_size": 64,
                     "total_seq_len": 96, "epochs": 1, "online_check_rows": 2, "nproc_per_node": 2,
                     "master_port": 29641, "online": True, **train}
    return write_config(s["tmp"], data, name)


@pytest.fixture(scope="module")
def first(served: dict[str, Any]) -> dict[str, Any]:
    lines: list[str] = []
    rep = run_train(load_config(_config(served, served["server"], "online.yaml")), echo=lines.append)
    return {"report": rep, "lines": lines}


def test_online_training_checks_every_sample_and_stores_no_hidden_state(served: dict[str, Any],
                                                                        first: dict[str, Any]) -> None:
    rep: TrainReport = first["report"]
    on = rep.online
    assert on is not None and rep.algorithm == "eagle3.1" and rep.processes == 2 and rep.hidden.startswith("online:")
    assert on.servers == [served["server"].root_url] and on.rows == len(merged_rows(served["tmp"] / "run"))
    assert on.preflight_rows == 2 and "teacher_reference" in on.preflight_checks
    # every 4th capture was NaN: excluded by the finite check, never trained on, counted
    assert on.excluded > 0 and on.excluded_by_check == {"finite": on.excluded}
    assert on.passed + on.excluded == on.requests > 0 and on.teacher_checked > 0
    assert 0 < on.peak_files <= MAX_FILES and 0 < on.peak_bytes <= on.window_bytes == 2000 * 10**6
    rd = RunDir(served["tmp"] / "run")
    assert not rd.hidden.exists()
    assert not [p for p in rd.train_online.rglob("*") if p.suffix == ".safetensors"]  # no hidden state stored
    assert not list((served["tmp"] / "hs").iterdir())  # every connector file was taken and removed
    cfg = json.loads((rd.train_drafter / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    steps = [r.global_step for _, r in iter_jsonl(rd.train_log, TrainLogRecord) if r.kind == "train"]
    assert steps == list(range(len(steps))) and steps  # rank 0 logs each step once
    assert any("excluded ({'finite'" in x for x in first["lines"])


def test_a_second_run_resumes_from_the_last_complete_checkpoint(served: dict[str, Any],
                                                                first: dict[str, Any]) -> None:
    rd = RunDir(served["tmp"] / "run")
    done = rd.train_checkpoints / "0"
    broken = rd.train_checkpoints / "1"  # a save killed half way on some rank: no completeness marker
    shutil.copytree(done, broken)
    (broken / COMPLETE).unlink()
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    lines: list[str] = []
    rep = run_train(load_config(_config(served, served["clean"], "online2.yaml", epochs=2)),
                           echo=lines.append)
    assert rep.first_step == first["report"].last_step > 0 and rep.last_step > rep.first_step
    assert any("never completed" in x and "resuming from 0" in x for x in lines)
    assert (rd.train_checkpoints / "incomplete-1").is_dir() and (broken / COMPLETE).is_file()


def test_a_miswired_server_is_stopped_by_the_preflight(served: dict[str, Any], tmp_path: Path) -> None:
    with start_in_thread(ModelServerOptions(model=str(served["target"]), port=0, threads=1,
                                            extract_dir=str(served["tmp"] / "hs"),
                                            extract_fault="final_post_norm")) as bad:
        cfg = load_config(_config(served, bad, "bad.yaml"), {"run_dir": str(tmp_path / "run")})
        shutil.copytree(served["tmp"] / "run" / "merged", tmp_path / "run" / "merged")
        shutil.copy(served["tmp"] / "run" / MARKER, tmp_path / "run" / MARKER)  # a run directory of draftgen's
        with pytest.raises(DraftgenError) as err:
            run_train(cfg, echo=lambda s: None)
    msg = str(err.value)
    assert bad.root_url in msg and "teacher_reference on 2 of 2 rows" in msg and "\n" not in msg
    assert not RunDir(tmp_path / "run").train_checkpoints.exists()  # stopped before any training step


def test_the_online_drafter_is_served_and_measured(served: dict[str, Any], first: dict[str, Any]) -> None:
    from draftgen.phases.accept.run import run_accept

    drafter = RunDir(served["tmp"] / "run").train_drafter
    cfg = load_config(served["cfg"], {"accept.prompts": 2, "accept.max_tokens": 12, "accept.server": "vllm"})
    with start_in_thread(ModelServerOptions(model=str(served["target"]), port=0, threads=1, drafter=str(drafter),
                                            served_model_name=cfg.model.id, num_speculative_tokens=3)) as srv:
        rep = run_accept(cfg, drafter=drafter, base_url=srv.base_url, echo=lambda s: None)
    assert rep.k == 3 and rep.acceptance.drafts > 0 and 1.0 <= rep.acceptance.acceptance_length <= 4.0


# -- issue 31: one outcome for every state that arrives, and a spot check the server cannot see -----------------


def _hostile_config(s: dict[str, Any], tmp: Path, url: str, name: str, **train: Any) -> Path:
    """A run directory of its own in ``tmp`` (the merged rows of ``s``), one trainer process, the server ``url``."""
    run = tmp / "run"
    if not run.exists():
        shutil.copytree(s["tmp"] / "run" / "merged", run / "merged")
        shutil.copy(s["tmp"] / "run" / MARKER, run / MARKER)
    data = yaml.safe_load(s["cfg"].read_text())
    data["run_dir"] = str(run)
    data["hidden_states"] = {"model": str(s["target"]), "base_urls": [url], "connector_dir": str(s["hs"]),
                             "teacher_min_margin": None}
    data["train"] = {"speculators": str(speculators_python()), "algorithm": "eagle3", "draft_vocab_size": 64,
                     "total_seq_len": 96, "epochs": 1, "online_check_rows": 2, "nproc_per_node": 1, "online": True,
                     **train}
    return write_config(tmp, data, name)


def _wait(cond: Any, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_hostile_server_after_a_kill_excludes_every_sample_and_nothing_is_published(
        served: dict[str, Any], tmp_path: Path) -> None:
    """Items 10, 1, 8, 9, 6 and 7 in one rerun. First ``draftgen train --online`` is killed (kill -9) while it
    waits on a connector file whose lock the server holds (its preflight's first: the same claims as the proxy's;
    test_train_proxy.py kills a proxy mid-service). The rerun sweeps what it left, then trains
    behind a server that, after an honest preflight, sends only broken samples: unreadable files, files with a
    layer too many or without token_ids, other prompt ids, locks held past the timeout. Every sample is
    excluded and counted (none is a server error), nothing is published (exit 3, train.json says why), and
    no connector file, lock, copy or claim is left."""
    s = {**served, "hs": served["tmp"] / "hs"}
    upstream = served["clean"].root_url
    rd = RunDir(tmp_path / "run")
    with ExtractMITM(upstream, lambda n, _b, _s: "hold" if n == 1 else None, hold_s=600) as first:
        cfg1 = _hostile_config(s, tmp_path, first.url, "killed.yaml")
        with open(tmp_path / "killed.log", "w") as log:
            child = subprocess.Popen([str(Path(sys.executable).parent / "draftgen"), "train", str(cfg1), "--online"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait(lambda: first.holds or child.poll() is not None, "the killed run's proxy asked for a sample")
            assert child.poll() is None, (tmp_path / "killed.log").read_text()[-2000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        first.release.set()
        for t in first.holds:
            t.join(30)
    left = [p for p in first.named if os.path.exists(p)]
    assert left and all(Path(p).parent == s["hs"] for p in left)  # what the kill left in the connector folder
    cycle = ["hold", "truncate", "layers", "ids", "nokeys"]
    with ExtractMITM(upstream, lambda n, _b, _s: None if n <= 2 else cycle[(n - 3) % len(cycle)], hold_s=4.5) as bad:
        cfg2 = _hostile_config(s, tmp_path, bad.url, "hostile.yaml")
        data = yaml.safe_load(cfg2.read_text())
        data["endpoint"] = {**data["endpoint"], "idle_timeout_s": 3, "request_timeout_s": 60}
        data["retry"] = {"max_attempts": 1}
        lines: list[str] = []
        with pytest.raises(ThresholdBroken) as err:
            run_train(load_config(write_config(tmp_path, data, "hostile.yaml")), echo=lines.append)
    assert any("removed" in x and "an interrupted run left" in x for x in lines), lines
    assert "\n" not in str(err.value)
    rep = read_json(rd.train_report, TrainReport)
    on = rep.online
    assert rep.exit_code == 3 and rep.checkpoint is None and not rd.train_drafter.exists()
    assert on is not None and on.requests == on.excluded > 0 and on.passed == 0
    kinds = set(on.excluded_by_check)
    assert {"bad_hidden_states", "ids_mismatch"} <= kinds <= {"bad_hidden_states", "ids_mismatch",
                                                              "hidden_states_timeout"}, on.excluded_by_check
    assert {k for _, k in bad.attacked} >= {"truncate", "layers", "ids", "nokeys"}
    assert not list(rd.train_handover.iterdir())
    # a file whose writer still held its lock when the run stopped stays claimed: the next start removes it
    claimed = {p.name for p in rd.train_connector_claims.iterdir()}
    assert {p.name for p in s["hs"].iterdir()} <= claimed | {f"{n}.lock" for n in claimed}
    assert ConnectorFolder(str(s["hs"]), claims=str(rd.train_connector_claims)).sweep()[1] == 0
    assert not list(s["hs"].iterdir()) and not list(rd.train_connector_claims.iterdir())


@pytest.fixture(scope="module")
def hundred(served: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """110 merged rows of their own (the spot check's test needs more than 100 samples)."""
    tmp = tmp_path_factory.mktemp("online-100")
    cfg = make_merged_run(tmp, n_chat=60, n_code=50, max_tokens=24)
    return {**served, "tmp": tmp, "cfg": cfg, "hs": served["tmp"] / "hs"}


def test_a_server_altering_what_it_believes_unchecked_is_caught_within_100_samples(
        hundred: dict[str, Any], tmp_path: Path) -> None:
    """Item 2 and the issue's "done when": a server, honest through the preflight, then shifting the states by
    one position on every sample it believes unchecked (a request without prompt_logprobs, or a sample whose
    sha256(sample_id) falls outside the default teacher_fraction: the old rule), is caught by the log-prob spot
    check within the first 100 samples at the default teacher_fraction (0.05): the run fails naming the server
    and the check, every request asked for prompt_logprobs, and nothing is published."""
    rows = merged_rows(hundred["tmp"] / "run")
    ids = {tuple(i): sid for sid, i, _ in rows}
    assert len(rows) > 100

    def shift(n: int, body: dict[str, Any], sid: str) -> str | None:
        checked = "prompt_logprobs" in body and teacher_selected(sid, 0.05)
        return None if n <= 2 or checked else "shift"

    with ExtractMITM(hundred["clean"].root_url, shift, sample_ids=ids) as bad:
        cfg = load_config(_hostile_config(hundred, tmp_path, bad.url, "spot.yaml", total_seq_len=512))
        assert cfg.hidden_states.teacher_fraction == 0.05  # the default
        with pytest.raises(ThresholdBroken) as err:
            run_train(cfg, echo=lambda _s: None)
    msg = str(err.value)
    assert bad.url in msg and "teacher_reference" in msg and "\n" not in msg
    at = int(msg.split(", request ")[1].split(" ")[0])
    assert 1 <= at <= 100, msg
    assert bad.attacked and all(b.get("prompt_logprobs") == 0 for b in bad.bodies)
    assert not RunDir(tmp_path / "run").train_drafter.exists()
