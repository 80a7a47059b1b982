"""``hidden_states.ray``: ``draftgen extract`` on a Ray Data actor pool (the hf backend, scaled out).

The driver (``run._extract_ray``) hands the PENDING rows (draftgen's own resume: ``HiddenStore.done`` by
sample_id; Ray Data's checkpointing is never used, it re-ran rows and duplicated outputs) to
``extract_with_ray``, which:

1. cuts them into the SAME batches as one process (``batches.split_batches``: windows of merged order sorted
   by length, ``batch_tokens`` padded tokens), so both paths capture identical batches and write identical files;
2. puts one item per batch into ``ray.data.from_items`` (the rows msgpack-encoded: ids and masks as raw
   int64/uint8 bytes) and runs ``map_batches(ExtractActor, batch_size=1, compute=ActorPoolStrategy(size=
   workers), num_gpus=num_gpus_per_worker, num_cpus=num_cpus_per_worker)``;
3. each ``worker.ExtractActor`` loads the target once, checks that the destination was written with its
   settings, and per batch runs ``batches.extract_batch`` (capture → encode → check → publish each file
   atomically → its own index part: no shared writer), returning small rows (the ``HiddenIndexRecord`` as JSON, the
   actor, bytes written, the batch's timings, and once per actor the target's ``TargetInfo``);
4. the driver collects the rows as they stream in (``worker.collect_rows``: progress lines, a summary per
   actor) and returns them; ``run`` then writes manifest.json LAST, in merged train order, with the same function as one process.
   Its throughput spans the actors' work (the first batch begun to the last one ended, by the actors'
   clocks), not their start-up (mostly loading the target: ``timings.first_result`` ≈ start-up + one batch;
   Ray's own start ``timings.ray_init``; ``timings.pool`` the whole pool), so a ``--pilot`` measures the
   steady rate.

Ray: ``ray_address`` unset starts a local instance (``ray.init(num_cpus=…, include_dashboard=False,
log_to_driver=False)``) that is shut down in a ``finally``; ``auto`` or ``ray://…`` joins a cluster (left
running). An already initialised Ray (a test, a notebook) is used as is. Ctrl-C: every published file and
index part stays; a rerun resumes. A DraftgenError raised in an actor (no model, a destination written with
other settings, a failed write) comes back as a row and is raised here with its own class and message.

Reads: nothing but what it is given (the actors read the target's weights and one stored sample); writes
the sample files and index parts under the destination. ray, torch and numpy are imported on use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError
from draftgen.hidden.format import require
from draftgen.phases.extract.batches import split_batches
from draftgen.phases.extract.worker import (
    ExtractActor,
    PoolResult,
    collect_rows,
    encode_batch,
    info_from_wire,
    info_to_wire,
)

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.format import HiddenStore
    from draftgen.phases.extract.capture import ExtractRow
    from draftgen.records import HiddenIndexRecord

__all__ = ["extract_with_ray", "validate_ray_settings"]

BATCHES_PER_BLOCK = 64  # upper bound of batches per Ray block (one actor task), for many batches


def _info_task(cfg: RunConfig) -> bytes:
    """Load the target only to describe it (nothing pending, but no manifest yet)."""
    from draftgen.phases.extract.capture import open_extract_backend

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


def extract_with_ray(cfg: RunConfig, store: HiddenStore, pending: Sequence[ExtractRow],
                     done: dict[str, HiddenIndexRecord], echo: Any, *, total: int,
                     done_before: int) -> PoolResult:
    """Extract ``pending`` on the actor pool (module docstring); adds each new record to ``done``."""
    validate_ray_settings(cfg)
    hs = cfg.hidden_states
    ray = require("ray", "ray")
    require("ray.data", "ray")
    t0 = time.monotonic()
    started = False
    if not ray.is_initialized():
        if hs.ray_address:
            ray.init(address=hs.ray_address, ignore_reinit_error=True, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, math.ceil(hs.workers * hs.num_cpus_per_worker)), include_dashboard=False,
                     ignore_reinit_error=True, log_to_driver=False)
        started = True
    ray_init = time.monotonic() - t0
    try:
        return _run_pool(cfg, store, pending, done, echo, total, done_before, ray_init)
    finally:
        if started:
            ray.shutdown()


def _run_pool(cfg: RunConfig, store: HiddenStore, pending: Sequence[ExtractRow],
              done: dict[str, HiddenIndexRecord], echo: Any, total: int, done_before: int,
              ray_init: float) -> PoolResult:
    import logging

    ray = require("ray", "ray")

    hs = cfg.hidden_states
    if not pending:
        task = ray.remote(num_cpus=hs.num_cpus_per_worker, num_gpus=hs.num_gpus_per_worker)(_info_task)
        return PoolResult(info=info_from_wire(ray.get(task.remote(cfg))), timings={"ray_init": ray_init})
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    batches = list(split_batches(pending, hs.batch_tokens))
    blocks = min(len(batches), max(4 * hs.workers, math.ceil(len(batches) / BATCHES_PER_BLOCK)))
    ds = ray.data.from_items([{"payload": encode_batch(b)} for b in batches], override_num_blocks=blocks)
    probe = dict([next(iter(done.items()))]) if done else {}
    out = ds.map_batches(
        ExtractActor, batch_size=1, compute=ray.data.ActorPoolStrategy(size=hs.workers),
        fn_constructor_kwargs={"cfg": cfg, "url": store.url, "storage_options": dict(hs.storage_options),
                               "probe": probe},
        num_cpus=hs.num_cpus_per_worker, num_gpus=hs.num_gpus_per_worker,
    )
    echo(f"extract (ray): {len(pending):,} of {total:,} samples to do ({done_before:,} done before) in "
         f"{len(batches):,} batches on {hs.workers} actor(s) ({hs.num_gpus_per_worker:g} GPU, "
         f"{hs.num_cpus_per_worker:g} CPU each) → {store.url}; Ray up in {ray_init:.1f} s")
    if store.local and hs.ray_address:
        echo(f"extract (ray): note: {store.url} is a local path; on a multi-node cluster every node must see it "
             "(a shared file system), else use an object store URL")
    res = collect_rows(out.iter_rows(), pending, done, echo, total, done_before, time.monotonic(), label="actor")
    res.timings.update(ray_init=ray_init)
    return res
