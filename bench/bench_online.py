"""Online training against offline (issue 25): the disk it needs and the time it takes, on the same rows.

One target (``--target DIR``; default the CPU chain's tiny target builder, ``draftgen.drafter.tiny
.build_tiny_target``, at hidden 512: the set's bytes per token scale with the width, draftgen's fixed files
do not) and one merged run of its own greedy answers (generated through ``draftgen emulate --model``: bundled
chat + code prompts, 10 held out by ``cap`` for accept). Then, side by side on the same rows and the same
``train`` settings (EAGLE-3, AdamW lr 3e-3, 2 epochs of 2,048-token batches, draft vocabulary 2048):

- offline: ``draftgen extract`` (hf backend, fp32 compute, bf16 storage, aux [2, 4, 5] + 8) then ``draftgen
  train`` on the stored set;
- online: ``draftgen train --online`` in a copy of the run directory, its states generated on demand by
  ``draftgen emulate --model TARGET --extract-dir D`` (vLLM's extract protocol, bf16, in this process's
  threads) through draftgen's checking proxy (preflight included).

Figures:

    online_disk_fraction     the disk online training needs besides the drafter, as a fraction of the offline
                             set's state files: what draftgen wrote under train/ outside checkpoints/, drafter/,
                             eagle3/ (train/online/, vocab/, log.jsonl) plus the most bytes of server connector
                             files that waited for the trainer at once (the bounded cache; each is deleted once
                             loaded); goal <= 0.01. Both parts are also reported alone (``draftgen_fraction``,
                             ``connector_peak_fraction``): the first is per token (the Arrow ids and masks), the
                             second one sample or so in flight, so both shrink against a real target's width
    online_time_vs_offline   online train seconds / (offline extract + offline train seconds); goal <= 1.5
    al_offline, al_online    acceptance length (k = 3, greedy, vLLM /metrics counters) of each drafter served
                             by ``draftgen emulate --drafter`` on the held-out prompts (their intervals come
                             with accept's bootstrap, issue 24)

and the parts: extract/train seconds, set bytes, online bytes, requests/passes/exclusions.

    python bench/bench_online.py [--quick] [--target DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._common import REPO_ROOT, emit_result, quick_mode
except ImportError:  # python bench/bench_online.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import REPO_ROOT, emit_result, quick_mode  # type: ignore[no-redef]

import yaml

from draftgen.config import load_config
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread
from draftgen.phases.accept import run_accept
from draftgen.phases.extract.run import run_extract
from draftgen.phases.online import run_train_online
from draftgen.phases.pipeline import run_pipeline
from draftgen.phases.train.run import run_train
from draftgen.rundir import MARKER, RunDir

DRAFTER_PARTS = ("checkpoints", "drafter", "eagle3", "speculators.log")  # the drafter itself: both ways alike
SERVED = "tiny"
HIDDEN = 512  # the default target's width: the set's bytes per token scale with it, draftgen's fixed files do not


def speculators() -> str:
    import os

    env = os.environ.get("DRAFTGEN_SPECULATORS")
    local = REPO_ROOT / ".venv-speculators" / "bin" / "speculators"
    return env or str(local)


def config(work: Path, target: Path, base_url: str, caps: tuple[int, int], held: int, epochs: int) -> Path:
    """The run: the bundled chat and code prompts, ``caps`` of each merged (``held`` of chat held out for
    accept), generated greedily by the target itself (``endpoint.kind: vllm`` on the emulator model server)."""
    data: dict[str, Any] = {
        "run_dir": str(work / "run"),
        "model": {"id": SERVED, "profile": "qwen3", "tokenizer": "bundled:qwen3", "thinking": False},
        "endpoint": {"kind": "vllm", "base_url": base_url, "idle_timeout_s": 300.0},
        "sampling": {"temperature": 0.0},
        "datasets": [{"name": "chat", "path": "bundled:chat", "max_samples": caps[0] + held, "cap": caps[0]},
                     {"name": "code", "path": "bundled:code", "max_samples": caps[1], "cap": caps[1]}],
        "partitions": {"short": {"concurrency": 64, "max_tokens": 96}, "long": {"concurrency": 4, "max_tokens": 96}},
        "merge": {"exports": []},
        "progress": "off",
        "hidden_states": {"model": str(target), "backend": "hf", "device": "cpu", "compute_dtype": "fp32",
                          "dtype": "bf16", "layer_ids": [2, 4, 5], "teacher_min_margin": None,
                          "max_flagged_fraction": 1.0},
        "train": {"speculators": speculators(), "draft_vocab_size": 2048, "optimizer": "adamw", "lr": 3e-3,
                  "epochs": epochs, "total_seq_len": 2048, "ttt_steps": 3, "train_data_ratio": 0.95,
                  "checkpoint_freq": epochs, "seed": 0},
        "accept": {"prompts": held, "max_tokens": 32, "concurrency": 4, "server": "vllm"},
    }
    path = work / "cfg.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def tree_bytes(root: Path, skip: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in root.rglob("*")
               if p.is_file() and not any(part in skip for part in p.relative_to(root).parts))


def accept(cfg_path: Path, target: Path, drafter: Path) -> float:
    cfg = load_config(cfg_path)
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2, drafter=str(drafter),
                                            served_model_name=cfg.model.id, num_speculative_tokens=3)) as srv:
        rep = run_accept(cfg, drafter=drafter, base_url=srv.base_url, echo=lambda s: None)
    return round(rep.acceptance.acceptance_length, 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", help="a target model folder (default: the CPU chain's tiny target)")
    args = ap.parse_args()
    quick = quick_mode()
    caps, held, epochs = ((8, 8), 4, 1) if quick else ((113, 91), 10, 2)
    quiet = lambda s: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-online-") as tmp:
        work = Path(tmp)
        if args.target:
            target = Path(args.target)
        else:
            from draftgen.drafter.tiny import build_tiny_target

            target = build_tiny_target(work / "target", hidden=HIDDEN, intermediate=2 * HIDDEN)
        with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2,
                                                served_model_name=SERVED)) as gen:
            cfg_path = config(work, target, gen.base_url, caps, held, epochs)
            assert run_pipeline(load_config(cfg_path), argv=["bench"], echo=quiet).exit_code == 0
        online_root = work / "online-run"
        online_root.mkdir()
        shutil.copytree(work / "run" / "merged", online_root / "merged")
        shutil.copytree(work / "run" / "prepared", online_root / "prepared")
        shutil.copy(work / "run" / MARKER, online_root / MARKER)

        t = time.perf_counter()
        ex = run_extract(load_config(cfg_path), echo=quiet)
        extract_s = time.perf_counter() - t
        set_bytes = tree_bytes(RunDir(work / "run").hidden / "states")
        t = time.perf_counter()
        off = run_train(load_config(cfg_path), echo=quiet)
        train_s = time.perf_counter() - t

        data = yaml.safe_load(cfg_path.read_text())
        data["run_dir"] = str(online_root)
        with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2, extract_dir=str(work / "hs"),
                                                extract_layers=[2, 4, 5, 8], dtype="bfloat16")) as srv:
            data["hidden_states"].update(base_urls=[srv.root_url], connector_dir=str(work / "hs"))
            online_cfg = work / "online.yaml"
            online_cfg.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            t = time.perf_counter()
            on = run_train_online(load_config(online_cfg), echo=quiet)
            online_s = time.perf_counter() - t
        assert on.online is not None
        written = tree_bytes(RunDir(online_root).train, DRAFTER_PARTS)
        disk = (written + on.online.peak_bytes) / set_bytes
        al_off = accept(cfg_path, target, RunDir(work / "run").train_drafter)
        al_on = accept(online_cfg, target, RunDir(online_root).train_drafter)
        print(f"rows {ex.samples}, {ex.tokens:,} tokens; offline set {set_bytes / 1e6:.2f} MB: extract {extract_s:.1f} s"
              f" + train {train_s:.1f} s ({off.steps_this_run} steps)")
        print(f"online: {online_s:.1f} s ({on.steps_this_run} steps); wrote {written / 1e3:.1f} kB besides the drafter,"
              f" at most {on.online.peak_files} connector files ({on.online.peak_bytes / 1e3:.1f} kB) waited; "
              f"{on.online.requests} samples asked, {on.online.excluded} excluded")
        print(f"online_disk_fraction {disk:.5f} (goal <= 0.01); online_time_vs_offline "
              f"{online_s / (extract_s + train_s):.3f} (goal <= 1.5); AL offline {al_off} online {al_on}")
        emit_result("bench_online", {
            "online_disk_fraction": round(disk, 6),
            "online_time_vs_offline": round(online_s / (extract_s + train_s), 4),
            "offline_extract_s": round(extract_s, 2), "offline_train_s": round(train_s, 2),
            "online_train_s": round(online_s, 2), "offline_set_bytes": set_bytes, "online_written_bytes": written,
            "draftgen_fraction": round(written / set_bytes, 6),
            "connector_peak_fraction": round(on.online.peak_bytes / set_bytes, 6),
            "connector_peak_bytes": on.online.peak_bytes, "rows": ex.samples, "tokens": ex.tokens,
            "online_requests": on.online.requests, "online_excluded": on.online.excluded,
            "steps_offline": off.steps_this_run, "steps_online": on.steps_this_run,
            "al_offline": al_off, "al_online": al_on,
        })


if __name__ == "__main__":
    main()
