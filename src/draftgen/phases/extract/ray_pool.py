"""``hidden_states.ray``: ``draftgen extract`` on a Ray Data actor pool (the hf backend, scaled out).

The driver (``run._extract_ray``) hands the PENDING rows (draftgen's own resume: ``HiddenStore.done`` by
sample_id; Ray Data's checkpointing is never used, it re-ran rows and duplicated outputs) to
``extract_with_ray``, which:

1. cuts them into the SAME batches as one process (``run._batches``: windows of merged order sorted by
   length, ``batch_tokens`` padded tokens), so both paths capture identical batches and write identical files;
2. puts one item per batch into ``ray.data.from_items`` (the rows msgpack-encoded: ids and masks as raw
   int64/uint8 bytes) and runs ``map_batches(ExtractActor, batch_size=1, compute=ActorPoolStrategy(size=
   workers), num_gpus=num_gpus_per_worker, num_cpus=num_cpus_per_worker)``;
3. each ``ExtractActor`` loads the target once, checks that the destination was written with its settings,
   and per batch runs ``run.extract_batch`` (capture → encode → check → publish each file atomically →
   its own index part: no shared writer), returning small rows (the ``HiddenIndexRecord`` as JSON, the
   actor, bytes written, the batch's timings, and once per actor the target's ``TargetInfo``);
4. the driver collects the rows as they stream in (progress lines, a summary per actor) and returns them;
   ``run`` then writes manifest.json LAST, in merged train order, with the same function as one process.
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
import os
import socket
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen import errors
from draftgen.errors import ConfigError, DraftgenError
from draftgen.hidden.format import require
from draftgen.records import HiddenIndexRecord
from draftgen.store import decode_json, encode_json

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.format import HiddenStore
    from draftgen.phases.extract.capture import ExtractRow, TargetInfo

__all__ = ["ExtractActor", "PoolResult", "collect_rows", "extract_with_ray", "validate_ray_settings"]

TIMING_KEYS = ("capture", "check", "encode", "publish")
BATCHES_PER_BLOCK = 64  # upper bound of batches per Ray block (one actor task), for many batches


class _Info(msgspec.Struct):
    """``TargetInfo`` on the wire (actor → driver); ``norm_weight`` as raw float32 bytes."""

    name: str
    revision: str | None
    num_layers: int
    hidden_size: int
    vocab_size: int
    norm_eps: float
    norm_weight: bytes
    aux: list[int]
    final: int


def _info_to_wire(info: TargetInfo) -> bytes:
    w = info.norm_weight.float().contiguous().numpy().tobytes()
    return msgspec.msgpack.encode(_Info(name=info.name, revision=info.revision, num_layers=info.num_layers,
                                        hidden_size=info.hidden_size, vocab_size=info.vocab_size,
                                        norm_eps=info.norm_eps, norm_weight=w, aux=list(info.layers.aux),
                                        final=info.layers.final))


def _info_from_wire(data: bytes) -> TargetInfo:
    np = require("numpy")
    torch = require("torch")
    from draftgen.phases.extract.capture import TargetInfo
    from draftgen.phases.extract.layers import LayerIds

    i = msgspec.msgpack.decode(data, type=_Info)
    weight = torch.from_numpy(np.frombuffer(i.norm_weight, dtype=np.float32).copy())
    return TargetInfo(name=i.name, revision=i.revision, num_layers=i.num_layers, hidden_size=i.hidden_size,
                      vocab_size=i.vocab_size, norm_eps=i.norm_eps, norm_weight=weight,
                      layers=LayerIds(aux=tuple(i.aux), final=i.final))


def _encode_batch(batch: Sequence[ExtractRow]) -> bytes:
    return msgspec.msgpack.encode([(r.sample_id, r.input_ids.tobytes(), r.loss_mask.tobytes()) for r in batch])


def _decode_batch(data: bytes) -> list[ExtractRow]:
    np = require("numpy")
    from draftgen.phases.extract.capture import ExtractRow

    return [ExtractRow(sample_id=sid, input_ids=np.frombuffer(ids, dtype=np.int64).copy(),
                       loss_mask=np.frombuffer(mask, dtype=np.uint8).copy())
            for sid, ids, mask in msgspec.msgpack.decode(data, type=list[tuple[str, bytes, bytes]])]


def _error_class(name: str) -> type[DraftgenError]:
    cls = getattr(errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, DraftgenError) else DraftgenError


class ExtractActor:
    """One Ray actor: the target loaded once (``open_extract_backend``), the destination opened, and per
    Ray batch (one item = one draftgen batch) ``run.extract_batch``. Its output rows: ``record`` (the
    HiddenIndexRecord as JSON bytes), ``actor``, ``written`` and ``t_<timing>`` (the batch's bytes and
    seconds, on its first row), ``info`` (the TargetInfo, on this actor's first row only), ``error`` / ``error_class``
    (a DraftgenError, as one row, instead of any record)."""

    def __init__(self, cfg: RunConfig, url: str, storage_options: dict[str, Any],
                 probe: dict[str, HiddenIndexRecord]) -> None:
        self.actor = f"{socket.gethostname()}:{os.getpid()}"
        self.hs = cfg.hidden_states
        self.error: DraftgenError | None = None
        self.info_sent = False
        try:
            torch = require("torch")
            torch.set_num_threads(max(1, int(self.hs.num_cpus_per_worker)))
            from draftgen.hidden.format import HiddenStore
            from draftgen.phases.extract.capture import open_extract_backend
            from draftgen.phases.extract.run import _check_settings

            self.store = HiddenStore(url, storage_options)
            self.be = open_extract_backend(cfg)
            _check_settings(self.store, probe, cfg, self.be)
        except DraftgenError as exc:
            self.error = exc

    def _err(self, exc: DraftgenError) -> dict[str, Any]:
        np = require("numpy")
        row: dict[str, Any] = {"record": [b""], "actor": [self.actor], "written": [0], "info": [b""],
                               "error": [str(exc)], "error_class": [type(exc).__name__]}
        row.update({f"t_{k}": [0.0] for k in (*TIMING_KEYS, "began", "ended")})
        return {k: np.array(v, dtype=object if k in ("record", "info") else None) for k, v in row.items()}

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        np = require("numpy")
        from draftgen.phases.extract.run import extract_batch

        if self.error is not None:
            return self._err(self.error)
        out: dict[str, list[Any]] = {k: [] for k in ("record", "actor", "written", "info", "error", "error_class",
                                                     "began", "ended", *(f"t_{k}" for k in TIMING_KEYS))}
        for payload in batch["payload"]:
            rows = _decode_batch(bytes(payload))
            timings = dict.fromkeys(TIMING_KEYS, 0.0)
            began = time.time()  # wall clock: the driver spans the pool's work over all actors
            try:
                records, nbytes = extract_batch(self.be, self.store, self.hs, rows, timings)
            except DraftgenError as exc:
                return self._err(exc)
            ended = time.time()
            for i, rec in enumerate(records):
                out["record"].append(encode_json(rec))
                out["actor"].append(self.actor)
                out["written"].append(nbytes if i == 0 else 0)
                out["info"].append(b"" if self.info_sent else _info_to_wire(self.be.info))
                self.info_sent = True
                out["error"].append("")
                out["error_class"].append("")
                out["began"].append(began)
                out["ended"].append(ended)
                for k in TIMING_KEYS:
                    out[f"t_{k}"].append(timings[k] if i == 0 else 0.0)
        return {k: np.array(v, dtype=object if k in ("record", "info") else None) for k, v in out.items()}


def _info_task(cfg: RunConfig) -> bytes:
    """Load the target only to describe it (nothing pending, but no manifest yet)."""
    from draftgen.phases.extract.capture import open_extract_backend

    be = open_extract_backend(cfg)
    try:
        return _info_to_wire(be.info)
    finally:
        be.close()


@dataclass
class PoolResult:
    info: TargetInfo
    extracted: int = 0
    tokens: int = 0
    written: int = 0
    seconds: float = 0.0  # first batch begun → last batch ended, over all actors: throughput = tokens / seconds
    timings: dict[str, float] = field(default_factory=dict)  # summed over actors; ray_init, first_result, pool
    per_actor: dict[str, int] = field(default_factory=dict)  # samples per actor


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
    from draftgen.phases.extract.run import _batches

    hs = cfg.hidden_states
    if not pending:
        task = ray.remote(num_cpus=hs.num_cpus_per_worker, num_gpus=hs.num_gpus_per_worker)(_info_task)
        return PoolResult(info=_info_from_wire(ray.get(task.remote(cfg))), timings={"ray_init": ray_init})
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    batches = list(_batches(pending, hs.batch_tokens))
    blocks = min(len(batches), max(4 * hs.workers, math.ceil(len(batches) / BATCHES_PER_BLOCK)))
    ds = ray.data.from_items([{"payload": _encode_batch(b)} for b in batches], override_num_blocks=blocks)
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


def collect_rows(rows: Iterable[dict[str, Any]], pending: Sequence[ExtractRow], done: dict[str, HiddenIndexRecord],
                 echo: Any, total: int, done_before: int, t0: float, *, label: str) -> PoolResult:
    """The driver's half of a pool (Ray's actors, or ``proc_pool``'s processes): the workers' result rows as
    they stream in (see ``ExtractActor``) → ``done``, progress lines, a line per worker, the PoolResult."""
    length = {r.sample_id: len(r.input_ids) for r in pending}
    res_info: TargetInfo | None = None
    timings = dict.fromkeys(TIMING_KEYS, 0.0)
    per_actor: Counter[str] = Counter()
    extracted = tokens = written = 0
    every = max(1, len(pending) // 20)
    next_echo = every
    first: float | None = None
    began, ended = math.inf, -math.inf
    for row in rows:
        if row["error"]:
            raise _error_class(str(row["error_class"]))(str(row["error"]))
        if first is None:
            first = time.monotonic() - t0
        began, ended = min(began, float(row["began"])), max(ended, float(row["ended"]))
        if res_info is None and row["info"]:
            res_info = _info_from_wire(bytes(row["info"]))
        rec = decode_json(bytes(row["record"]), HiddenIndexRecord, where="ray actor result")
        for k in TIMING_KEYS:
            timings[k] += float(row[f"t_{k}"])
        written += int(row["written"])
        if rec.sample_id in done or rec.sample_id not in length:
            continue  # a retried task's repeat (Ray restarted an actor): the same file, listed once
        done[rec.sample_id] = rec
        per_actor[str(row["actor"])] += 1
        extracted += 1
        tokens += length[rec.sample_id]
        if extracted >= next_echo or extracted == len(pending):
            next_echo += every
            echo(f"extract: {done_before + extracted:,}/{total:,} samples, {tokens:,} tokens this run, "
                 f"{tokens / max(time.monotonic() - t0, 1e-9):,.0f} tokens/s")
    seconds = max(ended - began, 0.0) if extracted else 0.0
    for actor, n in sorted(per_actor.items()):
        echo(f"extract ({'ray' if label == 'actor' else 'processes'}): {label} {actor}: {n:,} samples")
    if res_info is None:  # every row came from workers that had already reported (cannot happen on a fresh pool)
        raise DraftgenError(f"extract: no {label} reported the target; rerun")
    timings.update(first_result=first or 0.0, pool=time.monotonic() - t0)
    return PoolResult(info=res_info, extracted=extracted, tokens=tokens, written=written, seconds=seconds,
                      timings=timings, per_actor=dict(per_actor))
