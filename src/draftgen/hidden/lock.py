"""One writer per hidden-state destination: ``destination_lock(store, run_dir)``.

Local destination D: an exclusive non-blocking ``flock`` on ``D/.lock`` (the mechanism ``rundir`` uses for
the run directory: the kernel drops it when the holder dies), and ``D/.lock.json`` (HiddenLockHolder) names
the holder for the refusal message.

Object store (fsspec, s3): no portable put-if-absent, so ``D/.lock.json`` is an owner file: read before
writing; refused while another live holder has it; a holder is dead when its file was not refreshed for
``LOCK_STALE_S`` seconds, or when it is on this host and its pid no longer runs. After writing its own file
the writer reads it back and gives up if another token is there (two writers racing: at most one keeps
it; a narrow window remains, documented in docs/extract.md). The holder refreshes the file as it works
(``refresh``, at most once a minute) and removes it at the end.

Reads and writes only ``D/.lock`` and ``D/.lock.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator

from draftgen.errors import RunDirError
from draftgen.hidden.format import HiddenStore, atomic_write_bytes, storage_faults
from draftgen.records import HiddenLockHolder
from draftgen.rundir.claim import pid_runs, wait_for_name
from draftgen.store import decode_json, encode_json

__all__ = ["LOCK_STALE_S", "destination_lock", "read_holder"]

LOCK_STALE_S = 3600.0  # an owner file not refreshed for this long belongs to a dead writer

_LOCK = ".lock"
_HOLDER = ".lock.json"
_REFRESH_S = 60.0


def _where(store: HiddenStore) -> str:
    return f"{store.url.rstrip('/')}/{_HOLDER}"


def read_holder(store: HiddenStore) -> HiddenLockHolder | None:
    """The destination's ``.lock.json``, or None (absent or unreadable: a courtesy, not the lock itself)."""
    path = store.path(_HOLDER)
    with storage_faults(_where(store)):
        if not store.fs.exists(path):
            return None
        data = store.fs.cat_file(path)
    try:
        return decode_json(data, HiddenLockHolder, where=path)
    except Exception:  # a half-written courtesy file names nobody
        return None


def _text(h: HiddenLockHolder | None) -> str:
    if h is None:
        return "another draftgen extract"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.since))
    return f"draftgen extract of run {h.run_dir} (host {h.host}, pid {h.pid}, since {since})"


def _alive(h: HiddenLockHolder, now: float | None) -> bool:
    """Whether ``h`` still holds: refreshed within ``LOCK_STALE_S`` of ``now`` (None: age not checked) and,
    on this host, its pid still runs."""
    if now is not None and now - h.refreshed > LOCK_STALE_S:
        return False
    return h.host != socket.gethostname() or pid_runs(h.pid)


def _live_holder(store: HiddenStore) -> HiddenLockHolder | None:
    """The local flock's holder as its ``.lock.json`` names it (``rundir.claim.wait_for_name``); a file left by a dead
    holder names nobody. A local holder never refreshes its file: the flock is its lease, so age is not
    checked."""
    h = read_holder(store)
    return h if h is not None and _alive(h, None) else None


def _refuse(store: HiddenStore, h: HiddenLockHolder | None) -> RunDirError:
    return RunDirError(f"{store.url}: {_text(h)} is writing this hidden-state destination; wait for it to finish "
                       "or set another hidden_states.output (one writer per destination)")


@contextlib.contextmanager
def destination_lock(store: HiddenStore, run_dir: str) -> Iterator[Callable[[], None]]:
    """Hold ``store``'s destination for the block (see the module docstring); yields ``refresh`` (call it as
    the work goes on; cheap: it writes at most once a minute)."""
    now = time.time()
    me = HiddenLockHolder(host=socket.gethostname(), pid=os.getpid(), run_dir=run_dir, since=round(now, 3),
                          refreshed=round(now, 3), token=uuid.uuid4().hex)
    if store.local:
        yield from _local(store, me)
    else:
        yield from _remote(store, me)


def _local(store: HiddenStore, me: HiddenLockHolder) -> Iterator[Callable[[], None]]:
    os.makedirs(store.root, exist_ok=True)
    with storage_faults(store.path(_LOCK), "write"):
        fh = open(store.path(_LOCK), "a+b")  # noqa: SIM115 (held open while the lock is held; closed below)
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise _refuse(store, wait_for_name(lambda: _live_holder(store))) from None
        with contextlib.suppress(OSError):
            atomic_write_bytes(store.path(_HOLDER), encode_json(me) + b"\n")
        try:
            yield lambda: None  # the flock needs no refresh
        finally:
            with contextlib.suppress(OSError):
                os.unlink(store.path(_HOLDER))
    finally:
        fh.close()


def _remote(store: HiddenStore, me: HiddenLockHolder) -> Iterator[Callable[[], None]]:
    held = read_holder(store)
    if held is not None and held.token != me.token and _alive(held, time.time()):
        raise _refuse(store, held)
    path = store.path(_HOLDER)

    def put(h: HiddenLockHolder) -> None:
        with storage_faults(_where(store), "write"):
            store.fs.pipe_file(path, encode_json(h) + b"\n")

    put(me)
    back = read_holder(store)
    if back is None or back.token != me.token:
        raise _refuse(store, back)
    last = [time.monotonic()]

    def refresh() -> None:
        if time.monotonic() - last[0] >= _REFRESH_S:
            last[0] = time.monotonic()
            me.refreshed = round(time.time(), 3)
            put(me)

    try:
        yield refresh
    finally:
        back = read_holder(store)
        if back is not None and back.token == me.token:
            with contextlib.suppress(Exception), storage_faults(_where(store), "write"):
                store.fs.rm_file(path)
