"""Disk that ``draftgen train`` adds besides its checkpoints, as a fraction of the hidden set (issue 21).

Builds a synthetic local ``draftgen.hidden/1`` set (bf16, 3 aux layers + the final, random states; the
format's own ``HiddenStore``/``encode_sample``, an index part and a manifest), then runs what ``draftgen
train`` writes under ``train/`` before speculators starts: the inputs step (``phases.train.inputs
.build_index``: the Arrow dataset, token_freq.pt, draftgen_states.json, sample_ids.jsonl, export.json) and
the draft vocabulary (``vocab/d2t.npy``, ``t2d.npy``; draft vocabulary 32,000 of a 151,936-token target).
checkpoints/, drafter/ and eagle3/ are the drafter and not counted; log.jsonl (about 300 bytes a step) and
speculators.log are left out too. Reported:

    train_extra_disk_fraction   bytes under train/ (inputs/ + vocab/) / the hidden set's bytes (goal <= 0.01;
                                the full speculators copy train made before was about 1.0)
    inputs_bytes_per_token      train/inputs/ bytes per token (the set holds (n_aux+1)*H*2 per token)
    set_bytes_per_token         the hidden set's bytes per token
    per_token_fraction          inputs_bytes_per_token / set_bytes_per_token: the fraction at a size where
                                the fixed vocab/ files vanish (the reference's 5.21 TB set)
    index_s                     seconds the inputs step took

Full size: H 4096, 24 samples of 1,024 tokens (~0.8 GB of states); ``--quick``: H 1024, 16 samples of 512.

    python bench/bench_train_disk.py [--quick]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

try:
    from bench._common import emit_result, quick_mode
except ModuleNotFoundError:  # python bench/bench_train_disk.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import emit_result, quick_mode  # type: ignore[no-redef]

import numpy as np
import torch

from draftgen.hidden.codec import SCHEMA, Captured, encode_sample
from draftgen.hidden.format import HiddenStore, open_hidden
from draftgen.phases.train.inputs import build_index
from draftgen.phases.train.vocab import build_vocab_mapping, save_vocab_mapping
from draftgen.records import (
    HiddenCounts,
    HiddenIndexRecord,
    HiddenLayerIds,
    HiddenManifest,
    HiddenSampleEntry,
    HiddenTarget,
)

AUX = [2, 16, 29]
TARGET_VOCAB, DRAFT_VOCAB = 151_936, 32_000


def make_set(dest: Path, *, hidden: int, samples: int, tokens: int) -> None:
    """A synthetic bf16 hidden set: random ids (target vocabulary), loss mask on the last 3/4."""
    gen = torch.Generator().manual_seed(0)
    store = HiddenStore(str(dest))
    index: list[HiddenIndexRecord] = []
    for i in range(samples):
        ids = torch.randint(0, TARGET_VOCAB, (tokens,), generator=gen).numpy().astype(np.int64)
        mask = np.ones(tokens, dtype=np.uint8)
        mask[: tokens // 4] = 0
        aux = torch.randn(tokens, len(AUX) * hidden, generator=gen)
        final = torch.randn(tokens, hidden, generator=gen)
        sid = f"bench/{i:05d}"
        rel = store.publish(sid, encode_sample(Captured(sample_id=sid, input_ids=ids, loss_mask=mask, aux=aux,
                                                        final=final), "bf16"))
        index.append(HiddenIndexRecord(sample_id=sid, file=rel, length=tokens, n_loss=int(mask.sum())))
    store.write_index_part(index)
    store.write_manifest(HiddenManifest(
        schema=SCHEMA, target=HiddenTarget(name="bench-target"),
        layer_ids=HiddenLayerIds(aux=AUX, final=32, convention="vllm-layer-input", sglang_aux=[a - 1 for a in AUX],
                                 hf_hidden_states_index=AUX),
        hidden_size=hidden, num_layers=32, vocab_size=TARGET_VOCAB, dtype="bf16", norm_weight_sha256="",
        norm_eps=1e-6, counts=HiddenCounts(samples=samples, tokens=samples * tokens, flagged=0),
        samples=[HiddenSampleEntry(sample_id=r.sample_id, file=r.file, length=r.length) for r in index]))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    quick = quick_mode()
    hidden, samples, tokens = (1024, 16, 512) if quick else (4096, 24, 1024)
    torch.set_num_threads(1)
    import datasets

    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix="bench-train-disk-"))
    try:
        t0 = time.perf_counter()
        make_set(work / "hidden", hidden=hidden, samples=samples, tokens=tokens)
        made = time.perf_counter() - t0
        train = work / "run" / "train"
        t0 = time.perf_counter()
        rep = build_index(open_hidden(str(work / "hidden")), train / "inputs")
        index_s = time.perf_counter() - t0
        assert rep is not None
        freq = torch.load(train / "inputs" / "token_freq.pt", weights_only=True)
        d2t, t2d = build_vocab_mapping({int(k): int(v) for k, v in freq.items()}, DRAFT_VOCAB, TARGET_VOCAB)
        save_vocab_mapping(train / "vocab", d2t, t2d)
        set_bytes = tree_bytes(work / "hidden")
        inputs_bytes = tree_bytes(train / "inputs")
        extra = tree_bytes(train)
        copies = [p for p in train.rglob("hs_*.safetensors")]
        n_tok = samples * tokens
        print(f"hidden set: {samples} samples x {tokens} tokens, H {hidden}, bf16: {set_bytes / 2**20:.1f} MiB "
              f"(made in {made:.1f} s)")
        print(f"train/inputs/: {inputs_bytes / 1024:.1f} KiB ({inputs_bytes / n_tok:.1f} B/token vs the set's "
              f"{set_bytes / n_tok:.0f} B/token), built in {index_s:.2f} s; state copies under train/: {len(copies)}")
        print(f"train/ besides checkpoints/drafter/eagle3 (inputs/ + vocab/): {extra / 1024:.1f} KiB = "
              f"{extra / set_bytes:.5f} of the set (goal <= 0.01; the full copy was ~1.0)")
        emit_result("bench_train_disk", {
            "train_extra_disk_fraction": round(extra / set_bytes, 6),
            "inputs_bytes_per_token": round(inputs_bytes / n_tok, 2),
            "set_bytes_per_token": round(set_bytes / n_tok, 1),
            "per_token_fraction": round(inputs_bytes / set_bytes, 6),
            "state_copies": len(copies),
            "hidden_size": hidden, "samples": samples, "tokens_per_sample": tokens,
            "index_s": round(index_s, 3),
        })
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
