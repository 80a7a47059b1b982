"""``hidden_states.devices``: ``draftgen extract`` without Ray, one process per device (the hf backend).

With two or more entries in ``hidden_states.devices`` (and ``ray`` off), ``run`` hands the PENDING rows
(draftgen's own resume by sample_id) to ``extract_with_processes``, which:

1. cuts them into the SAME batches as one process (``batches.split_batches``), so the files are the same,
   byte for byte;
2. starts one spawned process per entry: ``cuda:N`` sees only GPU N (``CUDA_VISIBLE_DEVICES``) and runs the
   target with ``device: cuda``; ``cpu`` runs it on the CPU. Each process is a ``worker.ExtractActor`` (the
   target loaded once; per batch ``batches.extract_batch``: capture → encode → check → publish each file
   atomically → its own index part, no shared writer);
3. feeds the batches through one shared queue (a process that is done with a batch takes the next), and
   collects the small result rows as Ray's driver does (``worker.collect_rows``): progress lines, a line
   per process, a DraftgenError raised in a process comes back with its class and message.

``run`` then writes manifest.json LAST, in merged order, as for one process. Ctrl-C or an error stops every
process (what they published stays; a rerun resumes). Reads and writes nothing itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.errors import ConfigError, DraftgenError
from draftgen.phases.extract.batches import split_batches
from draftgen.phases.extract.worker import ExtractActor, PoolResult, collect_rows, encode_batch
from draftgen.records import HiddenIndexRecord

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.format import HiddenStore
    from draftgen.phases.extract.capture import ExtractRow

__all__ = ["extract_with_processes", "validate_devices"]

_POLL_S = 0.5


def validate_devices(cfg: RunConfig) -> None:
    hs = cfg.hidden_states
    if hs.backend != "hf":
        raise ConfigError(f"hidden_states.devices: one process per device runs the hf backend, not {hs.backend!r}")
    for d in hs.devices:
        if d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit()):
            raise ConfigError(f"hidden_states.devices: {d!r} is not a device; use cuda:N or cpu")


def _worker(cfg: RunConfig, device: str, url: str, storage_options: dict[str, Any],
            probe: dict[str, HiddenIndexRecord], tasks: Any, results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops every process itself
    if device.startswith("cuda:"):
        os.environ["CUDA_VISIBLE_DEVICES"] = device[5:]  # before torch loads: this process sees one GPU
    hs = msgspec.structs.replace(cfg.hidden_states, device="cuda" if device.startswith("cuda") else "cpu",
                                 device_map=None)
    actor = ExtractActor(msgspec.structs.replace(cfg, hidden_states=hs), url, storage_options, probe)
    actor.actor = f"{device}:{os.getpid()}"
    while True:
        item = tasks.get()
        if item is None:
            break
        out = actor({"payload": [item]})
        results.put(out)
        if any(out["error"]):
            break
    results.put(None)


def _rows(out: dict[str, Any]) -> Iterator[dict[str, Any]]:
    keys = list(out)
    for i in range(len(out[keys[0]])):
        yield {k: out[k][i] for k in keys}


def extract_with_processes(cfg: RunConfig, store: HiddenStore, pending: Sequence[ExtractRow],
                           done: dict[str, HiddenIndexRecord], echo: Any, *, total: int,
                           done_before: int) -> PoolResult:
    """Extract ``pending`` with one process per ``hidden_states.devices`` entry (module docstring)."""
    validate_devices(cfg)
    hs = cfg.hidden_states
    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    batches = list(split_batches(pending, hs.batch_tokens))
    probe = dict([next(iter(done.items()))]) if done else {}
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(cfg, d, store.url, dict(hs.storage_options), probe, tasks, results))
             for d in hs.devices]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for b in batches:
        tasks.put(encode_batch(b))
    for _ in procs:
        tasks.put(None)
    echo(f"extract (processes): {len(pending):,} of {total:,} samples to do ({done_before:,} done before) in "
         f"{len(batches):,} batches on {len(procs)} processes ({', '.join(hs.devices)}) → {store.url}")

    def stream() -> Iterator[dict[str, Any]]:
        finished = 0
        while finished < len(procs):
            try:
                out = results.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise DraftgenError(f"extract: a device process died (exit {dead[0].exitcode}); rerun to resume") from None
                continue
            if out is None:
                finished += 1
                continue
            yield from _rows(out)

    try:
        res = collect_rows(stream(), pending, done, echo, total, done_before, t0, label="process")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
    return res

