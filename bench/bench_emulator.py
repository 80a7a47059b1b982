"""Benchmark: how many responses/s the emulator serves on one core, against a trivial aiohttp server.

    python bench/bench_emulator.py [--seconds 5] [--concurrency 128] [--clients N] [--max-tokens 1024]

The server under test runs in a subprocess pinned to CPU 0 (``os.sched_setaffinity`` where available);
load comes from ``--clients`` plain aiohttp client processes pinned to the other CPUs, each cycling
with a distinct prompt per request (no
prompt-cache hits; the output pool is warmed first, as it is after a run's first seconds). Measured for the emulator (``fast`` scenario, Qwen3 profile) non-streamed
and streamed, and for a baseline aiohttp server answering every POST with a fixed body of the same
size. Prints responses/s, completion tokens/s and the emulator/baseline ratio. When the client
processes saturate their CPUs first, the figures are a lower bound of the server's capacity
(the script says so). The server's CPU seconds per response (from /proc) give its capacity per core
independently of other load on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import time
from typing import Any

import orjson


def _pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_emulator(port: int, ready: Any) -> None:
    _pin({0})
    from draftgen.emulator.core import EmulatorOptions
    from draftgen.emulator.server import serve_forever

    serve_forever(EmulatorOptions(port=port, scenario="fast"), echo=lambda s: ready.set())


def _run_baseline(port: int, body_size: int, ready: Any) -> None:
    _pin({0})
    from aiohttp import web

    body = orjson.dumps({"id": "gen-1", "choices": [{"message": {"content": "x" * body_size}}]})
    sse = b"".join(b"data: " + orjson.dumps({"choices": [{"delta": {"content": "x" * 120}}]}) + b"\n\n"
                   for _ in range(max(1, body_size // 120))) + b"data: [DONE]\n\n"

    async def handle(request: web.Request) -> web.Response:
        req = orjson.loads(await request.read())
        if req.get("stream"):
            return web.Response(body=sse, content_type="text/event-stream")
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/api/v1/chat/completions", handle)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def _client(port: int, stream: bool, seconds: float, concurrency: int, max_tokens: int, cpu: int | None,
            offset: int, out: Any) -> None:
    if cpu is not None:
        _pin({cpu})
    import aiohttp

    async def main() -> tuple[int, int, int]:
        url = f"http://127.0.0.1:{port}/api/v1/chat/completions"
        headers = {"Authorization": "Bearer sk-or-bench", "Content-Type": "application/json"}
        head = orjson.dumps({"model": "qwen/qwen3-8b", "max_tokens": max_tokens, "stream": stream})[:-1]
        head += b',"messages":[{"role":"user","content":"Question '
        tail = b': explain the idea step by step."}]}'
        done = errors = tokens = 0
        deadline = time.monotonic() + seconds
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            async def worker(w: int) -> None:
                nonlocal done, errors, tokens
                i = w
                while time.monotonic() < deadline:
                    body = head + str(offset + i).encode() + tail  # every prompt distinct: no cache hits
                    async with session.post(url, data=body, headers=headers) as r:
                        data = await r.read()
                    if r.status != 200:
                        errors += 1
                    else:
                        done += 1
                        k = data.rfind(b'"completion_tokens":')
                        if k >= 0:
                            tokens += int(data[k + 20: data.index(b",", k)])
                    i += concurrency
            await asyncio.gather(*(worker(w) for w in range(concurrency)))
        return done, errors, tokens

    t0 = time.process_time()
    res = asyncio.run(main())
    out.put((*res, time.process_time() - t0))


def _measure(port: int, stream: bool, args: argparse.Namespace, offset: int) -> tuple[float, float, float]:
    ncpu = os.cpu_count() or 1
    q: Any = mp.Queue()
    procs = []
    for c in range(args.clients):
        cpu = 1 + c % (ncpu - 1) if ncpu > 1 else None
        p = mp.Process(target=_client, args=(port, stream, args.seconds, args.concurrency // args.clients,
                                             args.max_tokens, cpu, offset + c * 10_000_000, q))
        p.start()
        procs.append(p)
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    done = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    tokens = sum(r[2] for r in results)
    client_cpu = sum(r[3] for r in results) / (args.seconds * args.clients)
    if errors:
        print(f"  ({errors} non-200 responses)")
    return done / args.seconds, tokens / args.seconds, client_cpu


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _serve(target: Any, extra: tuple[Any, ...]) -> tuple[mp.Process, int]:
    port = _free_port()
    ready = mp.Event()
    p = mp.Process(target=target, args=(port, *extra, ready), daemon=True)
    p.start()
    if not ready.wait(60):
        raise SystemExit("server did not start")
    return p, port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--clients", type=int, default=max(1, min(4, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--max-tokens", type=int, default=1024)
    args = ap.parse_args()
    mp.set_start_method("spawn", force=True)
    print(f"cpus={os.cpu_count()} clients={args.clients} concurrency={args.concurrency} "
          f"seconds={args.seconds} max_tokens={args.max_tokens}")

    emu, port = _serve(_run_emulator, ())
    # Warm up: fill the output pool and prompt cache (as a long run would).
    _measure(port, False, argparse.Namespace(**{**vars(args), "seconds": 2.0}), 0)
    results: dict[str, tuple[float, float, float]] = {}
    cpu_per_response: dict[str, float] = {}

    def run(name: str, proc: mp.Process, p: int, stream: bool, offset: int) -> None:
        c0 = _cpu_seconds(proc.pid)
        results[name] = _measure(p, stream, args, offset)
        c1 = _cpu_seconds(proc.pid)
        if c0 is not None and c1 is not None and results[name][0] > 0:
            cpu_per_response[name] = (c1 - c0) / (results[name][0] * args.seconds)

    for stream in (False, True):
        run(f"emulator {'stream' if stream else 'whole'}", emu, port, stream, 100_000_000 * (1 + stream))
    emu.terminate()
    emu.join()

    body_size = 4500
    base, bport = _serve(_run_baseline, (body_size,))
    for stream in (False, True):
        run(f"baseline {'stream' if stream else 'whole'}", base, bport, stream, 0)
    base.terminate()
    base.join()

    for name, (rps, tps, ccpu) in results.items():
        note = "  (clients saturated: lower bound)" if ccpu > 0.9 else ""
        cpu = cpu_per_response.get(name)
        cap = f"  server {cpu * 1e6:5.0f} us CPU/response = {1 / cpu:6.0f}/s per core" if cpu else ""
        print(f"{name:18s} {rps:9.0f} responses/s {tps:11.0f} tokens/s  client cpu {ccpu:4.0%}{cap}{note}")
    for mode in ("whole", "stream"):
        e, b = results[f"emulator {mode}"][0], results[f"baseline {mode}"][0]
        print(f"ratio emulator/baseline ({mode}): {e / b:.2f}")
    # Capacity from server CPU time is robust to a busy machine; the wall-clock rate is what clients got.
    caps = [1 / cpu_per_response[k] for k in ("emulator whole", "emulator stream") if k in cpu_per_response]
    worst = min(caps) if caps else min(results["emulator whole"][0], results["emulator stream"][0])
    print(f"target >= 1000 responses/s of ~{args.max_tokens} tokens on one core: "
          f"{'met' if worst >= 1000 else 'NOT met'} ({worst:.0f}/s)")


if __name__ == "__main__":
    main()
