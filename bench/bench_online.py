"""Online training against offline (issue 25) on the CPU chain's learned target: the acceptance each drafter
reaches, the disk online training needs and the time it takes, on the same rows with the same settings.

The CPU chain's setting (scripts/tiny-chain, examples/tiny-chain.yaml): the learned tiny target
(``drafter.learned``: a 4-layer Qwen3, hidden 128, trained on the CPU on ``drafter.tinylang``; ``--target DIR``
reuses a folder that holds it, default scripts/tiny-chain's ``runs/tiny-target``), prompts of the language's
four tasks (``PER_TASK``: 720 each, walk's all 112; 16 of each held out by ``cap``: 2,208 merged rows, 64
held-out prompts), generated greedily through ``draftgen emulate --model`` (vllm backend, exact ids). Many more
rows than the chain's 256 and one epoch (about 1.5 times its steps), so that the set is not so small that
draftgen's few fixed files, and the few samples in flight, dominate its disk figure. Then, on the same merged
rows and the same ``train`` settings (the example's otherwise: EAGLE-3, AdamW lr 3e-3, 512-token batches, draft
vocabulary 256, fp32 states, seed 0):

- offline: ``draftgen extract`` (hf backend, fp32, aux [1, 2, 3] + 4) then ``draftgen train`` on the stored set;
- online: ``draftgen train --online`` in a copy of the run directory, its states generated on demand by
  ``draftgen emulate --model TARGET --extract-dir D`` (vLLM's extract protocol, fp32, in this process's threads)
  through draftgen's checking proxy (preflight included), its window ``train.online_window_mb`` ``--window-mb``
  (default 1 MB: about one 512-token batch of this target's fp32 states, 2,063 bytes a token; what a user
  with a 5 TB set gives online training is a few GB: docs/train.md);
- the other served algorithms from the same stored set: ``train.algorithm`` ``eagle3.1`` and ``peagle``,
  ``OTHER_STEPS`` steps each (the CPU time).

Each drafter is served by ``draftgen emulate --drafter`` and measured by ``draftgen accept`` (k = 3, greedy, vLLM
/metrics, the 64 held-out prompts × 32 tokens; ``--quick``: 20 prompts a task, 6 held out, 1 epoch), with its
95% bootstrap interval over the prompts, and copy-last and lookup beside it (issue 24's machinery). Figures:

    al_offline, al_online    (with ``*_ci_lo``/``*_ci_hi``) the EAGLE-3 drafter trained offline and online
    al_online_in_offline_ci  1 when al_online lies within the offline drafter's 95% interval (issue 25's
                             "done when"), else 0
    al_eagle3_1, al_peagle   the other algorithms vLLM and the emulator serve, with their intervals (DFlash and
                             DSpark are not emulated; the chain's 4-layer target has no five distinct layers
                             for them: tests/phases/train/test_train_algorithms.py trains them, train.json
                             gives their offline estimate and the ``vllm serve`` line that measures them
                             on a GPU)
    online_disk_fraction     the disk online training needs besides the drafter, as a fraction of the offline
                             set's state files: what draftgen wrote under train/ outside checkpoints/, drafter/,
                             eagle3/, speculators.log (train/online/, vocab/, log.jsonl, train.json) plus the most
                             bytes of server connector files on disk at once (waiting for the trainer or being
                             captured: the window; each is deleted once loaded); goal <= 0.01. Its parts:
                             ``draftgen_fraction`` and ``connector_peak_fraction`` (``connector_peak_files``);
                             ``per_token_fraction`` is the part that grows with the rows (the Arrow ids and
                             masks and sample ids, per token, over the set's bytes per token): the fraction of a
                             set large enough for the fixed files (vocab/, the reports, the window) to vanish, as
                             the reference's 5.21 TB set is
    online_time_vs_offline   online train seconds / (offline extract + offline train seconds); goal <= 1.5

Threads: every process of the bench (this one: generation, offline extract, the target server and the proxy;
speculators' trainers) runs torch on ``--threads`` threads (default 1, ``OMP_NUM_THREADS`` and
``torch.set_num_threads``): the target's role and the trainer's role each get one of the two cores, as they get
devices of their own in a real deployment (offline uses one role at a time, online both at once). With 2 threads
each, the online run's two processes oversubscribe the two cores (``threads`` is a figure).

and the parts: extract/train seconds, set bytes, the bytes of each file draftgen wrote online,
requests/passes/exclusions, and the load average around the run (the machine is shared).

    python bench/bench_online.py [--quick] [--target DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._common import REPO_ROOT, emit_result, quick_mode
    from bench.bench_chain import load_chain_script
except ImportError:  # python bench/bench_online.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import REPO_ROOT, emit_result, quick_mode  # type: ignore[no-redef]
    from bench_chain import load_chain_script  # type: ignore[no-redef]

import yaml

from draftgen.config import load_config
from draftgen.drafter import tinylang
from draftgen.drafter.learned import build_learned_target
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread
from draftgen.phases.accept.run import run_accept
from draftgen.phases.extract.run import run_extract
from draftgen.phases.generate.run import run_generate
from draftgen.phases.merge.run import run_merge
from draftgen.phases.prepare.run import run_prepare
from draftgen.phases.train.run import run_train
from draftgen.records import AcceptReport
from draftgen.rundir import MARKER, RunDir

DRAFTER_PARTS = ("checkpoints", "drafter", "eagle3", "speculators.log")  # the drafter itself: both ways alike
LAYERS = [1, 2, 3, 4]  # the example's aux ids + the final (vLLM convention)
#: the other algorithms the emulator serves, trained on the offline set (extra speculators flags: P-EAGLE's
#: parallel groups = the k served)
#: prompts per task (16 of each held out for accept) and epochs: many more rows than the chain's 80 a task and
#: one epoch (about 1.5 times its steps), so that the set is not so small that draftgen's fixed files and the
#: samples in flight dominate (walk has 112 distinct prompts); the other algorithms' steps (about one epoch of
#: a third of the rows: their figures show they serve, at the CPU time this costs)
PER_TASK, EPOCHS, OTHER_STEPS = {"walk": 112, "sort": 720, "count": 720, "close": 720}, 1, 100
OTHERS: dict[str, list[str]] = {"eagle3.1": [], "peagle": ["--num-depths", "3"]}


def tree_bytes(root: Path, skip: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in root.rglob("*")
               if p.is_file() and not any(part in skip for part in p.relative_to(root).parts))


def accept(cfg_path: Path, target: Path, drafter: Path, served: str) -> AcceptReport:
    """``draftgen accept`` of ``drafter`` served by ``draftgen emulate --drafter`` (in this process's threads)."""
    cfg = load_config(cfg_path)
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2, drafter=str(drafter),
                                            served_model_name=served, num_speculative_tokens=3)) as srv:
        return run_accept(cfg, drafter=drafter, base_url=srv.base_url, echo=lambda s: None)


def al_figures(rep: AcceptReport, name: str) -> dict[str, Any]:
    a = rep.acceptance
    out: dict[str, Any] = {f"al_{name}": round(a.acceptance_length, 4)}
    if a.ci95:
        out[f"al_{name}_ci_lo"], out[f"al_{name}_ci_hi"] = a.ci95
    for alt in rep.alternatives if name == "offline" else ():
        out[f"al_{alt.name.replace('-', '_')}"] = alt.acceptance_length
    return out


def generate(chain: Any, work: Path, target: Path, per_task: dict[str, int], held: int, epochs: int) -> Path:
    """Prompts, prepare → generate → merge through the emulator: the run's config (the example's, with the
    quick mode's sizes)."""
    for task, n in per_task.items():
        tinylang.write_prompts(work / "prompts", n, chain.PROMPT_SEED, tasks=[task])
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2,
                                            served_model_name=chain.SERVED)) as gen:
        path = chain.write_config(work, "offline", base_url=gen.base_url, target=target)
        data = yaml.safe_load(path.read_text())
        for d in data["datasets"]:
            d["cap"] = per_task[d["name"]] - held
        data["accept"]["prompts"] = held * len(tinylang.TASKS)
        data["train"]["epochs"] = epochs
        data["train"]["layer_ids"] = LAYERS[:-1]  # the 4-layer target has no defaults (hidden.algorithms)
        data["train"]["checkpoint_freq"] = epochs
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        cfg = load_config(path)
        quiet = lambda s: None  # noqa: E731
        run_prepare(cfg, echo=quiet)
        assert run_generate(cfg, echo=quiet).exit_code == 0
    run_merge(cfg, echo=quiet)
    return path


def other_config(cfg_path: Path, work: Path, name: str, steps: int) -> Path:
    """The same run's config training ``name`` on the offline set (at most ``steps`` steps), in its own run
    folder."""
    data = yaml.safe_load(cfg_path.read_text())
    data["run_dir"] = str(work / name)
    data["train"] = {**data["train"], "hidden": str(work / "run" / "hidden"), "algorithm": name,
                     "extra_args": OTHERS[name], "epochs": 1, "checkpoint_freq": 1, "max_steps": steps}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def online(cfg_path: Path, work: Path, target: Path, window_mb: float) -> tuple[Path, Any, float]:
    """``draftgen train --online`` on a copy of the run's merged rows, with that window; returns its config,
    report, seconds."""
    root = work / "online-run"
    root.mkdir()
    for part in ("merged", "prepared"):
        shutil.copytree(work / "run" / part, root / part)
    shutil.copy(work / "run" / MARKER, root / MARKER)
    data = yaml.safe_load(cfg_path.read_text())
    data["run_dir"] = str(root)
    data["train"]["online_window_mb"] = window_mb
    data["train"]["online"] = True
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2, extract_dir=str(work / "hs"),
                                            extract_layers=LAYERS, dtype="float32")) as srv:
        data["hidden_states"].update(base_urls=[srv.root_url], connector_dir=str(work / "hs"))
        path = work / "online.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        t = time.perf_counter()
        rep = run_train(load_config(path), echo=lambda s: None)
        return path, rep, time.perf_counter() - t


def disk_figures(rd: RunDir, set_bytes: int, tokens: int, peak_bytes: int) -> dict[str, Any]:
    """What draftgen wrote under train/ besides the drafter, by file, and the fractions of the docstring."""
    files = {str(p.relative_to(rd.train)): p.stat().st_size for p in sorted(rd.train.rglob("*"))
             if p.is_file() and not any(part in DRAFTER_PARTS for part in p.relative_to(rd.train).parts)}
    written = sum(files.values())
    # grows with the rows: speculators' Arrow dataset (ids, masks, lengths) and the sample ids
    per_row = sum(v for k, v in files.items() if k.endswith(".arrow") or k.endswith("sample_ids.jsonl"))
    for k, v in files.items():
        print(f"  online wrote {k}: {v:,} bytes")
    return {"online_disk_fraction": round((written + peak_bytes) / set_bytes, 6),
            "draftgen_fraction": round(written / set_bytes, 6),
            "connector_peak_fraction": round(peak_bytes / set_bytes, 6),
            "per_token_fraction": round(per_row / set_bytes, 6),
            "online_written_bytes": written, "online_per_row_bytes": per_row,
            "online_bytes_per_token": round(per_row / tokens, 2), "set_bytes_per_token": round(set_bytes / tokens, 1),
            "connector_peak_bytes": peak_bytes, "offline_set_bytes": set_bytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target", type=Path, default=REPO_ROOT / "runs" / "tiny-target",
                    help="the learned target's folder, reused when it holds it, else trained there (default "
                         "runs/tiny-target, scripts/tiny-chain's)")
    ap.add_argument("--epochs", type=int, default=EPOCHS, help=f"training epochs (default {EPOCHS})")
    ap.add_argument("--window-mb", type=float, default=1.0,
                    help="train.online_window_mb of the online run (default 1: about one batch of states)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every process (default 1: see above)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the trainers and servers this bench starts
    import torch

    torch.set_num_threads(args.threads)
    # the orchestrator's timeout sends SIGTERM: leave through the ``with`` blocks (servers stopped, folder removed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    quick = quick_mode()
    chain = load_chain_script()
    per_task, held, epochs = (({t: 20 for t in PER_TASK}, 6, 1) if quick
                              else (PER_TASK, chain.HELD_PER_TASK, args.epochs))
    load0 = os.getloadavg()
    t_all = time.perf_counter()
    quiet = lambda s: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-online-") as tmp:
        work = Path(tmp)
        target = build_learned_target(args.target.resolve(), echo=print, strict=False)
        cfg_path = generate(chain, work, target, per_task, held, epochs)

        t = time.perf_counter()
        ex = run_extract(load_config(cfg_path), echo=quiet)
        extract_s = time.perf_counter() - t
        set_bytes = tree_bytes(RunDir(work / "run").hidden / "states")
        t = time.perf_counter()
        off = run_train(load_config(cfg_path), echo=quiet)
        train_s = time.perf_counter() - t
        online_cfg, on, online_s = online(cfg_path, work, target, args.window_mb)
        assert on.online is not None
        figures: dict[str, Any] = {}
        figures.update(disk_figures(RunDir(Path(load_config(online_cfg).run_path)), set_bytes, ex.tokens,
                                    on.online.peak_bytes))
        figures.update(al_figures(accept(cfg_path, target, RunDir(work / "run").train_drafter, chain.SERVED),
                                  "offline"))
        figures.update(al_figures(accept(online_cfg, target, RunDir(work / "online-run").train_drafter,
                                         chain.SERVED), "online"))
        lo, hi = figures.get("al_offline_ci_lo"), figures.get("al_offline_ci_hi")
        figures["al_online_in_offline_ci"] = int(lo is not None and hi is not None
                                                 and lo <= figures["al_online"] <= hi)
        for name in OTHERS:
            rep = run_train(load_config(other_config(cfg_path, work, name, OTHER_STEPS)), echo=quiet)
            assert rep.checkpoint, f"{name}: no checkpoint"
            figures.update(al_figures(accept(cfg_path, target, Path(rep.checkpoint), chain.SERVED),
                                      name.replace(".", "_")))
    load1 = os.getloadavg()
    figures.update({
        "online_time_vs_offline": round(online_s / (extract_s + train_s), 4),
        "offline_extract_s": round(extract_s, 2), "offline_train_s": round(train_s, 2),
        "online_train_s": round(online_s, 2), "rows": ex.samples, "tokens": ex.tokens,
        "online_requests": on.online.requests, "online_excluded": on.online.excluded,
        "steps_offline": off.steps_this_run, "steps_online": on.steps_this_run,
        "threads": args.threads, "online_window_mb": args.window_mb, "connector_peak_files": on.online.peak_files,
        "load_1min_before": round(load0[0], 2), "load_1min_after": round(load1[0], 2),
        "bench_wall_s": round(time.perf_counter() - t_all, 1),
    })
    print(f"rows {ex.samples}, {ex.tokens:,} tokens; offline set {set_bytes / 1e6:.2f} MB: extract {extract_s:.1f} s"
          f" + train {train_s:.1f} s ({off.steps_this_run} steps); online {online_s:.1f} s "
          f"({on.steps_this_run} steps, {on.online.requests} samples asked, {on.online.excluded} excluded)")
    print(f"AL offline {figures['al_offline']} [{figures.get('al_offline_ci_lo')}, {figures.get('al_offline_ci_hi')}]"
          f", online {figures['al_online']} [{figures.get('al_online_ci_lo')}, {figures.get('al_online_ci_hi')}]"
          f" (within the offline interval: {bool(figures['al_online_in_offline_ci'])}); eagle3.1 "
          f"{figures.get('al_eagle3_1')}, peagle {figures.get('al_peagle')}; copy-last "
          f"{figures.get('al_copy_last')}, lookup {figures.get('al_lookup')}")
    print(f"online_disk_fraction {figures['online_disk_fraction']:.5f} (goal <= 0.01; per-token part "
          f"{figures['per_token_fraction']:.5f}); online_time_vs_offline {figures['online_time_vs_offline']:.3f} "
          f"(goal <= 1.5); load {load0[0]:.2f} -> {load1[0]:.2f}")
    emit_result("bench_online", figures)


if __name__ == "__main__":
    main()
