"""Per-sample host work taken off the critical path: states staged where they were captured.

``stage_batch`` takes a batch's captured states where they are (the hf backend: on its GPU, before they leave
it) and, there, for every sample: rounds them to the storage dtype (``hidden.codec.storage_tensors``: fp8
quantised with its per-token scales; rows are independent, so the batch's rows are packed and converted at
once), computes the cheap checks' numbers on those stored values decoded (``target.checks.state_stats``, the
same numbers ``check_sample`` computes on the file's bytes), and copies the stored tensors and the numbers to
host memory: on a GPU into pinned buffers, asynchronously on a side stream (the next batch's forward is
launched meanwhile; ``hidden.codec.Staged.wait`` waits for the copy); on a CPU they are already there. Each
sample comes back a ``Captured`` with its ``Staged``; the worker then checks it (``check_staged``), encodes,
hashes and publishes it on a pool of ``host_threads()`` without decoding it again. ``stage_host`` stages a
sample a backend captured to host memory unstaged (vllm's connector files, a plugin's, the hf backend's on a
CPU, where staging in the capture thread would add to the forward instead of running beside the next one) the
same way, on the CPU. Reads and writes no file.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from draftgen.hidden.codec import Captured, Staged, storage_tensors
from draftgen.hidden.format import require
from draftgen.target.checks import state_stats

if TYPE_CHECKING:
    import torch

    from draftgen.target import ExtractRow

__all__ = ["MAX_HOST_THREADS", "host_threads", "stage_batch", "stage_host"]

MAX_HOST_THREADS = 32  # the host pool's ceiling: past it, encode/hash/publish are bound by the disk or memory


def host_threads() -> int:
    """Threads for per-sample host work (check, encode, hash, publish): the cores this process may run on, at
    least 2 (a file's write overlaps the next one's hash), at most ``MAX_HOST_THREADS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        cores = os.cpu_count() or 1
    return max(2, min(MAX_HOST_THREADS, cores))


def _decoded(stored: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A stored tensor as ``decode_sample`` reads it back: float32, fp8 times its scales."""
    x = stored[name].float()
    scale = stored.get(f"{name}_scale")
    return x * scale.float() if scale is not None else x


def stage_batch(rows: Sequence[ExtractRow], aux: Sequence[torch.Tensor], final: Sequence[torch.Tensor],
                embed: Callable[[torch.Tensor], torch.Tensor], n_aux: int, dtype: str) -> list[Captured]:
    """``rows``' states staged (see the module docstring): ``aux[i]`` [T_i, n_aux*H] and ``final[i]`` [T_i, H]
    on one device (any float dtype), ``embed(ids)`` the target's input embeddings of ids on that device."""
    torch = require("torch")
    np = require("numpy")
    if not rows:
        return []
    lengths = [len(r.input_ids) for r in rows]
    dev = final[0].device
    with torch.inference_mode():
        stored = storage_tensors(torch.cat([a.to(dev) for a in aux]), torch.cat([f.to(dev) for f in final]), dtype)
        aux_f, fin_f = _decoded(stored, "aux"), _decoded(stored, "final")
        ids = torch.from_numpy(np.concatenate([np.asarray(r.input_ids, dtype=np.int64) for r in rows]))
        emb = embed(ids).to(dev).float()
        bounds = np.cumsum([0, *lengths]).tolist()
        stats = torch.stack([state_stats(aux_f[s:e], fin_f[s:e], emb[s:e], n_aux)
                             for s, e in itertools.pairwise(bounds)])
        del aux_f, fin_f, emb
        host, pending, keep = _to_host({**stored, "stats": stats})
    return [Captured(sample_id=r.sample_id, input_ids=r.input_ids, loss_mask=r.loss_mask,
                     aux=host["aux"][s:e], final=host["final"][s:e],
                     staged=Staged(dtype=dtype, tensors={k: v[s:e] for k, v in host.items() if k != "stats"},
                                   stats=host["stats"][i], pending=pending, keep=keep))
            for i, (r, s, e) in enumerate(zip(rows, bounds[:-1], bounds[1:], strict=True))]


def _to_host(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any, Any]:
    """``tensors`` in host memory: (host tensors, what the copies wait on, the device tensors they read). On
    a GPU: pinned buffers filled by non-blocking copies on a side stream that first waits for the work that
    made them; on a CPU: the tensors themselves."""
    torch = require("torch")
    dev = next(iter(tensors.values())).device
    if dev.type != "cuda":
        return tensors, None, None
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in tensors.items()}
    with torch.cuda.stream(side):
        for k, v in tensors.items():
            host[k].copy_(v, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    return host, done, tensors


def stage_host(c: Captured, embed: Callable[[Any], torch.Tensor], n_aux: int, dtype: str) -> Captured:
    """A sample captured to host memory unstaged (aux/final float, CPU), staged on the CPU; ``embed`` is the
    backend's (``ExtractBackend.embed``: ids as numpy → float32 CPU)."""
    from draftgen.target import ExtractRow

    row = ExtractRow(sample_id=c.sample_id, input_ids=c.input_ids, loss_mask=c.loss_mask)
    return stage_batch([row], [c.aux.detach().cpu()], [c.final.detach().cpu()],
                       lambda ids: embed(ids.numpy()), n_aux, dtype)[0]
