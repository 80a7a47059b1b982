"""The tail of a chaotic run: how long the last 10 % of samples take, with the tail guard on and off.

The quickstart (examples/quickstart.yaml: 284 prompts over chat, code and tools, 64 short slots, max_tokens
4,096, retry.max_attempts 6) against the emulator's ``chaos`` scenario, seed 7: about 40 % of attempts
fail, of every fault kind, on a compressed clock (``time_scale`` 0.01) except ``hang``, which stops a
request for 10 minutes (before its headers, or mid-stream), so a client waits out its own bounds. Without
the tail guard the last samples sit out the 180 s idle timeout while the other slots idle: the run takes
minutes for what the first 90 % did in seconds.

Figures per run (``on``: the default ``tail.*``; ``off``: ``tail.slow_window_s: 0`` and
``tail.hedge_max_extra_spend: 0``, no rate floor and no hedges), from logs/attempts.jsonl (each sample's
finish: the end of the attempt whose response became its record, from the first request) and the generate
report:

- ``tail_ratio``: time to 100 % of samples ÷ time to 90 %;
- ``t50_s``, ``t90_s``, ``t100_s``;
- ``extra_spend_fraction``: what the losing requests of hedged samples cost ÷ this run's spend (both as
  draftgen booked them: a cancelled stream at the routed prices for its prompt and the tokens it received);
- ``hedges``, ``hedges_won``, ``slow_streams``, ``samples``, ``failed``.

Goal (issue 23): ``on_tail_ratio`` <= 2 with ``on_extra_spend_fraction`` <= 0.03. ``--quick`` runs only
``on``. The emulator runs in its own process pinned to CPU 0, the client in this one on CPU 1.
``DRAFTGEN_BENCH_KEEP=1`` keeps the temp folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
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
except ModuleNotFoundError:  # run as `python bench/bench_tail.py`
    from _common import (  # type: ignore[no-redef,import-not-found]
        REPO_ROOT,
        emit_result,
        free_port,
        pin_cpu,
        quick_mode,
        stop_process,
        wait_for_emulator,
    )

KEY = "sk-or-v1-" + "T41L" * 8
SEED = 7
GOAL_RATIO = 2.0
GOAL_EXTRA = 0.03
MODES = {"on": {}, "off": {"slow_window_s": 0.0, "hedge_max_extra_spend": 0.0}}


def _config(work: Path, mode: str, url: str) -> dict[str, Any]:
    import yaml

    data: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples" / "quickstart.yaml").read_text(encoding="utf-8"))
    data["run_dir"] = str(work / f"run-{mode}")
    data["endpoint"] = {"kind": "emulator", "base_url": url}
    data["tail"] = MODES[mode]
    data["progress"] = "off"
    return data


def _emulator(work: Path, port: int) -> subprocess.Popen[bytes]:
    code = ("from draftgen.emulator import EmulatorOptions, serve_forever; "
            f"serve_forever(EmulatorOptions(port={port}, scenario='chaos', seed={SEED}, api_key={KEY!r}, "
            "credits=100.0), echo=print)")
    log = open(work / "emulator.log", "ab")  # noqa: SIM115 (the emulator's stdout for its lifetime)
    return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: pin_cpu(0),
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src") + os.pathsep + str(REPO_ROOT)})


def _finish_times(run_dir: Path) -> tuple[list[float], list[dict[str, Any]]]:
    """Each sample's finish (its record's attempt's end) from the first request, sorted; and every attempt."""
    with open(run_dir / "logs" / "attempts.jsonl", "rb") as fh:
        atts = [json.loads(line) for line in fh if line.strip()]
    t0 = min(a["started_at"] for a in atts)
    ends: dict[str, float] = {}
    for a in atts:
        if a["outcome"] == "ok":
            ends[f"{a['dataset']}/{a['sample_id']}"] = a["ended_at"] - t0
    return sorted(ends.values()), atts


def _at(times: list[float], q: float) -> float:
    """The time by which a share ``q`` of the samples had finished."""
    return times[max(0, min(len(times) - 1, math.ceil(q * len(times) - 1e-9) - 1))]


def _run(work: Path, mode: str) -> dict[str, Any]:
    from draftgen.config import config_from_mapping
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare

    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    emu = _emulator(work, port)
    try:
        wait_for_emulator(url, KEY, emu, work / "emulator.log")
        data = _config(work, mode, url)
        cfg = config_from_mapping(data, where=f"tail-{mode}", base_dir=REPO_ROOT / "examples")
        os.environ["OPENROUTER_API_KEY"] = KEY
        run_prepare(cfg, echo=lambda s: None)
        rep = run_generate(cfg, echo=lambda s: None, argv=["bench_tail", mode])
    finally:
        stop_process(emu)
    times, atts = _finish_times(work / f"run-{mode}")
    t90, t100 = _at(times, 0.9), times[-1]
    return {
        "tail_ratio": round(t100 / t90, 3) if t90 > 0 else None, "t50_s": round(_at(times, 0.5), 2),
        "t90_s": round(t90, 2), "t100_s": round(t100, 2),
        "extra_spend_fraction": round(rep.hedge_extra_usd / rep.spend_session, 4) if rep.spend_session else 0.0,
        "extra_usd": round(rep.hedge_extra_usd, 5), "spend_usd": round(rep.spend_session, 4),
        "hedges": rep.hedges, "hedges_won": rep.hedges_won, "slow_streams": rep.slow_streams,
        "attempts": len(atts), "samples": rep.done, "failed": rep.failed, "exit_code": rep.exit_code,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="only the run with the tail guard on")
    ap.add_argument("--mode", action="append", choices=list(MODES), help="only this mode")
    args = ap.parse_args()
    modes = args.mode or (["on"] if quick_mode() else ["on", "off"])
    pin_cpu(1)
    work = Path(tempfile.mkdtemp(prefix="draftgen-bench-tail-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    results: dict[str, dict[str, Any]] = {}
    try:
        for mode in modes:
            results[mode] = _run(work, mode)
    finally:
        if os.environ.get("DRAFTGEN_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"quickstart (284 prompts) on the chaos scenario, seed {SEED}; time from the first request")
    head = ("tail", "samples", "t50 s", "t90 s", "t100 s", "t100/t90", "hedges (won)", "slow", "extra $ (share)")
    rows = [head] + [(m, str(r["samples"]), f"{r['t50_s']:.1f}", f"{r['t90_s']:.1f}", f"{r['t100_s']:.1f}",
                      f"{r['tail_ratio']:.2f}", f"{r['hedges']} ({r['hedges_won']})", str(r["slow_streams"]),
                      f"{r['extra_usd']:.4f} ({r['extra_spend_fraction']:.2%})") for m, r in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    figures: dict[str, Any] = {"seed": SEED}
    for mode, r in results.items():
        figures.update({f"{mode}_{k}": v for k, v in r.items()})
    if "on" in results:
        on = results["on"]
        met = on["tail_ratio"] is not None and on["tail_ratio"] <= GOAL_RATIO and on["extra_spend_fraction"] <= GOAL_EXTRA
        print(f"goal (tail on: t100/t90 <= {GOAL_RATIO:g} with extra spend <= {GOAL_EXTRA:.0%}): "
              f"{'met' if met else 'NOT met'}")
        figures["on_meets_goals"] = met
    emit_result("tail", figures)


if __name__ == "__main__":
    main()
