"""``hidden_states.devices``: ``draftgen extract`` without Ray, one process per device (the hf backend).

With two or more entries in ``hidden_states.devices`` (and ``ray`` off) the driver (``run``) runs the pending
batches on ``Processes``, an executor (``executor``):

1. ``start`` spawns one process per entry: ``cuda:N`` sees only GPU N (``CUDA_VISIBLE_DEVICES``) and runs
   the target with ``device: cuda``; ``cpu`` runs it on the CPU. Each process is a ``worker.PoolWorker`` (the
   target loaded once, the destination checked; its Worker captures, checks and writes each batch: every file
   published atomically, then its own index part, no shared writer);
2. ``results`` feeds the batches (the driver's, so the files are the same, byte for byte, as one process's)
   through one shared queue (a process that is done with a batch takes the next) and yields each
   ``BatchResult`` as it comes back; a DraftgenError raised in a process comes back with its class and
   message and is raised here; a process that dies is one error (rerun to resume);
3. ``close`` stops every process (what they published stays; a rerun resumes).

Reads and writes nothing itself.
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
from draftgen.phases.extract.worker import (
    BatchResult,
    PoolWorker,
    decode_result,
    encode_batch,
    error_class,
    info_from_wire,
)

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.format import HiddenStore
    from draftgen.records import HiddenIndexRecord
    from draftgen.target import ExtractRow, TargetInfo

__all__ = ["Processes", "validate_devices"]

_POLL_S = 0.5


def validate_devices(cfg: RunConfig) -> None:
    hs = cfg.hidden_states
    if hs.backend != "hf":
        raise ConfigError(f"hidden_states.devices: one process per device runs the hf backend, not {hs.backend!r}")
    for d in hs.devices:
        if d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit()):
            raise ConfigError(f"hidden_states.devices: {d!r} is not a device; use cuda:N or cpu")


def _serve(cfg: RunConfig, device: str, url: str, storage_options: dict[str, Any],
           probe: dict[str, HiddenIndexRecord], tasks: Any, results: Any) -> None:
    """One device process: the batches of ``tasks`` (None ends them) → encoded results, then None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops every process itself
    if device.startswith("cuda:"):
        os.environ["CUDA_VISIBLE_DEVICES"] = device[5:]  # before torch loads: this process sees one GPU
    hs = msgspec.structs.replace(cfg.hidden_states, device="cuda" if device.startswith("cuda") else "cpu",
                                 device_map=None)
    worker = PoolWorker(msgspec.structs.replace(cfg, hidden_states=hs), url, storage_options, probe)
    worker.name = f"{device}:{os.getpid()}"
    for out in worker.run(iter(tasks.get, None)):  # after an error result, run takes nothing more
        results.put(out)
    results.put(None)


class Processes:
    """One process per ``hidden_states.devices`` entry (module docstring)."""

    label = " (processes)"
    unit = "process"

    def __init__(self, cfg: RunConfig, store: HiddenStore, probe: dict[str, HiddenIndexRecord]) -> None:
        validate_devices(cfg)
        self.cfg, self.store, self.probe = cfg, store, probe
        self.ctx = mp.get_context("spawn")
        self.tasks: Any = self.ctx.Queue()
        self.results_q: Any = self.ctx.Queue()
        self.procs: list[Any] = []
        self.info: TargetInfo | None = None
        self.timings: dict[str, float] = {}

    def start(self) -> None:
        hs = self.cfg.hidden_states
        self.procs = [self.ctx.Process(target=_serve, daemon=True,
                                       args=(self.cfg, d, self.store.url, dict(hs.storage_options), self.probe,
                                             self.tasks, self.results_q))
                      for d in hs.devices]
        for p in self.procs:
            p.start()

    def describe(self, head: str, url: str) -> list[str]:
        devices = self.cfg.hidden_states.devices
        return [f"extract (processes): {head} on {len(self.procs)} processes ({', '.join(devices)}) → {url}"]

    def results(self, batches: Sequence[Sequence[ExtractRow]]) -> Iterator[BatchResult]:
        for b in batches:
            self.tasks.put(encode_batch(b))
        for _ in self.procs:
            self.tasks.put(None)
        finished = 0
        while finished < len(self.procs):
            try:
                out = self.results_q.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [p for p in self.procs if p.exitcode not in (None, 0)]
                if dead:
                    raise DraftgenError(f"extract: a device process died (exit {dead[0].exitcode}); rerun to "
                                        "resume") from None
                continue
            if out is None:
                finished += 1
                continue
            res = decode_result(out)
            if res.error:
                raise error_class(res.error_class)(res.error)
            if self.info is None and res.info:
                self.info = info_from_wire(res.info)
            yield res

    def target(self) -> TargetInfo:
        if self.info is None:  # every process was started for pending batches: one of them reports it
            raise DraftgenError("extract: no device process reported the target; rerun")
        return self.info

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
