"""Extract mode of ``draftgen emulate --model``: files exactly as vLLM's ExampleHiddenStatesConnector writes them.

vLLM (>= 0.22, checked against the 0.33.0 wheel source) served with ``speculative_config.method =
extract_hidden_states`` and ``kv_transfer_config.kv_connector = ExampleHiddenStatesConnector`` writes, per
request, ``<shared_storage_path>/<request_id>.safetensors`` (written by ``safetensors.torch.save_file``):

    hidden_states  [num_prompt_tokens, num_layer_ids, hidden_size]  model dtype; ids ascending
    token_ids      [num_prompt_tokens]                               int64 (the request's prompt ids)

Its companion ``<path>.lock`` is created and locked (``flock LOCK_EX``) before the response names the path
and released when the write is done; readers take ``LOCK_SH`` on it (vLLM's ``load_hidden_states``) and
remove both files when done (``cleanup_hidden_states``). The response carries top-level
``kv_transfer_params: {"hidden_states_path": "<path>"}``. Here the lock is taken in the engine's worker
right after the prefill (before the HTTP response), and the write runs on a small thread pool, as vLLM's
connector does (``num_writer_threads``).

``Fault`` alters what the server does, to test a client's checks: ``prompt_ids`` returns altered
``prompt_token_ids`` (``DRAFTGEN_EMULATE_FAULT=prompt_ids`` or ``--extract-fault prompt_ids``).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["FAULTS", "ConnectorWriter"]

#: the fault scenarios the extract mode knows
FAULTS = ("prompt_ids",)


class ConnectorWriter:
    """Writes one connector file per request under ``root`` with the ``.lock`` protocol."""

    def __init__(self, root: str, *, writer_threads: int = 8) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=max(1, writer_threads), thread_name_prefix="draftgen-hs-save")
        self.written = 0

    def new_path(self, request_id: str | None = None) -> str:
        rid = request_id or f"cmpl-{uuid.uuid4().hex}-0"
        return str(self.root / f"{rid}.safetensors")

    def lock(self, path: str) -> int:
        """Create ``<path>.lock`` and hold LOCK_EX on it; returns the fd (closed when the write is done)."""
        fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def submit(self, path: str, hidden: torch.Tensor, token_ids: list[int], lock_fd: int | None) -> Future[None]:
        """Write asynchronously; the lock is released (fd closed) when the file is complete or failed."""
        return self._pool.submit(_write, path, hidden, token_ids, lock_fd)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _write(path: str, hidden: torch.Tensor, token_ids: list[int], lock_fd: int | None) -> None:
    import torch
    from safetensors.torch import save_file

    try:
        save_file({"hidden_states": hidden.contiguous(), "token_ids": torch.tensor(token_ids, dtype=torch.int64)},
                  path)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
