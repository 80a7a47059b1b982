"""What ``draftgen train`` checks so that it cannot publish the wrong drafter, and how it owns its trainer.

- ``check_verifier``: the verifier folder is the target the hidden set was extracted from (its config's
  hidden_size / num_hidden_layers / vocab_size, the sha256 of its final norm weight as float32 bytes, the
  config digest when the manifest records one, and its weights digest, ``hidden.norm.weights_digest``, when
  the manifest records one: a set made before weights digests is checked without it), else a
  ``ConfigError`` naming both.
- ``check_complete``: an incomplete hidden set (``manifest.complete`` false) is refused, naming how many
  samples it lacks, unless ``train.allow_partial``.
- ``check_checkpoint``: a checkpoint folder loads (config.json parses as a speculators config,
  model.safetensors' header and every tensor read, every float tensor finite) before it is published or
  resumed from.
- ``trim_log``: ``train/log.jsonl`` keeps each global step once across resumes (records a killed run left at
  or after the resumed step are dropped, by an atomic rewrite).
- ``start_trainer`` / ``stop_trainer``: the speculators child runs in its own process group and gets SIGKILL
  when draftgen dies (Linux ``PR_SET_PDEATHSIG``, so even ``kill -9`` of draftgen ends it); on an error or
  Ctrl-C the whole group is killed.

Reads the verifier's config.json and safetensors (its final norm; every header and sampled bytes of every
tensor), the checkpoint folder, the run's merged/manifest.json (to
count the samples an incomplete set lacks) and ``log.jsonl``; writes only ``log.jsonl``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftgen.errors import ConfigError, DraftgenError, InputError
from draftgen.phases import Echo
from draftgen.records import HiddenManifest, MergeManifest, TrainLogRecord
from draftgen.store import atomic_write_bytes, encode_json, iter_jsonl, read_json, read_json_object

__all__ = ["check_checkpoint", "check_complete", "check_verifier", "start_trainer", "stop_trainer",
           "target_config_digest", "trim_log"]

_SHAPE = (("hidden_size", "hidden_size"), ("num_hidden_layers", "num_layers"), ("vocab_size", "vocab_size"))


def target_config_digest(model_dir: Path) -> str:
    """sha256 of the model folder's config.json bytes (compared with the manifest's, when it has one)."""
    return hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()


def _manifest_config_digest(manifest: HiddenManifest) -> str | None:
    # Tolerant of manifests written before the target's config digest was recorded (absent: not compared).
    for owner in (manifest.target, manifest):
        for name in ("config_sha256", "target_config_sha256"):
            value = getattr(owner, name, None)
            if isinstance(value, str) and value:
                return value
    return None


def check_verifier(verifier: Path, manifest: HiddenManifest, hidden: str) -> None:
    """Refuse a verifier other than the target ``hidden`` was extracted from (see the module docstring)."""
    from draftgen.hidden.norm import WeightsDigest, norm_digests, weights_digest

    fix = "set train.verifier (or hidden_states.model) to the folder of the model the hidden set was extracted from"
    head = f"train.verifier {str(verifier)!r} is not the target of the hidden set {hidden} ({manifest.target.name!r})"
    cfg = read_json_object(verifier / "config.json")
    text = cfg.get("text_config") or cfg
    for key, field in _SHAPE:
        mine, theirs = text.get(key), getattr(manifest, field)
        if mine != theirs:
            raise ConfigError(f"{head}: its {key} is {mine}, the hidden set's {theirs}; {fix}")
    want = _manifest_config_digest(manifest)
    if want is not None and target_config_digest(verifier) != want:
        raise ConfigError(f"{head}: its config.json sha256 {target_config_digest(verifier)[:12]}… differs from the "
                          f"hidden set's {want[:12]}…; {fix}")
    digests = norm_digests(verifier)  # the extractor hashes the weight as the target computed with it
    if manifest.norm_weight_sha256 not in digests:
        raise ConfigError(f"{head}: its final norm weight sha256 {digests[0][:12]}… differs from the hidden set's "
                          f"{manifest.norm_weight_sha256[:12]}…; {fix}")
    why = WeightsDigest.of(manifest.target).differs(weights_digest(verifier))
    if why:
        raise ConfigError(f"{head}: its weights differ from the hidden set's ({why}), though its final norm and "
                          f"config.json are the same (a fine-tune or merged adapter is another target); {fix}")


def _expected_samples(run_root: Path) -> int | None:
    """The merged train rows of the run (what a complete extraction has), or None when there is no merge."""
    from draftgen.rundir import RunDir

    path = RunDir(run_root).merged_manifest
    if not path.is_file():
        return None
    man = read_json(path, MergeManifest)
    return sum(f.rows for f in man.files if f.split == "train" and f.kind == "parquet")


def check_complete(manifest: HiddenManifest, hidden: str, *, run_root: Path, allow_partial: bool,
                   echo: Echo) -> int | None:
    """None for a complete set; else the number of samples missing (-1: unknown), after refusing the set
    unless ``allow_partial``."""
    if manifest.complete:
        return None
    have = manifest.counts.samples
    total = _expected_samples(run_root)
    missing = max(total - have, 0) if total is not None else -1
    what = (f"{missing} of {total} samples are missing ({have} extracted)" if total is not None
            else f"only {have} samples extracted, an unknown number missing")
    if not allow_partial:
        raise InputError(f"{hidden}: the hidden set is incomplete: {what}; finish it with `draftgen extract`, or "
                         f"pass --allow-partial (train.allow_partial) to train on the {have} there")
    echo(f"train: WARNING: the hidden set is incomplete ({what}); training on the {have} there (--allow-partial)")
    return missing


def check_checkpoint(epoch_dir: Path) -> None:
    """Refuse a checkpoint that does not load: its config.json and every tensor of model.safetensors."""
    from safetensors import safe_open

    fix = (f"rerun with --restart to train from scratch, or delete {epoch_dir} to resume from the checkpoint "
           "before it")
    try:
        spec = read_json_object(epoch_dir / "config.json")
        if not spec.get("speculators_model_type"):
            raise ValueError("config.json has no speculators_model_type")
        with safe_open(str(epoch_dir / "model.safetensors"), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no iterator)
                t = fh.get_tensor(name)
                if t.is_floating_point() and not bool(t.float().isfinite().all()):
                    raise ValueError(f"{name} holds NaN or Inf: the training diverged")
    except Exception as exc:  # any failure to load is the same refusal
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise DraftgenError(f"checkpoint {epoch_dir} does not load ({why}); {fix}") from None


def trim_log(path: Path, first_step: int) -> int:
    """Drop the records a resumed run will log again: train steps >= ``first_step``, validations after it
    (a validation at ``first_step`` ran before that checkpoint). Rewrites atomically; returns lines dropped."""
    if not path.is_file():
        return 0
    records = [r for _, r in iter_jsonl(path, TrainLogRecord)]
    keep = [r for r in records if (r.global_step < first_step if r.kind == "train" else r.global_step <= first_step)]
    if len(keep) == len(records):
        return 0  # (a torn last line is JsonlWriter's to repair when it opens the file)
    atomic_write_bytes(path, b"".join(encode_json(r) + b"\n" for r in keep))
    return len(records) - len(keep)


def _die_with_parent(parent: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)
        if sys.platform.startswith("linux"):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # draftgen died before the prctl: nobody would send the signal
            os._exit(1)
    return preexec


def start_trainer(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """The trainer child: its own process group, killed with draftgen (stdout+stderr on one pipe)."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=_die_with_parent(os.getpid()))


def stop_trainer(proc: subprocess.Popen[Any]) -> None:
    """Kill the trainer's whole process group (it and anything it started) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()
