"""A 20 s storm of 429s at 500 in flight, then recovery: how many samples fail and how soon the run is done.

The attack of issue 22: every request in the first 20 s is answered 429 with ``Retry-After: 2`` (the
emulator's ``storm_s``, OpenRouter's own rate limit whatever the provider), then the server recovers. 600
samples at 500 in flight (``--quick``: 150 at 120, a 5 s storm). Run twice in one process, against an
emulator in a thread (``fast`` providers with a little latency, so requests overlap):

- ``draftgen``: the defaults: rate limits are waited out on their own time budget
  (``retry.rate_limit_wait_s``), not on the six attempts;
- ``baseline``: the policy before issue 22, rate limits counted as attempts (``rate_limit_wait_s: 0``),
  which ended the reference attack after 23 s with 350 of 600 samples failed.

Reported per run: the failed fraction (the goal is 0 for draftgen), the wall time, and the time to
recover (from the end of the storm to the last record), read from the run directory's files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._common import emit_result, quick_mode
except ModuleNotFoundError:  # run as `python bench/bench_storm.py`
    from _common import emit_result, quick_mode  # type: ignore[no-redef,import-not-found]

KEY = "sk-or-v1-" + "ST0RM" * 8


def _run(work: Path, name: str, n: int, conc: int, storm_s: float, rate_limit_wait_s: float | None) -> dict[str, Any]:
    from draftgen.config import config_from_mapping
    from draftgen.emulator import EmulatorOptions, Provider, builtin_scenario, start_in_thread
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare
    from draftgen.records import AttemptRecord, ResponseRecord
    from draftgen.rundir import RunDir
    from draftgen.store import iter_jsonl

    providers = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, ttft_s=(0.2, 0.5), tokens_per_s=(400, 600)),
                 Provider("Baseten", "baseten/fp4", "fp4", 0.60, 3.00, ttft_s=(0.2, 0.5), tokens_per_s=(400, 600))]
    sc = builtin_scenario("fast").replace(providers=providers, pool_size=128, storm_s=(0.0, storm_s),
                                          storm_retry_after_s=2.0, reasoning_tokens_median=300,
                                          content_tokens_median=120, runaway_rate=0.0)
    retry: dict[str, Any] = {} if rate_limit_wait_s is None else {"rate_limit_wait_s": rate_limit_wait_s}
    data = {
        "run_dir": str(work / name),
        "model": {"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": "bundled:qwen3"},
        "partitions": {"short": {"concurrency": conc, "max_tokens": 4096}},
        "datasets": [{"name": "storm", "path": str(work / "prompts.jsonl"), "partition": "short"}],
        "progress": "off", "retry": retry,
    }
    with start_in_thread(EmulatorOptions(scenario_obj=sc, api_key=KEY)) as emu:
        data["endpoint"] = {"kind": "openrouter", "base_url": emu.base_url}
        cfg = config_from_mapping(data, where=name, base_dir=work)
        t0 = time.perf_counter()
        rep = run_generate(cfg, echo=lambda s: None, prepare=run_prepare)
        wall = time.perf_counter() - t0
        storms = emu.state.by_fault["storm"]
    rd = RunDir(cfg.run_path)
    first = min((a.started_at for _, a in iter_jsonl(rd.attempts, AttemptRecord)), default=0.0)
    last = max((r.created_at for _, r in iter_jsonl(rd.raw("storm"), ResponseRecord)), default=first)
    return {"failed_fraction": round(rep.failed / n, 4), "done": rep.done, "failed": rep.failed, "exit_code": rep.exit_code,
            "wall_s": round(wall, 2), "recover_s": round(max(0.0, last - (first + storm_s)), 2), "storm_429s": storms}


def main() -> None:
    quick = quick_mode()
    n, conc, storm = (150, 120, 5.0) if quick else (600, 500, 20.0)
    os.environ["OPENROUTER_API_KEY"] = KEY
    work = Path(tempfile.mkdtemp(prefix="draftgen-bench-storm-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    try:
        with open(work / "prompts.jsonl", "w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(json.dumps({"messages": [{"role": "user", "content": f"Storm task {i}: item {i * 37 % 997}."}]})
                         + "\n")
        ours = _run(work, "draftgen", n, conc, storm, None)
        base = _run(work, "baseline", n, conc, storm, 0.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{n} samples at {conc} in flight, a {storm:g} s storm of 429 (Retry-After 2 s), then recovery")
    print(f"{'run':<10} {'failed':>8} {'done':>6} {'wall s':>8} {'recover s':>10} {'429s':>7}")
    for label, r in (("draftgen", ours), ("baseline", base)):
        print(f"{label:<10} {r['failed_fraction']:>8.2%} {r['done']:>6} {r['wall_s']:>8.1f} {r['recover_s']:>10.1f} "
              f"{r['storm_429s']:>7}")
    emit_result("storm", {
        "storm_failed_fraction": ours["failed_fraction"], "storm_recover_s": ours["recover_s"],
        "storm_wall_s": ours["wall_s"], "storm_429s": ours["storm_429s"],
        "baseline_failed_fraction": base["failed_fraction"], "baseline_wall_s": base["wall_s"],
        "samples": n, "in_flight": conc, "storm_s": storm,
    })
    sys.stdout.flush()


if __name__ == "__main__":
    main()
