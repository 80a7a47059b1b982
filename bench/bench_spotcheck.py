"""The cost of asking ``prompt_logprobs`` on every extract request (issue 31: a spot check the server cannot see).

The vllm capture backend now asks every request the same question, ``prompt_logprobs: 0`` (whenever
``teacher_fraction`` is above 0), and draws the teacher-checked samples after the answer; before, only the
samples it would check asked, so a server could tell them apart. This measures what the question costs, both
ways in one run, against ``draftgen emulate --model DIR --extract-dir D`` (vLLM's extract protocol on CPU):

- a seeded random Qwen3 target (``LAYERS`` layers, hidden ``HIDDEN``, the Qwen3 vocabulary of 151,669 ids: the
  vocabulary is what the question costs), rows of ``TOKENS`` random ids (quick: fewer and shorter);
- ``capture_s_per_sample_{with,without}``: the backend's capture of the same rows (request, the server's prefill
  and, with the question, its log-probs of every prompt position, the connector file, read and decode), one
  request at a time, best of ``REPEATS`` alternating runs; ``capture_time_ratio`` = with / without;
- ``response_bytes_per_token_{with,without}``: the JSON answer's bytes per prompt token (vLLM's shape: one
  ``{id: {logprob, rank, decoded_token}}`` per position), ``response_bytes_ratio``, and beside them the
  connector file's bytes per token at this target's size and at a real one's (``real_file_bytes_per_token``:
  4 slots x hidden 4,096 x bf16), ``extra_response_vs_real_file`` = the extra answer bytes / those file bytes;
- ``vllm_head_flops_fraction_8b``: what vLLM computes for the question, as a share of the prefill: the LM head
  over every prompt position (2 x hidden x vocab FLOPs a token, plus a log-softmax and the rank over the
  vocabulary) against the forward's ~2 x parameters a token, for a Llama-3.1-8B-shaped target (hidden 4,096,
  vocabulary 128,256, 8.03 B parameters). vLLM's extract mode otherwise runs the head at the last position
  only. This tiny target is mostly vocabulary (its head is most of its weights), so its time ratio is an
  upper bound; the 8B share is the figure for a real server.

    python bench/bench_spotcheck.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._common import emit_result, machine_info, quick_mode
    from bench.bench_extract import VOCAB, build_model
except ImportError:  # python bench/bench_spotcheck.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import emit_result, machine_info, quick_mode  # type: ignore[no-redef]
    from bench_extract import VOCAB, build_model  # type: ignore[no-redef]

LAYERS, HIDDEN = 4, 256
# a Llama-3.1-8B-shaped target: hidden, vocabulary, parameters
REAL_HIDDEN, REAL_VOCAB, REAL_PARAMS = 4096, 128_256, 8.03e9
REAL_FILE_BYTES_PER_TOKEN = 4 * REAL_HIDDEN * 2  # 3 aux slots + the final state, bf16


def build_target(folder: Path) -> Path:
    """The seeded random target (``bench_extract.build_model``'s) with the bundled Qwen3 tokenizer."""
    from draftgen.drafter.tiny import write_qwen3_tokenizer

    build_model(folder, LAYERS, HIDDEN)
    write_qwen3_tokenizer(folder)
    return folder


def rows(n: int, tokens: int) -> list[Any]:
    import numpy as np

    from draftgen.target import ExtractRow

    gen = np.random.default_rng(0)
    mask = np.array([0] * (tokens // 2) + [1] * (tokens - tokens // 2), dtype=np.uint8)
    return [ExtractRow(f"b-{i}", gen.integers(10, VOCAB - 10, tokens).astype(np.int64), mask) for i in range(n)]


def capture_s(target: Path, url: str, folder: Path, batch: list[Any], fraction: float) -> float:
    """Seconds per sample for the backend's capture of ``batch``, one request at a time."""
    from draftgen.target.vllm import VllmClientOptions, VllmExtractBackend

    opts = VllmClientOptions(base_urls=(url,), connector_dir=str(folder), concurrency=1, teacher_fraction=fraction)
    be = VllmExtractBackend.from_parts(target, opts, [1, 2, 3])
    try:
        be.capture(batch[:1])  # the session and the model id
        t = time.perf_counter()
        be.capture(batch)
        return (time.perf_counter() - t) / len(batch)
    finally:
        be.close()


def response_bytes(url: str, row: Any, ask: bool) -> tuple[int, str]:
    """The answer's bytes for ``row`` (and the connector file it names, removed here)."""
    import os

    import httpx

    body: dict[str, Any] = {"model": "target", "prompt": [int(t) for t in row.input_ids], "max_tokens": 1,
                            "return_token_ids": True}
    if ask:
        body["prompt_logprobs"] = 0
    models = httpx.get(f"{url}/v1/models", timeout=60).json()
    body["model"] = models["data"][0]["id"]
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    path = r.json()["kv_transfer_params"]["hidden_states_path"]
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the connector's write of a small file
    size = os.path.getsize(path)
    for p in (path, path + ".lock"):
        if os.path.exists(p):
            os.remove(p)
    return len(r.content), str(size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    quick = args.quick or quick_mode()
    n, tokens, repeats = (3, 128, 2) if quick else (6, 512, 2)
    import torch

    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread

    torch.set_num_threads(1)
    print(f"machine: {machine_info()}")
    with tempfile.TemporaryDirectory(prefix="bench-spotcheck-") as tmp:
        target = build_target(Path(tmp) / "target")
        folder = Path(tmp) / "hs"
        batch = rows(n, tokens)
        with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=1, extract_dir=str(folder),
                                                extract_layers=[1, 2, 3, 4])) as srv:
            url = srv.root_url
            with_b, file_b = response_bytes(url, batch[0], True)
            without_b, _ = response_bytes(url, batch[0], False)
            best = {"with": float("inf"), "without": float("inf")}
            for _ in range(repeats):
                for key, frac in (("without", 0.0), ("with", 0.05)):
                    best[key] = min(best[key], capture_s(target, url, folder, batch, frac))
    file_per_token = int(file_b) / tokens
    extra = (with_b - without_b) / tokens
    head = 2 * REAL_HIDDEN * REAL_VOCAB / (2 * REAL_PARAMS)
    figures = {
        "rows": n, "tokens_per_row": tokens, "vocab": VOCAB, "hidden": HIDDEN, "layers": LAYERS,
        "capture_s_per_sample_with": round(best["with"], 4),
        "capture_s_per_sample_without": round(best["without"], 4),
        "capture_time_ratio": round(best["with"] / best["without"], 3),
        "response_bytes_per_token_with": round(with_b / tokens, 1),
        "response_bytes_per_token_without": round(without_b / tokens, 1),
        "response_bytes_ratio": round(with_b / without_b, 3),
        "file_bytes_per_token": round(file_per_token, 1),
        "real_file_bytes_per_token": REAL_FILE_BYTES_PER_TOKEN,
        "extra_response_vs_real_file": round(extra / REAL_FILE_BYTES_PER_TOKEN, 5),
        "vllm_head_flops_fraction_8b": round(head, 4),
    }
    print(f"capture per sample: {best['with']:.4f} s asking prompt_logprobs, {best['without']:.4f} s not: ratio "
          f"{figures['capture_time_ratio']} (this target: vocabulary {VOCAB:,}, hidden {HIDDEN}, {LAYERS} layers)")
    print(f"answer bytes per token: {figures['response_bytes_per_token_with']} asking, "
          f"{figures['response_bytes_per_token_without']} not (ratio {figures['response_bytes_ratio']}); the extra "
          f"is {figures['extra_response_vs_real_file']:.2%} of a real target's connector file per token "
          f"({REAL_FILE_BYTES_PER_TOKEN:,} bytes)")
    print(f"vLLM's extra compute for the question on an 8B target: {head:.1%} of the prefill (the LM head over "
          "every prompt position)")
    emit_result("bench_spotcheck", figures)


if __name__ == "__main__":
    main()
