"""The client side of vLLM's ExampleHiddenStatesConnector files: the folder they may be in, the lock, the read,
and which of them are draftgen's to remove.

A server in extract mode names, per request, ``<shared_storage_path>/<request_id>.safetensors`` in its
response (``kv_transfer_params.hidden_states_path``), with a companion ``<path>.lock`` (held ``LOCK_EX`` by
the writer until the file is complete). The client reads the file and removes both. A server is not trusted
with the client's files: ``ConnectorFolder.admit`` accepts a path only when, once symlinks are resolved
(``os.path.realpath``), it is a file of the connector's naming directly in the configured folder
(``hidden_states.connector_dir``); anything else is a ``PermanentAPIError`` (kind
``foreign_hidden_states_path``) naming the path, raised before the path is touched (no lock is opened, no
file read or removed). ``ConnectorFolder.remove`` unlinks only entries of that folder.

Ownership: a path admitted for a request is draftgen's to remove once that request is answered, whatever the
answer (read and accepted, refused, or abandoned after a timeout). ``discard`` removes such a file at once or,
while the server still holds its lock (a write still running), watches it: ``tidy`` removes it once the writer
lets go, ``close`` in any case, and ``watched`` counts it meanwhile. With a ``claims`` folder (draftgen's own,
in its run directory) each admitted path is noted there (``claim``: one marker file, named as the connector
file, holding its real path) until it is removed for good, so ``sweep`` at the next start removes what a
killed run left: only paths a request of draftgen's named, and only in this connector folder.

Reads the connector's files; removes the ones the client was named; writes only the markers in ``claims``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftgen.errors import ConfigError, InputError, PermanentAPIError, RetryableAPIError, StorageError
from draftgen.hidden.format import require, storage_faults

if TYPE_CHECKING:
    import torch

__all__ = ["CONNECTOR_NAME", "ConnectorFolder", "ServerFile", "read_connector_file", "wait_for_lock"]

#: the connector's file names: ``<request_id>.safetensors`` (vLLM's ids are ``cmpl-<hex>-<n>``); no
#: separator, no leading dot (never a hidden or temporary file)
CONNECTOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,250}\.safetensors")

_KEY = "hidden_states.connector_dir"


@dataclass
class ServerFile:
    """What one connector file held: ``hidden_states`` [T, n_slots, H] and ``token_ids`` int64 [T]; ``data``:
    the very bytes those were decoded from (when the reader was asked to keep them)."""

    hidden_states: torch.Tensor
    token_ids: torch.Tensor
    data: bytes = b""


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _locked(lock: str) -> bool:
    """Whether a writer holds ``lock`` (LOCK_EX); False when it is gone."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class ConnectorFolder:
    """The one folder whose connector files the client reads and removes (see the module docstring)."""

    def __init__(self, folder: str, *, destination: str | None = None, claims: str | None = None) -> None:
        """``folder``: the servers' ``shared_storage_path`` as seen here; must be an existing folder.
        ``destination``: the local hidden-state destination, refused when it overlaps the folder (the
        folder's files are removed; draftgen's own must never be among them). ``claims``: draftgen's folder of
        markers of the admitted paths (created when needed; None: nothing is noted)."""
        real = os.path.realpath(folder)
        if not os.path.isdir(real):
            raise ConfigError(f"{_KEY} {folder!r}: not a folder; give the servers' kv_transfer_config "
                              "shared_storage_path as this host sees it (the servers create it when they start)")
        for other, what in ((destination, "hidden_states.output"), (claims, "draftgen's run directory")):
            if other is not None and (_inside(real, os.path.realpath(other)) or _inside(os.path.realpath(other), real)):
                raise ConfigError(f"{_KEY} {folder!r} overlaps {what} {other!r}; the connector's folder is "
                                  "emptied by the client: keep the two apart")
        self.root = real
        self.claims = claims
        self._watch: set[str] = set()  # discarded while their lock was held: removed again by ``tidy``

    def admit(self, path: object, *, sample_id: str, where: str) -> str:
        """The real path of ``path`` when it is a connector file directly in the folder (it need not exist
        yet: the write may still be running); else a PermanentAPIError naming it. Touches no file."""
        if not isinstance(path, str) or not path or "\x00" in path:
            self._refuse(path, sample_id, where, "not a path")
        assert isinstance(path, str)
        real = os.path.realpath(path)
        if os.path.dirname(real) != self.root:
            self._refuse(path, sample_id, where, f"it resolves to {real}, outside {self.root}")
        if not CONNECTOR_NAME.fullmatch(os.path.basename(real)):
            self._refuse(path, sample_id, where, "not a connector file name (<request_id>.safetensors)")
        return real

    def claim(self, real: str) -> None:
        """Note the admitted ``real`` in ``claims`` (a marker named as the file, holding its path) until it is
        removed for good; a killed run's claims are what ``sweep`` removes."""
        if self.claims is None:
            return
        os.makedirs(self.claims, exist_ok=True)
        fd = os.open(os.path.join(self.claims, os.path.basename(real)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, real.encode())
        finally:
            os.close(fd)

    def check_file(self, real: str, *, sample_id: str, where: str) -> None:
        """After the write: ``real`` is still a regular file (not a link, not a folder) of the folder."""
        try:
            st = os.lstat(real)
        except FileNotFoundError:
            raise RetryableAPIError(f"hidden_states_missing: the connector file {real} is gone ({where})",
                                    kind="hidden_states_missing") from None
        if not stat.S_ISREG(st.st_mode) or os.path.realpath(real) != real:
            self._refuse(real, sample_id, where, "not a regular file")

    def remove(self, real: str) -> None:
        """Unlink ``real`` and ``real.lock`` (entries of the folder only: an entry that is a link loses the
        link, never its target) and its claim; a file not there yet keeps its claim (a server may still write
        it, after its request was given up on: the next ``sweep`` removes it, or drops a claim of nothing)."""
        name = os.path.basename(real)
        if os.path.dirname(real) != self.root or not CONNECTOR_NAME.fullmatch(name):
            return  # never reached for an admitted path; removing nothing is the safe answer
        written = os.path.lexists(real) or os.path.lexists(real + ".lock")
        for entry in (name + ".lock", name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, entry))
        self._watch.discard(real)
        if self.claims is not None and written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.claims, name))

    def discard(self, real: str) -> None:
        """An admitted file its request gave up on (refused, or not complete in time): removed with its lock now,
        or, while its writer still holds the lock (a write still running), watched until it lets go (``tidy``)."""
        if _locked(real + ".lock"):
            self._watch.add(real)
        else:
            self.remove(real)

    def tidy(self) -> None:
        """Remove the watched files whose writer has let go of the lock."""
        for real in list(self._watch):
            if not _locked(real + ".lock"):
                self.remove(real)

    def watched(self) -> tuple[int, int]:
        """Files and bytes of the watched paths on disk now."""
        sizes = []
        for real in self._watch:
            with contextlib.suppress(OSError):
                sizes.append(os.lstat(real).st_size)
        return len(sizes), sum(sizes)

    def close(self, wait_s: float = 2.0) -> None:
        """Give the watched writers up to ``wait_s`` to let go, then remove every watched file and lock, except
        those whose writer still holds the lock: left as they are, claimed, for the next ``sweep``; forget them."""
        deadline = time.monotonic() + wait_s
        while self._watch and time.monotonic() < deadline:
            self.tidy()
            if self._watch:
                time.sleep(0.02)
        for real in list(self._watch):
            if _locked(real + ".lock"):
                self.claim(real)
            else:
                self.remove(real)
        self._watch.clear()

    def sweep(self) -> tuple[int, int]:
        """At a start, before any request: remove the files (and locks) ``claims`` names in this folder, left by
        a run that was killed (or given up on by an earlier pass of this one), and drop their claims; a file
        whose writer still holds its lock is left as it is, claimed (removing it under a late write would only
        let the write bring it back unclaimed): the next ``sweep`` takes it. Returns (files removed, claims of
        another folder dropped)."""
        if self.claims is None or not os.path.isdir(self.claims):
            return 0, 0
        removed = elsewhere = 0
        for name in sorted(os.listdir(self.claims)):
            marker = os.path.join(self.claims, name)
            try:
                with open(marker, "rb") as fh:
                    real = fh.read().decode("utf-8", "replace")
            except (IsADirectoryError, FileNotFoundError):
                continue
            if os.path.dirname(real) == self.root and os.path.basename(real) == name and CONNECTOR_NAME.fullmatch(name):
                if _locked(real + ".lock"):
                    continue
                removed += os.path.lexists(real) or os.path.lexists(real + ".lock")
                self.remove(real)
            else:
                elsewhere += 1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker)
        return removed, elsewhere

    def _refuse(self, path: object, sample_id: str, where: str, why: str) -> None:
        raise PermanentAPIError(
            f"sample {sample_id}: the server named hidden_states_path {path!r} ({where}): {why}; only connector "
            f"files directly in {_KEY} {self.root} are read or removed (is shared_storage_path that folder?)",
            kind="foreign_hidden_states_path")


async def wait_for_lock(path: str, timeout_s: float, poll_s: float = 0.005) -> None:
    """Wait until the connector has finished writing ``path``: a shared flock on ``<path>.lock`` (held
    LOCK_EX by the writer), or, with no lock file (``use_synchronization_lock: false``), until the file is
    there. RetryableAPIError (kind ``hidden_states_timeout``) when neither happens within ``timeout_s``."""
    lock = path + ".lock"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, OSError):
            if os.path.exists(path) and not os.path.lexists(lock):
                return
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return  # the writer released LOCK_EX: the file is complete
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
        if time.monotonic() > deadline:
            raise RetryableAPIError(
                f"hidden_states_timeout: the connector file {path} was not complete within {timeout_s:g}s; the "
                "server's shared_storage_path must be readable here (same host or a shared filesystem)",
                kind="hidden_states_timeout")
        await asyncio.sleep(poll_s)


def read_connector_file(path: str, *, keep_bytes: bool = False) -> ServerFile:
    """The two tensors of one connector file, decoded from one read of its bytes (kept in ``data`` with
    ``keep_bytes``: what was checked is what can be handed on); StorageError naming ``path`` when it is
    missing, truncated or unreadable, or its keys are missing."""
    st = require("safetensors.torch")
    try:
        with storage_faults(path):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
            tensors = st.load(data)
    except InputError as exc:  # the storage boundary's one-line reason, with the connector's fix
        reason = str(exc).removeprefix(f"{path}: ").split(";")[0]
        raise StorageError(f"{path}: cannot read the connector's safetensors file ({reason}); keep "
                           "use_synchronization_lock on in the server's kv_transfer_config and its "
                           "shared_storage_path on a filesystem this host reads whole, then rerun") from None
    missing = [k for k in ("hidden_states", "token_ids") if k not in tensors]
    if missing:
        raise StorageError(f"{path}: no {', '.join(missing)} tensor; not an ExampleHiddenStatesConnector file")
    return ServerFile(hidden_states=tensors["hidden_states"], token_ids=tensors["token_ids"],
                      data=data if keep_bytes else b"")
