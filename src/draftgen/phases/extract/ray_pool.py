"""``hidden_states.ray``: ``draftgen extract`` on a Ray Data actor pool (the hf backend, scaled out).

``RayPool`` is an executor (``executor``). The driver (``run``) hands it the batches of the PENDING rows
(draftgen's own resume: ``HiddenStore.done`` by sample_id; Ray Data's checkpointing is never used, it
re-ran rows and duplicated outputs), cut as for one process (``batches.split_batches``), so every path
captures identical batches and writes identical files. ``results``:

1. puts one item per batch into ``ray.data.from_items`` (the rows msgpack-encoded: ids and masks as raw
   int64/uint8 bytes) and runs ``map_batches(PoolWorker, batch_size=1, compute=ActorPoolStrategy(size=
   workers), num_gpus=num_gpus_per_worker, num_cpus=num_cpus_per_worker)``;
2. each actor (``worker.PoolWorker``) loads the target once, checks that the destination was written with its
   settings, and runs the Worker on each batch (capture → encode → check → publish each file atomically →
   its own index part: no shared writer), returning the ``BatchResult`` (msgpack; the index records, bytes,
   seconds, its wall-clock span, and once per actor the target's ``TargetInfo``);
3. yields each result as it streams in. A task Ray re-runs (an actor killed mid-task is restarted, and its
   task retried) writes its samples again, byte for byte, and its index parts under the same names (a part
   is named by its samples: ``hidden.format.index_part_name``), so the index lists each sample once; it
   reports them again, and the driver counts each sample once.

Ray: ``ray_address`` unset starts a local instance (``ray.init(num_cpus=…, include_dashboard=False,
log_to_driver=False)``) in ``start`` that ``close`` shuts down; ``auto`` or ``ray://…`` joins a cluster (left
running). An already initialised Ray (a test, a notebook) is used as is. ``timings``: ``ray_init``.
Ray Data's progress bars would replace ``builtins.print`` in this process (``ray.experimental.tqdm_ray``);
``start`` sets ``RAY_TQDM_PATCH_PRINT=0`` unless the caller set it, so the caller's ``print`` stays its own.
Ctrl-C: every published file and index part stays; a rerun resumes. A DraftgenError raised in an actor (no
model, a destination written with other settings, a failed write) comes back as a result and is raised here
with its own class and message. ``target`` with no batch run asks one Ray task to load the target.

Reads nothing but what it is given; writes nothing itself (the actors write the sample files and index
parts). ray, torch and numpy are imported on use.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from draftgen.errors import ConfigError
from draftgen.hidden.format import require
from draftgen.phases.extract.worker import (
    BatchResult,
    PoolWorker,
    decode_result,
    encode_batch,
    error_class,
    info_from_wire,
    info_to_wire,
)

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.format import HiddenStore
    from draftgen.records import HiddenIndexRecord
    from draftgen.target import ExtractRow, TargetInfo

__all__ = ["BATCHES_PER_BLOCK", "RayPool", "validate_ray_settings"]

BATCHES_PER_BLOCK = 64  # upper bound of batches per Ray block (one actor task), for many batches


def _info_task(cfg: RunConfig) -> bytes:
    """Load the target only to describe it (nothing pending, but no manifest yet)."""
    from draftgen.target import open_extract_backend

    be = open_extract_backend(cfg)
    try:
        return info_to_wire(be.info)
    finally:
        be.close()


def validate_ray_settings(cfg: RunConfig) -> None:
    hs = cfg.hidden_states
    if hs.backend != "hf":
        raise ConfigError(f"hidden_states.ray: runs the hf backend on a Ray actor pool, not {hs.backend!r}; "
                          "the vllm backend scales out over its servers (base_urls) instead")
    if hs.workers < 1:
        raise ConfigError("hidden_states.workers must be >= 1")
    if hs.num_cpus_per_worker <= 0 or hs.num_gpus_per_worker < 0:
        raise ConfigError("hidden_states.num_cpus_per_worker must be > 0 and num_gpus_per_worker >= 0")
    if hs.device == "cuda" and hs.num_gpus_per_worker == 0:
        raise ConfigError("hidden_states.device is cuda but num_gpus_per_worker is 0; set "
                          "hidden_states.num_gpus_per_worker (1 per GPU) so Ray gives each actor its GPU")


class RayPool:
    """The actor pool (module docstring)."""

    label = " (ray)"
    unit = "actor"

    def __init__(self, cfg: RunConfig, store: HiddenStore, probe: dict[str, HiddenIndexRecord]) -> None:
        validate_ray_settings(cfg)
        self.cfg, self.store, self.probe = cfg, store, probe
        self.started = False
        self.info: TargetInfo | None = None
        self.timings: dict[str, float] = {}

    def start(self) -> None:
        hs = self.cfg.hidden_states
        ray = require("ray", "ray")
        require("ray.data", "ray")
        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        t0 = time.monotonic()
        if not ray.is_initialized():
            if hs.ray_address:
                ray.init(address=hs.ray_address, ignore_reinit_error=True, log_to_driver=False)
            else:
                ray.init(num_cpus=max(1, math.ceil(hs.workers * hs.num_cpus_per_worker)), include_dashboard=False,
                         ignore_reinit_error=True, log_to_driver=False)
            self.started = True
        self.timings["ray_init"] = time.monotonic() - t0

    def describe(self, head: str, url: str) -> list[str]:
        hs = self.cfg.hidden_states
        lines = [f"extract (ray): {head} on {hs.workers} actor(s) ({hs.num_gpus_per_worker:g} GPU, "
                 f"{hs.num_cpus_per_worker:g} CPU each) → {url}; Ray up in {self.timings['ray_init']:.1f} s"]
        if self.store.local and hs.ray_address:
            lines.append(f"extract (ray): note: {url} is a local path; on a multi-node cluster every node must "
                         "see it (a shared file system), else use an object store URL")
        return lines

    def results(self, batches: Sequence[Sequence[ExtractRow]]) -> Iterator[BatchResult]:
        if not batches:
            return
        ray = require("ray", "ray")
        hs = self.cfg.hidden_states
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        ray.data.DataContext.get_current().enable_progress_bars = False
        blocks = min(len(batches), max(4 * hs.workers, math.ceil(len(batches) / BATCHES_PER_BLOCK)))
        ds = ray.data.from_items([{"payload": encode_batch(b)} for b in batches], override_num_blocks=blocks)
        out = ds.map_batches(
            PoolWorker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=hs.workers),
            fn_constructor_kwargs={"cfg": self.cfg, "url": self.store.url,
                                   "storage_options": dict(hs.storage_options), "probe": self.probe},
            num_cpus=hs.num_cpus_per_worker, num_gpus=hs.num_gpus_per_worker,
        )
        for row in out.iter_rows():
            res = decode_result(bytes(row["result"]))
            if res.error:
                raise error_class(res.error_class)(res.error)
            if self.info is None and res.info:
                self.info = info_from_wire(res.info)
            yield res

    def target(self) -> TargetInfo:
        if self.info is None:
            ray = require("ray", "ray")
            hs = self.cfg.hidden_states
            task = ray.remote(num_cpus=hs.num_cpus_per_worker, num_gpus=hs.num_gpus_per_worker)(_info_task)
            self.info = info_from_wire(ray.get(task.remote(self.cfg)))
        return self.info

    def close(self) -> None:
        if self.started:
            require("ray", "ray").shutdown()
            self.started = False
