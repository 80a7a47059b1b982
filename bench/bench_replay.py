"""The reference job, time-compressed: budgets and occupancy under both token policies, side by side.

The reference run held 2,000 requests in flight (short, max_tokens 10,240) and 500 (long, 16,384), with a
10M-token budget per dataset and $100, and finished 35,314 samples in 33 minutes. This replays that job
against the emulator and asks: does draftgen keep the configured concurrency busy until the budgets bind
(``budget.token_policy: expected``), where ``strict`` (every request reserves max_tokens) throttles it?

Workload (``--full``): 35,000 prompts over 6 datasets, 4 short (26,000, 2,500, 2,000 and 1,500) and 2
long (1,700 and 1,300), a 10M-token budget per dataset, $100 at Kimi-K2.5's routed prices (the
``realistic`` roster routed as examples/openrouter-kimi.yaml: fp4 hosts and Fireworks ignored, cheapest
first with fallbacks: Chutes $0.44/$2.00 per M serves most; the reservations use the worst routable
price, $3.00/M). The big short dataset binds its token budget at about 3,850 samples, the others run out
of prompts; both partitions have 5-6 waves of work; about 33M tokens, about $70, so the dollars come
near their cap (a full set of slots reserves about $20 at the mean, $86 at worst) but do not bind.

Emulated Kimi-like lengths: lognormal reasoning (median 1,170) and content (median 290), sigma 0.8, 2 %
runaways to max_tokens: about 2,600 completion tokens a sample, about 80 % reasoning. Latencies are the
``realistic`` roster's (Chutes: 1-8 s to first token, 20-70 tokens/s) times ``TIME_SCALE`` (0.1, so a
two-minute request takes 6 s); retry delays are scaled alike.

Scale: this 2-core machine cannot stream 60M tokens in a few minutes, so the default run divides samples,
budgets, dollars and concurrency by a scale (10: 3,500 prompts, 200/50 in flight, 1M-token budgets,
$10); ``--quick`` by 20. Every ratio that decides occupancy is kept: samples per slot (waves), budget per
slot × max_tokens, dollars per slot. ``--full`` runs the reference's own figures (``--scale N`` any).

Figures per policy (``expected_*``, ``strict_*``), from logs/attempts.jsonl and the generate report:

- ``occupancy``: mean requests on the wire ÷ configured concurrency, per partition weighted by it, from the
  first request until the budgets bind: the earliest of (a) the datasets' remaining token budget falls
  under one full set of slots at the mean length, (b) the dollars left fall under one full set of slots at
  the mean cost, (c) the last ``concurrency`` requests of the partition start (the final drain).
- ``time_vs_ideal``: wall time (first request to last response) ÷ the ideal API-bound time: the same
  samples with the same latencies (their attempts' durations), list-scheduled in their start order onto
  the configured slots of their partition with no gap (the makespan).
- ``tokens_over_budget`` (largest per dataset) and ``tokens_over_bound`` (its bound: concurrency ×
  max_tokens), ``usd_spent``, ``usd_over_budget`` and ``usd_in_flight_worst`` (the bound).

Goal (issue 13): ``expected_occupancy`` >= 0.95 and ``expected_time_vs_ideal`` <= 1.1.
The emulator runs in its own process pinned to CPU 0, the client in this one on CPU 1.
``DRAFTGEN_BENCH_KEEP=1`` keeps the temp folder.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
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
except ModuleNotFoundError:  # run as `python bench/bench_replay.py`
    from _common import (  # type: ignore[no-redef,import-not-found]
        REPO_ROOT,
        emit_result,
        free_port,
        pin_cpu,
        quick_mode,
        stop_process,
        wait_for_emulator,
    )

KEY = "sk-or-v1-" + "R3PL4Y" * 6
TIME_SCALE = 0.1
SHORT = {"concurrency": 2000, "max_tokens": 10240}
LONG = {"concurrency": 500, "max_tokens": 16384}
DATASETS = [("chat", "short", 26000), ("code", "short", 2500), ("tools", "short", 2000), ("math", "short", 1500),
            ("agentic", "long", 1700), ("docs", "long", 1300)]
TOKEN_BUDGET = 10_000_000
USD_BUDGET = 100.0
ROUTING = {"ignore": ["baseten/fp4", "deepinfra/fp4", "fireworks"], "sort": "price", "allow_fallbacks": True}
SCENARIO = f"""\
base: realistic
name: replay
time_scale: {TIME_SCALE}
reasoning_tokens_median: 1170
content_tokens_median: 290
length_sigma: 0.8
runaway_rate: 0.02
max_generated_tokens: 16384
stream_chunk_tokens: 32
keepalive_comments: 1
"""
GOAL_OCCUPANCY = 0.95
GOAL_TIME = 1.1



def _write_prompts(work: Path, scale: int) -> None:
    for name, _, n in DATASETS:
        with open(work / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(n // scale):
                fh.write(json.dumps({"messages": [{"role": "user", "content":
                                                   f"{name} task {i}: explain item {i * 31 % 1009} step by step."}]})
                         + "\n")


def _config(work: Path, run: str, url: str, scale: int, policy: str) -> dict[str, Any]:
    return {
        "run_dir": str(work / run),
        "model": {"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": "bundled:qwen3"},
        "endpoint": {"kind": "openrouter", "base_url": url, "idle_timeout_s": 60.0},
        "routing": ROUTING,
        "partitions": {"short": {**SHORT, "concurrency": SHORT["concurrency"] // scale},
                       "long": {**LONG, "concurrency": LONG["concurrency"] // scale}},
        "datasets": [{"name": n, "path": str(work / f"{n}.jsonl"), "partition": p} for n, p, _ in DATASETS],
        "budget": {"max_spend_usd": USD_BUDGET / scale, "token_budget": TOKEN_BUDGET // scale,
                   "token_policy": policy},
        "retry": {"base_delay_s": 0.5 * TIME_SCALE, "max_delay_s": 60.0 * TIME_SCALE,
                  "shutdown_grace_s": 30.0},
        "progress": "off",
    }


def _emulator(work: Path, port: int, credits: float) -> subprocess.Popen[bytes]:
    code = ("import sys; from draftgen.emulator import EmulatorOptions, serve_forever, load_scenario; "
            f"serve_forever(EmulatorOptions(port={port}, scenario_obj=load_scenario(sys.argv[1]), api_key={KEY!r}, "
            f"credits={credits}), echo=print)")
    log = open(work / "emulator.log", "ab")  # noqa: SIM115 (the emulator's stdout for its lifetime)
    return subprocess.Popen([sys.executable, "-c", code, str(work / "scenario.yaml")], stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: pin_cpu(0),
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src") + os.pathsep + str(REPO_ROOT)})


def _attempts(run_dir: Path) -> list[dict[str, Any]]:
    with open(run_dir / "logs" / "attempts.jsonl", "rb") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _first_time(events: list[tuple[float, float]], start: float, threshold: float) -> float | None:
    """First time the running sum of ``events`` (time, amount) from ``start`` reaches ``threshold``."""
    acc = start
    for t, amount in sorted(events):
        acc += amount
        if acc >= threshold:
            return t
    return None


def _analyse(cfg: dict[str, Any], atts: list[dict[str, Any]]) -> dict[str, Any]:
    part_of = {d["name"]: d["partition"] for d in cfg["datasets"]}
    conc = {p: cfg["partitions"][p]["concurrency"] for p in ("short", "long")}
    budget_tokens = cfg["budget"]["token_budget"]
    budget_usd = cfg["budget"]["max_spend_usd"]
    t0 = min(a["started_at"] for a in atts)
    t_last = max(a["ended_at"] for a in atts)
    ok = [a for a in atts if a["outcome"] == "ok"]
    mean_len = {p: [a["completion_tokens"] for a in ok if part_of[a["dataset"]] == p] for p in conc}
    mean_cost = {p: [a["cost"] for a in ok if part_of[a["dataset"]] == p] for p in conc}
    # (b) dollars: the spend booked by time t (responses in) reaches budget - one full set of slots' mean cost
    slots_usd = sum(conc[p] * (sum(mean_cost[p]) / max(1, len(mean_cost[p]))) for p in conc)
    t_usd = _first_time([(a["ended_at"], a["cost"]) for a in atts], 0.0, budget_usd - slots_usd)
    occ_num = occ_den = 0.0
    per_part: dict[str, float] = {}
    ideal = 0.0
    for p, c in conc.items():
        mine = [a for a in atts if part_of[a["dataset"]] == p]
        if not mine:
            continue
        datasets = {a["dataset"] for a in mine}
        mlen = sum(mean_len[p]) / max(1, len(mean_len[p]))
        # (a) tokens: the datasets' remaining budget falls under one full set of slots at the mean length
        t_tok = _first_time([(a["ended_at"], a["completion_tokens"]) for a in mine if a["outcome"] == "ok"], 0.0,
                            budget_tokens * len(datasets) - c * mlen)
        # (c) the final drain: the start of the last ``c`` samples of the partition
        firsts: dict[str, float] = {}
        dur: dict[str, float] = defaultdict(float)
        for a in mine:
            firsts[a["sample_id"]] = min(firsts.get(a["sample_id"], a["started_at"]), a["started_at"])
            dur[a["sample_id"]] += a["ended_at"] - a["started_at"]
        starts = sorted(firsts.values())
        t_drain = starts[max(0, len(starts) - c)]
        p0 = starts[0]
        end = min(x for x in (t_tok, t_usd, t_drain) if x is not None)
        # mean requests on the wire over [p0, end]
        busy = sum(max(0.0, min(a["ended_at"], end) - max(a["started_at"], p0)) for a in mine)
        span = max(1e-9, end - p0)
        per_part[p] = busy / (c * span)
        occ_num += busy
        occ_den += c * span
        # ideal: list-schedule the samples (their attempts' durations) in start order onto c slots
        slots = [p0] * c
        heapq.heapify(slots)
        finish = p0
        for sid in sorted(firsts, key=firsts.__getitem__):
            free = heapq.heappop(slots)
            done = max(free, p0) + dur[sid]
            finish = max(finish, done)
            heapq.heappush(slots, done)
        ideal = max(ideal, finish - t0)
    wall = t_last - t0
    return {"occupancy": occ_num / occ_den if occ_den else 0.0, "occupancy_short": per_part.get("short"),
            "occupancy_long": per_part.get("long"), "wall_s": wall, "ideal_s": ideal,
            "time_vs_ideal": wall / ideal if ideal > 0 else 0.0,
            "mean_tokens": sum(sum(v) for v in mean_len.values()) / max(1, sum(len(v) for v in mean_len.values()))}


def _run_policy(work: Path, scale: int, policy: str, credits: float) -> dict[str, Any]:
    import yaml

    from draftgen.config import config_from_mapping
    from draftgen.phases.generate.run import run_generate

    port = free_port()
    url = f"http://127.0.0.1:{port}/api/v1"
    emu = _emulator(work, port, credits)
    try:
        wait_for_emulator(url, KEY, emu, work / "emulator.log")
        data = _config(work, f"run-{policy}", url, scale, policy)
        (work / f"config-{policy}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
        cfg = config_from_mapping(data, where=f"replay-{policy}", base_dir=work)
        os.environ["OPENROUTER_API_KEY"] = KEY
        from draftgen.phases.prepare.run import run_prepare

        run_prepare(cfg, echo=lambda s: None)
        w0 = time.perf_counter()
        rep = run_generate(cfg, echo=lambda s: None, argv=["bench_replay"])
        run_wall = time.perf_counter() - w0
    finally:
        stop_process(emu)
    got = _analyse(data, _attempts(work / f"run-{policy}"))
    part_of = {d["name"]: d["partition"] for d in data["datasets"]}
    conc_mt = {p: data["partitions"][p]["concurrency"] * data["partitions"][p]["max_tokens"] for p in ("short", "long")}
    over = {d.name: d.tokens_over_budget for d in rep.datasets}
    worst_name = max(over, key=lambda n: over[n]) if over else None
    # the dollar bound: a full set of slots at max_tokens and the worst routable price ($3.00/M)
    usd_in_flight_worst = sum(data["partitions"][p]["concurrency"] * data["partitions"][p]["max_tokens"] * 3.0e-6
                              for p in ("short", "long"))
    got.update({
        "exit_code": rep.exit_code, "message": rep.message, "run_wall_s": run_wall, "samples": rep.done,
        "failed": rep.failed, "completion_tokens": rep.completion_tokens,
        "token_budget_total": data["budget"]["token_budget"] * len(rep.datasets),
        "tokens_over_budget": over[worst_name] if worst_name else 0,
        "tokens_over_bound": conc_mt[part_of[worst_name]] if worst_name else 0,
        "usd_spent": rep.spend_total, "usd_budget": data["budget"]["max_spend_usd"],
        "usd_over_budget": rep.spend_over_budget, "usd_in_flight_worst": usd_in_flight_worst,
    })
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="samples, budgets and concurrency ÷ 20")
    ap.add_argument("--full", action="store_true", help="the reference's own figures (35,000 prompts, 2,000/500)")
    ap.add_argument("--scale", type=int, default=None, help="divide samples, budgets and concurrency by N")
    ap.add_argument("--policy", action="append", choices=["expected", "strict"], help="only this policy")
    args = ap.parse_args()
    scale = args.scale or (1 if args.full else 20 if quick_mode() else 10)
    policies = args.policy or ["expected", "strict"]
    pin_cpu(1)
    work = Path(tempfile.mkdtemp(prefix="draftgen-bench-replay-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    results: dict[str, dict[str, Any]] = {}
    try:
        (work / "scenario.yaml").write_text(SCENARIO, encoding="utf-8")
        _write_prompts(work, scale)
        for policy in policies:
            results[policy] = _run_policy(work, scale, policy, credits=10 * USD_BUDGET)
    finally:
        if os.environ.get("DRAFTGEN_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    n = sum(k for _, _, k in DATASETS) // scale
    print(f"replay of the reference job ÷ {scale}: {n:,} prompts over {len(DATASETS)} datasets, "
          f"{SHORT['concurrency'] // scale}/{LONG['concurrency'] // scale} in flight, "
          f"{TOKEN_BUDGET // scale:,}-token budgets, ${USD_BUDGET / scale:g}; latencies realistic × {TIME_SCALE}")
    head = ("policy", "samples", "mean tok", "occupancy (short/long)", "wall s", "ideal s", "×ideal",
            "tokens/budget", "max over (bound)", "$ spent/budget", "$ over (bound)")
    rows = [head]
    for pol, r in results.items():
        rows.append((pol, f"{r['samples']:,}", f"{r['mean_tokens']:,.0f}",
                     f"{r['occupancy']:.3f} ({r['occupancy_short'] or 0:.3f}/{r['occupancy_long'] or 0:.3f})",
                     f"{r['wall_s']:.1f}", f"{r['ideal_s']:.1f}", f"{r['time_vs_ideal']:.3f}",
                     f"{r['completion_tokens'] / 1e6:.2f}M/{r['token_budget_total'] / 1e6:.1f}M",
                     f"{r['tokens_over_budget']:,} ({r['tokens_over_bound']:,})",
                     f"{r['usd_spent']:.2f}/{r['usd_budget']:g}",
                     f"{r['usd_over_budget']:.3f} ({r['usd_in_flight_worst']:.2f})"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    for pol, r in results.items():
        if r["exit_code"] not in (0,) and r["message"]:
            print(f"{pol}: stopped: {r['message']}")
    figures: dict[str, Any] = {"scale": scale, "time_scale": TIME_SCALE, "prompts": n}
    for pol, r in results.items():
        figures.update({
            f"{pol}_occupancy": round(r["occupancy"], 4),
            f"{pol}_time_vs_ideal": round(r["time_vs_ideal"], 4),
            f"{pol}_occupancy_short": None if r["occupancy_short"] is None else round(r["occupancy_short"], 4),
            f"{pol}_occupancy_long": None if r["occupancy_long"] is None else round(r["occupancy_long"], 4),
            f"{pol}_wall_s": round(r["wall_s"], 2),
            f"{pol}_ideal_s": round(r["ideal_s"], 2),
            f"{pol}_samples": r["samples"],
            f"{pol}_failed": r["failed"],
            f"{pol}_mean_completion_tokens": round(r["mean_tokens"], 1),
            f"{pol}_completion_tokens": r["completion_tokens"],
            f"{pol}_tokens_over_budget": r["tokens_over_budget"],
            f"{pol}_tokens_over_bound": r["tokens_over_bound"],
            f"{pol}_usd_spent": round(r["usd_spent"], 4),
            f"{pol}_usd_over_budget": round(r["usd_over_budget"], 4),
            f"{pol}_usd_in_flight_worst": round(r["usd_in_flight_worst"], 4),
        })
    if "expected" in results:
        e = results["expected"]
        met = e["occupancy"] >= GOAL_OCCUPANCY and e["time_vs_ideal"] <= GOAL_TIME
        print(f"goal (expected: occupancy >= {GOAL_OCCUPANCY}, time <= {GOAL_TIME}x ideal): {'met' if met else 'NOT met'}")
        figures["expected_meets_goals"] = met
    emit_result("replay", figures)


if __name__ == "__main__":
    main()
