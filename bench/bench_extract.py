"""Extraction overhead: ``draftgen extract`` (hf backend) beside a bare HF forward over the same batches.

One process, CPU, one torch thread. Builds a seeded random Qwen3 target (8 layers, hidden 256, the Qwen3
vocabulary of 151,669 ids) and a run directory holding only merged/ (synthetic rows: random ids, lengths
200-600, the last half of each row a completion), then:

1. bare: ``model.model(ids, mask)`` (the base model: what capture runs) and ``model(ids, mask)`` (with the
   lm_head logits) over exactly the batches ``run_extract`` forms (``extract.batches.split_batches``);
2. extract: ``run_extract`` into a fresh local destination (capture by hooks, encode, every-sample checks,
   the teacher/reference check on ``teacher_fraction`` of samples, atomic publish, index parts, manifest),
   at teacher_fraction 0.05 (the default) and 0.

Figures: ``extract_overhead_vs_forward`` = extract loop time / bare base-model forward time (teacher 0.05),
the same at teacher 0, the ratio against the full forward with logits, the time split (capture, check,
encode, publish), tokens/s, and write throughput MB/s (bytes published / publish seconds).

    python bench/bench_extract.py            # 64 rows
    python bench/bench_extract.py --quick    # 16 rows
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from bench._common import emit_result, machine_info, quick_mode
except ImportError:  # python bench/bench_extract.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import emit_result, machine_info, quick_mode  # type: ignore[no-redef]

VOCAB = 151_669


def build_model(folder: Path, layers: int, hidden: int) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    heads = hidden // 32
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=32,
                      max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


def build_run(root: Path, n: int) -> Path:
    """A run directory with merged/ only (train shard + manifest), and its config; returns the config path."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from draftgen.config import config_from_mapping
    from draftgen.records import MANIFEST_LAYOUT, MergedFile, MergeManifest
    from draftgen.rundir import writer
    from draftgen.store import atomic_write_json

    rng = random.Random(0)
    ids, masks, sids = [], [], []
    for i in range(n):
        t = rng.randint(200, 600)
        ids.append([rng.randrange(VOCAB) for _ in range(t)])
        masks.append([0] * (t // 2) + [1] * (t - t // 2))
        sids.append(f"bench-{i:05d}")
    data = {"run_dir": str(root / "run"), "endpoint": "emulator", "progress": "off",
            "datasets": [{"name": "bench", "path": "bench.jsonl"}]}
    cfg_path = root / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    cfg = config_from_mapping(data, where=str(cfg_path), base_dir=str(root))
    with writer(cfg, "bench") as rd:
        rd.merged.mkdir(parents=True, exist_ok=True)
        shard = rd.merged_shard("train", 0, 1)
        table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "loss_mask": pa.array(masks, pa.list_(pa.int8())),
                          "sample_id": pa.array(sids, pa.string())})
        pq.write_table(table, shard)
        body = shard.read_bytes()
        atomic_write_json(rd.merged_manifest, MergeManifest(
            files=[MergedFile(path=str(shard.relative_to(rd.root)), split="train", kind="parquet", rows=n,
                              bytes=len(body), sha256=hashlib.sha256(body).hexdigest())],
            seed=0, merge={}, datasets=["bench"], profile="qwen3", layout=MANIFEST_LAYOUT))
    return cfg_path


def bare(model: Any, batches: list[list[Any]], full: bool) -> float:
    import torch

    total = 0.0
    for batch in batches:
        lengths = [len(r.input_ids) for r in batch]
        ids = torch.zeros((len(batch), max(lengths)), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(batch):
            ids[i, :lengths[i]] = torch.from_numpy(r.input_ids)
            mask[i, :lengths[i]] = 1
        t = time.perf_counter()
        with torch.inference_mode():
            (model if full else model.model)(input_ids=ids, attention_mask=mask, use_cache=False)
        total += time.perf_counter() - t
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", type=int)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from draftgen.config import load_config
    from draftgen.phases.extract.batches import read_merged_rows, split_batches
    from draftgen.phases.extract.run import run_extract
    from draftgen.rundir import RunDir

    torch.set_num_threads(1)
    n = args.rows or (16 if args.quick or quick_mode() else 64)
    with tempfile.TemporaryDirectory(prefix="dg-bench-extract-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "target", layers=8, hidden=256)
        cfg_path = build_run(root, n)
        base = load_config(cfg_path)
        rows = read_merged_rows(RunDir(base.run_path))
        batch_tokens = 4096
        batches = list(split_batches(rows, batch_tokens))
        tokens = sum(len(r.input_ids) for r in rows)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
        bare(model, batches[:1], full=False)  # warm-up
        t_base = bare(model, batches, full=False)
        t_full = bare(model, batches, full=True)
        del model
        figures: dict[str, Any] = {"rows": n, "tokens": tokens, "batches": len(batches), "hidden": 256, "layers": 8,
                                   "vocab": VOCAB, "bare_base_forward_s": round(t_base, 3),
                                   "bare_full_forward_s": round(t_full, 3)}
        for frac in (0.05, 0.0):
            over = {"model": str(model_dir), "teacher_fraction": frac, "teacher_min_margin": None,
                    "batch_tokens": batch_tokens, "output": str(root / f"hidden-{frac}"), "max_flagged_fraction": 1.0}
            cfg = load_config(cfg_path, {f"hidden_states.{k}": v for k, v in over.items()})
            rep = run_extract(cfg, echo=lambda s: None)
            loop = tokens / rep.throughput_tokens_per_s if rep.throughput_tokens_per_s else float("nan")
            tag = "teacher5" if frac else "teacher0"
            figures[f"{tag}_extract_s"] = round(loop, 3)
            figures[f"{tag}_tokens_per_s"] = round(rep.throughput_tokens_per_s or 0.0, 1)
            figures[f"{tag}_overhead_vs_base_forward"] = round(loop / t_base, 3)
            figures[f"{tag}_overhead_vs_full_forward"] = round(loop / t_full, 3)
            for k, v in rep.timings.items():
                figures[f"{tag}_{k}_s"] = round(v, 3)
            figures[f"{tag}_write_mb_per_s"] = round(rep.bytes_written / 1e6 / max(rep.timings["publish"], 1e-9), 1)
            figures[f"{tag}_bytes_written"] = rep.bytes_written
        figures["extract_overhead_vs_forward"] = figures["teacher5_overhead_vs_base_forward"]
    m = machine_info()
    print(f"machine: {m.get('cpu', '?')}, {m.get('usable_cores', '?')} usable cores (shared); torch threads 1")
    print(f"{n} rows, {tokens:,} tokens in {len(batches)} batches (batch_tokens {batch_tokens}); target 8 layers × "
          f"hidden 256, vocab {VOCAB:,}, bf16")
    print(f"bare forward: base model {t_base:.2f} s, with logits {t_full:.2f} s")
    for tag in ("teacher5", "teacher0"):
        print(f"extract ({tag}): {figures[f'{tag}_extract_s']:.2f} s = {figures[f'{tag}_overhead_vs_base_forward']:.2f}× "
              f"the base forward ({figures[f'{tag}_overhead_vs_full_forward']:.2f}× with logits); split capture "
              f"{figures[f'{tag}_capture_s']:.2f} / check {figures[f'{tag}_check_s']:.2f} / encode "
              f"{figures[f'{tag}_encode_s']:.2f} / publish {figures[f'{tag}_publish_s']:.2f} s; write "
              f"{figures[f'{tag}_write_mb_per_s']:.0f} MB/s")
    emit_result("extract", figures)


if __name__ == "__main__":
    main()
