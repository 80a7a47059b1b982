"""Starting speculators for ``draftgen train``: its flags, one process or ``torchrun``'s, what it streams back,
and which of its checkpoints a run may resume from.

- ``find_speculators_python`` / ``has_gpu``: speculators' own Python (``train.speculators`` or
  ``DRAFTGEN_SPECULATORS``), and whether it sees a usable accelerator;
- ``speculators_args``: the ``speculators train`` flags of the run (``--speculator-type`` and the algorithm's
  flags from ``hidden.algorithms``, the aux ids it trains on, the ``train`` section);
- ``launch_command``: ``python speculators_runner.py ARGS``, or with ``train.nproc_per_node`` /
  ``train.nnodes`` above 1 the same under ``python -m torch.distributed.run`` (torchrun, from speculators' own
  torch), one process per GPU (gloo processes on a CPU); every rank reads the same inputs;
- ``run_trainer``: runs it in its own process group (``guards.start_trainer``), streams each metric line into
  ``train/log.jsonl`` (``parse_metrics``) and speculators' console into ``train/speculators.log``, and stops it
  when the verifier norm it trains with is not the target's (``check_norm``);
- ``last_complete`` / ``global_step``: the runner writes ``draftgen-complete.json`` into a checkpoint folder
  after every rank finished saving it. The last folder that has one is resumed from; a later folder without
  one (a kill during the save, on any rank) is moved aside to ``checkpoints/incomplete-<epoch>`` first, so
  speculators resumes from the last complete one too. Checkpoints of a runner that wrote no markers are
  taken as they are (the last one with weights and config).
- ``samples_seen``: what the drafter of a checkpoint trained on, as the runner counted it into that marker.

Reads speculators' checkpoint folders; writes log.jsonl, speculators.log, and renames incomplete checkpoints.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from draftgen.errors import ConfigError, DraftgenError
from draftgen.phases.train.guards import start_trainer, stop_trainer
from draftgen.records import TrainLogRecord
from draftgen.store import JsonlWriter, decode_json_object, read_json_object

if TYPE_CHECKING:
    from draftgen.config.train import TrainConfig
    from draftgen.hidden.algorithms import Algorithm
    from draftgen.phases import Echo
    from draftgen.rundir import RunDir

__all__ = ["COMPLETE", "ENV", "NORM_PREFIX", "ONLINE_FLAG", "PREFIX", "RUNNER", "SELECT_FLAG", "SamplesSeen",
           "TrainerRun", "find_speculators_python", "global_step", "has_gpu", "last_complete", "launch_command",
           "offline_al", "parse_metrics", "run_trainer", "samples_seen", "speculators_args"]

ENV = "DRAFTGEN_SPECULATORS"
RUNNER = Path(__file__).with_name("speculators_runner.py")
# the runner's own spellings (it imports nothing of draftgen;
# tests/phases/train/test_train.py keeps them equal)
PREFIX = "@@draftgen-metrics "
NORM_PREFIX = "@@draftgen-verifier-norm "
SELECT_FLAG = "--draftgen-select"
ONLINE_FLAG = "--draftgen-online"
COMPLETE = "draftgen-complete.json"
INCOMPLETE = "incomplete-"


def find_speculators_python(given: str | None) -> str:
    """The Python of speculators' environment, from a ``speculators`` executable or a Python path."""
    name = given or os.environ.get(ENV) or shutil.which("speculators")
    hint = (f"install speculators 0.9 in an environment of its own (scripts/test shows how) and set {ENV} or "
            "train.speculators to its `speculators` executable or its python")
    if not name:
        raise ConfigError(f"speculators not found; {hint}")
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"speculators {name!r} (train.speculators or {ENV}) does not exist; {hint}")
    if path.name.startswith("python"):
        return str(path)
    sibling = path.with_name("python")
    if sibling.is_file():
        return str(sibling)
    first = path.read_bytes()[:300].split(b"\n", 1)[0]
    if first.startswith(b"#!"):
        return first[2:].decode().strip().split()[0]
    raise ConfigError(f"{name}: cannot tell which python runs it; set {ENV} to that python instead")


def has_gpu(python: str) -> bool:
    """Whether speculators' Python sees a usable accelerator. A CPU-only host is a CPU whatever torch was
    built for: ``check_available=True`` (without it torch names its compiled-in backend, e.g. CUDA)."""
    probe = "import torch; print(torch.accelerator.current_accelerator(check_available=True) is not None)"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    return out.stdout.strip() == "True"


def speculators_args(*, verifier: Path, data: Path, save: Path, vocab: tuple[Path, Path] | None,
                     aux_ids: list[int], alg: Algorithm, tc: TrainConfig, gpu: bool) -> list[str]:
    """The ``speculators train`` flags for this run (``tc``: the ``train`` config section; ``vocab``: the
    d2t/t2d files of the draft vocabulary, None for the target's whole one)."""
    mapping = ["--d2t-path", str(vocab[0]), "--t2d-path", str(vocab[1])] if vocab is not None else []
    args = ["--verifier-name-or-path", str(verifier), "--data-path", str(data), "--save-path", str(save),
            "--speculator-type", alg.speculator_type, *alg.flags, *mapping,
            "--target-layer-ids", *[str(i) for i in aux_ids], "--ttt-steps", str(tc.ttt_steps),
            "--epochs", str(tc.epochs), "--lr", str(tc.lr), "--optimizer", tc.optimizer,
            "--total-seq-len", str(tc.total_seq_len), "--train-data-ratio", str(tc.train_data_ratio),
            "--checkpoint-freq", str(tc.checkpoint_freq), "--hidden-states-dtype", tc.hidden_states_dtype,
            "--draft-attn-impl", tc.draft_attn_impl or ("simple_flex_attention" if gpu else alg.cpu_attn),
            "--loss-implementation", tc.loss_implementation or ("fused" if gpu else "eager"),
            "--seed", str(tc.seed), "--num-workers", str(tc.num_workers), "--log-dir", str(save / "metrics")]
    if tc.max_steps is not None:
        args += ["--max-steps", str(tc.max_steps)]
    return args + list(tc.extra_args)


def launch_command(python: str, tc: TrainConfig, args: list[str]) -> list[str]:
    """The trainer's command line: the runner alone, or under torchrun for several processes/nodes."""
    if tc.nproc_per_node == 1 and tc.nnodes == 1:
        return [python, str(RUNNER), *args]
    return [python, "-m", "torch.distributed.run", f"--nproc-per-node={tc.nproc_per_node}",
            f"--nnodes={tc.nnodes}", f"--node-rank={tc.node_rank}", f"--master-addr={tc.master_addr}",
            f"--master-port={tc.master_port}", str(RUNNER), *args]


def _f(v: Any, default: float = 0.0) -> float:
    """A metric value: the runner sends a NaN (a metric over no tokens) as null, read as ``default``."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


def _per_step(d: dict[str, Any], name: str, suffix: str = "") -> list[float]:
    out: list[float] = []
    while f"{name}_{len(out)}{suffix}" in d:
        out.append(_f(d[f"{name}_{len(out)}{suffix}"]))
    return out


def _scalars(m: dict[str, Any], suffix: str = "") -> dict[str, float]:
    """Every numeric metric, its ``suffix`` dropped (``eal``, ``accept_rate``, ``position_3_acc`` ...)."""
    return {k.removesuffix(suffix): float(v) for k, v in m.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def parse_metrics(line: str) -> TrainLogRecord | None:
    """A ``log.jsonl`` record from one tagged runner line (None for any other line)."""
    if not line.startswith(PREFIX):
        return None
    d = decode_json_object(line[len(PREFIX):])
    epoch = int(d.get("epoch") or 0)
    if "train" in d:
        m, lr = d["train"], d.get("lr")
        lr_v = _f(next(iter(lr.values()))) if isinstance(lr, dict) and lr else (_f(lr) if lr else None)
        prof = d.get("profile") or {}
        return TrainLogRecord(kind="train", global_step=int(d.get("global_step", d.get("step") or 0)), epoch=epoch,
                              loss=_f(m.get("loss")), loss_k=_per_step(m, "loss"),
                              full_acc_k=_per_step(m, "full_acc"), cond_acc_k=_per_step(m, "cond_acc"), lr=lr_v,
                              tokens_per_s=prof.get("tokens_per_s"), step_ms=prof.get("step_ms"), time=time.time(),
                              metrics=_scalars(m))
    if "val" in d:
        m = d["val"]
        return TrainLogRecord(kind="val", global_step=int(d.get("step") or 0), epoch=epoch,
                              loss=_f(m.get("loss_epoch")), loss_k=_per_step(m, "loss", "_epoch"),
                              full_acc_k=_per_step(m, "full_acc", "_epoch"),
                              cond_acc_k=_per_step(m, "cond_acc", "_epoch"), time=time.time(),
                              metrics=_scalars(m, "_epoch"))
    return None


def offline_al(cond_acc: list[float]) -> float:
    """Acceptance length estimate from per-step conditional accuracy: 1 + Σ_k Π_{j≤k} acc_j."""
    total, prod = 1.0, 1.0
    for a in cond_acc:
        prod *= a
        total += prod
    return total


def _fmt(rec: TrainLogRecord) -> str:
    acc = "/".join(f"{a:.3f}" for a in rec.cond_acc_k)
    eal = rec.metrics.get("eal")
    est = f"AL≈{offline_al(rec.cond_acc_k):.2f}" if rec.cond_acc_k else (f"eal {eal:.2f}" if eal else "")
    if rec.kind == "val":
        return f"train: epoch {rec.epoch} validation loss {rec.loss:.4f} cond_acc {acc} ({est})"
    return f"train: step {rec.global_step} epoch {rec.epoch} loss {rec.loss:.4f} cond_acc {acc}"


class TrainerRun(NamedTuple):
    steps: int
    seconds: float
    last_train: TrainLogRecord | None
    last_val: TrainLogRecord | None
    norm_sha256: str | None  # the verifier norm the trainer built (its runner's line)


def _lines(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stdout is not None
    for raw in proc.stdout:
        yield raw.rstrip("\n")


def run_trainer(cmd: list[str], rd: RunDir, echo: Echo, *, check_norm: Callable[[str], str | None]) -> TrainerRun:
    """Run speculators (``cmd``), streaming its metrics into log.jsonl and its console into speculators.log;
    ``check_norm(sha256)`` says what is wrong with the verifier norm it built (None: it is the target's), and
    a wrong one stops it at once. A failed run is a DraftgenError quoting its last line. The child dies with
    draftgen (guards)."""
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    tail: deque[str] = deque(maxlen=30)
    last_train: TrainLogRecord | None = None
    last_val: TrainLogRecord | None = None
    norm: str | None = None
    t0, steps = time.perf_counter(), 0
    with JsonlWriter(rd.train_log) as log, open(rd.train_speculators_log, "a", encoding="utf-8") as raw:
        proc = start_trainer(cmd, env)
        try:
            for line in _lines(proc):
                if line.startswith(NORM_PREFIX):
                    norm = str(decode_json_object(line[len(NORM_PREFIX):])["sha256"])
                    problem = check_norm(norm)
                    if problem:
                        raise DraftgenError(problem)
                    continue
                rec = parse_metrics(line)
                if rec is None:
                    raw.write(line + "\n")
                    tail.append(line)
                    continue
                log.write(rec)
                if rec.kind == "train":
                    last_train, steps = rec, steps + 1
                else:
                    last_val = rec
                if rec.kind == "val" or rec.global_step % 10 == 0:
                    echo(_fmt(rec))
        except BaseException:
            stop_trainer(proc)
            raise
        rc = proc.wait()
    if rc != 0:
        why = next((t for t in reversed(tail) if t.strip()), "")
        raise DraftgenError(f"speculators train failed (exit {rc}): {why.strip()[:300]}; its output is in "
                            f"{rd.train_speculators_log}")
    return TrainerRun(steps, time.perf_counter() - t0, last_train, last_val, norm)


def _epochs(ckpts: Path) -> list[Path]:
    dirs = [p for p in ckpts.iterdir() if p.is_dir() and not p.is_symlink() and p.name.isdigit()] \
        if ckpts.is_dir() else []
    return sorted(dirs, key=lambda p: int(p.name))


def last_complete(ckpts: Path, echo: Echo | None = None) -> Path | None:
    """The checkpoint folder to resume from (see the module docstring); with ``echo``, later incomplete folders
    are moved aside to ``incomplete-<epoch>`` (replacing an earlier one of that name) and said so."""
    epochs = _epochs(ckpts)
    marked = [p for p in epochs if (p / COMPLETE).is_file()]
    if not marked:  # a runner that wrote no markers: the last one with weights and config
        done = [p for p in epochs if (p / "model.safetensors").is_file() and (p / "config.json").is_file()]
        return done[-1] if done else None
    last = marked[-1]
    for p in epochs:
        if int(p.name) > int(last.name) and echo is not None:
            aside = ckpts / f"{INCOMPLETE}{p.name}"
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(p, aside)
            echo(f"train: checkpoint {p} was never completed (no {COMPLETE}: killed while saving); moved to "
                 f"{aside.name}, resuming from {last.name}")
    return last


def global_step(epoch_dir: Path | None) -> int:
    if epoch_dir is None or not (epoch_dir / "training_state.json").is_file():
        return 0
    return int(read_json_object(epoch_dir / "training_state.json").get("global_step", 0))


class SamplesSeen(NamedTuple):
    """What the drafter of a checkpoint trained on, from its first step (the runner's count, all ranks): the
    training split's rows, those its training batches asked for, those with a loss token in one of them."""

    rows: int
    asked: int
    trained: int


def samples_seen(epoch_dir: Path) -> SamplesSeen | None:
    """The checkpoint's ``SamplesSeen`` (its ``draftgen-complete.json``); None when it does not say: no marker
    (a runner that wrote none) or ``samples`` null (not counted: see the runner's docstring)."""
    marker = epoch_dir / COMPLETE
    if not marker.is_file():
        return None
    got = read_json_object(marker).get("samples")
    if not isinstance(got, dict):
        return None
    try:
        return SamplesSeen(int(got["rows"]), int(got["asked"]), int(got["trained"]))
    except (KeyError, TypeError, ValueError):
        raise DraftgenError(f"{marker}: 'samples' is not the runner's (rows, asked, trained); rerun with "
                            "--restart") from None
