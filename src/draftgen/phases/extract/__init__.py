"""``draftgen extract``: capture the target model's hidden states for every merged training row.

Reads the merged train rows (``target.rows.read_merged_rows``), runs the target model with a capture backend
(``target.EXTRACT_BACKENDS``: ``hf`` = transformers with forward hooks, ``vllm``), checks every sample
(``target.checks``) and writes the ``draftgen.hidden/1`` format (``draftgen.hidden.format``, through the
store's ``hidden.stream.Sink``) to ``hidden_states.output`` (default ``<run>/hidden``; any fsspec URL such as
``s3://bucket/prefix``).

merged rows → length-sorted batches → one worker → an executor → a sink. Modules: ``run`` (the driver and
its one loop, ``drive``), ``batches`` (length-sorted batches, resume, settings checks), ``worker`` (the
Worker: capture → encode → checks → the sink, overlapped; ``PoolWorker`` in another process), ``executor``
(the protocol and ``InProcess``), ``proc_pool`` / ``ray_pool`` (the two pools). The target itself (the backends,
the checks, the layer ids, provider fidelity: ``target.fidelity``) is ``draftgen.target``'s. Imports: run →
{executor, proc_pool, ray_pool} → worker → batches; nothing imports run.

Layer ids are stored in the vLLM convention (``target.layers``). The modules here import torch,
transformers, safetensors and fsspec only when they run (``pip install 'draftgen[extract]'``).

Public API (imported on first use, so ``import draftgen.phases.extract`` stays light; the hidden-state
file format and store are ``draftgen.hidden.format``)::

    run_extract(cfg, *, echo=print, profile=None, force=False, rd=None, ...) -> ExtractReport
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ExtractReport", "run_extract"]

_HOME = {"ExtractReport": "run", "run_extract": "run"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
