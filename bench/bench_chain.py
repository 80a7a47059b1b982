"""The CPU drafter chain (issue 15): acceptance lengths of a trained, an untrained and a broken EAGLE-3 drafter.

Runs scripts/tiny-chain's ``chain`` (the command a user runs, and what tests/integration/test_chain.py asserts on) once, in
a fresh temporary folder, with examples/tiny-chain.yaml: the tiny learnable target (``draftgen.drafter.tiny``:
random Qwen3, 8 layers, hidden 128, seed 0, bundled Qwen3 tokenizer) served by ``draftgen emulate --model``;
prepare → generate (vllm backend, exact ids, greedy, 96 tokens) → merge (bundled chat + code, 20 prompts held
out by ``cap``) → extract (hf, aux ids [2, 4, 5] + 8, fp32) → train (speculators on the CPU: AdamW lr 3e-3,
4 epochs of 2,048-token packed batches, draft vocab 2048, ttt 3, seed 0) → accept (``draftgen emulate
--drafter``, k = 3, 20 held-out prompts × 32 tokens, greedy, vLLM /metrics; the trained drafter once more
through SGLang ``meta_info``). The untrained drafter is the same train path with lr 0 and one step; the broken
one is trained on states whose aux layers were not captured (zeros, with the checks that flag them off). A
one-position shift is not told apart by AL, so the extract checks are measured on it instead.

Figures: ``al_trained``, ``al_untrained``, ``al_broken`` (and ``*_per_position``), the differences the
issue bounds (``al_trained_minus_untrained`` >= 0.3, ``al_trained_minus_broken`` >= 0.2), the SGLang AL and
its distance from the vLLM-counter one, the shifted extract's flagged samples, the trained drafter's steps
and speculators' offline AL estimate, and each stage's wall time.

``--quick`` runs the same chain: a smaller training is not known to clear the issue's bounds, and the chain
(a few minutes on 2 cores) is the proof, not a throughput figure. Needs the ``[extract]`` extra and
speculators 0.9 (``DRAFTGEN_SPECULATORS``, or ``.venv-speculators`` in the checkout).

    python bench/bench_chain.py
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import re
import signal
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

try:
    from bench._common import REPO_ROOT, emit_result, machine_info, quick_mode
except ImportError:  # python bench/bench_chain.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import REPO_ROOT, emit_result, machine_info, quick_mode  # type: ignore[no-redef]

SCRIPT = REPO_ROOT / "scripts" / "tiny-chain"


def load_chain_script() -> ModuleType:
    """scripts/tiny-chain as a module (it has no .py suffix), as tests/integration/test_chain.py loads it."""
    loader = importlib.machinery.SourceFileLoader("draftgen_tiny_chain", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def flat_figures(f: dict[str, Any]) -> dict[str, Any]:
    """The chain's nested figures as the flat mapping ``emit_result`` takes (per-position lists as text)."""
    out: dict[str, Any] = {"samples": f["samples"], "tokens": f["tokens"]}
    for name in ("trained", "untrained", "broken"):
        if f"al_{name}" in f:
            out[f"al_{name}"] = f[f"al_{name}"]
            out[f"al_{name}_per_position"] = " / ".join(f"{v:.3f}" for v in f[f"per_position_{name}"])
    if "al_untrained" in f:
        out["al_trained_minus_untrained"] = round(f["al_trained"] - f["al_untrained"], 4)
    if "al_broken" in f:
        out["al_trained_minus_broken"] = round(f["al_trained"] - f["al_broken"], 4)
    if "al_trained_sglang" in f:
        out["al_trained_sglang"] = f["al_trained_sglang"]
        out["al_trained_sglang_vs_vllm"] = round(abs(f["al_trained_sglang"] - f["al_trained"]), 4)
    if "shifted" in f:
        s = f["shifted"]
        out.update(shifted_samples=s["samples"], shifted_flagged=s["flagged"],
                   shifted_reference_aux=s["reference_aux"], shifted_extract_refused=s["threshold_broken"])
    tr = f["train_trained"]
    out.update(train_trained_steps=tr["steps"], train_trained_s=tr["seconds"], offline_al_trained=tr["offline_al"])
    for stage, secs in f["times_s"].items():
        slug = re.sub(r"[^a-z0-9]+", "_", stage.split(":")[0].lower()).strip("_")
        out[f"stage_{slug}_s"] = secs
    out["chain_wall_s"] = f["total_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the same chain (see the module docstring)")
    ap.parse_args()
    # the orchestrator's timeout sends SIGTERM: exit through the ``with`` blocks, so the emulator is stopped and
    # the temporary work folder (hundreds of MB) removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    local = REPO_ROOT / ".venv-speculators" / "bin" / "speculators"
    if not os.environ.get("DRAFTGEN_SPECULATORS") and not local.is_file():
        raise SystemExit("bench_chain: speculators not found; set DRAFTGEN_SPECULATORS to its executable "
                         "(scripts/test makes .venv-speculators)")
    mod = load_chain_script()
    torch.manual_seed(0)
    m = machine_info()
    print(f"machine: {m['cpu']}, {m['usable_cores']} usable cores (shared); mode: "
          f"{'quick (the same chain as full)' if quick_mode() else 'full'}; config examples/tiny-chain.yaml")
    with tempfile.TemporaryDirectory(prefix="dg-bench-chain-") as tmp:
        figures = mod.chain(Path(tmp) / "work", echo=lambda s: print(s, flush=True) if s.startswith("==") else None)
    for line in mod.summary(figures):
        print(line)
    emit_result("chain", flat_figures(figures))


if __name__ == "__main__":
    main()
