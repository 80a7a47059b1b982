"""``draftgen train`` cannot publish the wrong drafter (issue 21): a verifier other than the extraction
target is refused; a checkpoint that does not load is neither resumed from nor published (the previous
drafter/, eagle3/ and train.json stay as they were); an incomplete hidden set is refused unless
``--allow-partial`` (and then recorded); a CUDA build of torch on a CPU-only host counts as a CPU; bad train
settings are refused at config load; log.jsonl holds each global step once across a kill -9 and a resume;
and the speculators child dies with draftgen, kill -9 included.

Real speculators (``DRAFTGEN_SPECULATORS`` / .venv-speculators) trains a tiny target's real hidden states
on the CPU, as in tests/phases/train/test_train.py; the detection test alone uses a fake ``torch`` for the
probe.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import config_dict, write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run  # noqa: E402
from _hidden_export_helpers import make_hidden_set, speculators_python  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.errors import ConfigError, DraftgenError, InputError  # noqa: E402
from draftgen.phases.train.launch import RUNNER  # noqa: E402
from draftgen.phases.train.run import run_train  # noqa: E402
from draftgen.phases.train.trainer import read_report  # noqa: E402
from draftgen.records import TrainLogRecord  # noqa: E402
from draftgen.rundir import RunDir  # noqa: E402
from draftgen.store import iter_jsonl  # noqa: E402

from ._helpers import cli_cmd, cli_env  # noqa: E402

DRAFT_VOCAB = 256
SEQ = 64  # one sample per batch: about ten steps an epoch, so a kill lands well before the next checkpoint


def _config(tmp: Path, model_dir: Path, hidden: Path, name: str = "train.yaml", **train: Any) -> Path:
    data = config_dict(tmp, progress="off", hidden_states={"model": str(model_dir), "output": str(hidden)},
                       train={"speculators": str(speculators_python()), "draft_vocab_size": DRAFT_VOCAB,
                              "total_seq_len": SEQ, "epochs": 1, "ttt_steps": 2, **train})
    return write_config(tmp, data, name)


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny target and a complete hidden set of 12 samples extracted from it."""
    torch.set_num_threads(1)
    speculators_python()
    root = tmp_path_factory.mktemp("guards")
    model_dir = build_tiny_model(root / "target", layers=8, hidden=64)
    hidden, _ = make_hidden_set(model_dir, root / "hidden", n=12)
    return {"root": root, "model_dir": model_dir, "hidden": hidden}


def _trained(tmp: Path, target: dict[str, Path]) -> tuple[Path, RunDir]:
    """One finished epoch in ``tmp/run``; returns (its config, its run directory)."""
    cfg_path = _config(tmp, target["model_dir"], target["hidden"])
    cfg = load_config(cfg_path)
    run_train(cfg, echo=_quiet, argv=["draftgen", "train"])
    return cfg_path, RunDir(cfg.run_path)


def _snapshot(rd: RunDir) -> dict[str, bytes]:
    out = {}
    for folder in (rd.train_drafter, rd.train_eagle):
        for f in sorted(folder.iterdir()):
            out[f"{folder.name}/{f.name}"] = f.read_bytes()
    out["train.json"] = rd.train_report.read_bytes()
    return out


# -- 7 ------------------------------------------------------------------------------------------------------


def _other_target(src: Path, dest: Path, *, norm_scale: float = 1.0, **config: Any) -> Path:
    """A copy of the target with its final norm scaled and/or config.json keys changed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dest)
    if norm_scale != 1.0:
        weights = load_file(str(dest / "model.safetensors"))
        weights["model.norm.weight"] = weights["model.norm.weight"] * norm_scale
        save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    if config:
        cfg = json.loads((dest / "config.json").read_text())
        cfg.update(config)
        (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_item07_wrong_verifier_refused(target: dict[str, Path], tmp_path: Path) -> None:
    cases = {
        "norm": (_other_target(target["model_dir"], tmp_path / "other-norm", norm_scale=1.5), "final norm"),
        "layers": (_other_target(target["model_dir"], tmp_path / "other-layers", num_hidden_layers=6),
                   "num_hidden_layers is 6, the hidden set's 8"),
    }
    for name, (other, what) in cases.items():
        cfg = load_config(_config(tmp_path / name, target["model_dir"], target["hidden"], verifier=str(other)))
        with pytest.raises(ConfigError) as err:
            run_train(cfg, echo=_quiet, argv=["draftgen", "train"])
        msg = str(err.value)
        assert "\n" not in msg and what in msg
        assert str(other) in msg and str(target["model_dir"]) in msg  # names both: the verifier and the target
        assert not RunDir(cfg.run_path).train_checkpoints.exists()  # refused before any training


# -- 10 -----------------------------------------------------------------------------------------------------


def test_item10_truncated_checkpoint_not_published(target: dict[str, Path], tmp_path: Path) -> None:
    cfg_path, rd = _trained(tmp_path, target)
    before = _snapshot(rd)
    ckpt = rd.train_checkpoints / "0"
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a save cut short
    with pytest.raises(DraftgenError) as err:
        run_train(load_config(cfg_path), echo=_quiet, argv=["draftgen", "train"])
    msg = str(err.value)
    assert "\n" not in msg and str(ckpt) in msg and "--restart" in msg and "delete" in msg
    assert _snapshot(rd) == before  # the previous drafter/, eagle3/ and train.json, untouched
    assert not [p for p in rd.train_drafter.parent.iterdir() if p.name.startswith((".publish", ".drafter", ".eagle"))]


# -- 11 -----------------------------------------------------------------------------------------------------


def test_item11_partial_set_refused_unless_allowed(target: dict[str, Path], tmp_path: Path) -> None:
    import yaml

    from draftgen.phases.extract.run import run_extract

    cfg_path = make_merged_run(tmp_path, n_chat=6, n_code=4, max_tokens=24, model=str(target["model_dir"]),
                               backend="hf", device="cpu", dtype="fp32", compute_dtype="fp32", teacher_fraction=0.0)
    run_extract(load_config(cfg_path), echo=_quiet, limit=4)  # 4 of the 10 merged rows
    data = yaml.safe_load(cfg_path.read_text())
    data["train"] = {"speculators": str(speculators_python()), "draft_vocab_size": DRAFT_VOCAB,
                     "total_seq_len": SEQ, "epochs": 1, "ttt_steps": 2}
    train_cfg = write_config(tmp_path, data, "train.yaml")
    with pytest.raises(InputError) as err:
        run_train(load_config(train_cfg), echo=_quiet, argv=["draftgen", "train"])
    msg = str(err.value)
    assert "\n" not in msg and "6 of 10 samples are missing" in msg and "--allow-partial" in msg
    rd = RunDir(load_config(train_cfg).run_path)
    assert not rd.train_checkpoints.exists()
    lines: list[str] = []
    report = run_train(load_config(train_cfg, {"train.allow_partial": True}), echo=lines.append,
                       argv=["draftgen", "train"])
    assert report.partial and report.missing_samples == 6 and report.samples == 4
    assert read_report(rd).partial and any("incomplete" in x and "--allow-partial" in x for x in lines)


# -- 13 -----------------------------------------------------------------------------------------------------

_FAKE_TORCH = '''
import os


class device(str):
    pass


class accelerator:
    @staticmethod
    def current_accelerator(check_available=False):
        usable = os.environ.get("FAKE_GPU") == "1"
        return device("cuda") if usable or not check_available else None  # a CUDA build: compiled in


class cuda:
    @staticmethod
    def is_available():
        return os.environ.get("FAKE_GPU") == "1"
'''


def test_item13_cuda_build_without_gpu_is_a_cpu(tmp_path: Path) -> None:
    """A python whose torch is a CUDA build on a host without a GPU: both probes say CPU; with a GPU, GPU."""
    from draftgen.phases.train.launch import has_gpu

    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(_FAKE_TORCH)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "fake"}:{RUNNER.parent} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    runner_probe = "import speculators_runner as r; print(r.on_cpu())"
    for gpu in (False, True):
        os.environ["FAKE_GPU"] = "1" if gpu else "0"
        try:
            assert has_gpu(str(python)) is gpu
            out = subprocess.run([str(python), "-c", runner_probe], capture_output=True, text=True, check=True)
            assert out.stdout.strip() == str(not gpu)
        finally:
            del os.environ["FAKE_GPU"]


# -- 15 -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value", "says"), [
    ("lr", -0.001, "train.lr -0.001 must be >= 0"),
    ("max_steps", 0, "train.max_steps 0 must be >= 1"),
    ("total_seq_len", 0, "train.total_seq_len 0 must be >= 1"),
    ("checkpoint_freq", 0, "train.checkpoint_freq 0.0 must be > 0"),
    ("checkpoint_freq", 1.5, "whole number of epochs"),
    ("optimizer", "sgd", "train.optimizer 'sgd' is not one of muon, adamw"),
    ("hidden_states_dtype", "float16", "train.hidden_states_dtype 'float16' is not one of bfloat16, float32"),
    ("hidden_states_dtype", "bf16", "is not one of bfloat16, float32"),
    ("draft_attn_impl", "flash", "is not one of simple_flex_attention, sdpa, eager"),
])
def test_item15_bad_train_settings_refused_at_load(tmp_path: Path, key: str, value: Any, says: str) -> None:
    path = write_config(tmp_path, config_dict(tmp_path, train={key: value}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


def test_item15_lr_zero_and_the_documented_example_load(tmp_path: Path) -> None:
    import yaml

    assert load_config(write_config(tmp_path, config_dict(tmp_path, train={"lr": 0}))).train.lr == 0.0
    doc = (Path(__file__).resolve().parents[2] / "docs" / "train.md").read_text()
    example = doc.split("## `draftgen train`", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    train = yaml.safe_load(example)["train"]
    cfg = load_config(write_config(tmp_path, config_dict(tmp_path, train=train), "doc.yaml"))
    assert cfg.train.lr == pytest.approx(1e-4)


# -- 16 and 17: kill -9 of draftgen train ---------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` and that run the speculators runner."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and RUNNER.name.encode() in cmd:
            out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_cli(cfg_path: Path) -> subprocess.Popen[bytes]:
    env = cli_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen(cli_cmd("train", str(cfg_path)), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _wait(what: str, cond: Any, proc: subprocess.Popen[bytes], timeout: float = 240) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"draftgen train exited ({proc.returncode}) before {what}"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def _train_steps(rd: RunDir) -> list[int]:
    return [r.global_step for _, r in iter_jsonl(rd.train_log, TrainLogRecord) if r.kind == "train"]


def test_item16_log_holds_each_step_once_after_kill9_and_resume(target: dict[str, Path], tmp_path: Path) -> None:
    _, rd = _trained(tmp_path, target)
    first = _train_steps(rd)
    g = len(first)
    assert first == list(range(g)) and g >= 5
    more = _config(tmp_path, target["model_dir"], target["hidden"], "more.yaml", epochs=2)
    proc = _start_cli(more)
    _wait("a step of the resumed run", lambda: len(_train_steps(rd)) > g + 1, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (rd.train_checkpoints / "1").exists(), "the kill came after the next checkpoint; nothing to test"
    assert _train_steps(rd)[g] == g  # the killed run logged steps the rerun will take again
    report = run_train(load_config(more), echo=_quiet, argv=["draftgen", "train"])
    assert report.first_step == g
    assert _train_steps(rd) == list(range(report.last_step))  # each global step once
    vals = [r for _, r in iter_jsonl(rd.train_log, TrainLogRecord) if r.kind == "val"]
    assert [v.epoch for v in vals] == [0, 1]


def test_item17_trainer_dies_with_draftgen(target: dict[str, Path], tmp_path: Path) -> None:
    cfg_path = _config(tmp_path, target["model_dir"], target["hidden"])
    proc = _start_cli(cfg_path)
    child = _wait("the speculators child", lambda: _children(proc.pid), proc)[0]
    group = os.getpgid(child)
    os.kill(proc.pid, signal.SIGKILL)  # the child is still starting up: it prints nothing to notice with
    proc.wait()
    deadline = time.monotonic() + 3
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived, "the speculators trainer outlived draftgen train"
    assert group == child  # its own process group (what draftgen kills on an error or Ctrl-C)
