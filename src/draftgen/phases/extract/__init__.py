"""``draftgen extract``: capture the target model's hidden states for every merged training row.

Reads ``merged/train-*.parquet`` (``input_ids``, ``loss_mask``, ``sample_id``), runs the target model with a
capture backend (``extract.capture.EXTRACT_BACKENDS``: ``hf`` = transformers with forward hooks, ``vllm``),
checks every sample (``extract.checks``) and writes the ``draftgen.hidden/1`` format (``draftgen.hidden.format``,
through the store's ``hidden.stream.Sink``) to ``hidden_states.output`` (default ``<run>/hidden``; any fsspec URL such as ``s3://bucket/prefix``).

merged rows → length-sorted batches → one worker → an executor → a sink. Modules: ``run`` (the driver and
its one loop, ``drive``), ``batches`` (merged rows, length-sorted batches, resume, settings checks),
``worker`` (the Worker: capture → encode → checks → the sink, overlapped; ``PoolWorker`` in another
process), ``executor`` (the protocol and ``InProcess``), ``proc_pool`` / ``ray_pool`` (the two pools),
``checks``, ``layers``, ``capture/`` (the backends). Imports: run → {executor, proc_pool, ray_pool} → worker
→ batches; nothing imports run.

Layer ids are stored in the vLLM convention (``extract.layers``). The modules here import torch,
transformers, safetensors and fsspec only when they run (``pip install 'draftgen[extract]'``).

Public API (imported on first use, so ``import draftgen.phases.extract`` stays light; the hidden-state
file format and store are ``draftgen.hidden.format``)::

    run_extract(cfg, *, echo=print, profile=None, force=False, rd=None, ...) -> ExtractReport
    LayerIds, default_aux_ids, check_layer_ids, to_sglang, resolve_layer_ids
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ExtractReport",
    "LayerIds",
    "check_layer_ids",
    "default_aux_ids",
    "resolve_layer_ids",
    "run_extract",
    "to_sglang",
]

_HOME = {
    "LayerIds": "layers", "check_layer_ids": "layers", "default_aux_ids": "layers", "to_sglang": "layers",
    "resolve_layer_ids": "layers",
    "ExtractReport": "run", "run_extract": "run",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
