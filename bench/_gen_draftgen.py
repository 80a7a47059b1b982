"""draftgen side of bench_generate: one ``run_generate`` against a running emulator, instrumented.

Run as a subprocess (its CPU time and peak RSS are its own)::

    python bench/_gen_draftgen.py SPEC.json

SPEC: {"base_url", "prompts", "run_dir", "concurrency", "max_tokens", "stream", "timeline": bool,
"stop_when_scheduled": seconds or null (stop this long after the last prompt was sent: steady state only)}.
Prints one JSON line with: n, failed, cpu_s (the engine's run, process CPU), process_cpu_s (the whole
process up to the end of ``run_generate``, imports and tokenizer load included, less the untimed
``run_prepare`` before it, whose CPU is prepare_cpu_s), wall_s, recon_cpu_s
(``build_output`` in the CPU pool, thread CPU), prompt_ids_cpu_s, raw_encode_cpu_s (the tokenizer's own
encode of the reasoning and the content of every record, afterwards), mean_latency_s, occupancy (busy HTTP
attempts ÷ concurrency, averaged over the steady state), peak_rss_mb.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _occupancy(spans: list[tuple[float, float]], concurrency: int, last_start: float) -> float | None:
    """Mean number of attempts on the wire ÷ concurrency, from when the slots first filled until the last
    prompt was sent (the ramp-up and the drain at the end are not steady state)."""
    if not spans:
        return None
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    busy, t_full = 0, None
    for t, d in events:
        busy += d
        if busy >= concurrency and t_full is None:
            t_full = t
            break
    if t_full is None or last_start <= t_full:
        return None
    total = 0.0
    for s, e in spans:
        lo, hi = max(s, t_full), min(e, last_start)
        if hi > lo:
            total += hi - lo
    return total / ((last_start - t_full) * concurrency)


def main(spec: dict[str, Any]) -> dict[str, Any]:
    from draftgen.backends.openrouter import OpenAIChatBackend
    from draftgen.config import config_from_mapping
    from draftgen.engine import scheduler
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare
    from draftgen.records import ResponseRecord
    from draftgen.store import iter_jsonl
    from draftgen.tokens.profile import Profile

    run_dir = Path(spec["run_dir"])
    # draftgen writes only into run directories it made: the dataset lives beside the run directory and
    # goes through ``run_prepare`` (untimed; its CPU is reported apart as prepare_cpu_s).
    source = run_dir.parent / f"{run_dir.name}-dataset.jsonl"
    with open(spec["prompts"], encoding="utf-8") as src, open(source, "w", encoding="utf-8") as dst:
        for line in src:
            if line.strip():
                dst.write(json.dumps({"messages": json.loads(line)["messages"]}) + "\n")
    cfg = config_from_mapping({
        "run_dir": str(run_dir),
        "endpoint": {"kind": "emulator", "base_url": spec["base_url"], "stream": spec["stream"],
                     "idle_timeout_s": spec.get("idle_timeout_s", 60)},
        "model": {"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": "bundled:qwen3"},
        "partitions": {"short": {"concurrency": spec["concurrency"], "max_tokens": spec["max_tokens"]},
                       "long": {"concurrency": 1, "max_tokens": 16}},
        "datasets": [{"name": "bench", "path": str(source), "partition": "short"}],
        "progress": "off",
    }, where="bench", base_dir=run_dir)

    lock = threading.Lock()
    acc = {"recon": 0.0, "prompt": 0.0}
    orig_build, orig_prompt = Profile.build_output, Profile.prompt_ids

    def build_output(self: Profile, *a: Any, **k: Any) -> Any:
        t = time.thread_time()
        try:
            return orig_build(self, *a, **k)
        finally:
            with lock:
                acc["recon"] += time.thread_time() - t

    def prompt_ids(self: Profile, *a: Any, **k: Any) -> Any:
        t = time.thread_time()
        try:
            return orig_prompt(self, *a, **k)
        finally:
            with lock:
                acc["prompt"] += time.thread_time() - t

    Profile.build_output = build_output  # type: ignore[method-assign]
    Profile.prompt_ids = prompt_ids  # type: ignore[method-assign]

    spans: list[tuple[float, float]] = []
    starts: list[float] = []  # first attempts only: the last one marks the end of the steady state
    seen: set[str] = set()
    orig_complete = OpenAIChatBackend.complete
    if spec.get("timeline"):
        async def complete(self: OpenAIChatBackend, req: Any) -> Any:
            t0 = time.monotonic()
            if req.sample_id not in seen:
                seen.add(req.sample_id)
                starts.append(t0)
            try:
                return await orig_complete(self, req)
            finally:
                spans.append((t0, time.monotonic()))

        OpenAIChatBackend.complete = complete  # type: ignore[method-assign]

    engine_cpu: dict[str, float] = {}
    orig_run = scheduler.Engine.run

    async def run(self: Any) -> Any:
        c0, w0 = _cpu(), time.perf_counter()
        watcher = None
        if spec.get("stop_when_scheduled") is not None:
            # Steady-state figures only: once every prompt has been sent, stop without waiting for the
            # slowest responses (and the fault tail) to come back.
            async def watch() -> None:
                while not self._producers or not all(p.done() for p in self._producers):
                    await asyncio.sleep(0.1)
                await asyncio.sleep(spec["stop_when_scheduled"])
                self.request_stop("bench: steady state measured", exit_code=0, hard=True)

            watcher = asyncio.get_running_loop().create_task(watch())
        try:
            return await orig_run(self)
        finally:
            if watcher is not None:
                watcher.cancel()
            engine_cpu["cpu"] = _cpu() - c0
            engine_cpu["wall"] = time.perf_counter() - w0

    scheduler.Engine.run = run  # type: ignore[method-assign]
    p0 = _cpu()
    run_prepare(cfg, echo=lambda s: None)
    prepare_cpu = _cpu() - p0
    acc["prompt"] = 0.0  # prompt ids counted while preparing are not part of the generate run
    report = run_generate(cfg, echo=lambda s: None, partition="short")
    # the whole process so far (imports, config, tokenizer load, the run, its finish) less the prepare step:
    # what `draftgen generate` costs as its own process
    process_cpu = _cpu() - prepare_cpu

    # The tokenizer's own encode of the same text, for the reconstruction ratio.
    from draftgen.tokens import profile_from_config

    tok = profile_from_config(cfg).tokenizer
    texts = []
    lat = []
    for _, rec in iter_jsonl(run_dir / "raw" / "bench" / "raw_responses.jsonl", ResponseRecord):
        texts.extend(s for s in (rec.reasoning, rec.content) if s)
        if rec.latency_s is not None:
            lat.append(rec.latency_s)
    t = time.thread_time()
    for s in texts:
        tok.encode(s)
    raw = time.thread_time() - t
    return {
        "n": report.done, "failed": report.failed, "cpu_s": engine_cpu.get("cpu"), "process_cpu_s": process_cpu, "prepare_cpu_s": prepare_cpu,
        "wall_s": engine_cpu.get("wall"),
        "recon_cpu_s": acc["recon"], "prompt_ids_cpu_s": acc["prompt"], "raw_encode_cpu_s": raw,
        "mean_latency_s": sum(lat) / len(lat) if lat else None,
        "occupancy": _occupancy(spans, spec["concurrency"], max(starts)) if starts else None,
        "peak_rss_mb": _peak_rss_mb(),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(Path(sys.argv[1]).read_text()))), flush=True)
