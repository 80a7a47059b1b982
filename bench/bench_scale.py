"""A run at the reference's scale, time-compressed: 35,000 samples and ~90.9M completion tokens.

The reference run sent 35,314 samples (90.9M tokens) in 33 minutes at 2,000 in flight: about 46k
tokens/s in aggregate. Can draftgen's client sustain ten times that (460k tokens/s) on one core?

The emulator (``fast`` scenario, responses sized to about 2,600 completion tokens a sample, no latency)
runs in its own process pinned to CPU 0; ``run_generate`` (default settings: streamed, 2,000 in flight,
exact ids rebuilt from text) runs in another pinned to CPU 1, so the client has exactly one core,
reconstruction threads included. Prompts are prepared first (not timed).

Reported: the completion-token and response rates over the whole run and over its steady part (5 %-95 %
of the records by completion time), the client's CPU seconds and utilisation, its capacity per core
(tokens / client CPU second), and the emulator's CPU (when the emulator's core is saturated while the
client's is not, the emulator is the limit and the client's capacity figure is the better estimate).
``--quick``: 3,500 samples. ``DRAFTGEN_BENCH_KEEP=1`` keeps the temp folder (run dir, logs) for a look.
"""

from __future__ import annotations

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
        peak_rss_mb,
        pin_cpu,
        quick_mode,
        stop_process,
        wait_for_emulator,
    )
except ModuleNotFoundError:  # run as `python bench/bench_scale.py`
    from _common import (  # type: ignore[no-redef,import-not-found]
        REPO_ROOT,
        emit_result,
        free_port,
        peak_rss_mb,
        pin_cpu,
        quick_mode,
        stop_process,
        wait_for_emulator,
    )

KEY = "sk-or-v1-" + "SC4L3" * 8
REFERENCE_TOKENS_PER_S = 90.9e6 / (33 * 60)  # 45.9k
TARGET_TOKENS_PER_S = 460_000
SCENARIO = """\
base: fast
name: scale
reasoning_tokens_median: 1540
content_tokens_median: 460
length_sigma: 0.3
runaway_rate: 0.0
max_generated_tokens: 10000
"""



def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(config: str, base_url: str) -> dict[str, Any]:
    """In its own process, on one core: prepare (untimed), then the timed generate."""
    import resource

    from draftgen.config import load_config
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare

    pin_cpu(1)
    os.environ["OPENROUTER_API_KEY"] = KEY
    cfg = load_config(config)
    run_prepare(cfg, echo=lambda s: None)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.time()
    w0 = time.perf_counter()
    report = run_generate(cfg, echo=lambda s: None, argv=["bench_scale"], base_url_flag=base_url)
    wall = time.perf_counter() - w0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "start": t0, "cpu_s": ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime,
            "peak_rss_mb": peak_rss_mb(), "exit_code": report.exit_code, "failed": report.failed,
            "message": report.message}


def _steady(raw: Path, t_start: float) -> dict[str, Any]:
    """Rates over the whole run and over its steady part (5 %-95 % of records by completion time)."""
    rows: list[tuple[float, int]] = []
    with open(raw, "rb") as fh:
        for line in fh:
            rec = json.loads(line)
            rows.append((rec["created_at"], rec["usage"]["completion_tokens"]))
    rows.sort()
    n = len(rows)
    lo, hi = int(n * 0.05), max(int(n * 0.95) - 1, int(n * 0.05) + 1)
    span = rows[hi][0] - rows[lo][0]
    tokens_mid = sum(t for _, t in rows[lo + 1 : hi + 1])
    total = sum(t for _, t in rows)
    return {"samples": n, "completion_tokens": total, "steady_tokens_per_s": tokens_mid / span if span > 0 else 0.0,
            "steady_responses_per_s": (hi - lo) / span if span > 0 else 0.0,
            "first_record_after_s": rows[0][0] - t_start}


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3])), flush=True)
        return
    import yaml

    quick = quick_mode()
    n = 3_500 if quick else 35_000
    work = Path(tempfile.mkdtemp(prefix="draftgen-bench-scale-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    emu: subprocess.Popen[bytes] | None = None
    try:
        (work / "scenario.yaml").write_text(SCENARIO, encoding="utf-8")
        with open(work / "prompts.jsonl", "w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(json.dumps({"messages": [{"role": "user", "content": f"Task {i}: explain item {i * 31 % 1009}."}]})
                         + "\n")
        cfg = {
            "run_dir": str(work / "run"),
            "model": {"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": "bundled:qwen3"},
            "endpoint": {"kind": "openrouter", "base_url": None},
            "partitions": {"short": {"concurrency": 2000, "max_tokens": 10240},
                           "long": {"concurrency": 500, "max_tokens": 16384}},
            "datasets": [{"name": "scale", "path": str(work / "prompts.jsonl"), "partition": "short"}],
            "progress": "off",
        }
        port = free_port()
        url = f"http://127.0.0.1:{port}/api/v1"
        cfg["endpoint"]["base_url"] = url  # type: ignore[index]
        (work / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
        log = open(work / "emulator.log", "wb")  # noqa: SIM115 (the emulator's stdout for its lifetime)
        emu = subprocess.Popen([sys.executable, "-m", "draftgen.cli", "emulate", "--port", str(port), "--scenario",
                                str(work / "scenario.yaml"), "--credits", "1000000000"],
                               env={**os.environ, "DRAFTGEN_EMULATOR_API_KEY": KEY}, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: pin_cpu(0))
        wait_for_emulator(url, KEY, emu, work / "emulator.log")
        emu_cpu0 = _proc_cpu_s(emu.pid)
        res = subprocess.run([sys.executable, __file__, "--worker", str(work / "config.yaml"), url],
                             capture_output=True, text=True, check=False, timeout=1500,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        emu_cpu = _proc_cpu_s(emu.pid) - emu_cpu0
        if res.returncode != 0:
            raise SystemExit("the client failed: " + res.stderr[-3000:])
        got: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
        if got["exit_code"] != 0:
            raise SystemExit(f"the run did not finish (exit {got['exit_code']}): {got['message']}")
        steady = _steady(work / "run" / "raw" / "scale" / "raw_responses.jsonl", got["start"])
    finally:
        if emu is not None:
            stop_process(emu)
        if os.environ.get("DRAFTGEN_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    tokens, wall, cpu = steady["completion_tokens"], got["wall_s"], got["cpu_s"]
    overall = tokens / wall
    capacity = tokens / cpu if cpu > 0 else 0.0
    sustained = steady["steady_tokens_per_s"]
    print(f"{steady['samples']:,} samples, {tokens / 1e6:.1f}M completion tokens "
          f"({tokens / max(1, steady['samples']):,.0f}/sample), 2,000 in flight, streamed, one client core")
    print(f"wall {wall:.1f} s (the reference: 33 min); failed {got['failed']}; exit {got['exit_code']}")
    print(f"overall: {overall / 1e3:,.0f}k tokens/s, {steady['samples'] / wall:,.0f} responses/s")
    print(f"steady (5-95 %): {sustained / 1e3:,.0f}k tokens/s, {steady['steady_responses_per_s']:,.0f} responses/s "
          f"= {sustained / REFERENCE_TOKENS_PER_S:.1f}x the reference's {REFERENCE_TOKENS_PER_S / 1e3:.1f}k tokens/s")
    print(f"client: {cpu:.1f} CPU s ({cpu / wall:.0%} of its core), {capacity / 1e3:,.0f}k tokens per CPU second, "
          f"peak RSS {got['peak_rss_mb']:.0f} MiB; emulator: {emu_cpu:.1f} CPU s ({emu_cpu / wall:.0%} of its core)")
    verdict = "yes" if sustained >= TARGET_TOKENS_PER_S else "no"
    print(f"10x the reference ({TARGET_TOKENS_PER_S / 1e3:.0f}k tokens/s) on one core: {verdict}")
    emit_result("scale", {
        "samples": steady["samples"],
        "completion_tokens": tokens,
        "tokens_per_sample": round(tokens / max(1, steady["samples"]), 1),
        "wall_s": round(wall, 2),
        "overall_tokens_per_s": round(overall),
        "overall_responses_per_s": round(steady["samples"] / wall, 1),
        "max_sustained_tokens_per_s": round(sustained),
        "max_sustained_responses_per_s": round(steady["steady_responses_per_s"], 1),
        "x_reference_rate": round(sustained / REFERENCE_TOKENS_PER_S, 2),
        "meets_10x_reference": sustained >= TARGET_TOKENS_PER_S,
        "client_cpu_s": round(cpu, 2),
        "client_cpu_utilisation": round(cpu / wall, 3),
        "client_tokens_per_cpu_s": round(capacity),
        "client_peak_rss_mb": round(got["peak_rss_mb"], 1),
        "emulator_cpu_utilisation": round(emu_cpu / wall, 3),
        "failed": got["failed"],
    })


if __name__ == "__main__":
    main()
