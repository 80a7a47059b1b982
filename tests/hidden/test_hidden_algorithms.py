"""``draftgen.hidden.algorithms``: the layers each drafter algorithm takes from one capture, what a set feeds,
the disk each choice costs, and the trainer launch (one process or torchrun) and runner spellings that go with
them. Pure arithmetic and strings: no model, no speculators run (tests/phases/train/test_train_algorithms.py
trains them)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftgen.config.train import ALGORITHM_NAMES
from draftgen.errors import ConfigError
from draftgen.hidden.algorithms import (
    ALGORITHMS,
    algorithm,
    bytes_per_token,
    default_aux,
    feeds,
    feeds_lines,
    select,
    union_aux,
)
from draftgen.phases.train import launch


def test_the_config_offers_exactly_the_table() -> None:
    assert tuple(ALGORITHMS) == ALGORITHM_NAMES
    with pytest.raises(ConfigError, match=r"train.algorithm 'mtp' is not one of eagle3, eagle3.1, peagle"):
        algorithm("mtp")


def test_default_layers_follow_eagle3_and_zlab_dflash() -> None:
    assert default_aux("eagle3", 36) == [2, 18, 33] == default_aux("peagle", 36) == default_aux("eagle3.1", 36)
    assert default_aux("dflash", 36) == [2, 10, 18, 26, 34]  # z-lab's Qwen3-8B drafters: --target-layer-ids 2 10 18 26 34
    assert default_aux("dspark", 8) == [2, 3, 4, 5, 6] and default_aux("eagle3", 8) == [2, 4, 5]
    assert union_aux(ALGORITHMS, 36) == [2, 10, 18, 26, 33, 34]
    with pytest.raises(ConfigError, match=r"give them in train\.layer_ids"):
        default_aux("dflash", 6)


def test_a_superset_feeds_every_algorithm_and_each_takes_its_own_slots() -> None:
    assert feeds([2, 4, 5], 8) == ["eagle3", "eagle3.1", "peagle"]
    assert feeds([2, 3, 4, 5, 6], 8) == list(ALGORITHMS)
    assert select("eagle3", [2, 3, 4, 5, 6], 8) == ([2, 4, 5], [0, 2, 3])
    assert select("dspark", [2, 3, 4, 5, 6], 8) == ([2, 3, 4, 5, 6], [0, 1, 2, 3, 4])
    assert select("eagle3", [2, 3, 4, 5, 6], 8, chosen=[3, 6, 2]) == ([2, 3, 6], [0, 1, 4])
    with pytest.raises(ConfigError) as err:
        select("dflash", [2, 4, 5], 8)
    msg = str(err.value)
    assert "missing [3, 6]" in msg and "feeds eagle3, eagle3.1, peagle" in msg and "[2, 3, 4, 5, 6]" in msg


def test_disk_per_layer_choice_and_the_lines_plan_and_extract_print() -> None:
    assert bytes_per_token(3, 7168, "bf16") == 4 * 7168 * 2
    assert bytes_per_token(5, 7168, "fp8") == 6 * 7168 + 8
    lines = feeds_lines([2, 4, 5], 36, 4096, "bf16", 10**6)
    assert lines[0].startswith("layers [2, 4, 5] + final 36: feeds no algorithm by its defaults")
    lines = feeds_lines([2, 18, 33], 36, 4096, "bf16", 10**6)
    assert "feeds eagle3, eagle3.1, peagle (32.8 GB)" in lines[0]
    assert any("dflash/dflash2/dspark/xpress: layers [2, 10, 18, 26, 34] + final, 49.2 GB alone" in x for x in lines)
    assert any("every algorithm from one capture: hidden_states.layer_ids [2, 10, 18, 26, 33, 34], 57.3 GB" in x
               for x in lines)


def test_serve_lines_and_the_trainer_command() -> None:
    assert algorithm("peagle").serve_line("/m/t", "/r/drafter", 7) == (
        "vllm serve /m/t --speculative-config '{\"method\": \"eagle3\", \"model\": \"/r/drafter\", "
        "\"num_speculative_tokens\": 7, \"parallel_drafting\": true}'")
    assert '"method": "dspark"' in algorithm("dspark").serve_line("t", "d", 4)
    tc = SimpleNamespace(nproc_per_node=1, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29500)
    assert launch.launch_command("py", tc, ["--x"]) == ["py", str(launch.RUNNER), "--x"]  # type: ignore[arg-type]
    tc.nproc_per_node, tc.nnodes, tc.node_rank, tc.master_addr = 4, 2, 1, "10.0.0.1"
    assert launch.launch_command("py", tc, ["--x"]) == [  # type: ignore[arg-type]
        "py", "-m", "torch.distributed.run", "--nproc-per-node=4", "--nnodes=2", "--node-rank=1",
        "--master-addr=10.0.0.1", "--master-port=29500", str(launch.RUNNER), "--x"]


def test_the_runner_spells_what_draftgen_reads() -> None:
    """speculators_runner.py imports nothing of draftgen: its constants must equal launch's."""
    tree = ast.parse(Path(launch.RUNNER).read_text(encoding="utf-8"))
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              for t in n.targets if isinstance(t, ast.Name)}
    assert consts["PREFIX"] == launch.PREFIX and consts["NORM_PREFIX"] == launch.NORM_PREFIX
    assert consts["SELECT_FLAG"] == launch.SELECT_FLAG and consts["ONLINE_FLAG"] == launch.ONLINE_FLAG
    assert consts["COMPLETE"] == launch.COMPLETE


def test_resume_takes_the_last_complete_checkpoint(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    for epoch, complete in ((0, True), (1, True), (2, False)):
        d = ckpts / str(epoch)
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x")
        (d / "config.json").write_text("{}")
        if complete:
            (d / launch.COMPLETE).write_text("{}")
    assert launch.last_complete(ckpts) == ckpts / "1"  # without echo nothing is moved
    assert (ckpts / "2").is_dir()
    lines: list[str] = []
    assert launch.last_complete(ckpts, lines.append) == ckpts / "1"
    assert not (ckpts / "2").exists() and (ckpts / "incomplete-2" / "model.safetensors").is_file()
    assert len(lines) == 1 and "never completed" in lines[0] and "resuming from 1" in lines[0]
    legacy = tmp_path / "legacy"  # checkpoints of a runner that wrote no markers: the last one with weights
    for epoch in (0, 1):
        (legacy / str(epoch)).mkdir(parents=True)
        (legacy / str(epoch) / "model.safetensors").write_bytes(b"x")
        (legacy / str(epoch) / "config.json").write_text("{}")
    assert launch.last_complete(legacy, lines.append) == legacy / "1"
