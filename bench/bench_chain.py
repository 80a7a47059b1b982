"""The CPU drafter chain (issues 15, 24): a trained EAGLE-3 drafter beside copy-last, lookup, its zero-aux ablation and an untrained one, on a target with learned structure.

Runs scripts/tiny-chain's ``chain`` (the command a user runs, and what tests/integration/test_chain.py asserts on)
once, in a fresh temporary folder, with examples/tiny-chain.yaml: the learned tiny target (``drafter.learned``: a
4-layer Qwen3, hidden 128, trained on the CPU on the tiny language of ``drafter.tinylang``, recipe, seed and
checksum in code) served by ``draftgen emulate --model``; prompts of the language's four tasks (walk, sort,
count, close: 80 each, 16 held out by ``cap``) → prepare → generate (vllm backend, exact ids, greedy, 96
tokens) → merge → extract (hf, aux ids [1, 2, 3] + 4, fp32) → train (speculators on the CPU, draft vocab 256,
ttt 3, seed 0) → accept (``draftgen emulate --drafter``, k = 3, 64 held-out prompts × 32 tokens, greedy,
vLLM /metrics around each prompt; the trained drafter once more through SGLang ``meta_info`` on the first 16
of them). Beside the
trained drafter, on the same prompts: copy-last and n-gram lookup (no model; replayed on the target's greedy
output), the zero-aux ablation (the trained drafter served with zeroed aux states) and the untrained drafter
(the same train path, lr 0, one step), each with its 95% bootstrap interval over the prompts, and per dataset.
A one-position shift is not told apart by AL, so the extract checks are measured on it instead.

Figures: ``al_trained``, ``al_copy_last``, ``al_lookup``, ``al_zero_aux``, ``al_untrained`` with ``*_ci_lo``/
``*_ci_hi``; the paired differences the issue bounds (``al_trained_minus_no_model`` >= 0.2 with its interval's
low end > 0, ``al_trained_minus_zero_aux`` likewise, ``al_trained_minus_untrained`` >= 0.3); per dataset
(``<dataset>_al_trained`` and the alternatives); the SGLang AL; the held-out continuations' loops and the
target's accuracy on them; the shifted extract's flagged samples; each stage's wall time. The ``random_target_*``
figures are the chain's before issue 24 (a random Qwen3 target, 20 held-out prompts, the issue's table), kept
for comparison: there lookup beat the trained drafter.

``--quick`` runs the same chain. Needs the ``[extract]`` extra and speculators 0.9 (``DRAFTGEN_SPECULATORS``,
or ``.venv-speculators`` in the checkout). ``DRAFTGEN_CHAIN_TARGET`` names a folder that keeps the learned target
between runs (reused while it holds the recipe's target; ``target_train_s`` is then the training time recorded
in it); by default the target is trained afresh in the temporary folder.

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


#: the chain's figures with the random target it had before issue 24 (the issue's table: 20 held-out prompts)
RANDOM_TARGET = {"al_trained": 1.351, "al_copy_last": 1.387, "al_lookup": 1.738, "al_untrained": 1.0}


def flat_figures(f: dict[str, Any]) -> dict[str, Any]:
    """The chain's nested figures as the flat mapping ``emit_result`` takes (lists and intervals as numbers)."""
    out: dict[str, Any] = {"samples": f["samples"], "tokens": f["tokens"]}
    for name in ("trained", "copy_last", "lookup", "zero_aux", "untrained"):
        if f"al_{name}" in f:
            out[f"al_{name}"] = f[f"al_{name}"]
            ci = f.get(f"ci_{name}")
            if ci:
                out[f"al_{name}_ci_lo"], out[f"al_{name}_ci_hi"] = ci
        if f"per_position_{name}" in f:
            out[f"al_{name}_per_position"] = " / ".join(f"{v:.3f}" for v in f[f"per_position_{name}"])
    for name in ("no_model", "zero_aux"):
        d = f.get(f"trained_minus_{name}")
        if d:
            out[f"al_trained_minus_{name}"] = d["difference"]
            out[f"al_trained_minus_{name}_ci_lo"], out[f"al_trained_minus_{name}_ci_hi"] = d["ci95"]
    out["al_trained_minus_untrained"] = f["trained_minus_untrained"]
    for ds, d in f.get("datasets_trained", {}).items():
        out[f"{ds}_al_trained"] = d["al"]
        if d.get("ci95"):
            out[f"{ds}_al_trained_ci_lo"], out[f"{ds}_al_trained_ci_hi"] = d["ci95"]
        for alt in ("copy-last", "lookup", "zero-aux"):
            if alt in d:
                out[f"{ds}_al_{alt.replace('-', '_')}"] = d[alt]
    if "al_trained_sglang" in f:
        out["al_trained_sglang"] = f["al_trained_sglang"]
        same = f.get("al_trained_vllm_same_prompts", f["al_trained"])
        out["al_trained_vllm_same_prompts"] = same
        out["al_trained_sglang_vs_vllm"] = round(abs(f["al_trained_sglang"] - same), 4)
    for key in ("per_request_prompts", "per_request_prompts_equal", "accept_per_request_s", "accept_one_at_a_time_s"):
        if key in f:
            out[key] = f[key]
    if "per_request_prompts" in f:
        out["per_request_prompts_differ"] = f["per_request_prompts"] - f["per_request_prompts_equal"]
    for k, d in f.get("k_sweep", {}).items():
        out[f"al_trained_{k}_served"] = d["served"]
        out[f"al_trained_{k}_from_per_position"] = d[next(n for n in d if n.startswith("from_k"))]
        out[f"al_trained_{k}_within_ci"] = int(d["within"])
    h, t = f["held_out"], f["target"]
    out.update(held_out_prompts=h["prompts"], held_out_looping=h["looping"], held_out_target_right=h["target_right"],
               target_sha256=t["sha256"][:16], target_matches_recorded=t["matches_recorded"],
               target_train_s=t["train_seconds"])
    for task, acc in t["accuracy"].items():
        out[f"target_accuracy_{task}"] = acc
    if "shifted" in f:
        s = f["shifted"]
        out.update(shifted_samples=s["samples"], shifted_flagged=s["flagged"],
                   shifted_reference_aux=s["reference_aux"], shifted_extract_refused=s["threshold_broken"])
    tr = f["train_trained"]
    out.update(train_trained_steps=tr["steps"], train_trained_s=tr["seconds"], offline_al_trained=tr["offline_al"],
               train_trained_epochs=tr["epochs"], train_trained_val_loss_first=tr["val_loss_first"],
               train_trained_val_loss_last=tr["val_loss_last"],
               train_trained_val_loss_change_last_quarter=tr["val_loss_change_last_quarter"],
               train_trained_val_loss_spread_last_half=tr["val_loss_spread_last_half"])
    for stage, secs in f["times_s"].items():
        slug = re.sub(r"[^a-z0-9]+", "_", stage.split(":")[0].lower()).strip("_")
        out[f"stage_{slug}_s"] = secs
    out["chain_wall_s"] = f["total_s"]
    out.update({f"random_target_{k}": v for k, v in RANDOM_TARGET.items()})
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
    kept = os.environ.get("DRAFTGEN_CHAIN_TARGET")
    if kept:
        print(f"target: {kept} (DRAFTGEN_CHAIN_TARGET; reused when it holds the recipe's target, else trained there)")
    with tempfile.TemporaryDirectory(prefix="dg-bench-chain-") as tmp:
        figures = mod.chain(Path(tmp) / "work", target=Path(kept) if kept else Path(tmp) / "target",
                            echo=lambda s: print(s, flush=True) if s.startswith("==") else None)
    for line in mod.summary(figures):
        print(line)
    emit_result("chain", flat_figures(figures))


if __name__ == "__main__":
    main()
