"""The reference job bought through OpenRouter's Batch API: its cost as a ratio to sync, same exact-id audit.

The reference run paid about $86 for 90.9M tokens at synchronous prices. This replays its workload (the
six datasets of ``bench_replay``, its partitions' max_tokens 10,240/16,384, its routing: the fp4 hosts and
Fireworks ignored, the cheapest first) against the emulator twice, once per ``endpoint.mode``, each on
the same prompts with the same emulator seed (so the same samples), then audits each run with the
emulator's ground truth as the exact-id reference.

Figures: ``batch_cost_vs_sync`` (batch dollars ÷ sync dollars over the same samples; goal (issue 26)
≤ 0.55), ``sync_usd``, ``batch_usd``, ``samples``, ``usd_per_m_output_sync``/``_batch``, each run's audit
verdict and exact-match count (``same_audit_verdict``: both PASS, or both the same), the batches and their
wall time. The token budgets of the reference job are left out: they stop the two modes at different
samples (a batch reserves max_tokens per request until its results are in), and the ratio is of the same
samples. Latencies are the ``realistic`` roster's × ``TIME_SCALE``; its batches take 10 s validating, 300
s + 0.05 s a request in progress, 30 s finalizing, × ``TIME_SCALE``.

Scale: the reference's 35,000 prompts ÷ 100 (350), ``--quick`` ÷ 400, ``--scale N`` any. The emulator
runs in its own process pinned to CPU 0, the client in this one on CPU 1. ``DRAFTGEN_BENCH_KEEP=1``
keeps the temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._common import (
        REPO_ROOT,
        emit_result,
        free_port,
        pin_cpu,
        quick_mode,
        stop_process,
        wait_for_emulator,
    )
    from bench.bench_replay import DATASETS, LONG, ROUTING, SHORT, USD_BUDGET
except ModuleNotFoundError:  # run as `python bench/bench_replay_batch.py`
    from _common import (  # type: ignore[no-redef,import-not-found]
        REPO_ROOT,
        emit_result,
        free_port,
        pin_cpu,
        quick_mode,
        stop_process,
        wait_for_emulator,
    )
    from bench_replay import DATASETS, LONG, ROUTING, SHORT, USD_BUDGET  # type: ignore[no-redef,import-not-found]

KEY = "sk-or-v1-" + "B4TCH" * 7
TIME_SCALE = 0.01
GOAL = 0.55
SCENARIO = f"""\
base: realistic
name: replay-batch
time_scale: {TIME_SCALE}
reasoning_tokens_median: 1170
content_tokens_median: 290
length_sigma: 0.8
runaway_rate: 0.02
max_generated_tokens: 16384
stream_chunk_tokens: 32
keepalive_comments: 1
"""


def _write_prompts(work: Path, scale: int) -> int:
    n = 0
    for name, _, count in DATASETS:
        with open(work / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(max(1, count // scale)):
                fh.write(json.dumps({"messages": [{"role": "user", "content":
                                                   f"{name} job {i}: walk through case {i * 37 % 1013} carefully."}]})
                         + "\n")
                n += 1
    return n


def _config(work: Path, mode: str, url: str) -> dict[str, Any]:
    return {
        "run_dir": str(work / f"run-{mode}"),
        "model": {"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": "bundled:qwen3"},
        "endpoint": {"kind": "openrouter", "base_url": url, "idle_timeout_s": 60.0, "mode": mode,
                     "batch": {"poll_interval_s": 0.5, "poll_max_interval_s": 2.0}},
        "routing": ROUTING,
        "partitions": {"short": {**SHORT, "concurrency": 100}, "long": {**LONG, "concurrency": 25}},
        "datasets": [{"name": n, "path": str(work / f"{n}.jsonl"), "partition": p} for n, p, _ in DATASETS],
        "budget": {"max_spend_usd": USD_BUDGET},
        "retry": {"base_delay_s": 0.5 * TIME_SCALE, "max_delay_s": 60.0 * TIME_SCALE},
        "audit": {"reference": str(work / "ground_truth.jsonl"), "max_billing_disagreement": None},
        "progress": "off",
    }


def _emulator(work: Path, port: int) -> subprocess.Popen[bytes]:
    code = ("import sys; from draftgen.emulator import EmulatorOptions, serve_forever, load_scenario; "
            f"serve_forever(EmulatorOptions(port={port}, scenario_obj=load_scenario(sys.argv[1]), api_key={KEY!r}, "
            f"credits={10 * USD_BUDGET}, ground_truth=sys.argv[2]), echo=print)")
    log = open(work / "emulator.log", "ab")  # noqa: SIM115 (the emulator's stdout for its lifetime)
    return subprocess.Popen([sys.executable, "-c", code, str(work / "scenario.yaml"), str(work / "ground_truth.jsonl")],
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: pin_cpu(0),
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src") + os.pathsep + str(REPO_ROOT)})


def _run(work: Path, mode: str, url: str) -> dict[str, Any]:
    from draftgen.config import config_from_mapping
    from draftgen.engine.batch_journal import load_batches
    from draftgen.phases.audit.run import run_audit
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare
    from draftgen.rundir import RunDir

    cfg = config_from_mapping(_config(work, mode, url), where=f"replay-batch-{mode}", base_dir=work)
    run_prepare(cfg, echo=lambda s: None)
    t0 = time.perf_counter()
    rep = run_generate(cfg, echo=lambda s: None, argv=["bench_replay_batch", mode])
    wall = time.perf_counter() - t0
    audit = run_audit(cfg, echo=lambda s: None)
    o = audit.overall
    batches = load_batches(RunDir(cfg.run_path).batch_journal)
    return {"exit_code": rep.exit_code, "message": rep.message, "samples": rep.done, "failed": rep.failed,
            "usd": rep.spend_total, "completion_tokens": rep.completion_tokens, "wall_s": wall,
            "verdict": audit.verdict, "exact_match": o.exact_match, "compared": o.reference_compared,
            "batches": len(batches)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="prompts ÷ 400")
    ap.add_argument("--scale", type=int, default=None, help="divide the reference's prompts by N (default 100)")
    args = ap.parse_args()
    scale = args.scale or (400 if quick_mode() else 100)
    pin_cpu(1)
    work = Path(tempfile.mkdtemp(prefix="draftgen-bench-replay-batch-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    got: dict[str, dict[str, Any]] = {}
    try:
        (work / "scenario.yaml").write_text(SCENARIO, encoding="utf-8")
        n = _write_prompts(work, scale)
        port = free_port()
        url = f"http://127.0.0.1:{port}/api/v1"
        emu = _emulator(work, port)
        os.environ["OPENROUTER_API_KEY"] = KEY
        try:
            wait_for_emulator(url, KEY, emu, work / "emulator.log")
            for mode in ("sync", "batch"):
                got[mode] = _run(work, mode, url)
        finally:
            stop_process(emu)
    finally:
        if os.environ.get("DRAFTGEN_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    s, b = got["sync"], got["batch"]
    ratio = b["usd"] / s["usd"] if s["usd"] else float("nan")
    print(f"reference job ÷ {scale}: {n:,} prompts over {len(DATASETS)} datasets, max_tokens "
          f"{SHORT['max_tokens']:,}/{LONG['max_tokens']:,}, routing {ROUTING}")
    for mode, r in got.items():
        per_m = r["usd"] / r["completion_tokens"] * 1e6 if r["completion_tokens"] else 0.0
        r["usd_per_m_output"] = per_m
        print(f"{mode:5}  {r['samples']:,} samples, {r['completion_tokens']:,} completion tokens, ${r['usd']:.4f} "
              f"(${per_m:.3f}/M output), {r['wall_s']:.1f}s, {r['batches']} batches; audit {r['verdict']} "
              f"(exact {r['exact_match']}/{r['compared']})")
        if r["exit_code"]:
            print(f"{mode}: stopped: {r['message']}")
    same = s["verdict"].split(":")[0] == b["verdict"].split(":")[0]
    print(f"batch_cost_vs_sync {ratio:.4f} (goal <= {GOAL}): {'met' if ratio <= GOAL else 'NOT met'}; "
          f"same audit verdict: {same}")
    emit_result("replay_batch", {
        "scale": scale, "prompts": n, "time_scale": TIME_SCALE,
        "batch_cost_vs_sync": round(ratio, 4), "sync_usd": round(s["usd"], 4), "batch_usd": round(b["usd"], 4),
        "samples_sync": s["samples"], "samples_batch": b["samples"],
        "usd_per_m_output_sync": round(s["usd_per_m_output"], 4),
        "usd_per_m_output_batch": round(b["usd_per_m_output"], 4),
        "sync_audit_verdict": s["verdict"], "batch_audit_verdict": b["verdict"], "same_audit_verdict": same,
        "exact_match_sync": f"{s['exact_match']}/{s['compared']}", "exact_match_batch": f"{b['exact_match']}/{b['compared']}",
        "batches": b["batches"], "sync_wall_s": round(s["wall_s"], 2), "batch_wall_s": round(b["wall_s"], 2),
        "meets_goal": ratio <= GOAL,
    })


if __name__ == "__main__":
    main()
