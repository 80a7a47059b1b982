"""The worker half of ``draftgen extract``'s pools, shared by ``ray_pool`` (Ray actors) and ``proc_pool``
(one process per device), and the driver's collector of what the workers return.

- ``encode_batch`` / ``decode_batch``: one draftgen batch on the wire (msgpack: sample ids, ids and masks as
  raw int64/uint8 bytes), driver → worker;
- ``ExtractActor``: one worker; per batch ``batches.extract_batch`` (capture → encode → check → publish each
  file → its own index part); it returns small column rows (``dict[str, numpy array]``, Ray Data's batch
  format): the ``HiddenIndexRecord`` as JSON, the worker, bytes and seconds, once the ``TargetInfo``
  (``info_to_wire``), or one error row (a DraftgenError's class and message);
- ``collect_rows``: the driver's half: those rows → ``done``, progress lines, a line per worker, a
  ``PoolResult``; an error row is raised again with its own class (``error_class``).

Reads and writes nothing itself (the worker writes through ``HiddenStore``). torch and numpy are imported
on use.
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
from draftgen.errors import DraftgenError
from draftgen.hidden.format import require
from draftgen.records import HiddenIndexRecord
from draftgen.store import decode_json, encode_json

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.phases.extract.capture import ExtractRow, TargetInfo

__all__ = ["TIMING_KEYS", "ExtractActor", "PoolResult", "collect_rows", "decode_batch", "encode_batch",
           "error_class", "info_from_wire", "info_to_wire"]

TIMING_KEYS = ("capture", "check", "encode", "publish")


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
    config_sha256: str | None = None


def info_to_wire(info: TargetInfo) -> bytes:
    w = info.norm_weight.float().contiguous().numpy().tobytes()
    return msgspec.msgpack.encode(_Info(name=info.name, revision=info.revision, num_layers=info.num_layers,
                                        hidden_size=info.hidden_size, vocab_size=info.vocab_size,
                                        norm_eps=info.norm_eps, norm_weight=w, aux=list(info.layers.aux),
                                        final=info.layers.final, config_sha256=info.config_sha256))


def info_from_wire(data: bytes) -> TargetInfo:
    np = require("numpy")
    torch = require("torch")
    from draftgen.phases.extract.capture import TargetInfo
    from draftgen.phases.extract.layers import LayerIds

    i = msgspec.msgpack.decode(data, type=_Info)
    weight = torch.from_numpy(np.frombuffer(i.norm_weight, dtype=np.float32).copy())
    return TargetInfo(name=i.name, revision=i.revision, num_layers=i.num_layers, hidden_size=i.hidden_size,
                      vocab_size=i.vocab_size, norm_eps=i.norm_eps, norm_weight=weight,
                      layers=LayerIds(aux=tuple(i.aux), final=i.final), config_sha256=i.config_sha256)


def encode_batch(batch: Sequence[ExtractRow]) -> bytes:
    return msgspec.msgpack.encode([(r.sample_id, r.input_ids.tobytes(), r.loss_mask.tobytes()) for r in batch])


def decode_batch(data: bytes) -> list[ExtractRow]:
    np = require("numpy")
    from draftgen.phases.extract.capture import ExtractRow

    return [ExtractRow(sample_id=sid, input_ids=np.frombuffer(ids, dtype=np.int64).copy(),
                       loss_mask=np.frombuffer(mask, dtype=np.uint8).copy())
            for sid, ids, mask in msgspec.msgpack.decode(data, type=list[tuple[str, bytes, bytes]])]


def error_class(name: str) -> type[DraftgenError]:
    cls = getattr(errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, DraftgenError) else DraftgenError


class ExtractActor:
    """One worker of a pool (a Ray actor, or one ``proc_pool`` process): the target loaded once
    (``open_extract_backend``), the destination opened and checked (``batches.check_settings`` on the probe),
    and per Ray batch (one item = one draftgen batch) ``batches.extract_batch``. Its output rows: ``record`` (the
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
            from draftgen.phases.extract.batches import check_settings
            from draftgen.phases.extract.capture import open_extract_backend

            self.store = HiddenStore(url, storage_options)
            self.be = open_extract_backend(cfg)
            check_settings(self.store, probe, cfg, self.be)
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
        from draftgen.phases.extract.batches import extract_batch

        if self.error is not None:
            return self._err(self.error)
        out: dict[str, list[Any]] = {k: [] for k in ("record", "actor", "written", "info", "error", "error_class",
                                                     "began", "ended", *(f"t_{k}" for k in TIMING_KEYS))}
        for payload in batch["payload"]:
            rows = decode_batch(bytes(payload))
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
                out["info"].append(b"" if self.info_sent else info_to_wire(self.be.info))
                self.info_sent = True
                out["error"].append("")
                out["error_class"].append("")
                out["began"].append(began)
                out["ended"].append(ended)
                for k in TIMING_KEYS:
                    out[f"t_{k}"].append(timings[k] if i == 0 else 0.0)
        return {k: np.array(v, dtype=object if k in ("record", "info") else None) for k, v in out.items()}


@dataclass
class PoolResult:
    """What a pool hands back to ``run``: the target it ran and the totals of this run."""

    info: TargetInfo
    extracted: int = 0
    tokens: int = 0
    written: int = 0
    seconds: float = 0.0  # first batch begun → last batch ended, over all actors: throughput = tokens / seconds
    timings: dict[str, float] = field(default_factory=dict)  # summed over actors; ray_init, first_result, pool
    per_actor: dict[str, int] = field(default_factory=dict)  # samples per actor


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
            raise error_class(str(row["error_class"]))(str(row["error"]))
        if first is None:
            first = time.monotonic() - t0
        began, ended = min(began, float(row["began"])), max(ended, float(row["ended"]))
        if res_info is None and row["info"]:
            res_info = info_from_wire(bytes(row["info"]))
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
