"""``python -m bench``: run every benchmark and write bench/RESULTS.md, the whole file.

Runs each ``bench/bench_*.py`` in its own subprocess (own process group, own timeout), so one failure or
hang does not stop the rest, and the whole run stays inside a global time budget (default 80 minutes; quick
30). A script's figures are read from its ``RESULT-JSON: {...}`` lines (see ``bench/_common.py``); its whole
output is kept verbatim as well. RESULTS.md (``bench/_results.py`` renders it) holds the machine, package
versions, git SHA, date and size (full or quick), a table of the targets from the issues (met / not met / not
measured), one section per script (every figure, each measured one with its goal, and the raw output), and
nothing else: every section is generated, the hidden-state extraction (``bench_extract``) and the CPU
drafter chain (``bench_chain``, scripts/tiny-chain's ``chain``) included; tests/test_bench_common.py checks
that the committed file is what this renders.

Flags: ``--quick`` (smoke size: every script gets ``DRAFTGEN_BENCH_QUICK=1`` and, where it accepts it,
``--quick``), ``--only NAME`` (repeatable; ``resume`` or ``bench_resume``), ``--budget SECONDS``,
``--timeout SECONDS`` (per script, overriding the defaults), ``--output PATH`` (default bench/RESULTS.md;
with ``--quick``, bench/RESULTS-quick.md so that a smoke run never replaces the full figures unless asked),
``--update`` (with ``--only``: re-run those and keep every other benchmark's section from the output file as
it is, the header naming the kept ones and that file's date; for a machine too loaded to run all in one go).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench._common import REPO_ROOT, git_sha, machine_info, package_versions, parse_results
from bench._results import BenchRun, Header, Target, read_date, read_runs, render

BENCH_DIR = Path(__file__).resolve().parent
PACKAGES = [
    "draftgen", "aiohttp", "msgspec", "orjson", "tokenizers", "tiktoken", "pyarrow", "openai", "uvloop",
]
# Seconds per script (full size, quick size). Their sum may exceed the global budget: the budget wins.
TIMEOUTS: dict[str, tuple[int, int]] = {
    "bench_resume": (150, 60),
    "bench_reconstruct": (150, 60),
    "bench_emulator": (150, 60),
    "bench_report": (120, 60),
    "bench_merge": (300, 90),
    "bench_generate": (480, 200),
    "bench_scale": (450, 120),
    "bench_peers": (420, 180),
    "bench_replay": (600, 600),
    "bench_plan": (420, 240),
    "bench_replay_batch": (600, 300),
    "bench_tail": (720, 240),
    "bench_extract": (600, 240),  # with the target-sized, model-free mode
    "bench_chain": (1200, 900),
    "bench_train_disk": (240, 90),
    "bench_storm": (240, 120),
    "bench_online": (3000, 600),  # the learned target at 2,208 rows: four trainings, four accepts
    "bench_loop": (1800, 1800),  # seven 24-epoch trainings and seven accepts on the learned target
    "bench_fidelity": (600, 600),
}
DEFAULT_TIMEOUT = (180, 90)
# Smoke-size flags for scripts that neither read DRAFTGEN_BENCH_QUICK nor accept --quick.
QUICK_ARGS: dict[str, list[str]] = {
    "bench_merge": ["--scale", "0.05"],
    "bench_emulator": ["--seconds", "2"],
}
# Run order: cheap and independent first, the long engine runs after.
ORDER = ["bench_resume", "bench_reconstruct", "bench_emulator", "bench_report", "bench_merge", "bench_generate",
         "bench_scale", "bench_storm", "bench_peers", "bench_replay", "bench_replay_batch", "bench_plan",
         "bench_tail", "bench_extract", "bench_train_disk", "bench_online", "bench_spotcheck", "bench_chain",
         "bench_fidelity", "bench_loop"]


TARGETS = [
    Target("emulator responses/s per core (~1k tokens, fast, streamed)", ("bench_emulator",),
           ("responses_per_s_per_core", "responses_per_s", "emulator_responses_per_s"), ">=", 1000, "issue 2",
           pattern=r"target >= 1000 responses/s.*?\((\d+(?:\.\d+)?)/s\)"),
    Target("request-path CPU vs openai-SDK baseline (ratio)", ("bench_generate",),
           ("request_path_cpu_ratio",), "<=", 1 / 3, "issue 3", detail=("total_cpu_ratio",)),
    Target("reconstruction cost vs raw tokenizer encode (ratio)", ("bench_reconstruct", "bench_generate"),
           ("reconstruct_vs_raw_ratio", "ratio_vs_raw", "overhead_ratio", "reconstruct_inline_vs_raw_ratio"),
           "<=", 1.25, "issue 3"),
    Target("slot occupancy at 2,000 in flight (realistic)", ("bench_generate",),
           ("slot_occupancy", "occupancy"), ">=", 0.97, "issue 3"),
    Target("peak RSS at 5,000 in flight (MiB)", ("bench_generate",),
           ("peak_rss_mb_5000", "rss_mb_5000", "peak_rss_mb_at_5000"), "<=", 1024, "issue 3"),
    Target("merge peak RSS at the reference's scale, with exports (GiB)", ("bench_merge",),
           ("peak_rss_gib", "peak_rss_gb"), "<=", 4, "issue 6",
           pattern=r"4 GB RSS budget: within \(worst (\d+(?:\.\d+)?) GiB"),
    Target("10x reference rate on one core: measured steady tokens/s", ("bench_scale",),
           ("max_sustained_tokens_per_s",), ">=", 460_000, "issue 7"),
    Target("10x reference rate on one core: client tokens per CPU second", ("bench_scale",),
           ("client_tokens_per_cpu_s",), ">=", 460_000, "issue 7"),
    Target("reference job replay: occupancy until budgets bind (token_policy expected)", ("bench_replay",),
           ("expected_occupancy",), ">=", 0.95, "issue 13"),
    Target("reference job replay: wall time vs ideal API-bound time (expected)", ("bench_replay",),
           ("expected_time_vs_ideal",), "<=", 1.1, "issue 13"),
    Target("plan's time vs the run it plans (quickstart job, realistic): abs(plan ÷ run - 1)", ("bench_plan",),
           ("plan_time_abs_error",), "<=", 0.25, "issue 23", detail=("plan_time_s", "run_time_s")),
    Target("reference job through the Batch API: cost vs sync on the emulator, same audit verdict (ratio)",
           ("bench_replay_batch",), ("batch_cost_vs_sync",), "<=", 0.55, "issue 26",
           detail=("batch_usd", "sync_usd", "same_audit_verdict")),
    Target("chaos quickstart: time to 100% of samples / time to 90% (tail guard on)", ("bench_tail",),
           ("on_tail_ratio",), "<=", 2.0, "issue 23", detail=("on_t90_s", "on_t100_s", "off_tail_ratio")),
    Target("chaos quickstart: hedges' extra spend, share of the run's spend", ("bench_tail",),
           ("on_extra_spend_fraction",), "<=", 0.03, "issue 23", detail=("on_hedges", "on_hedges_won")),
    Target("hidden-state extract vs the bare base-model forward, teacher_fraction 0.05 (ratio)", ("bench_extract",),
           ("extract_overhead_vs_forward",), "<=", 1.10, "issue 21",
           detail=("teacher5_extract_s", "bare_base_forward_s", "extract_cpu_overhead_vs_forward")),
    # 0.8, for samples of a real target's size (32 MiB): publishing one file per sample atomically (temp,
    # fsync, rename; a batch's files at once) plus one index part per batch may cost at most a fifth of the
    # disk's sequential rate, so that at the reference scale (5 TB of states) extract's writes stay bound by
    # the disk, not by per-file work (this tiny target's sub-MB samples, run_write_*, are shown beside it)
    Target("hidden-state store writes vs a plain sequential write of the same bytes (ratio)", ("bench_extract",),
           ("write_throughput_vs_sequential",), ">=", 0.8, "issue 21",
           detail=("store_write_mb_per_s", "sequential_write_mb_per_s", "run_write_throughput_vs_sequential")),
    # 0.8: extraction's host pipeline (checks read from the device's numbers, encode, sha256, atomic publish,
    # index parts, on the host pool) at target size (hidden 4,096 and 7,168, 8,192-token batches; the lower)
    # keeps within a fifth of a plain copy + write + fsync per file of the same bytes, so a GPU is not held up
    Target("extract host pipeline vs a plain copy + write of the same bytes, bf16 (ratio, model-free)",
           ("bench_extract",), ("host_pipeline_vs_plain_write_bf16",), ">=", 0.8, "issue 33",
           detail=("host_pipeline_vs_plain_write_bf16_4096", "host_pipeline_vs_plain_write_bf16_7168")),
    Target("extract host pipeline vs a plain copy + write of the same bytes, fp8 (ratio, model-free)",
           ("bench_extract",), ("host_pipeline_vs_plain_write_fp8",), ">=", 0.8, "issue 33",
           detail=("host_pipeline_vs_plain_write_fp8_4096", "host_pipeline_vs_plain_write_fp8_7168")),
    Target("drafter chain: AL trained - max(copy-last, lookup) (k=3, 64 held-out prompts)", ("bench_chain",),
           ("al_trained_minus_no_model",), ">=", 0.2, "issue 24", detail=("al_trained", "al_copy_last", "al_lookup")),
    Target("drafter chain: low end of the 95% interval of AL trained - max(copy-last, lookup)", ("bench_chain",),
           ("al_trained_minus_no_model_ci_lo",), ">", 0.0, "issue 24", detail=("al_trained_minus_no_model_ci_hi",)),
    Target("drafter chain: AL trained - zero-aux (the trained drafter fed zeroed aux states)", ("bench_chain",),
           ("al_trained_minus_zero_aux",), ">=", 0.2, "issue 24", detail=("al_trained", "al_zero_aux")),
    Target("drafter chain: low end of the 95% interval of AL trained - zero-aux", ("bench_chain",),
           ("al_trained_minus_zero_aux_ci_lo",), ">", 0.0, "issue 24", detail=("al_trained_minus_zero_aux_ci_hi",)),
    Target("drafter chain: AL trained - untrained (k=3, vLLM /metrics)", ("bench_chain",),
           ("al_trained_minus_untrained",), ">=", 0.3, "issue 15", detail=("al_trained", "al_untrained")),
    Target("drafter chain: held-out continuations of the learned target that loop", ("bench_chain",),
           ("held_out_looping",), "<=", 0, "issue 24", detail=("held_out_prompts", "held_out_target_right")),
    Target("drafter chain: SGLang meta_info AL vs the vLLM-counter AL on the same prompts (absolute difference)",
           ("bench_chain",), ("al_trained_sglang_vs_vllm",), "<=", 0.15, "issue 15",
           detail=("al_trained_sglang", "al_trained_vllm_same_prompts")),
    Target("drafter chain: states shifted by one, samples the extract checks flag reference_aux", ("bench_chain",),
           ("shifted_reference_aux",), ">=", 1, "issue 15", detail=("shifted_flagged", "shifted_samples")),
    Target("drafter chain: held-out prompts whose per-request counters (many in flight) differ from a pass one "
           "at a time around /metrics", ("bench_chain",), ("per_request_prompts_differ",), "<=", 0, "issue 35",
           detail=("per_request_prompts", "accept_per_request_s", "accept_one_at_a_time_s")),
    Target("drafter chain: AL at k=1 from the k=3 pass's per-position counts within the k=1 pass's interval "
           "(1 = yes)", ("bench_chain",), ("al_trained_k1_within_ci",), ">=", 1, "issue 35",
           detail=("al_trained_k1_served", "al_trained_k1_from_per_position")),
    Target("drafter chain: AL at k=2 from the k=3 pass's per-position counts within the k=2 pass's interval "
           "(1 = yes)", ("bench_chain",), ("al_trained_k2_within_ci",), ">=", 1, "issue 35",
           detail=("al_trained_k2_served", "al_trained_k2_from_per_position")),
    Target("provider fidelity on the chain's target: a provider serving it perturbed by 20% flagged (1 = yes)",
           ("bench_fidelity",), ("fidelity_perturbed_flagged",), ">=", 1, "issue 35",
           detail=("q20_top1", "faithful_top1", "q20_top1_gap_ci_lo", "q05_top1_gap", "q05_flagged")),
    Target("provider fidelity on the chain's target: providers flagged among two faithful ones",
           ("bench_fidelity",), ("fidelity_faithful_flagged",), "<=", 0, "issue 35",
           detail=("faithful_a_top1", "faithful_b_top1")),
    Target("data loop on the chain: AL guided - uniform round 2, on the dataset weakest after round 1",
           ("bench_loop",), ("al_guided_minus_uniform_weakest",), ">=", 0.2, "issue 35",
           detail=("al_guided_minus_uniform_weakest_ci_lo", "al_guided_minus_uniform_weakest_ci_hi", "weakest")),
    Target("data loop on the chain: AL guided - uniform round 2, traffic-weighted mean", ("bench_loop",),
           ("al_guided_minus_uniform_weighted",), ">=", 0.1, "issue 35",
           detail=("al_guided_minus_uniform_weighted_ci_lo", "al_guided_minus_uniform_weighted_ci_hi")),
    Target("data loop on the chain: AL of round 1's 24-epoch drafter - an independent draft LM of its size "
           "(ids only; same rows, steps, tokens)", ("bench_loop",), ("al_trained_minus_draft_lm",), ">=", 0.0,
           "issue 35", detail=("al_trained_minus_draft_lm_ci_lo", "al_trained_minus_draft_lm_ci_hi", "al_draft_lm",
                               "r1_val_loss_change_last_quarter")),
    Target("a 20 s 429 storm at 500 in flight: share of samples failed", ("bench_storm",),
           ("storm_failed_fraction",), "<=", 0.0, "issue 22",
           detail=("storm_recover_s", "baseline_failed_fraction")),
    Target("train: disk under train/ besides the drafter, as a fraction of the hidden set", ("bench_train_disk",),
           ("train_extra_disk_fraction",), "<=", 0.01, "issue 21",
           detail=("inputs_bytes_per_token", "set_bytes_per_token")),
    Target("train --online: bytes written besides the drafter (+ peak connector files) / the offline set",
           ("bench_online",), ("online_disk_fraction",), "<=", 0.01, "issue 25",
           detail=("online_written_bytes", "offline_set_bytes")),
    Target("train --online time / (offline extract + train) on the same rows", ("bench_online",),
           ("online_time_vs_offline",), "<=", 1.5, "issue 25",
           detail=("online_train_s", "offline_extract_s", "offline_train_s")),
    Target("train --online on the learned target: the online EAGLE-3 drafter's AL within the offline one's 95% "
           "interval (1 = yes)", ("bench_online",), ("al_online_in_offline_ci",), ">=", 1, "issue 25",
           detail=("al_online", "al_offline", "al_offline_ci_lo", "al_offline_ci_hi")),
]


def discover(only: list[str]) -> list[Path]:
    found = {p.stem: p for p in sorted(BENCH_DIR.glob("bench_*.py"))}
    if only:
        wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in only]
        missing = [n for n in wanted if n not in found]
        if missing:
            raise SystemExit(f"no such benchmark: {', '.join(missing)}; have: {', '.join(found)}")
        return [found[n] for n in wanted]
    ranked = sorted(found, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    return [found[n] for n in ranked]


def _accepts_quick(path: Path) -> bool:
    try:
        return "--quick" in path.read_text(encoding="utf-8") or "quick_mode" in path.read_text(encoding="utf-8")
    except OSError:
        return False


def run_one(run: BenchRun, *, quick: bool, timeout: float) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if quick:
        env["DRAFTGEN_BENCH_QUICK"] = "1"
    extra: list[str] = []
    if quick:
        extra = ["--quick"] if _accepts_quick(run.path) else QUICK_ARGS.get(run.name, [])
    cmd = [sys.executable, str(run.path), *extra]
    print(f"\n=== {run.name} (timeout {timeout:.0f} s) ===", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    chunks: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            chunks.append(line)
            sys.stdout.write("  " + line)
            sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        run.rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        run.rc = proc.wait()
    reader.join(timeout=10)
    run.wall_s = time.perf_counter() - t0
    run.output = "".join(chunks)
    run.results = parse_results(run.output)
    if timed_out:
        run.status = f"timed out after {timeout:.0f} s"
    elif run.rc != 0:
        run.status = f"failed (exit {run.rc})"
    elif not run.results:
        run.status = "ok (no RESULT-JSON; raw output only)"
    else:
        run.status = "ok"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the script and everything it started (emulator processes): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _update(runs: list[BenchRun], previous: str) -> tuple[list[BenchRun], list[str], str]:
    """Every benchmark, in the run order: the ones run now, the others as ``previous`` (a RESULTS.md) shows them
    (absent there: not run); with the names kept and ``previous``'s date."""
    now = {r.name: r for r in runs}
    before = {r.name: r for r in read_runs(previous, BENCH_DIR)}
    out = [now.get(p.stem) or before.get(p.stem) or BenchRun(p.stem, p) for p in discover([])]
    kept = [r.name for r in out if r.name not in now and r.name in before]
    return out, kept, read_date(previous)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke size (minutes, not the headline figures)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this benchmark")
    ap.add_argument("--budget", type=float, default=None, help="global time budget in seconds (default 4800; quick 1800)")
    ap.add_argument("--timeout", type=float, default=None, help="per-script timeout in seconds")
    ap.add_argument("--output", type=Path, default=None,
                    help="default bench/RESULTS.md (quick: bench/RESULTS-quick.md, so the full one is kept)")
    ap.add_argument("--update", action="store_true",
                    help="keep the sections of the benchmarks not run now from the output file")
    args = ap.parse_args(argv)
    raw_argv = list(argv if argv is not None else sys.argv[1:])
    budget = args.budget if args.budget is not None else (1800.0 if args.quick else 4800.0)
    output: Path = args.output or BENCH_DIR / ("RESULTS-quick.md" if args.quick else "RESULTS.md")
    paths = discover(args.only)
    runs = [BenchRun(p.stem, p) for p in paths]
    load_before = load_average()
    t0 = time.perf_counter()
    for run in runs:
        left = budget - (time.perf_counter() - t0)
        if left < 20:
            run.status = "not run: the global time budget was spent"
            continue
        own = args.timeout or TIMEOUTS.get(run.name, DEFAULT_TIMEOUT)[1 if args.quick else 0]
        run_one(run, quick=args.quick, timeout=min(own, left))
        print(f"=== {run.name}: {run.status}, {run.wall_s:.1f} s", flush=True)
    total = time.perf_counter() - t0
    kept: list[str] = []
    kept_date = ""
    if args.update and output.is_file():
        runs, kept, kept_date = _update(runs, output.read_text(encoding="utf-8"))
    header = Header(argv=raw_argv, date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    git=git_sha() or "unknown", quick=args.quick, total_s=total, machine=machine_info(),
                    packages=package_versions(PACKAGES), load_before=load_before, load_after=load_average(),
                    kept=kept, kept_date=kept_date)
    output.write_text(render(header, runs, TARGETS, BENCH_DIR), encoding="utf-8")
    print(f"\nwrote {output} ({total:.0f} s)")
    return 0 if all(r.status.startswith("ok") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
