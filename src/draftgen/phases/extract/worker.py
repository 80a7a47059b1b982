"""The one worker of ``draftgen extract``: batches of merged rows → captured, encoded, checked samples → a sink.

``Worker`` holds the loaded capture backend and the destination (``HiddenStore``, a ``hidden.stream.Sink``);
every executor runs it (``executor.InProcess`` here, ``proc_pool`` in each device process, ``ray_pool`` in each
actor). Per batch:

1. ``capture``: the backend's states of the batch (the target's forward), staged where they are (the hf
   backend, ``target.staging``: rounded to the storage dtype, the cheap checks' numbers computed on those
   values on the device, copied to pinned host memory asynchronously; a backend that hands them unstaged is
   staged on the CPU in step 2);
2. ``finish``: each sample, on the host pool (``host_threads()`` threads, one job per sample): its cheap checks
   read from its staged numbers (``check_staged``: the result ``check_sample`` gives on the file), encoded once
   (``encode_sample``: exactly the staged tensors; the bytes that are hashed and published; decoded again only
   for the teacher check and provider fidelity: ``check_fidelity`` on a row marked ``fidelity`` and on every
   teacher-checked one), its ``HiddenIndexRecord`` (``file_sha256``) made, its file published atomically;
   once EVERY job of the batch has ended, ONE index part listing them. Returns a ``BatchResult`` (the index
   records, bytes written, seconds per step summed over the pool's threads, the wall-clock span).

``run(batches)`` overlaps the two when the backend allows it (``ExtractCapabilities.overlap``): while
threads finish batches k, k-1, … (``FINISHING`` at most), the caller's thread captures batch k+1 (the target's forward is the costly part;
encoding, checks and file writes hide behind it). Which samples get the teacher check is
``target.checks.spot_checked``'s answer: the backend's own draw after each answer (vllm: ``SpotCheck``, a
secret no server sees), else the sample id's hash (hf). The teacher check of a selected sample costs many
forwards of that sample (a reference forward, its aux slots run on through the layers); so with overlap it
runs in a third thread, the teacher lane: ``finish`` leaves the sample out of its batch and hands it, encoded
and cheaply checked, to the lane, which checks it, then publishes its file and an index part of its own, and
the rest of the batch does not wait. Batch results come back in batch order, each lane sample's
as it lands; at most ``FINISHING`` + 1 batches (one captured, up to ``FINISHING`` finishing on the shared host
pool) and ``TEACHER_HELD`` lane samples are in flight (a kill loses at most those: a sample is done only once
listed). Without overlap the steps run one after the other.

``PoolWorker`` is a Worker in another process: it opens its own store and backend from the config, checks
the destination against them (``batches.check_settings``), takes batches as msgpack (``encode_batch``) and
returns each ``BatchResult`` as msgpack (``encode_result``), the first one with the target's ``TargetInfo``
(``info_to_wire``); a DraftgenError becomes one result with its class and message (``error_class`` raises it
again in the driver). Writes through the store only. torch and numpy are imported on use.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen import errors
from draftgen.errors import DraftgenError
from draftgen.hidden.codec import bytes_digest, decode_sample, row_digest, sample_parts
from draftgen.hidden.format import HiddenStore, require, sample_path
from draftgen.hidden.stream import Sink, StreamSample
from draftgen.records import HiddenIndexRecord
from draftgen.target.staging import host_threads

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.codec import Captured, LoadedSample
    from draftgen.target import ExtractBackend, ExtractRow, TargetInfo
    from draftgen.target.checks import CheckResult

__all__ = ["TIMING_KEYS", "BatchResult", "PoolWorker", "Worker", "decode_batch", "decode_result", "encode_batch",
           "encode_result", "error_class", "info_from_wire", "info_to_wire"]

TIMING_KEYS = ("capture", "check", "encode", "publish")
TEACHER_HELD = 4  # samples waiting in the teacher lane at most (each holds its bytes and decoded states)
#: batches finishing at once on the host pool while the next is captured: a batch holds only a few samples (8,192
#: tokens of 1-4k-token rows), so one at a time leaves most of the pool idle and the disk waiting (H200, 8B, bf16:
#: 0.68x the forward + copy with one, the host lane's pace)
FINISHING = 3


class BatchResult(msgspec.Struct, kw_only=True):
    """One batch done by a worker: its index records (in batch order), the bytes it wrote, its seconds per
    step, and its wall-clock span (``time.time``: spans are compared over processes and hosts). From a
    pool: ``worker`` names it, ``info`` (its first result only) is its ``TargetInfo`` (``info_to_wire``),
    ``error``/``error_class`` a DraftgenError instead of records."""

    records: list[HiddenIndexRecord] = msgspec.field(default_factory=list)
    written: int = 0
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    began: float = 0.0
    ended: float = 0.0
    worker: str = ""
    info: bytes = b""
    error: str = ""
    error_class: str = ""


def encode_result(r: BatchResult) -> bytes:
    return msgspec.msgpack.encode(r)


def decode_result(data: bytes) -> BatchResult:
    return msgspec.msgpack.decode(data, type=BatchResult)


class _Info(msgspec.Struct):
    """``TargetInfo`` on the wire (worker → driver); ``norm_weight`` as raw float32 bytes."""

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
    from draftgen.target import TargetInfo
    from draftgen.target.layers import LayerIds

    i = msgspec.msgpack.decode(data, type=_Info)
    weight = torch.from_numpy(np.frombuffer(i.norm_weight, dtype=np.float32).copy())
    return TargetInfo(name=i.name, revision=i.revision, num_layers=i.num_layers, hidden_size=i.hidden_size,
                      vocab_size=i.vocab_size, norm_eps=i.norm_eps, norm_weight=weight,
                      layers=LayerIds(aux=tuple(i.aux), final=i.final), config_sha256=i.config_sha256)


def encode_batch(batch: Sequence[ExtractRow]) -> bytes:
    return msgspec.msgpack.encode([(r.sample_id, r.input_ids.tobytes(), r.loss_mask.tobytes(), r.fidelity)
                                   for r in batch])


def decode_batch(data: bytes) -> list[ExtractRow]:
    np = require("numpy")
    from draftgen.target import ExtractRow

    return [ExtractRow(sample_id=sid, input_ids=np.frombuffer(ids, dtype=np.int64).copy(),
                       loss_mask=np.frombuffer(mask, dtype=np.uint8).copy(), fidelity=fid)
            for sid, ids, mask, fid in msgspec.msgpack.decode(data, type=list[tuple[str, bytes, bytes, bool]])]


def error_class(name: str) -> type[DraftgenError]:
    cls = getattr(errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, DraftgenError) else DraftgenError


@dataclass
class _Captured:
    """A batch's rows and their captured states, when and how long the capture took."""

    rows: Sequence[ExtractRow]
    caps: list[Captured | None]  # ``finish`` lets each go once encoded
    began: float
    seconds: float


@dataclass
class _Done:
    """A sample's host job ended: published (its ``record`` and ``size``) or, for the teacher lane, encoded
    and decoded (``data``, ``loaded``) with its cheap checks' result; seconds per step."""

    row: ExtractRow
    data: bytes
    res: CheckResult
    timings: dict[str, float]
    loaded: LoadedSample | None = None
    record: HiddenIndexRecord | None = None
    size: int = 0


def _all(jobs: list[Future[_Done]]) -> list[_Done]:
    """Every job's result, in order, once ALL have ended: the first failure raised only then, so no job of a
    failed batch is still writing when its error reaches the caller."""
    wait(jobs)
    return [j.result() for j in jobs]


class Worker:
    """See the module docstring. ``Worker.open`` loads the configured backend (or takes one) and checks the
    destination; ``close`` closes a backend it loaded."""

    def __init__(self, cfg: RunConfig, store: HiddenStore, backend: ExtractBackend, *, overlap: bool,
                 own: bool = False) -> None:
        self.hs = cfg.hidden_states
        self.store = store
        self.backend = backend
        self.overlap = overlap
        self.own = own
        self._lane: ThreadPoolExecutor | None = None  # the teacher lane, while ``run`` overlaps
        self._pool: ThreadPoolExecutor | None = None  # the host pool (``host_threads``), while ``run`` runs
        self._held: deque[Future[BatchResult]] = deque()  # samples in the lane, oldest first
        self._room = threading.BoundedSemaphore(TEACHER_HELD)  # a place in the lane

    @classmethod
    def open(cls, cfg: RunConfig, store: HiddenStore, probe: dict[str, HiddenIndexRecord],
             backend: ExtractBackend | None = None) -> Worker:
        """The worker for ``cfg`` writing to ``store``: the configured backend loaded (unless ``backend`` is
        given: then no overlap, nothing is known of its threads), the destination checked against it with
        one done sample of ``probe`` (``check_settings``: identity.json is written here on a new set)."""
        from draftgen.phases.extract.batches import check_settings
        from draftgen.target import backend_capabilities, open_extract_backend

        own = backend is None
        be = open_extract_backend(cfg) if backend is None else backend
        try:
            check_settings(store, probe, cfg, be)
        except BaseException:
            if own:
                be.close()
            raise
        return cls(cfg, store, be, overlap=own and backend_capabilities(cfg).overlap, own=own)

    def close(self) -> None:
        if self.own:
            self.backend.close()

    def capture(self, rows: Sequence[ExtractRow]) -> _Captured:
        began, t = time.time(), time.monotonic()
        caps: list[Captured | None] = list(self.backend.capture(rows))
        return _Captured(rows=rows, caps=caps, began=began, seconds=time.monotonic() - t)

    def finish(self, c: _Captured) -> BatchResult:
        """Check → encode → hash → publish each sample on the host pool, then ONE index part listing the batch
        (see the module docstring). With a teacher lane (``run`` with overlap) a teacher-selected sample's
        teacher check and write go to the lane instead."""
        from draftgen.target.checks import spot_checked

        if len(c.caps) != len(c.rows):
            raise RuntimeError(f"capture returned {len(c.caps)} samples for {len(c.rows)} rows")
        pool = self._pool or ThreadPoolExecutor(host_threads(), thread_name_prefix="draftgen-extract-host")
        try:
            jobs: list[Future[_Done]] = []
            for i, row in enumerate(c.rows):
                cap, c.caps[i] = c.caps[i], None  # held by its job only: let go once encoded
                assert cap is not None
                teacher = spot_checked(self.backend, row.sample_id, self.hs.teacher_fraction)
                jobs.append(pool.submit(self._sample_job, row, cap, teacher, self._lane is not None and teacher))
            done = _all(jobs)  # every job ended (a failure: its files may be published, none is listed)
        finally:
            if pool is not self._pool:
                pool.shutdown(wait=True)
        timings = dict.fromkeys(TIMING_KEYS, 0.0)
        timings["capture"] = c.seconds
        records: list[HiddenIndexRecord] = []
        written = 0
        for d in done:
            for k, v in d.timings.items():
                timings[k] += v
            if d.loaded is not None:  # to the lane, in batch order: it publishes and lists it
                self._to_lane(d.row, d.data, d.loaded, d.res)
            elif d.record is not None:
                records.append(d.record)
                written += d.size
        t = time.monotonic()
        self.store.write_index_part(records)  # the batch's samples are done from here on
        timings["publish"] += time.monotonic() - t
        return BatchResult(records=records, written=written, timings=timings, began=c.began, ended=time.time())

    def _sample_job(self, row: ExtractRow, cap: Captured, teacher: bool, lane: bool) -> _Done:
        """One sample on the host pool: staged (a backend that did not stage it: here, on the CPU), its cheap
        checks read from its staged numbers, encoded, hashed and published, unless it goes to the ``lane``
        (then it comes back encoded and decoded, unpublished). A teacher sample is decoded for the teacher
        check, a fidelity sample (``_measured``) for ``check_fidelity``; no other is decoded."""
        from draftgen.target.checks import check_fidelity, check_staged, check_teacher
        from draftgen.target.staging import stage_host

        hs, be = self.hs, self.backend
        t = time.monotonic()
        if cap.staged is None:
            cap = stage_host(cap, be.embed, len(be.info.layers.aux), hs.dtype)
        res = check_staged(cap, row, be, hs)
        t2 = time.monotonic()
        parts = sample_parts(cap, hs.dtype)  # the file's buffers, uncopied: hashed and written as they are
        del cap
        t3 = time.monotonic()
        if lane:
            data = b"".join(parts)
            loaded = decode_sample(data)
            timings = {"check": t2 - t + time.monotonic() - t3, "encode": t3 - t2}
            return _Done(row=row, data=data, res=res, loaded=loaded, timings=timings)
        measured = self._measured(row, teacher)
        if (teacher or measured) and "shape" not in res.failed and "finite" not in res.failed:
            loaded = decode_sample(b"".join(parts))
            if teacher:
                check_teacher(loaded, row, be, hs, res)
            if measured:
                check_fidelity(loaded, row, be, hs, res)
            del loaded
        t4 = time.monotonic()
        rec = _record(row, bytes_digest(parts), res)
        t5 = time.monotonic()
        self.store.publish(row.sample_id, parts)
        timings = {"check": t2 - t + t4 - t3, "encode": t3 - t2 + t5 - t4, "publish": time.monotonic() - t5}
        return _Done(row=row, data=b"", res=res, record=rec, size=sum(memoryview(b).nbytes for b in parts),
                     timings=timings)

    def _measured(self, row: ExtractRow, teacher: bool) -> bool:
        """Whether the sample's provider fidelity is measured: a row extract chose (``ExtractRow.fidelity``),
        and every teacher-checked sample unless ``hidden_states.fidelity_samples`` is 0."""
        return row.fidelity or (teacher and self.hs.fidelity_samples > 0)

    def _to_lane(self, row: ExtractRow, data: bytes, loaded: LoadedSample, res: CheckResult) -> None:
        """Hand a sample to the teacher lane: at most ``TEACHER_HELD`` wait or run there (this waits for room)."""
        assert self._lane is not None
        self._room.acquire()  # released by the job when it ends, whatever its outcome
        try:
            self._held.append(self._lane.submit(self._teacher, row, data, loaded, res))
        except BaseException:
            self._room.release()
            raise

    def _teacher(self, row: ExtractRow, data: bytes, loaded: LoadedSample, res: CheckResult) -> BatchResult:
        """The teacher lane's job: one sample's teacher check (and provider fidelity), then its file and an index
        part of its own."""
        from draftgen.target.checks import check_fidelity, check_teacher

        try:
            began, t = time.time(), time.monotonic()
            check_teacher(loaded, row, self.backend, self.hs, res)
            if self._measured(row, True):
                check_fidelity(loaded, row, self.backend, self.hs, res)
            del loaded
            t2 = time.monotonic()
            sample = _sample(row, data, res)
            sink: Sink = self.store
            sink.write([sample])
        finally:
            self._room.release()
        timings = dict.fromkeys(TIMING_KEYS, 0.0)
        timings.update(check=t2 - t, publish=time.monotonic() - t2)
        assert sample.record is not None
        return BatchResult(records=[sample.record], written=len(data), timings=timings, began=began,
                           ended=time.time())

    def _landed(self, *, wait: bool) -> Iterator[BatchResult]:
        """The teacher lane's results, oldest first: those done (``wait``: all of them, waiting)."""
        while self._held and (wait or self._held[0].done()):
            yield self._held.popleft().result()

    def run(self, batches: Iterable[Sequence[ExtractRow]]) -> Iterator[BatchResult]:
        """Each batch's result, in batch order, and each teacher-lane sample's as it lands (see the module
        docstring for the overlap)."""
        with ThreadPoolExecutor(host_threads(), thread_name_prefix="draftgen-extract-host") as host:
            self._pool = host
            try:
                if not self.overlap:
                    for rows in batches:
                        yield self.finish(self.capture(rows))
                    return
                yield from self._overlapped(batches)
            finally:
                self._pool = None

    def _overlapped(self, batches: Iterable[Sequence[ExtractRow]]) -> Iterator[BatchResult]:
        with (ThreadPoolExecutor(max_workers=FINISHING, thread_name_prefix="draftgen-extract-finish") as pool,
              ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftgen-extract-teacher") as lane):
            self._lane = lane
            try:
                ahead: deque[Future[BatchResult]] = deque()
                for rows in batches:
                    captured = self.capture(rows)
                    ahead.append(pool.submit(self.finish, captured))
                    while len(ahead) > FINISHING or (ahead and ahead[0].done()):  # in batch order
                        yield ahead.popleft().result()
                    yield from self._landed(wait=False)
                while ahead:
                    yield ahead.popleft().result()
                yield from self._landed(wait=True)
            finally:
                self._lane = None
                for f in self._held:
                    f.cancel()  # a job cancelled before it ran keeps its place: the next run gets a fresh lane
                self._held.clear()
                self._room = threading.BoundedSemaphore(TEACHER_HELD)


def _record(row: ExtractRow, file_sha256: str, res: CheckResult) -> HiddenIndexRecord:
    """A checked sample's index record."""
    return HiddenIndexRecord(sample_id=row.sample_id, file=sample_path(row.sample_id), length=len(row.input_ids),
                             n_loss=int(row.loss_mask.sum()), failed=res.failed, teacher=res.teacher,
                             fidelity=res.fidelity,
                             row_sha256=row_digest(row.input_ids, row.loss_mask), file_sha256=file_sha256)


def _sample(row: ExtractRow, data: bytes, res: CheckResult) -> StreamSample:
    """A checked sample as the sink takes it: its bytes and its index record."""
    rec = _record(row, bytes_digest(data), res)
    return StreamSample(sample_id=row.sample_id, file=rec.file, data=data, length=len(row.input_ids), record=rec)


class PoolWorker:
    """A Worker in a pool's process (see the module docstring): ``run(payloads)`` for a stream of batches
    (``proc_pool``), ``__call__`` for one Ray Data batch of items (``ray_pool``)."""

    def __init__(self, cfg: RunConfig, url: str, storage_options: dict[str, Any],
                 probe: dict[str, HiddenIndexRecord]) -> None:
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.error: DraftgenError | None = None
        self.info_sent = False
        self.worker: Worker | None = None
        try:
            torch = require("torch")
            torch.set_num_threads(max(1, int(cfg.hidden_states.num_cpus_per_worker)))
            self.worker = Worker.open(cfg, HiddenStore(url, storage_options), probe)
        except DraftgenError as exc:
            self.error = exc

    def _failed(self, exc: DraftgenError) -> bytes:
        return encode_result(BatchResult(worker=self.name, error=str(exc), error_class=type(exc).__name__))

    def run(self, payloads: Iterable[bytes]) -> Iterator[bytes]:
        """Each batch's encoded result; after an error result nothing more is taken."""
        if self.error is not None or self.worker is None:
            yield self._failed(self.error or DraftgenError("extract: the worker did not start"))
            return
        w = self.worker
        try:
            for res in w.run(decode_batch(p) for p in payloads):
                res.worker = self.name
                if not self.info_sent:
                    res.info, self.info_sent = info_to_wire(w.backend.info), True
                yield encode_result(res)
        except DraftgenError as exc:
            yield self._failed(exc)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        np = require("numpy")
        out = list(self.run(bytes(p) for p in batch["payload"]))
        return {"result": np.array(out, dtype=object)}
