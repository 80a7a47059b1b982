"""bench_extract's ``--device cuda`` mode: extraction on a GPU beside the forward it wraps (the issue 33 table).

Builds a Qwen3-8B-shaped target (hidden 4,096, 36 layers, intermediate 12,288, 32 heads / 8 KV heads, vocab
151,936; random bf16 weights made on the device, saved once) and a run directory holding only merged/ (96
rows of 1,000-4,000 random ids, the first quarter of each a prompt), then, in one process:

1. the bare base-model forward over exactly the batches ``run_extract`` forms (``split_batches`` at the
   default ``batch_tokens``), and the same forward with ``output_hidden_states`` and the 4 slots (3 aux +
   final) of each sample copied to host: the floor any extractor pays;
2. the device-to-host copy rate, pageable and pinned;
3. ``run_extract`` (hf backend, teacher_fraction 0.05) with bf16 storage, then fp8: loop seconds, tokens/s,
   ratio to the forward + copy, the summed step timings, process CPU, the flagged counts by check.

Every figure goes to the JSON file (``--json``; default ``$OUT/bench_extract_gpu.json``) after each stage, so a
run cut short still reports; the table is printed at the end. ``--size tiny --device cpu`` rehearses it on a
CPU in about a minute (8 layers × hidden 256, 24 rows of 100-300 ids, batch_tokens 1,024). Needs only the
project's ``src`` on the path and torch, transformers, safetensors, pyarrow, pyyaml, numpy (and msgspec, which
draftgen itself imports).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

SHAPES = {  # hidden, layers, intermediate, heads, kv heads, head dim
    "8b": (4096, 36, 12288, 32, 8, 128),
    "tiny": (256, 8, 768, 8, 4, 32),
}
VOCAB = 151_936


class Run:
    def __init__(self, size: str, device: str, out: Path, work: Path, rows: int | None,
                 batch_tokens: int | None) -> None:
        self.size, self.dev, self.out, self.work = size, device, out, work
        self.rows = rows or (96 if size == "8b" else 24)
        self.lo, self.hi = (1000, 4000) if size == "8b" else (100, 300)
        self.bt = batch_tokens or (8192 if size == "8b" else 1024)  # 8192: hidden_states.batch_tokens' default
        self.R: dict[str, Any] = {"size": size, "device": device, "rows": self.rows, "batch_tokens": self.bt}
        self.t0 = time.monotonic()

    def save(self, stage: str) -> None:
        self.R.setdefault("stages", []).append(stage)
        self.R["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.R, indent=1))
        print(f"[{self.R['elapsed_s']:7.1f}s] {stage} saved", flush=True)

    def sync(self) -> None:
        import torch

        if self.dev == "cuda":
            torch.cuda.synchronize()

    def build_model(self, folder: Path) -> Any:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        H, L, inter, nh, kv, hd = SHAPES[self.size]
        cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=H, intermediate_size=inter, num_hidden_layers=L,
                          num_attention_heads=nh, num_key_value_heads=kv, head_dim=hd,
                          max_position_embeddings=40960, tie_word_embeddings=False)
        t = time.perf_counter()
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device(self.dev):
            model = Qwen3ForCausalLM(cfg).eval()
        torch.set_default_dtype(torch.float32)
        self.sync()
        self.R["model_params_b"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 3)
        self.R["model_build_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        model.save_pretrained(folder)
        self.R["model_save_s"] = round(time.perf_counter() - t, 1)
        self.save("model")
        return model

    def build_run(self, root: Path) -> Path:
        from _merged_run import write_merged_run

        rng = random.Random(0)
        ids, masks, sids = [], [], []
        for i in range(self.rows):
            t = rng.randint(self.lo, self.hi)
            ids.append([rng.randrange(VOCAB) for _ in range(t)])
            masks.append([0] * (t // 4) + [1] * (t - t // 4))
            sids.append(f"gpu-{i:05d}")
        cfg_path = write_merged_run(root, "gpu", ids, masks, sids)
        self.R["tokens"] = sum(len(x) for x in ids)
        self.save("run")
        return cfg_path

    def bare(self, model: Any, batches: list[Any], tag: str) -> None:
        """The base forward over ``batches``; and with the 4 slots of each sample copied to host (pageable)."""
        import torch

        from draftgen.target.hf import padded_batch

        L = SHAPES[self.size][1]
        layer_ids = [2, L // 2, L - 3]  # draftgen's default aux ids (vLLM convention: the input of layer k)
        for copy in (False, True):
            wall, moved = 0.0, 0
            for batch in batches:
                lengths = [len(r.input_ids) for r in batch]
                ids, mask = (x.to(self.dev) for x in padded_batch(batch))
                self.sync()
                t = time.perf_counter()
                with torch.inference_mode():
                    out = model.model(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=copy)
                    if copy:
                        hs = out.hidden_states
                        for i, n in enumerate(lengths):
                            for k in layer_ids:
                                moved += hs[k][i, :n].to("cpu").numel() * 2
                            moved += out.last_hidden_state[i, :n].to("cpu").numel() * 2
                self.sync()
                wall += time.perf_counter() - t
            self.R[f"{tag}_forward{'_copy' if copy else ''}_s"] = round(wall, 3)
            if copy:
                self.R[f"{tag}_copy_gb"] = round(moved / 1e9, 2)
        tok = self.R["tokens"]
        self.R[f"{tag}_forward_tok_per_s"] = round(tok / self.R[f"{tag}_forward_s"], 1)
        self.R[f"{tag}_forward_copy_tok_per_s"] = round(tok / self.R[f"{tag}_forward_copy_s"], 1)
        self.save(tag)

    def d2h(self) -> None:
        import torch

        if self.dev != "cuda":
            return
        x = torch.randn(256, 1024, 1024, device="cuda", dtype=torch.bfloat16)  # 512 MiB
        for pinned in (False, True):
            dst = torch.empty(x.shape, dtype=x.dtype, pin_memory=pinned)
            best = float("inf")
            for _ in range(3):
                self.sync()
                t = time.perf_counter()
                dst.copy_(x, non_blocking=pinned)
                self.sync()
                best = min(best, time.perf_counter() - t)
            self.R[f"d2h_{'pinned' if pinned else 'pageable'}_gb_per_s"] = round(x.numel() * 2 / best / 1e9, 1)
        del x, dst
        self.save("d2h")

    def extract(self, cfg_path: Path, model_dir: Path, dtype: str) -> None:
        from draftgen.config import load_config
        from draftgen.phases.extract.run import run_extract

        tag = f"extract_{dtype}"
        dest = self.work / f"hidden-{dtype}"
        over = {"model": str(model_dir), "teacher_min_margin": None, "output": str(dest), "max_flagged_fraction": 1.0,
                "device": self.dev, "compute_dtype": "bf16", "dtype": dtype, "batch_tokens": self.bt}
        cfg = load_config(cfg_path, {f"hidden_states.{k}": v for k, v in over.items()})
        t = time.perf_counter()
        rep = run_extract(cfg, echo=lambda s: print("   extract:", s, flush=True))
        R, tok = self.R, self.R["tokens"]
        R[f"{tag}_wall_s"] = round(time.perf_counter() - t, 1)
        loop = tok / rep.throughput_tokens_per_s if rep.throughput_tokens_per_s else float("nan")
        R[f"{tag}_s"] = round(loop, 2)
        R[f"{tag}_tok_per_s"] = round(rep.throughput_tokens_per_s or 0.0, 1)
        R[f"{tag}_vs_forward_copy"] = round(R["bare_forward_copy_s"] / loop, 3)  # >= 0.85: the goal
        R[f"{tag}_timings"] = {k: round(v, 2) for k, v in rep.timings.items()}
        R[f"{tag}_bytes_gb"] = round(rep.bytes_written / 1e9, 2)
        R[f"{tag}_write_gb_per_s"] = round(rep.bytes_written / 1e9 / loop, 2)
        R[f"{tag}_flagged"] = rep.flagged
        R[f"{tag}_samples"] = self.rows
        R[f"{tag}_failed_by_check"] = rep.failed_by_check
        R[f"{tag}_teacher_checked"] = rep.teacher_checked
        shutil.rmtree(dest, ignore_errors=True)
        self.save(tag)

    def table(self) -> None:
        R = self.R
        print(f"\n{R.get('env_device', self.dev)}: {R.get('model_params_b', '?')} B parameters, {self.rows} rows, "
              f"{R['tokens']:,} tokens, batch_tokens {self.bt} ({R.get('batches', '?')} batches), host threads "
              f"{R.get('host_threads', '?')}")
        print("| what | seconds | tokens/s | vs forward + copy |\n|---|---|---|---|")
        print(f"| forward (base model) | {R['bare_forward_s']:.2f} | {R['bare_forward_tok_per_s']:,.0f} | |")
        print(f"| forward + `output_hidden_states` + the 4 slots copied to host ({R['bare_copy_gb']} GB) | "
              f"{R['bare_forward_copy_s']:.2f} | {R['bare_forward_copy_tok_per_s']:,.0f} | 1.00 |")
        for dtype in ("bf16", "fp8"):
            tag = f"extract_{dtype}"
            if f"{tag}_s" not in R:
                continue
            print(f"| `run_extract`, {dtype} storage | {R[f'{tag}_s']:.2f} | {R[f'{tag}_tok_per_s']:,.0f} | "
                  f"{R[f'{tag}_vs_forward_copy']:.2f} |")
        for dtype in ("bf16", "fp8"):
            tag = f"extract_{dtype}"
            if f"{tag}_s" in R:
                tm = R[f"{tag}_timings"]
                print(f"{dtype}: summed steps capture {tm.get('capture', 0):.1f} / check {tm.get('check', 0):.1f} / "
                      f"encode {tm.get('encode', 0):.1f} / publish {tm.get('publish', 0):.1f} s (they overlap); "
                      f"process CPU {tm.get('process_cpu', float('nan')):.1f} s; flagged {R[f'{tag}_flagged']} of "
                      f"{self.rows} ({R[f'{tag}_failed_by_check']}), teacher-checked {R[f'{tag}_teacher_checked']}; "
                      f"wrote {R[f'{tag}_write_gb_per_s']} GB/s")
        for k in ("d2h_pageable_gb_per_s", "d2h_pinned_gb_per_s"):
            if k in R:
                print(f"{k}: {R[k]}")


def main(size: str, device: str, json_path: str | None, rows: int | None = None,
         batch_tokens: int | None = None) -> dict[str, Any]:
    import torch
    import transformers

    from draftgen.config import load_config
    from draftgen.phases.extract.batches import split_batches
    from draftgen.rundir import RunDir
    from draftgen.target.rows import read_merged_rows
    from draftgen.target.staging import host_threads

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_extract --device cuda: torch sees no GPU")
    out = Path(json_path or Path(os.environ.get("OUT") or ".") / "bench_extract_gpu.json")
    work = Path(os.environ.get("WORK") or "/tmp/dg-bench-extract-gpu")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run = Run(size, device, out, work, rows, batch_tokens)
    run.R.update(env_torch=torch.__version__, env_transformers=transformers.__version__, env_cpus=os.cpu_count(),
                 host_threads=host_threads(), env_device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu")
    try:
        model = run.build_model(work / "target")
        cfg_path = run.build_run(work)
        rows_ = read_merged_rows(RunDir(load_config(cfg_path).run_path))
        batches = list(split_batches(rows_, run.bt))
        run.R["batches"] = len(batches)
        run.bare(model, batches[:1], "warm")
        run.bare(model, batches, "bare")
        run.d2h()
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        for dtype in ("bf16", "fp8"):
            run.extract(cfg_path, work / "target", dtype)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run.save("done")
    run.table()
    return run.R
