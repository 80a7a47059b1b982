"""``draftgen extract``: capture the target model's hidden states for every merged training row.

Reads ``merged/train-*.parquet`` (``input_ids``, ``loss_mask``, ``sample_id``), runs the target model with a
capture backend (``capture.EXTRACT_BACKENDS``: ``hf`` = transformers with forward hooks, ``vllm``),
checks every sample (``extract.checks``) and writes the ``draftgen.hidden/1`` format (``extract.format``) to
``hidden_states.output`` (default ``<run>/hidden``; any fsspec URL such as ``s3://bucket/prefix``).

Layer ids are stored in the vLLM convention (``extract.layers``). The modules here import torch,
transformers, safetensors and fsspec only when they run (``pip install 'draftgen[extract]'``).

Public API (imported on first use, so ``import draftgen.phases.extract`` stays light)::

    run_extract(cfg, *, echo=print, profile=None, force=False, rd=None, ...) -> ExtractReport
    Captured, LoadedSample, HiddenStore, HiddenSet, open_hidden, encode_sample, decode_sample,
    sample_key, sample_path, SCHEMA
    LayerIds, default_aux_ids, check_layer_ids, to_sglang, resolve_layer_ids
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "SCHEMA",
    "Captured",
    "ExtractReport",
    "HiddenSet",
    "HiddenStore",
    "LayerIds",
    "LoadedSample",
    "check_layer_ids",
    "decode_sample",
    "default_aux_ids",
    "encode_sample",
    "open_hidden",
    "resolve_layer_ids",
    "run_extract",
    "sample_key",
    "sample_path",
    "to_sglang",
]

_HOME = {
    "SCHEMA": "format", "Captured": "format", "HiddenSet": "format", "HiddenStore": "format",
    "LoadedSample": "format", "decode_sample": "format", "encode_sample": "format", "open_hidden": "format",
    "sample_key": "format", "sample_path": "format",
    "LayerIds": "layers", "check_layer_ids": "layers", "default_aux_ids": "layers", "to_sglang": "layers",
    "resolve_layer_ids": "layers",
    "ExtractReport": "run", "run_extract": "run",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
