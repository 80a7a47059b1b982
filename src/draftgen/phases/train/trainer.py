"""One training run of ``draftgen train`` on what was prepared for it (``Prepared``: the offline set's or
online's inputs), however it was prepared: ``train_prepared`` resumes from the last complete checkpoint (or
drops them with ``restart``), runs speculators (``launch``: one process or torchrun) beside the ``Session``
(online: the checking proxy), checks the checkpoint, then publishes the drafter (``drafter/``, and ``eagle3/``
for the EAGLE-3 family) and writes ``train.json`` last, or refuses it: under ``train.min_trained_fraction`` of
the samples its batches asked for (``records.below_floor``), or when the session refuses, the drafter published
before moves to ``previous/`` and ``ThresholdBroken`` (exit 3) says why. Also what both halves need about the
verifier (``verifier_path``, ``norm_digest``) and ``read_report``.

Reads the prepared folder's ``token_freq.pt``, the verifier's ``config.json`` and final norm, the checkpoints;
writes ``train/`` (``vocab/``, ``checkpoints/`` through speculators, ``drafter/``, ``eagle3/``, ``previous/``,
``log.jsonl``, ``train.json``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from draftgen.config import RunConfig
from draftgen.errors import ConfigError, DraftgenError, InputError, ThresholdBroken
from draftgen.hidden.algorithms import algorithm
from draftgen.hidden.speculators import TOKEN_FREQ
from draftgen.phases import Echo
from draftgen.phases.train.convert import to_eagle3
from draftgen.phases.train.guards import check_checkpoint, trim_log
from draftgen.phases.train.launch import (
    global_step,
    has_gpu,
    last_complete,
    launch_command,
    offline_al,
    run_trainer,
    samples_seen,
    speculators_args,
)
from draftgen.phases.train.vocab import build_vocab_mapping, save_vocab_mapping
from draftgen.records import TrainOnlineReport, TrainReport, below_floor, trained_line
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, decode_json, read_json_object

if TYPE_CHECKING:
    from draftgen.hidden.algorithms import Algorithm
    from draftgen.phases.train.launch import SamplesSeen, TrainerRun

__all__ = ["Prepared", "Session", "norm_digest", "read_report", "train_prepared", "verifier_path"]


class Session(Protocol):
    """What runs beside the trainer (online: draftgen's checking proxy, started and stopped by its caller);
    ``report()`` says what it saw, for train.json. ``refusal()`` is asked once training ended, before anything is
    published: a message (one line naming the figures, the key and where to look) refuses the drafter as the
    sample floor does (train.json with exit_code 3 and that message, no drafter published, ThresholdBroken);
    None lets it be published."""

    def report(self) -> TrainOnlineReport: ...

    def refusal(self) -> str | None: ...


@dataclass
class Prepared:
    """What a training run trains on, however it was prepared: speculators' data folder (``--data-path``),
    the samples in it, where they come from (``source``: the hidden set, or the servers), a fingerprint of
    them (checkpoints of other data are refused), the aux ids trained on and the runner's and speculators'
    extra flags, the target's final-norm sha256 (the verifier norm the trainer must build); ``excluded``: the
    set's samples left out, by reason (``TrainReport.excluded``)."""

    python: str
    verifier: Path
    data: Path
    samples: int
    source: str
    fingerprint: str
    layer_ids: list[int]
    norm_sha256: str
    runner_flags: list[str] = field(default_factory=list)
    speculators_flags: list[str] = field(default_factory=list)
    missing: int | None = None
    excluded: dict[str, int] = field(default_factory=dict)


def verifier_path(cfg: RunConfig, fallback: str | None = None) -> Path:
    """The target model's local folder speculators reads (``train.verifier``, ``hidden_states.model``, else
    ``fallback``: the hidden set's target)."""
    name = cfg.train.verifier or cfg.hidden_states.model or fallback
    path = cfg.path(name) if name else Path()
    if not name or not (path / "config.json").is_file():
        raise ConfigError(f"train.verifier {str(path)!r}: not a model folder (no config.json); speculators needs "
                          "the target model's local folder: set train.verifier (or hidden_states.model)")
    return path


def norm_digest(verifier: Path) -> str:
    """sha256 of the target's final norm weight as its folder stores it: what speculators loads into its
    ``verifier_norm`` (``guards.check_verifier`` ties it to the hidden set's own)."""
    from draftgen.hidden.norm import load_final_norm, norm_weight_digest

    return norm_weight_digest(load_final_norm(verifier).weight)


def _target_vocab(verifier: Path) -> int:
    cfg = read_json_object(verifier / "config.json")
    return int((cfg.get("text_config") or cfg)["vocab_size"])


def _norm_check(prep: Prepared) -> Callable[[str], str | None]:
    def check(sha256: str) -> str | None:
        if sha256 == prep.norm_sha256:
            return None
        return (f"speculators built its verifier norm from {prep.verifier} with sha256 {sha256[:12]}…, not the "
                f"target's final norm ({prep.norm_sha256[:12]}…): it would train against another distribution than "
                "the target's post-norm one (TorchSpec#169); check that the folder's weights hold model.norm.weight")
    return check


def train_prepared(cfg: RunConfig, rd: RunDir, echo: Echo, prep: Prepared, *, restart: bool,
                   session: Session | None = None) -> TrainReport:
    """Train on ``prep`` (resuming from the last complete checkpoint unless ``restart``), with ``session``
    running beside the trainer; publish the drafter and write train.json. A drafter ``session.refusal()``
    refuses (it names the cause), or one below the sample floor (``_floor``), is not published (``_refuse``:
    ThresholdBroken)."""
    tc = cfg.train
    alg = algorithm(tc.algorithm)
    ckpts = rd.train_checkpoints
    if restart:
        shutil.rmtree(ckpts, ignore_errors=True)
    resume_from = last_complete(ckpts, echo)
    if resume_from is not None:
        check_checkpoint(resume_from)  # speculators would resume from it, and it would be published
    if prep.samples < 2:
        raise InputError(f"{prep.source}: {prep.samples} sample(s); speculators needs at least 2 (train and "
                         "validation)")
    first = global_step(resume_from)
    gpu = has_gpu(prep.python)
    args = speculators_args(verifier=prep.verifier, data=prep.data, save=ckpts, vocab=_vocab(cfg, rd, prep, alg),
                            aux_ids=prep.layer_ids, alg=alg, tc=tc, gpu=gpu) + prep.speculators_flags
    procs = tc.nproc_per_node * tc.nnodes
    echo(f"train: {alg.name} with speculators on {'GPU' if gpu else 'CPU'}"
         + (f" ({procs} processes, torchrun)" if procs > 1 else "")
         + f", {prep.samples} samples, layers {prep.layer_ids} (vLLM ids), draft vocab {tc.draft_vocab_size}"
         + (f", resuming at step {first}" if first else ""))
    trim_log(rd.train_log, first)  # a killed run's records at or after the resumed step are logged again
    cmd = launch_command(prep.python, tc, [*args, *prep.runner_flags])
    run = run_trainer(cmd, rd, echo, check_norm=_norm_check(prep))
    if tc.node_rank != 0:  # another node publishes
        return _report(cfg, prep, run, first, None, None, None if session is None else session.report())
    last = last_complete(ckpts)
    if last is None:
        raise DraftgenError(f"speculators train saved no checkpoint in {ckpts}; see {rd.train_speculators_log}")
    check_checkpoint(last)
    seen = samples_seen(last)
    why = (session.refusal() if session is not None else None) or _floor(cfg, rd, prep, seen, echo)
    online = None if session is None else session.report()
    if why is not None:
        _refuse(rd, echo, _report(cfg, prep, run, first, last, None, online, seen, refused=why))
    drafter, eagle = _publish(last, rd, eagle=alg.rule == "eagle3" and alg.speculator_type == "eagle3")
    report = _report(cfg, prep, run, first, last, (drafter, eagle), online, seen)
    atomic_write_json(rd.train_report, report)  # last: its presence says drafter/ (and eagle3/) are this run's
    echo(f"train: {run.steps} steps this run (global step {report.last_step}) in {run.seconds:.1f} s"
         + (f"; {trained_line(seen.trained, seen.asked, seen.rows, prep.samples)}" if seen is not None else "")
         + f"; {report.message}")
    return report


def _floor(cfg: RunConfig, rd: RunDir, prep: Prepared, seen: SamplesSeen | None, echo: Echo) -> str | None:
    """Why the drafter is not published for the sample floor (``train.min_trained_fraction``), or None."""
    fraction = cfg.train.min_trained_fraction
    if seen is None:
        if fraction > 0:
            echo("train: the checkpoint does not say how many samples its drafter trained on (it resumed one of a "
                 "draftgen before schema 3, or was saved another way): train.min_trained_fraction is not checked; "
                 "rerun with --restart to count them")
        return None
    if not below_floor(seen.trained, seen.asked, fraction):
        return None
    return (f"train: the drafter is not published: {trained_line(seen.trained, seen.asked, seen.rows, prep.samples)}"
            f", under train.min_trained_fraction {fraction}; a sample is left out when unavailable (online: "
            f"{rd.train_report}'s online part), dropped by speculators ({rd.train_speculators_log}) or cut by "
            "train.total_seq_len before its first loss token; fix that and rerun with --restart")


def _refuse(rd: RunDir, echo: Echo, report: TrainReport) -> NoReturn:
    """Publish nothing: the drafter published before (drafter/, eagle3/ and the train.json that describes them)
    goes to ``train/previous/`` (``_set_aside``), so that nothing serves or measures it as this run's; then
    train.json says why (exit_code 3, no checkpoint) and ThresholdBroken carries the same line."""
    if _set_aside(rd):
        echo(f"train: the drafter published before, with its train.json, is now in {rd.train_previous}; there is "
             f"no {rd.train_drafter} until a drafter is published")
    atomic_write_json(rd.train_report, report)
    raise ThresholdBroken(report.message)


def _set_aside(rd: RunDir) -> bool:
    """Move drafter/, eagle3/ and train.json (draftgen's own) into ``train/previous/``, replacing the one
    there (set aside by an earlier refusal, and older than these); False when no drafter is published."""
    out_d, out_e, prev = rd.train_drafter, rd.train_eagle, rd.train_previous
    if not out_d.exists() and not out_e.exists():
        return False
    tmp = Path(tempfile.mkdtemp(dir=out_d.parent, prefix=".previous-"))
    try:
        new = tmp / prev.name
        new.mkdir()
        for path in (out_d, out_e, rd.train_report):
            if path.exists():
                os.replace(path, new / path.name)
        if prev.exists():
            os.replace(prev, tmp / f"old-{prev.name}")
        os.replace(new, prev)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _vocab(cfg: RunConfig, rd: RunDir, prep: Prepared, alg: Algorithm) -> tuple[Path, Path] | None:
    """The draft vocabulary's d2t/t2d files (``vocab``), None for an algorithm over the whole vocabulary."""
    if alg.full_vocab:
        return None
    import torch

    freq = torch.load(prep.data / TOKEN_FREQ, weights_only=True)
    d2t, t2d = build_vocab_mapping({int(k): int(v) for k, v in freq.items()}, cfg.train.draft_vocab_size,
                                   _target_vocab(prep.verifier))
    return save_vocab_mapping(rd.train_vocab, d2t, t2d)


def _report(cfg: RunConfig, prep: Prepared, run: TrainerRun, first: int, last: Path | None,
            published: tuple[Path, Path | None] | None, online: TrainOnlineReport | None,
            seen: SamplesSeen | None = None, refused: str | None = None) -> TrainReport:
    tc = cfg.train
    alg = algorithm(tc.algorithm)
    latest = run.last_val or run.last_train
    acc = latest.cond_acc_k if latest is not None else []
    eal = latest.metrics.get("eal") if latest is not None and alg.block else None
    k = _speculative_tokens(last)
    drafter, eagle = published if published is not None else (None, None)
    serve = alg.serve_line(str(prep.verifier), str(drafter), k or tc.ttt_steps) if drafter is not None else None
    if refused is not None:
        message = refused
    elif drafter is None:
        message = f"node {tc.node_rank} of {tc.nnodes}: trained; node 0 publishes the drafter"
    else:
        message = f"drafter: {drafter} (vllm serve)" + (f", {eagle} (SGLang)" if eagle is not None else "")
    return TrainReport(
        exit_code=0 if refused is None else ThresholdBroken.exit_code, message=message, verifier=str(prep.verifier),
        hidden=prep.source, samples=prep.samples,
        layer_ids=prep.layer_ids, draft_vocab_size=_target_vocab(prep.verifier) if alg.full_vocab else tc.draft_vocab_size,
        ttt_steps=tc.ttt_steps, first_step=first,
        last_step=global_step(last) if last is not None else first + run.steps, steps_this_run=run.steps,
        seconds=round(run.seconds, 2), steps_per_s=round(run.steps / run.seconds, 3) if run.steps and run.seconds > 0
        else None, checkpoint=str(drafter) if drafter else None, eagle_checkpoint=str(eagle) if eagle else None,
        final_train=run.last_train, final_val=run.last_val,
        offline_al=round(offline_al(acc), 4) if acc else None, partial=prep.missing is not None,
        missing_samples=prep.missing, algorithm=alg.name, speculator_type=alg.speculator_type,
        speculative_tokens=k, offline_eal=round(eal, 4) if eal is not None else None, serve=serve,
        verifier_norm_sha256=run.norm_sha256, processes=tc.nproc_per_node * tc.nnodes, online=online,
        samples_trained=None if seen is None else seen.trained, samples_asked=None if seen is None else seen.asked,
        train_rows=None if seen is None else seen.rows, min_trained_fraction=tc.min_trained_fraction,
        excluded=prep.excluded)


def _speculative_tokens(epoch_dir: Path | None) -> int | None:
    """What the drafter proposes per step (its speculators config's first proposal method)."""
    if epoch_dir is None:
        return None
    spec = read_json_object(epoch_dir / "config.json").get("speculators_config") or {}
    methods = spec.get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens")
    return int(k) if isinstance(k, int) else None


def _publish(epoch_dir: Path, rd: RunDir, *, eagle: bool) -> tuple[Path, Path | None]:
    """The (checked) checkpoint as ``train/drafter/`` and, for the EAGLE-3 family, ``train/eagle3/``. Both are
    built in temp folders inside train/ first, so a failure leaves the previous pair as it was; train.json is
    removed before the renames and rewritten after them, so a published pair without train.json is never
    mistaken for one run's (a crash between the renames is the only window, and it leaves no report). An
    eagle3/ of an earlier EAGLE-3 run goes when another algorithm's drafter is published."""
    out_d, out_e = rd.train_drafter, rd.train_eagle
    parent = out_d.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".publish-"))
    try:
        new_d = tmp / out_d.name
        new_d.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copyfile(epoch_dir / name, new_d / name)
        pairs = [(new_d, out_d)]
        if eagle:
            pairs.append((to_eagle3(new_d, tmp / out_e.name), out_e))
        rd.train_report.unlink(missing_ok=True)
        for new, out in pairs:
            old = tmp / f"old-{out.name}"
            if out.exists():
                os.replace(out, old)
            os.replace(new, out)
        if not eagle and out_e.exists():
            os.replace(out_e, tmp / f"old-{out_e.name}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_d, (out_e if eagle else None)


def read_report(rd: RunDir) -> TrainReport:
    """``train/train.json`` of a run directory."""
    path = rd.train_report
    return decode_json(path.read_bytes(), TrainReport, where=str(path))
