"""``draftgen train --online`` on many processes (issue 25 items 1 and 4), all on a CPU.

A merged run from the emulator pipeline and a tiny Qwen3 target served by ``draftgen emulate --model`` in
extract mode (vLLM's protocol: connector files, ``prompt_logprobs``). The server is made to write NaN states
for every 4th sample (``--extract-fault nan_every_4``): the preflight passes (its rows come first), then the
checking proxy excludes each bad sample, which speculators leaves out of its batch; the run counts them.
Training is EAGLE-3.1 under torchrun with two processes (gloo), both taking samples through the one proxy;
no hidden state is stored; a second run resumes from the last complete checkpoint, setting aside one that
was never completed; the drafter is served by ``draftgen emulate --drafter`` and measured by ``accept``. A
server whose final state is taken after the norm is stopped by the preflight, named with the check.
(speculators' own online client reading the emulator directly: tests/test_train_algorithms.py.)

Sizes are the smallest that exercise each path (ten rows, one epoch, then one more); the CPU time is mostly
speculators' start-up in each of the two processes.
"""

from __future__ import annotations

import json
import shutil
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
from draftgen.config import load_config  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, RunningModelServer, start_in_thread  # noqa: E402
from draftgen.errors import DraftgenError  # noqa: E402
from draftgen.phases.online import MAX_FILES, run_train_online  # noqa: E402
from draftgen.phases.train.launch import COMPLETE  # noqa: E402
from draftgen.records import TrainLogRecord, TrainReport  # noqa: E402
from draftgen.rundir import MARKER, RunDir  # noqa: E402
from draftgen.store import iter_jsonl  # noqa: E402


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
                             "connector_dir": str(s["tmp"] / "hs"), "teacher_fraction": 0.5,
                             "teacher_min_margin": None, "max_flagged_fraction": 1.0}
    data["train"] = {"speculators": str(speculators_python()), "algorithm": "eagle3.1", "draft_vocab_size": 64,
                     "total_seq_len": 96, "epochs": 1, "online_check_rows": 2, "nproc_per_node": 2,
                     "master_port": 29641, **train}
    return write_config(s["tmp"], data, name)


@pytest.fixture(scope="module")
def first(served: dict[str, Any]) -> dict[str, Any]:
    lines: list[str] = []
    rep = run_train_online(load_config(_config(served, served["server"], "online.yaml")), echo=lines.append)
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
    rep = run_train_online(load_config(_config(served, served["clean"], "online2.yaml", epochs=2)),
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
            run_train_online(cfg, echo=lambda s: None)
    msg = str(err.value)
    assert bad.root_url in msg and "teacher_reference on 2 of 2 rows" in msg and "\n" not in msg
    assert not RunDir(tmp_path / "run").train_checkpoints.exists()  # stopped before any training step


def test_the_online_drafter_is_served_and_measured(served: dict[str, Any], first: dict[str, Any]) -> None:
    from draftgen.phases.accept import run_accept

    drafter = RunDir(served["tmp"] / "run").train_drafter
    cfg = load_config(served["cfg"], {"accept.prompts": 2, "accept.max_tokens": 12, "accept.server": "vllm"})
    with start_in_thread(ModelServerOptions(model=str(served["target"]), port=0, threads=1, drafter=str(drafter),
                                            served_model_name=cfg.model.id, num_speculative_tokens=3)) as srv:
        rep = run_accept(cfg, drafter=drafter, base_url=srv.base_url, echo=lambda s: None)
    assert rep.k == 3 and rep.acceptance.drafts > 0 and 1.0 <= rep.acceptance.acceptance_length <= 4.0
