"""``draftgen train``: an EAGLE-3 drafter trained by speculators 0.9 on the extracted hidden states.

Reads the hidden set (``train.hidden``, default ``hidden_states.output`` / ``<run>/hidden``) and the target
model folder (``train.verifier``, default ``hidden_states.model``, else the manifest's target name). Writes,
under ``<run>/train/`` (``RunDir.train_*``):

    inputs/        what speculators reads besides the states (train.inputs): its Arrow dataset (ids, loss
                   masks, lengths), token_freq.pt and draftgen_states.json (row i -> the set's own state
                   file, read in place: no second copy); for an object-store set, the full speculators export
    vocab/         d2t.npy (int64 offsets), t2d.npy (bool): the draft vocabulary (train.vocab)
    checkpoints/   speculators' own checkpoints (<epoch>/ with optimizer state; it resumes from the last)
    drafter/       the last checkpoint's config.json + model.safetensors: ``vllm serve train/drafter``
    eagle3/        the same drafter in the flat EAGLE-3 format (train.convert): SGLang's draft model path
    log.jsonl      TrainLogRecord lines: loss and per-TTT-step accuracy, every step and every validation
    speculators.log  speculators' own console output
    train.json     TrainReport, written last

speculators runs as a subprocess in its own environment (``train.speculators`` / ``DRAFTGEN_SPECULATORS``:
its ``speculators`` executable or its Python): ``speculators_runner.py`` (a file of this package that
imports only speculators) calls speculators' trainer with the flags built here, fixes what it lacks on a
machine without a GPU, and prints each metric record as a tagged JSON line. Layer ids go as
``--target-layer-ids`` = the manifest's aux ids (vLLM convention, which speculators uses unshifted).
A rerun resumes from the last checkpoint (step count continues; log.jsonl keeps each step once); a changed
hidden set is refused unless ``restart``. Before anything is trained (``guards``): the verifier must be the
extraction target, the set complete (or ``train.allow_partial``), the checkpoint resumed from loadable; the
new checkpoint is loaded before drafter/ and eagle3/ are swapped in, train.json last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from draftgen.config import RunConfig
from draftgen.errors import ConfigError, DraftgenError, InputError
from draftgen.phases import Echo
from draftgen.phases.train.convert import to_eagle3
from draftgen.phases.train.guards import (
    check_checkpoint,
    check_complete,
    check_verifier,
    start_trainer,
    stop_trainer,
    trim_log,
)
from draftgen.phases.train.vocab import build_vocab_mapping, save_vocab_mapping
from draftgen.records import HiddenExportReport, TrainLogRecord, TrainReport
from draftgen.rundir import RunDir, writer
from draftgen.store import (
    JsonlWriter,
    atomic_write_json,
    decode_json,
    decode_json_object,
    read_json,
    read_json_object,
)

if TYPE_CHECKING:
    from draftgen.phases import PhaseContext, PhaseOutcome
    from draftgen.tokens import Profile

__all__ = [
    "find_speculators_python", "has_gpu", "offline_al", "parse_metrics", "read_report", "run_train", "speculators_args",
]


ENV = "DRAFTGEN_SPECULATORS"
RUNNER = Path(__file__).with_name("speculators_runner.py")
PREFIX = "@@draftgen-metrics "


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


def speculators_args(*, verifier: Path, data: Path, save: Path, d2t: Path, t2d: Path, aux_ids: list[int],
                     tc: Any, gpu: bool) -> list[str]:
    """The ``speculators train`` flags for this run (``tc``: the ``train`` config section)."""
    args = ["--verifier-name-or-path", str(verifier), "--data-path", str(data), "--save-path", str(save),
            "--speculator-type", "eagle3", "--d2t-path", str(d2t), "--t2d-path", str(t2d),
            "--target-layer-ids", *[str(i) for i in aux_ids], "--ttt-steps", str(tc.ttt_steps),
            "--epochs", str(tc.epochs), "--lr", str(tc.lr), "--optimizer", tc.optimizer,
            "--total-seq-len", str(tc.total_seq_len), "--train-data-ratio", str(tc.train_data_ratio),
            "--checkpoint-freq", str(tc.checkpoint_freq), "--hidden-states-dtype", tc.hidden_states_dtype,
            "--draft-attn-impl", tc.draft_attn_impl or ("simple_flex_attention" if gpu else "eager"),
            "--loss-implementation", tc.loss_implementation or ("fused" if gpu else "eager"),
            "--seed", str(tc.seed), "--num-workers", str(tc.num_workers), "--on-missing", "raise",
            "--log-dir", str(save / "metrics")]
    if tc.max_steps is not None:
        args += ["--max-steps", str(tc.max_steps)]
    return args + list(tc.extra_args)


def _per_step(d: dict[str, Any], name: str, suffix: str = "") -> list[float]:
    out: list[float] = []
    while f"{name}_{len(out)}{suffix}" in d:
        out.append(float(d[f"{name}_{len(out)}{suffix}"]))
    return out


def parse_metrics(line: str) -> TrainLogRecord | None:
    """A ``log.jsonl`` record from one tagged runner line (None for any other line)."""
    if not line.startswith(PREFIX):
        return None
    d = decode_json_object(line[len(PREFIX):])
    epoch = int(d.get("epoch") or 0)
    if "train" in d:
        m, lr = d["train"], d.get("lr")
        lr_v = float(next(iter(lr.values()))) if isinstance(lr, dict) and lr else (float(lr) if lr else None)
        prof = d.get("profile") or {}
        return TrainLogRecord(kind="train", global_step=int(d.get("global_step", d.get("step") or 0)), epoch=epoch,
                              loss=float(m.get("loss", 0.0)), loss_k=_per_step(m, "loss"),
                              full_acc_k=_per_step(m, "full_acc"), cond_acc_k=_per_step(m, "cond_acc"), lr=lr_v,
                              tokens_per_s=prof.get("tokens_per_s"), step_ms=prof.get("step_ms"), time=time.time())
    if "val" in d:
        m = d["val"]
        return TrainLogRecord(kind="val", global_step=int(d.get("step") or 0), epoch=epoch,
                              loss=float(m.get("loss_epoch", 0.0)), loss_k=_per_step(m, "loss", "_epoch"),
                              full_acc_k=_per_step(m, "full_acc", "_epoch"),
                              cond_acc_k=_per_step(m, "cond_acc", "_epoch"), time=time.time())
    return None


def offline_al(cond_acc: list[float]) -> float:
    """Acceptance length estimate from per-step conditional accuracy: 1 + Σ_k Π_{j≤k} acc_j."""
    total, prod = 1.0, 1.0
    for a in cond_acc:
        prod *= a
        total += prod
    return total


def _resolve_verifier(cfg: RunConfig, manifest_target: str) -> Path:
    tc = cfg.train
    name = tc.verifier or cfg.hidden_states.model
    path = cfg.path(name) if name else Path(manifest_target)
    if not (path / "config.json").is_file():
        raise ConfigError(f"train.verifier {str(path)!r}: not a model folder (no config.json); speculators needs "
                          "the target model's local folder: set train.verifier (or hidden_states.model)")
    return path


def _target_vocab(verifier: Path) -> int:
    cfg = read_json_object(verifier / "config.json")
    return int((cfg.get("text_config") or cfg)["vocab_size"])


def _last_epoch_dir(ckpts: Path) -> Path | None:
    epochs = [p for p in ckpts.iterdir() if p.is_dir() and p.name.isdigit()] if ckpts.is_dir() else []
    done = [p for p in epochs if (p / "model.safetensors").is_file() and (p / "config.json").is_file()]
    return max(done, key=lambda p: int(p.name)) if done else None


def _global_step(epoch_dir: Path | None) -> int:
    if epoch_dir is None or not (epoch_dir / "training_state.json").is_file():
        return 0
    return int(read_json_object(epoch_dir / "training_state.json").get("global_step", 0))


def _lines(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stdout is not None
    for raw in proc.stdout:
        yield raw.rstrip("\n")


def _fmt(rec: TrainLogRecord) -> str:
    acc = "/".join(f"{a:.3f}" for a in rec.cond_acc_k)
    if rec.kind == "val":
        return f"train: epoch {rec.epoch} validation loss {rec.loss:.4f} cond_acc {acc} (AL≈{offline_al(rec.cond_acc_k):.2f})"
    return f"train: step {rec.global_step} epoch {rec.epoch} loss {rec.loss:.4f} cond_acc {acc}"


def run_train(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
              restart: bool = False, argv: list[str] | None = None) -> TrainReport:
    """Train the drafter (see the module docstring). ``profile``: not needed (the vocabulary comes from the
    hidden set's token counts and the verifier's config). ``force``: hold a run directory made with another
    target (``rundir.writer``). ``restart``: drop earlier checkpoints first. ``argv``: recorded in run.json."""
    with writer(cfg, "train", force=force, argv=argv) as rd:
        return _train(cfg, rd, echo, restart)


def _train(cfg: RunConfig, rd: RunDir, echo: Echo, restart: bool) -> TrainReport:
    from draftgen.hidden.exports import export_hidden
    from draftgen.hidden.format import open_hidden
    from draftgen.hidden.stream import hidden_url
    from draftgen.phases.train.inputs import INDEX_FORMAT, STATES_FLAG, STATES_MAP, build_index

    tc = cfg.train  # its values are checked at config load (TrainConfig.__post_init__)
    python = find_speculators_python(tc.speculators)
    url = hidden_url(cfg, tc.hidden)
    hset = open_hidden(url, dict(cfg.hidden_states.storage_options))
    manifest = hset.manifest
    verifier = _resolve_verifier(cfg, manifest.target.name)
    check_verifier(verifier, manifest, url)
    missing = check_complete(manifest, url, run_root=rd.root, allow_partial=tc.allow_partial, echo=echo)
    data, ckpts = rd.train_inputs, rd.train_checkpoints
    if restart:
        shutil.rmtree(ckpts, ignore_errors=True)
    resume_from = _last_epoch_dir(ckpts)
    if resume_from is not None:
        check_checkpoint(resume_from)  # speculators would resume from it, and it would be published
    before = data / "export.json"
    old = read_json(before, HiddenExportReport) if before.is_file() else None

    def say(line: str) -> None:  # the export's echo returns None; ours may return anything
        echo(line)

    # a local set is read in place (inputs/ holds only the index); an object-store set is copied once
    rep = build_index(hset, data, echo=say) or export_hidden(cfg, ["speculators"], data, hidden=url, echo=say)[0]
    states = [STATES_FLAG, str(data / STATES_MAP)] if rep.format == INDEX_FORMAT else []
    if old is not None and old.manifest_fingerprint != rep.manifest_fingerprint and _last_epoch_dir(ckpts):
        raise InputError(f"{ckpts}: these checkpoints were trained on another hidden set; rerun with --restart "
                         "to train from scratch on the new one")
    if rep.samples < 2:
        raise InputError(f"{url}: {rep.samples} sample(s); speculators needs at least 2 (train and validation)")

    import torch

    freq = torch.load(data / "token_freq.pt", weights_only=True)
    d2t, t2d = build_vocab_mapping({int(k): int(v) for k, v in freq.items()}, tc.draft_vocab_size,
                                   _target_vocab(verifier))
    d2t_path, t2d_path = save_vocab_mapping(rd.train_vocab, d2t, t2d)

    first = 0 if restart else _global_step(_last_epoch_dir(ckpts))
    gpu = has_gpu(python)
    args = speculators_args(verifier=verifier, data=data, save=ckpts, d2t=d2t_path, t2d=t2d_path,
                            aux_ids=list(manifest.layer_ids.aux), tc=tc, gpu=gpu)
    echo(f"train: speculators on {'GPU' if gpu else 'CPU'}, {rep.samples} samples, layers {manifest.layer_ids.aux} "
         f"(vLLM ids), draft vocab {tc.draft_vocab_size}, ttt {tc.ttt_steps}"
         + (f", resuming at step {first}" if first else ""))
    trim_log(rd.train_log, first)  # a killed run's records at or after the resumed step are logged again
    run = _run_trainer([python, str(RUNNER), *args, *states], rd, echo)
    last = _last_epoch_dir(ckpts)
    if last is None:
        raise DraftgenError(f"speculators train saved no checkpoint in {ckpts}; see {rd.train_speculators_log}")
    check_checkpoint(last)
    drafter, eagle = _publish(last, rd)
    steps, seconds, last_train, last_val = run.steps, run.seconds, run.last_train, run.last_val
    latest = last_val or last_train
    acc = latest.cond_acc_k if latest is not None else []
    report = TrainReport(
        exit_code=0, message=f"drafter: {drafter} (vllm serve), {eagle} (SGLang)", verifier=str(verifier),
        hidden=url, samples=rep.samples, layer_ids=list(manifest.layer_ids.aux),
        draft_vocab_size=tc.draft_vocab_size, ttt_steps=tc.ttt_steps, first_step=first,
        last_step=_global_step(last), steps_this_run=steps, seconds=round(seconds, 2),
        steps_per_s=round(steps / seconds, 3) if steps and seconds > 0 else None, checkpoint=str(drafter),
        eagle_checkpoint=str(eagle), final_train=last_train, final_val=last_val,
        offline_al=round(offline_al(acc), 4) if acc else None, partial=missing is not None,
        missing_samples=missing)
    atomic_write_json(rd.train_report, report)  # last: its presence says drafter/ and eagle3/ are this run's
    echo(f"train: {steps} steps this run (global step {report.last_step}) in {seconds:.1f} s; {report.message}")
    return report


class _Run(NamedTuple):
    steps: int
    seconds: float
    last_train: TrainLogRecord | None
    last_val: TrainLogRecord | None


def _run_trainer(cmd: list[str], rd: RunDir, echo: Echo) -> _Run:
    """Run speculators (``cmd``), streaming its metrics into log.jsonl and its console into speculators.log;
    a failed run is a DraftgenError quoting its last line. The child dies with draftgen (guards)."""
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    tail: deque[str] = deque(maxlen=30)
    last_train: TrainLogRecord | None = None
    last_val: TrainLogRecord | None = None
    t0 = time.perf_counter()
    steps = 0
    with JsonlWriter(rd.train_log) as log, open(rd.train_speculators_log, "a", encoding="utf-8") as raw:
        proc = start_trainer(cmd, env)
        try:
            for line in _lines(proc):
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
    return _Run(steps, time.perf_counter() - t0, last_train, last_val)


def _publish(epoch_dir: Path, rd: RunDir) -> tuple[Path, Path]:
    """The (checked) checkpoint as ``train/drafter/`` and ``train/eagle3/``. Both are built in temp folders
    inside train/ first, so a failure leaves the previous pair as it was; train.json is removed before the
    two renames and rewritten after them, so a published pair without train.json is never mistaken for one
    run's (a crash between the renames is the only window, and it leaves no report)."""
    out_d, out_e = rd.train_drafter, rd.train_eagle
    parent = out_d.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".publish-"))
    try:
        new_d = tmp / out_d.name
        new_d.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(epoch_dir / name, new_d / name)
        new_e = to_eagle3(new_d, tmp / out_e.name)
        rd.train_report.unlink(missing_ok=True)
        for new, out in ((new_d, out_d), (new_e, out_e)):
            old = tmp / f"old-{out.name}"
            if out.exists():
                os.replace(out, old)
            os.replace(new, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_d, out_e


def read_report(rd: RunDir) -> TrainReport:
    """``train/train.json`` of a run directory."""
    path = rd.train_report
    return decode_json(path.read_bytes(), TrainReport, where=str(path))


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``train`` row of ``phases.PHASES`` (``train.enabled``): train in the run directory the pipeline
    already holds (``run_train`` would take the writer lock again), resuming from the last checkpoint."""
    from draftgen.phases import PhaseOutcome

    _train(ctx.cfg, ctx.rd, ctx.echo, False)
    return PhaseOutcome()
