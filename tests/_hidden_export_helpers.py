"""Helpers for the hidden-state export and train tests: a real hidden set from a tiny target, and a way to
run a script in speculators' own environment.

``make_hidden_set(model_dir, dest, n=10, seed=0, dtype="bf16", digests=False, aux_ids=None)``: ``n`` samples
of random token ids (lengths 40..71, the first quarter loss-masked off), run through the tiny target of
``_extract_helpers`` (aux = HF ``output_hidden_states[k]`` for ``aux_ids``, default ``[2, L//2, L-3]``, final =
the forward hook on the last decoder layer = pre-norm), written with hidden.format's ``HiddenStore``/
``encode_sample`` plus index part and manifest (with ``digests=True`` they record each file's sha256, as
extract's do; else none, as an older draftgen's). Returns (dest, rows) with rows = [(sample_id, ids, mask, aux
fp32, final fp32)].

``speculators_python()``: speculators' Python (``DRAFTGEN_SPECULATORS`` or ``.venv-speculators``), or skip.
``run_in_speculators(code, *args)``: runs ``code`` there, returns its stdout (asserts exit 0).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from _common_helpers import CHECKOUT

SPECULATORS_MISSING = "speculators environment not found"


def make_hidden_set(model_dir: Path, dest: Path, *, n: int = 10, seed: int = 0, dtype: str = "bf16",
                    vocab_hi: int = 400, digests: bool = False, aux_ids: list[int] | None = None,
                    ) -> tuple[Path, list[tuple[str, list[int], list[int], Any, Any]]]:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from draftgen.hidden.codec import SCHEMA, Captured, bytes_digest, encode_sample
    from draftgen.hidden.format import HiddenStore
    from draftgen.hidden.norm import norm_weight_digest
    from draftgen.records import (
        HiddenCounts,
        HiddenIndexRecord,
        HiddenLayerIds,
        HiddenManifest,
        HiddenSampleEntry,
        HiddenTarget,
    )
    from draftgen.target.layers import default_aux_ids, to_sglang

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = model.config
    L = cfg.num_hidden_layers
    aux_ids = sorted(aux_ids) if aux_ids else default_aux_ids(L)
    gen = torch.Generator().manual_seed(seed)
    store = HiddenStore(str(dest))
    rows: list[tuple[str, list[int], list[int], Any, Any]] = []
    index: list[HiddenIndexRecord] = []
    for i in range(n):
        t = 40 + (i * 7) % 32
        ids = torch.randint(0, vocab_hi, (t,), generator=gen)
        mask = np.ones(t, dtype=np.uint8)
        mask[: t // 4] = 0
        cap: dict[str, Any] = {}
        hook = model.model.layers[L - 1].register_forward_hook(
            lambda _m, _i, o, c=cap: c.__setitem__("pre", o[0] if isinstance(o, tuple) else o))
        with torch.no_grad():
            out = model(ids[None], output_hidden_states=True)
        hook.remove()
        aux = torch.cat([out.hidden_states[k][0] for k in aux_ids], dim=-1)
        final = cap["pre"][0]
        sid = f"chat/{i:04d}" if i % 2 else f"code-{i:04d}"
        c = Captured(sample_id=sid, input_ids=ids.numpy().astype(np.int64), loss_mask=mask, aux=aux, final=final)
        data = encode_sample(c, dtype)
        rel = store.publish(sid, data)
        index.append(HiddenIndexRecord(sample_id=sid, file=rel, length=t, n_loss=int(mask.sum()),
                                       file_sha256=bytes_digest(data) if digests else ""))
        rows.append((sid, ids.tolist(), mask.tolist(), aux, final))
    store.write_index_part(index)
    norm = model.model.norm
    store.write_manifest(HiddenManifest(
        schema=SCHEMA, target=HiddenTarget(name=str(model_dir)),
        layer_ids=HiddenLayerIds(aux=aux_ids, final=L, convention="vllm-layer-input", sglang_aux=to_sglang(aux_ids),
                                 hf_hidden_states_index=aux_ids),
        hidden_size=cfg.hidden_size, num_layers=L, vocab_size=cfg.vocab_size, dtype=dtype,
        norm_weight_sha256=norm_weight_digest(norm.weight), norm_eps=float(norm.variance_epsilon),
        counts=HiddenCounts(samples=n, tokens=sum(len(r[1]) for r in rows), flagged=0),
        samples=[HiddenSampleEntry(sample_id=r.sample_id, file=r.file, length=r.length, file_sha256=r.file_sha256)
                 for r in index]))
    return dest, rows


def speculators_python() -> Path:
    env = os.environ.get("DRAFTGEN_SPECULATORS")
    cands = [Path(env).with_name("python")] if env else []
    cands.append(CHECKOUT / ".venv-speculators" / "bin" / "python")
    for c in cands:
        if c.is_file():
            return c
    pytest.skip(f"{SPECULATORS_MISSING} (scripts/test builds .venv-speculators)")


def run_in_speculators(code: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(speculators_python()), "-c", code, *args], capture_output=True, text=True,
                         timeout=timeout, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
