"""bench_extract's target-sized, model-free mode: extraction's host pipeline beside a plain copy + write.

Synthetic captured states of a real target's size (hidden 4,096 and 7,168; 3 aux layers + the final; 8,192-
token batches of four 2,048-token samples; seeded random values) are staged once, untimed, as the hf backend
stages them on its device (``target.staging.stage_batch``: storage dtype, the cheap checks' numbers). Then,
best of ``repeats``, alternating:

- pipeline: the real ``phases.extract.worker.Worker`` over those batches (capture hands the staged samples
  back, so it costs nothing; overlap on, teacher fraction 0): on its host pool, each sample's cheap checks
  read from its staged numbers, encoded (``encode_sample``), hashed (``file_sha256``), published atomically
  (temp file, write, fsync, rename), then each batch's index part (written and fsynced the same way);
- plain: the same encoded bytes (precomputed, untimed), each file copied once in memory (``bytearray``:
  what a device-to-host copy into a host buffer costs) and written to its own file with one fsync, one after
  the other, in one thread: the same bytes and the same fsync per file, none of the checks, hash, rename or
  index.

Figure: ``host_pipeline_vs_plain_write_<dtype>`` = plain seconds / pipeline seconds (1.0: the pipeline keeps
up with a plain write of its bytes), the lower of the two hidden sizes; each size's own figure beside it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HIDDENS = (4096, 7168)
N_AUX = 3
BATCH_TOKENS = 8192
SAMPLE_TOKENS = 2048


class StagedBackend:
    """A capture backend whose states were staged beforehand: ``capture`` hands them back (no forward)."""

    def __init__(self, info: Any, staged: dict[str, Any]) -> None:
        self.info = info
        self.staged = staged

    def capture(self, rows: Sequence[Any]) -> list[Any]:
        return [self.staged[r.sample_id] for r in rows]

    def embed(self, ids: Any) -> Any:
        raise AssertionError("staged samples are not staged again")

    def head_logprobs(self, final_pre: Any, targets: Any) -> Any:
        raise AssertionError("teacher fraction 0: no teacher check")

    def reference(self, row: Any, positions: Any) -> Any:
        return None

    def close(self) -> None:
        pass


def build(hidden: int, dtype: str, n_batches: int) -> tuple[Any, list[list[Any]], dict[str, Any]]:
    """(target info, batches of rows, staged sample by id)."""
    import numpy as np
    import torch

    from draftgen.target import ExtractRow, TargetInfo
    from draftgen.target.layers import LayerIds
    from draftgen.target.staging import stage_batch

    info = TargetInfo(name="synthetic", revision=None, num_layers=32, hidden_size=hidden, vocab_size=151_936,
                      norm_eps=1e-6, norm_weight=torch.ones(hidden), layers=LayerIds(aux=(2, 16, 29), final=32))
    gen = torch.Generator().manual_seed(hidden)
    table = torch.randn(4096, hidden, generator=gen)  # the "embeddings" the aux_embedding check compares with
    batches: list[list[Any]] = []
    staged: dict[str, Any] = {}
    per = BATCH_TOKENS // SAMPLE_TOKENS
    for b in range(n_batches):
        rows = [ExtractRow(sample_id=f"syn-{hidden}-{b}-{i}", input_ids=np.arange(SAMPLE_TOKENS, dtype=np.int64) % 4096,
                           loss_mask=np.ones(SAMPLE_TOKENS, dtype=np.uint8)) for i in range(per)]
        aux = [torch.randn(SAMPLE_TOKENS, N_AUX * hidden, generator=gen).to(torch.bfloat16) for _ in rows]
        final = [torch.randn(SAMPLE_TOKENS, hidden, generator=gen).to(torch.bfloat16) for _ in rows]
        for c in stage_batch(rows, aux, final, lambda ids: table[ids], N_AUX, dtype):
            staged[c.sample_id] = c
        batches.append(rows)
    return info, batches, staged


def config(root: Path, dtype: str) -> Any:
    from draftgen.config import config_from_mapping

    data = {"run_dir": str(root / "run"), "endpoint": "emulator", "progress": "off",
            "datasets": [{"name": "syn", "path": "syn.jsonl"}],
            "hidden_states": {"dtype": dtype, "teacher_fraction": 0.0, "batch_tokens": BATCH_TOKENS}}
    return config_from_mapping(data, where="bench", base_dir=str(root))


def pipeline(cfg: Any, backend: StagedBackend, batches: list[list[Any]], dest: Path) -> float:
    from draftgen.hidden.format import HiddenStore
    from draftgen.phases.extract.worker import Worker

    store = HiddenStore(str(dest))
    store.claim()
    t = time.perf_counter()
    results = list(Worker(cfg, store, backend, overlap=True).run(batches))  # type: ignore[arg-type]
    took = time.perf_counter() - t
    assert sum(len(r.records) for r in results) == sum(len(b) for b in batches)
    assert not any(rec.failed for r in results for rec in r.records), "synthetic states flagged"
    return took


def plain(files: list[bytes], dest: Path) -> float:
    dest.mkdir(parents=True)
    t = time.perf_counter()
    for i, data in enumerate(files):
        buf = bytearray(data)  # the one copy into a host buffer
        with open(dest / f"{i:05d}.safetensors", "wb") as fh:
            fh.write(buf)
            fh.flush()
            os.fsync(fh.fileno())
        del buf
    return time.perf_counter() - t


def measure(work: Path, repeats: int, n_batches: int, hiddens: Sequence[int] = HIDDENS) -> dict[str, Any]:
    """Every figure of the mode (see the module docstring), for bf16 and fp8 storage."""
    from draftgen.hidden.codec import encode_sample

    out: dict[str, Any] = {"host_batch_tokens": BATCH_TOKENS, "host_sample_tokens": SAMPLE_TOKENS,
                           "host_batches": n_batches, "host_repeats": repeats, "host_threads": _threads()}
    for dtype in ("bf16", "fp8"):
        ratios = []
        for hidden in hiddens:
            info, batches, staged = build(hidden, dtype, n_batches)
            files = [encode_sample(staged[r.sample_id], dtype) for b in batches for r in b]
            cfg = config(work, dtype)
            backend = StagedBackend(info, staged)
            best_pipe = best_plain = float("inf")
            for k in range(repeats):
                for side in ("pipe", "plain") if k % 2 == 0 else ("plain", "pipe"):
                    _settle()
                    if side == "pipe":
                        best_pipe = min(best_pipe, pipeline(cfg, backend, batches, work / f"pipe-{k}"))
                    else:
                        best_plain = min(best_plain, plain(files, work / f"plain-{k}"))
                    shutil.rmtree(work / f"{side}-{k}")
            nbytes = sum(len(f) for f in files)
            tag = f"host_{dtype}_{hidden}"
            out[f"{tag}_bytes"] = nbytes
            out[f"{tag}_pipeline_s"] = round(best_pipe, 3)
            out[f"{tag}_plain_s"] = round(best_plain, 3)
            out[f"{tag}_pipeline_mb_per_s"] = round(nbytes / 1e6 / best_pipe, 1)
            out[f"{tag}_plain_mb_per_s"] = round(nbytes / 1e6 / best_plain, 1)
            out[f"host_pipeline_vs_plain_write_{dtype}_{hidden}"] = round(best_plain / best_pipe, 3)
            ratios.append(best_plain / best_pipe)
            del files, staged, backend, batches
        out[f"host_pipeline_vs_plain_write_{dtype}"] = round(min(ratios), 3)
    return out


def _settle() -> None:
    """Flush every dirty page first: neither side pays for the other's writeback (whole runs wrote GBs before)."""
    os.sync()
    time.sleep(0.5)


def _threads() -> int:
    from draftgen.target.staging import host_threads

    return host_threads()


def show(f: dict[str, Any]) -> None:
    print(f"host pipeline (model-free, {f['host_batches']} batches of {f['host_batch_tokens']:,} tokens, "
          f"{f['host_sample_tokens']:,}-token samples, {f['host_threads']} host threads; best of "
          f"{f['host_repeats']} alternating) vs a plain copy + write + fsync per file of the same bytes:")
    for dtype in ("bf16", "fp8"):
        for hidden in HIDDENS:
            tag = f"host_{dtype}_{hidden}"
            if f"{tag}_bytes" not in f:
                continue
            print(f"  {dtype} hidden {hidden:,}: {f[f'{tag}_bytes'] / 1e6:,.0f} MB, pipeline {f[f'{tag}_pipeline_s']:.2f} s "
                  f"({f[f'{tag}_pipeline_mb_per_s']:.0f} MB/s), plain {f[f'{tag}_plain_s']:.2f} s "
                  f"({f[f'{tag}_plain_mb_per_s']:.0f} MB/s): "
                  f"{f[f'host_pipeline_vs_plain_write_{dtype}_{hidden}']:.3f}×")
        print(f"  host_pipeline_vs_plain_write_{dtype} = {f[f'host_pipeline_vs_plain_write_{dtype}']:.3f} (the lower)")
