"""Peer-style baseline client for bench_generate: how the peers write it.

``openai.AsyncOpenAI`` + ``asyncio.Semaphore(concurrency)`` + one task per prompt created up front
(``asyncio.gather``) + one JSONL line appended (json.dumps, write, flush) per response. The SDK's pool is
raised to ``concurrency`` connections so the baseline is not throttled by httpx's default 1,000.

Run as a subprocess (so its CPU time is its own)::

    python bench/_gen_baseline.py BASE_URL PROMPTS.jsonl OUT.jsonl CONCURRENCY MAX_TOKENS [stream]

Prints one JSON line: {"n", "errors", "cpu_s", "wall_s", "peak_rss_mb"}.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def main(base_url: str, prompts_path: str, out_path: str, concurrency: int, max_tokens: int, stream: bool) -> dict[str, float]:
    try:
        import httpx
    except ImportError:  # newer openai releases ship httpx2
        import httpx2 as httpx  # type: ignore[no-redef]
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    prompts = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line.strip()]
    client = AsyncOpenAI(
        base_url=base_url, api_key="sk-or-bench-baseline", max_retries=6, timeout=600,
        http_client=DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=concurrency,
                                                                max_keepalive_connections=concurrency)),
    )
    sem = asyncio.Semaphore(concurrency)
    out = open(out_path, "a", encoding="utf-8")  # noqa: SIM115
    errors = 0

    async def one(p: dict) -> None:  # type: ignore[type-arg]
        nonlocal errors
        async with sem:
            try:
                if stream:
                    parts: list[str] = []
                    reasoning: list[str] = []
                    usage = None
                    s = await client.chat.completions.create(
                        model="qwen/qwen3-8b", messages=p["messages"], max_tokens=max_tokens, stream=True,
                        stream_options={"include_usage": True},
                    )
                    async for ch in s:
                        if ch.choices:
                            d = ch.choices[0].delta
                            if d.content:
                                parts.append(d.content)
                            r = getattr(d, "reasoning", None)
                            if r:
                                reasoning.append(r)
                        if ch.usage is not None:
                            usage = ch.usage.model_dump()
                    row = {"id": p["sample_id"], "content": "".join(parts), "reasoning": "".join(reasoning),
                           "usage": usage}
                else:
                    resp = await client.chat.completions.create(
                        model="qwen/qwen3-8b", messages=p["messages"], max_tokens=max_tokens,
                    )
                    msg = resp.choices[0].message
                    row = {"id": p["sample_id"], "content": msg.content,
                           "reasoning": getattr(msg, "reasoning", None),
                           "finish_reason": resp.choices[0].finish_reason,
                           "usage": resp.usage.model_dump() if resp.usage else None}
            except Exception:  # the peers count and move on
                errors += 1
                return
            out.write(json.dumps(row) + "\n")
            out.flush()

    c0, w0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    wall, cpu = time.perf_counter() - w0, _cpu() - c0
    out.close()
    await client.close()
    return {"n": len(prompts) - errors, "errors": errors, "cpu_s": cpu, "wall_s": wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


if __name__ == "__main__":
    a = sys.argv[1:]
    res = asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]), len(a) > 5 and a[5] == "stream"))
    print(json.dumps(res), flush=True)
