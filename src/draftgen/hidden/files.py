"""Local file primitives of the hidden-state set and its exports, and the storage-fault table.

draftgen's one temp-file pattern (``TEMP_PATTERN``: ``.<name>.<16 hex>.tmp``, made by ``temp_name`` /
``open_temp``, recognised by ``is_temp``), the one local atomic writer (``atomic_save``: a temp file filled by a
writer such as ``BytesWriter`` or ``PartsWriter``, then renamed; ``atomic_write_bytes`` for bytes), ``file_digest``, the readers of
other safetensors and torch files (``read_safetensors``, ``read_torch``: connector files, checkpoints), and
``_FAULTS``: the ONE table that turns foreign storage exceptions (fsspec/s3fs/botocore/aiohttp, safetensors,
torch, OSError) into one-line draftgen errors naming the path or URL and the fix (``storage_faults`` applies
it); an exception no row matches propagates unchanged (a bug). Writes only the files it is given.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from draftgen.errors import ConfigError, DraftgenError, InputError, StorageError

__all__ = [
    "REDO_HINT",
    "TEMP_PATTERN",
    "BytesWriter",
    "PartsWriter",
    "atomic_save",
    "atomic_write_bytes",
    "file_digest",
    "is_temp",
    "missing_bucket",
    "open_temp",
    "read_safetensors",
    "read_torch",
    "require",
    "storage_faults",
    "temp_name",
    "translate_storage_error",
]


#: The name of every temp file (and temp folder) draftgen writes in a hidden set or an export folder:
#: ``.<final name>.<16 hex>.tmp`` (``temp_name``). Cleaners remove only names this matches in full.
TEMP_PATTERN = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{8,}\.tmp")

def temp_name(name: str) -> str:
    """A fresh temp name for the file ``name`` (same folder), matching ``TEMP_PATTERN``."""
    return f".{name}.{secrets.token_hex(8)}.tmp"

def is_temp(basename: str, of: str | None = None) -> bool:
    """Whether ``basename`` is a draftgen temp name (``TEMP_PATTERN``, the whole name); with ``of``, a temp
    of the file named ``of``."""
    m = TEMP_PATTERN.fullmatch(basename)
    return m is not None and (of is None or m.group("name") == of)

def open_temp(folder: str, name: str) -> tuple[int, str]:
    """Create a new temp file for ``name`` in ``folder`` (exclusively, mode 0600): (fd, its path)."""
    while True:
        path = os.path.join(folder, temp_name(name))
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), path
        except FileExistsError:  # pragma: no cover (16 random hex digits)
            continue

def require(module: str, extra: str = "extract") -> Any:
    """Import an optional dependency, or a one-line ConfigError saying which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{module} is not installed; pip install 'draftgen[{extra}]'") from None

# -- storage faults: one translation table -----------------------------------------------------------------

REDO_HINT = "delete it and rerun the step that wrote it (draftgen extract redoes a missing sample)"

_RERUN = "then rerun: completed files are kept"

_ENDPOINT = "hidden_states.storage_options.endpoint_url"

def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (s3fs wraps botocore's)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(seen) < 8:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__

def _named(exc: BaseException, *names: str) -> BaseException | None:
    """The first exception of ``exc``'s chain with a class (or base class) called one of ``names``."""
    for e in _chain(exc):
        if any(c.__name__ in names for c in type(e).__mro__):
            return e
    return None

def missing_bucket(exc: BaseException) -> bool:
    return (_named(exc, "NoSuchBucket") is not None
            or any("bucket does not exist" in str(e).lower() for e in _chain(exc)))

def _disk_full(exc: BaseException) -> bool:
    return any(getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "os error 28" in str(e)
               for e in _chain(exc))

def _bucket(where: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(where).netloc or where

def _profile(exc: BaseException) -> str:
    kwargs = getattr(_named(exc, "ProfileNotFound"), "kwargs", None) or {}
    return str(kwargs.get("profile") or os.environ.get("AWS_PROFILE", ""))

@dataclass(frozen=True)
class _Fault:
    """A row of ``_FAULTS``: a foreign exception (a class name anywhere in the MRO of an exception of its
    chain: the libraries are optional imports), an optional extra test, the draftgen error and its message
    (``str.format`` fields: where, detail, bucket, profile)."""

    names: tuple[str, ...]
    error: type[DraftgenError]
    message: str
    test: Callable[[BaseException, str], bool] | None = None

#: foreign exception → draftgen error, first matching row wins (see the module docstring)
_FAULTS: tuple[_Fault, ...] = (
    _Fault(("OSError", "SafetensorError"), StorageError,
           "{where}: disk full (no space left on device); free some space or write elsewhere, " + _RERUN,
           lambda e, op: _disk_full(e)),
    _Fault(("ProfileNotFound",), ConfigError,
           "{where}: AWS_PROFILE {profile!r} is not a profile in ~/.aws/config or ~/.aws/credentials; set "
           "AWS_PROFILE to one that is, or unset it and export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    _Fault(("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"), ConfigError,
           "{where}: no usable AWS credentials ({detail}); export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
           "or set AWS_PROFILE to a profile in ~/.aws/credentials"),
    _Fault(("HTTPClientError", "ValueError"), ConfigError,
           "{where}: the storage endpoint URL holds credentials (user:password@); give the bare "
           f"http://host:port in {_ENDPOINT} and export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
           lambda e, op: any("credentials encoded in url" in str(x).lower() for x in _chain(e))),
    _Fault(("FileNotFoundError", "NoSuchBucket"), ConfigError,
           "{where}: bucket {bucket!r} does not exist; create it, or name an existing bucket in "
           "hidden_states.output", lambda e, op: missing_bucket(e)),
    _Fault(("PermissionError", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"),
           StorageError, "{where}: permission denied ({detail}); check the folder's permissions, or for an "
           "object store the credentials (AWS_* variables, AWS_PROFILE) and the bucket's policy"),
    _Fault(("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
            "ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError", "ConnectionError",
            "TimeoutError"), StorageError,
           "{where}: the storage endpoint cannot be reached ({detail}); check that it is up and "
           f"{_ENDPOINT} (and the network), " + _RERUN),
    _Fault(("FileNotFoundError",), InputError,
           "{where}: not found; check the path, or rerun the step that writes it", lambda e, op: op == "read"),
    _Fault(("SafetensorError", "HeaderTooLarge", "UnpicklingError", "EOFError", "error", "UnicodeDecodeError"),
           InputError, "{where}: unreadable ({detail}): truncated or corrupt; " + REDO_HINT,
           lambda e, op: op == "read"),
    _Fault(("RuntimeError",), InputError, "{where}: unreadable torch file ({detail}): truncated or corrupt; " + REDO_HINT,
           lambda e, op: op == "read" and "PytorchStreamReader" in str(e)),
    _Fault(("ClientError",), StorageError,
           "{where}: the object store refused the request ({detail}); check the bucket, the credentials and "
           f"{_ENDPOINT}"),
    _Fault(("OSError",), StorageError,
           "{where}: write failed ({detail}); check the path and its permissions, " + _RERUN,
           lambda e, op: op == "write"),
)

def _detail(exc: BaseException) -> str:
    from draftgen.secrets import redact

    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    text = " ".join(redact(text or type(exc).__name__).split())
    return text if len(text) <= 160 else text[:157] + "..."

def translate_storage_error(exc: BaseException, where: str, op: str = "read") -> DraftgenError | None:
    """The draftgen error for a foreign exception raised reading (``op="read"``), listing or writing
    (``"write"``) ``where`` (a path or URL), or None when ``_FAULTS`` has no row for it."""
    if isinstance(exc, DraftgenError):
        return exc
    for fault in _FAULTS:
        hit = _named(exc, *fault.names)
        if hit is not None and (fault.test is None or fault.test(exc, op)):
            shown = where.rstrip("/")
            return fault.error(fault.message.format(where=shown, detail=_detail(hit), bucket=_bucket(shown),
                                                    profile=_profile(exc)))
    return None

@contextlib.contextmanager
def storage_faults(where: str, op: str = "read") -> Iterator[None]:
    """Translate what the block raises about ``where`` through ``_FAULTS`` (unmatched: unchanged)."""
    try:
        yield
    except Exception as exc:
        err = translate_storage_error(exc, where, op)
        if err is None or err is exc:
            raise
        raise err from None

def read_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tensors of a safetensors file (on CPU); a missing, truncated or corrupt file is one InputError
    naming ``path``."""
    st = require("safetensors.torch")
    with storage_faults(str(path)):
        tensors: dict[str, Any] = st.load_file(str(path), device="cpu")
    return tensors

def read_torch(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)``; a missing, truncated or corrupt file is one InputError
    naming ``path``."""
    torch = require("torch")
    with storage_faults(str(path)):
        return torch.load(str(path), weights_only=True, map_location="cpu")

def atomic_save(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Publish the local file ``path`` atomically: ``write(tmp)`` fills a temp file in the same folder
    (``open_temp``: draftgen's temp name, never read), then ``os.replace``; on failure the temp file is
    removed and the error translated (a full disk: StorageError naming ``path``)."""
    target = os.fspath(path)
    with storage_faults(target, "write"):
        folder = os.path.dirname(target) or "."
        os.makedirs(folder, exist_ok=True)
        fd, tmp = open_temp(folder, os.path.basename(target))
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

@dataclass(frozen=True)
class BytesWriter:
    """An ``atomic_save`` writer of ``data``, fsynced (a caller can take the file's digest from ``data``)."""

    data: bytes

    def __call__(self, tmp: str) -> None:
        PartsWriter([self.data])(tmp)


@dataclass(frozen=True)
class PartsWriter:
    """An ``atomic_save`` writer of the buffers a file is made of, in order, each written as it is (no join
    copy), fsynced."""

    parts: list[Any]

    def __call__(self, tmp: str) -> None:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:  # the file open_temp made
            for part in self.parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """``atomic_save`` of ``data`` (the store's and export-hidden's one local atomic writer)."""
    atomic_save(path, BytesWriter(data))

def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, sha256) of a local file's bytes, read in chunks."""
    with storage_faults(os.fspath(path)), open(path, "rb") as fh:
        return os.fstat(fh.fileno()).st_size, hashlib.file_digest(fh, "sha256").hexdigest()
