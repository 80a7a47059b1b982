"""draftgen against the peers' clients, at 2,000 and 5,000 requests in flight, on the same emulator.

Clients (each in its own process pinned to one core, the emulator pinned to another):

- ``draftgen``: ``run_generate`` on an equivalent config (non-streamed, so that every client reads the same
  bytes). It does more work per response than the peers: it rebuilds exact token ids from the text (the
  tokenizer-bound reconstruction) and fsyncs every batch;
- ``curator``: ``bespokelabs-curator``'s ``LLM`` with the ``openai`` backend pointed at the emulator.
  Curator and its dependencies pin versions that clash with draftgen's, so it runs from its own venv
  (``$DRAFTGEN_CURATOR_PYTHON``, else ``~/.cache/draftgen-bench/venv-curator``, created with
  ``pip install bespokelabs-curator`` when missing). Offline, it needs telemetry off, LiteLLM's local cost map
  and a tiktoken file: its request estimator asks for ``cl100k_base``, which cannot be downloaded here, so
  it is given ``o200k_base`` from ``../shared`` (an equally costly BPE). When any of this fails, the output
  says why and the other clients still run;
- ``openai``: the peers' usual baseline, ``AsyncOpenAI`` + ``asyncio.Semaphore`` + JSONL appends (its pool
  raised to the concurrency, else httpx caps it at 1,000 connections).

Workload: N distinct prompts, ``max_tokens`` 4,096, responses of about 1,000 tokens, and a 1 s time to first
token so that the cap really is reached. Measured per client: CPU seconds per 1,000 responses (all
threads), wall time, peak RSS (and RSS after imports). ``--quick``: 1,000 prompts at 200 and 500 in flight.
"""

from __future__ import annotations

import asyncio
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
    )
except ModuleNotFoundError:  # run as `python bench/bench_peers.py`
    from _common import REPO_ROOT, emit_result, free_port, peak_rss_mb, pin_cpu, quick_mode, stop_process  # type: ignore[no-redef,import-not-found]

KEY = "sk-or-v1-" + "B3NCH" * 8
MODEL = "qwen/qwen3-8b"
MAX_TOKENS = 4096
SHARED = REPO_ROOT.parent / "shared"
O200K = SHARED / "assets" / "tokenizers" / "gpt-oss" / "o200k_base.tiktoken"
O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"  # sha1 of tiktoken's o200k_base URL
SCENARIO = """\
base: fast
name: peers
reasoning_tokens_median: 700
content_tokens_median: 300
length_sigma: 0.05
runaway_rate: 0.0
providers:
  - {name: Emu, tag: emu/bf16, quantization: bf16, ttft_s: [1.0, 1.0], tokens_per_s: [0, 0]}
"""



# -- workers (each runs in its own process; prints one JSON line) ----------------------------------------


def _prompts(spec: dict[str, Any]) -> list[str]:
    return [json.loads(line)["messages"][0]["content"] for line in Path(spec["prompts"]).read_text().splitlines()]


def _measure_start() -> tuple[float, float, float]:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), ru.ru_utime + ru.ru_stime, peak_rss_mb()


def _measure_end(start: tuple[float, float, float], **extra: Any) -> dict[str, Any]:
    import resource

    w0, c0, rss0 = start
    ru = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": time.perf_counter() - w0, "cpu_s": ru.ru_utime + ru.ru_stime - c0
            + kids.ru_utime + kids.ru_stime, "peak_rss_mb": peak_rss_mb(), "rss_after_import_mb": rss0, **extra}


def worker_openai(spec: dict[str, Any]) -> dict[str, Any]:
    import httpx2 as httpx  # the installed openai SDK's transport
    import openai

    prompts = _prompts(spec)
    out = Path(spec["workdir"]) / "openai_responses.jsonl"
    c = spec["concurrency"]
    start = _measure_start()

    async def main() -> tuple[int, int]:
        client = openai.AsyncOpenAI(
            base_url=spec["base_url"], api_key=spec["key"], max_retries=6, timeout=600,
            http_client=openai.DefaultAsyncHttpxClient(
                limits=httpx.Limits(max_connections=c, max_keepalive_connections=c)),
        )
        sem = asyncio.Semaphore(c)
        ok = failed = 0
        with open(out, "a", encoding="utf-8") as fh:

            async def one(i: int, prompt: str) -> None:
                nonlocal ok, failed
                async with sem:
                    try:
                        resp = await client.chat.completions.create(
                            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS)
                    except openai.OpenAIError:
                        failed += 1
                        return
                fh.write(json.dumps({"id": i, "response": resp.model_dump()}) + "\n")
                ok += 1

            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        await client.close()
        return ok, failed

    ok, failed = asyncio.run(main())
    return _measure_end(start, responses=ok, failed=failed)


def worker_curator(spec: dict[str, Any]) -> dict[str, Any]:
    work = Path(spec["workdir"])
    os.environ.update({
        "TELEMETRY_ENABLED": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1", "CURATOR_DISABLE_RICH_DISPLAY": "1", "CURATOR_VIEWER": "0",
        # a fresh cache per run: curator would otherwise serve the second run from the first one's cache
        "CURATOR_CACHE_DIR": str(work / f"curator-cache-{spec['concurrency']}"),
        "TIKTOKEN_CACHE_DIR": spec["tiktoken_cache"],
    })
    import tiktoken

    real_get_encoding = tiktoken.get_encoding

    def o200k(encoding_name: str) -> tiktoken.Encoding:  # cl100k cannot be fetched offline
        return real_get_encoding("o200k_base")

    tiktoken.get_encoding = o200k
    from bespokelabs import curator  # type: ignore[import-not-found]

    prompts = _prompts(spec)
    llm = curator.LLM(
        model_name=MODEL, backend="openai", generation_params={"max_tokens": MAX_TOKENS},
        backend_params={
            "base_url": spec["base_url"], "api_key": spec["key"], "max_requests_per_minute": 100_000_000,
            "max_tokens_per_minute": 100_000_000_000, "max_concurrent_requests": spec["concurrency"],
            "max_retries": 6, "require_all_responses": False, "request_timeout": 600,
        },
    )
    start = _measure_start()
    result = llm(prompts)
    ds = getattr(result, "dataset", result)
    return _measure_end(start, responses=len(ds), failed=len(prompts) - len(ds))


def worker_draftgen(spec: dict[str, Any]) -> dict[str, Any]:
    import threading

    from draftgen.config import load_config
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare
    from draftgen.store import scan_responses
    from draftgen.tokens.profile import Profile

    # Thread CPU spent rebuilding ids (work the peers do not do), to show the request path on its own.
    lock = threading.Lock()
    spent = {"ids": 0.0}

    def timed(fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                with lock:
                    spent["ids"] += time.thread_time() - t

        return wrapper

    os.environ["OPENROUTER_API_KEY"] = spec["key"]
    cfg = load_config(spec["config"])
    run_prepare(cfg, echo=lambda s: None)  # not timed: the peers get their prompts as a ready list
    Profile.build_output = timed(Profile.build_output)  # type: ignore[method-assign]
    Profile.prompt_ids = timed(Profile.prompt_ids)  # type: ignore[method-assign]
    start = _measure_start()
    report = run_generate(cfg, echo=lambda s: None, argv=["bench_peers"])
    idx = scan_responses(cfg.run_path / "raw" / "peers" / "raw_responses.jsonl")
    return _measure_end(start, responses=len(idx.done), failed=spec["n"] - len(idx.done),
                        exit_code=report.exit_code, ids_cpu_s=spent["ids"])


WORKERS = {"openai": worker_openai, "curator": worker_curator, "draftgen": worker_draftgen}

# -- the orchestration -------------------------------------------------------------------------------------


def curator_python() -> tuple[str | None, str]:
    """The curator venv's interpreter (created on first use), or None and why not."""
    env = os.environ.get("DRAFTGEN_CURATOR_PYTHON")
    if env:
        return (env, "from $DRAFTGEN_CURATOR_PYTHON") if Path(env).exists() else (None, f"{env} does not exist")
    venv = Path.home() / ".cache" / "draftgen-bench" / "venv-curator"
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"creating {venv} and installing bespokelabs-curator (first run only)", flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
            res = subprocess.run([str(py), "-m", "pip", "install", "-q", "bespokelabs-curator"],
                                 capture_output=True, text=True, timeout=900, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"could not create the venv: {exc}"
        if res.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            return None, "pip install bespokelabs-curator failed: " + " ".join(res.stderr.split())[-300:]
    check = subprocess.run([str(py), "-c", "import bespokelabs.curator"], capture_output=True, text=True,
                           timeout=120, check=False)
    if check.returncode != 0:
        return None, "bespokelabs.curator does not import: " + " ".join(check.stderr.split())[-300:]
    ver = subprocess.run([str(py), "-c", "from importlib.metadata import version; print(version('bespokelabs-curator'))"],
                         capture_output=True, text=True, timeout=60, check=False).stdout.strip()
    return str(py), f"bespokelabs-curator {ver}"


def run_worker(kind: str, spec: dict[str, Any], python: str, timeout: float) -> dict[str, Any]:
    proc = subprocess.run([python, __file__, "--worker", kind, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        return {"error": f"exit {proc.returncode}: {tail}"}
    res: dict[str, Any] = json.loads(lines[-1])
    return res


def start_emulator(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    scen = work / "scenario.yaml"
    scen.write_text(SCENARIO, encoding="utf-8")
    port = free_port()
    log = open(work / "emulator.log", "wb")  # noqa: SIM115 (kept open for the emulator's life)
    proc = subprocess.Popen(
        [sys.executable, "-m", "draftgen.cli", "emulate", "--port", str(port), "--scenario", str(scen),
         "--credits", "1000000000"],
        env={**os.environ, "DRAFTGEN_EMULATOR_API_KEY": KEY}, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: pin_cpu(0),
    )
    url = f"http://127.0.0.1:{port}/api/v1"
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url + "/key", headers={"Authorization": f"Bearer {KEY}"})
            urllib.request.urlopen(req, timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the emulator did not start: " + (work / "emulator.log").read_text(errors="replace")[-1000:])


def write_inputs(work: Path, n: int, concurrency: int, url: str) -> dict[str, Any]:
    import yaml

    prompts = work / "prompts.jsonl"
    if not prompts.exists():
        with open(prompts, "w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}: why is {i % 97} odd?"}]})
                         + "\n")
    run = work / f"draftgen-run-{concurrency}"
    cfg = {
        "run_dir": str(run),
        "model": {"id": MODEL, "profile": "qwen3", "tokenizer": "bundled:qwen3"},
        "endpoint": {"kind": "openrouter", "base_url": url, "stream": False},
        "partitions": {"short": {"concurrency": concurrency, "max_tokens": MAX_TOKENS},
                       "long": {"concurrency": concurrency, "max_tokens": MAX_TOKENS}},
        "datasets": [{"name": "peers", "path": str(prompts), "partition": "short"}],
        "progress": "off",
    }
    cfg_path = work / f"draftgen-{concurrency}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    tk = work / "tiktoken"
    tk.mkdir(exist_ok=True)
    if O200K.exists() and not (tk / O200K_CACHE_NAME).exists():
        shutil.copy(O200K, tk / O200K_CACHE_NAME)
    return {"base_url": url, "key": KEY, "n": n, "concurrency": concurrency, "prompts": str(prompts),
            "config": str(cfg_path), "tiktoken_cache": str(tk)}


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--worker":
        pin_cpu(1)
        print(json.dumps(WORKERS[sys.argv[2]](json.loads(sys.argv[3]))), flush=True)
        return
    quick = quick_mode()
    n, levels = (1000, (200, 500)) if quick else (6000, (2000, 5000))
    # bench_generate measures the openai SDK baseline at 2,000 in flight; here it runs at the top level only.
    clients = {level: ["draftgen", "curator", "openai"] if level == levels[-1] else ["draftgen", "curator"]
               for level in levels}
    cur_py, cur_note = curator_python()
    print(f"curator: {cur_note}", flush=True)
    if cur_py is not None and not O200K.exists():
        cur_py, cur_note = None, f"no tiktoken file at {O200K} for curator's offline token estimator"
    figures: dict[str, Any] = {"prompts": n, "curator": cur_note}
    results: dict[tuple[str, int], dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="draftgen-bench-peers-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    emu = None
    try:
        emu, url = start_emulator(work)
        for level in levels:
            for kind in clients[level]:
                if kind == "curator" and cur_py is None:
                    results[(kind, level)] = {"error": cur_note}
                    continue
                spec = write_inputs(work, n, level, url) | {"workdir": str(work)}
                python = cur_py if kind == "curator" and cur_py is not None else sys.executable
                t0 = time.perf_counter()
                try:
                    res = run_worker(kind, spec, python, timeout=300)
                except subprocess.TimeoutExpired:
                    res = {"error": "timed out after 300 s"}
                results[(kind, level)] = res
                shown = ("error: " + res["error"]) if "error" in res else (
                    f"{res['responses']} ok, {res['failed']} failed, wall {res['wall_s']:.1f} s, "
                    f"cpu {res['cpu_s']:.1f} s, peak RSS {res['peak_rss_mb']:.0f} MiB")
                print(f"{kind:>9} @ {level}: {shown}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        if emu is not None:
            stop_process(emu)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'client':<10}{'in flight':>10}{'ok':>7}{'cpu s/1k':>10}{'(req. path)':>12}{'wall s':>9}"
          f"{'peak RSS MiB':>14}{'(after import)':>16}")
    for (kind, level), r in results.items():
        if "error" in r:
            print(f"{kind:<10}{level:>10}  not measured: {r['error'][:200]}")
            continue
        per_k = r["cpu_s"] / max(1, r["responses"]) * 1000
        r["cpu_s_per_1k"] = per_k
        if "ids_cpu_s" in r:
            r["request_path_cpu_s_per_1k"] = (r["cpu_s"] - r["ids_cpu_s"]) / max(1, r["responses"]) * 1000
        req_path = f"{r['request_path_cpu_s_per_1k']:.2f}" if "request_path_cpu_s_per_1k" in r else "-"
        print(f"{kind:<10}{level:>10}{r['responses']:>7}{per_k:>10.2f}{req_path:>12}{r['wall_s']:>9.1f}"
              f"{r['peak_rss_mb']:>14.0f}{r['rss_after_import_mb']:>16.0f}")
        for k in ("cpu_s_per_1k", "request_path_cpu_s_per_1k", "wall_s", "peak_rss_mb", "responses"):
            if k in r:
                figures[f"{kind}_{level}_{k}"] = round(r[k], 3) if isinstance(r[k], float) else r[k]
    for level in levels:
        ours = results.get(("draftgen", level), {})
        for peer in ("curator", "openai"):
            theirs = results.get((peer, level), {})
            if "cpu_s_per_1k" in ours and "cpu_s_per_1k" in theirs:
                cpu = theirs["cpu_s_per_1k"] / ours["cpu_s_per_1k"]
                req = theirs["cpu_s_per_1k"] / ours["request_path_cpu_s_per_1k"]
                wall = theirs["wall_s"] / ours["wall_s"]
                rss = theirs["peak_rss_mb"] / ours["peak_rss_mb"]
                figures[f"{peer}_vs_draftgen_cpu_ratio_{level}"] = round(cpu, 2)
                figures[f"{peer}_vs_draftgen_request_path_cpu_ratio_{level}"] = round(req, 2)
                figures[f"{peer}_vs_draftgen_wall_ratio_{level}"] = round(wall, 2)
                figures[f"{peer}_vs_draftgen_peak_rss_ratio_{level}"] = round(rss, 2)
                print(f"{peer} / draftgen at {level} in flight: CPU per response x{cpu:.2f} (x{req:.2f} against "
                      f"draftgen's request path alone), wall x{wall:.2f}, peak RSS x{rss:.2f}")
    print("(draftgen's CPU includes rebuilding exact token ids from text and rendering prompt ids, which the peers "
          "do not do; its request path is the rest: HTTP, parsing, validation, budget, writing with fsync)")
    emit_result("peers", figures)
    broken = [f"{kind}@{level}" for (kind, level), r in results.items() if "error" in r and kind != "curator"]
    if broken:  # curator may be unavailable (said above); draftgen and the SDK baseline must run
        raise SystemExit(f"not measured: {', '.join(broken)}")


if __name__ == "__main__":
    main()
