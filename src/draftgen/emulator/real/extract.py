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

A fault (``--extract-fault NAME`` or ``DRAFTGEN_EMULATE_FAULT=NAME``) alters what the server does, to test a
client's checks (``FAULTS``): ``prompt_ids`` returns altered ``prompt_token_ids``; the others break the capture
the way a miswired server does, while the response (its ``prompt_logprobs`` included) stays the model's own:
``layers_off_by_one`` captures every id one layer early (the input of layer k-1 stored as id k: a layer-id
convention mistake), ``final_wrong_layer`` takes the last slot from the input of the last layer instead of
its output, ``final_post_norm`` stores the last slot after the final norm, ``aux_zeros`` stores zeros in the aux
slots (layers not captured), ``shift`` stores the states of position t+1 at t, ``nan_every_N`` stores NaN
states for every N-th captured request only (one bad sample now and then) (``capture_ids``, ``corrupt``).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["FAULTS", "ConnectorWriter", "capture_ids", "corrupt", "known_fault"]

#: the fault scenarios the extract mode knows
FAULTS = ("prompt_ids", "layers_off_by_one", "final_wrong_layer", "final_post_norm", "aux_zeros", "shift",
          "nan_every_N")


def known_fault(fault: str) -> bool:
    """``fault`` is one of ``FAULTS`` (``nan_every_N`` with N a whole number above 0)."""
    if fault.startswith("nan_every_"):
        n = fault.removeprefix("nan_every_")
        return n.isdigit() and int(n) > 0
    return fault in FAULTS


def capture_ids(fault: str | None, layer_ids: list[int]) -> list[int]:
    """The layer ids the engine really captures for the ids ``layer_ids`` the files claim (ascending)."""
    if fault == "layers_off_by_one":
        return [k - 1 for k in layer_ids]
    if fault == "final_wrong_layer":
        return [*layer_ids[:-1], layer_ids[-1] - 1]
    return list(layer_ids)


def corrupt(fault: str | None, hidden: torch.Tensor, final_norm: Any, count: int = 1) -> torch.Tensor:
    """The captured states [T, n_ids, H] as a server with ``fault`` would write them (see the module docstring);
    ``final_norm``: the model's final norm module; ``count``: this request's number among the captured ones."""
    import torch

    out = hidden.clone()
    if fault is not None and fault.startswith("nan_every_"):
        if count % int(fault.removeprefix("nan_every_")) == 0:
            out[:] = float("nan")
        return out
    if fault == "final_post_norm":
        with torch.inference_mode():
            out[:, -1] = final_norm(hidden[:, -1].to(next(final_norm.parameters()).dtype)).to(out.dtype)
    elif fault == "aux_zeros":
        out[:, :-1] = 0
    elif fault == "shift":
        out[:-1] = hidden[1:]
    return out


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
