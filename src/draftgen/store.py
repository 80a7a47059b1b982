"""Crash-safe append-only JSONL, atomic JSON files, and the resume index.

This is the only module that encodes or decodes JSON for files (the HTTP wire format is decoded in
``backends.wire`` and the emulator). Formats:

- JSONL: one record per line, UTF-8, ``\\n``-terminated, written by ``JsonlWriter``. A line is either
  complete and valid, or it is the last line and partial (a crash mid-write); ``repair_partial_tail``
  truncates such a tail before anything is appended, so completed lines are never touched.
- JSON documents (``run.json``, ``stats.json``, ``audit.json``): written to a temp file, fsynced and renamed.

Resume is by ``sample_id``: ``scan_responses`` reads only the fields resume needs (id, token counts, cost),
so start-up stays fast on logs of hundreds of millions of tokens.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from draftgen.errors import InputError, StorageError
from draftgen.records import (
    SCHEMA_VERSION,
    AttemptRecord,
    AttemptSpend,
    FailureRecord,
    Provenance,
    ResponseKeyView,
    ResponseRecord,
    ResponseScanView,
    SettlementRecord,
    attempt_spend,
    spend_usd,
)

__all__ = [
    "JsonlReader",
    "JsonlWriter",
    "ResumeIndex",
    "atomic_write_bytes",
    "atomic_write_json",
    "decode_json",
    "decode_json_object",
    "encode_json",
    "encode_json_pretty",
    "first_records",
    "iter_jsonl",
    "iter_jsonl_offsets",
    "iter_responses",
    "move_records",
    "new_file_mode",
    "publish",
    "raw_ids_len",
    "read_json",
    "read_json_object",
    "repair_partial_tail",
    "scan_attempt_spend",
    "scan_failures",
    "scan_responses",
    "storage_error",
    "superseded_lines",
    "temp_beside",
]

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


def encode_json(obj: Any) -> bytes:
    return _encoder.encode(obj)


def decode_json(data: bytes | str, type: type[T], *, where: str = "<input>") -> T:
    try:
        return msgspec.json.decode(data, type=type)
    except msgspec.ValidationError as exc:
        raise InputError(f"{where}: {exc}; fix the field or regenerate the file") from None
    except msgspec.DecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from None


def decode_json_object(data: bytes | str) -> dict[str, Any]:
    """A foreign JSON object (a model's ``config.json``, a trainer's state file, a safetensors header) as a
    dict. Raises ``ValueError`` when it is not valid JSON or not an object, so callers keep their own
    message, which names the file and the fix."""
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def read_json_object(path: Path) -> dict[str, Any]:
    """``decode_json_object`` of a file; ``OSError`` (``FileNotFoundError``) propagates as it is."""
    return decode_json_object(path.read_bytes())


def encode_json_pretty(obj: Any) -> bytes:
    """Indented JSON with a final newline, for files people read (a checkpoint's ``config.json``)."""
    return msgspec.json.format(_encoder.encode(obj), indent=2) + b"\n"


def storage_error(path: Path, exc: OSError) -> StorageError:
    """The one-line StorageError for a failed write to ``path`` (ENOSPC named as such)."""
    if exc.errno == errno.ENOSPC:
        return StorageError(f"{path}: no space left on device; free space and rerun (completed work is kept)")
    return StorageError(f"{path}: write failed ({exc.strerror or exc}); completed work is kept")


def new_file_mode() -> int:
    """The mode a new file gets from the umask (0644 under the usual 022): what a temp file made by
    ``mkstemp`` (always 0600) is given before it takes its final name, so outputs are not private."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def temp_beside(path: Path) -> Path:
    """A new, empty temp file of this writer's own beside ``path`` (``mkstemp``: two writers never share
    one), with the mode a new file gets from the umask."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())
    finally:
        os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temp file, fsynced, renamed over it), with the mode a new
    file gets from the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, new_file_mode())
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise storage_error(path, exc) from None


def publish(tmp: Path, final: Path) -> None:
    """Make a fully written temp file durable and give it its final name in one atomic step."""
    try:
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as exc:
        raise storage_error(final, exc) from None


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, msgspec.json.format(encode_json(obj), indent=2) + b"\n")


def read_json(path: Path, type: type[T]) -> T:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    return decode_json(data, type, where=str(path))


def repair_partial_tail(path: Path) -> int:
    """Truncate an unterminated last line (a write cut by a crash). Returns the bytes removed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        # Walk back to the last newline in blocks.
        pos = size
        block = 1 << 16
        cut = 0
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                cut = start + idx + 1
                break
            pos = start
        try:
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError as exc:
            raise storage_error(path, exc) from None
        return size - cut


class JsonlWriter:
    """Append records to one JSONL file. One writer owns a file; call ``write_many`` from one task.

    Each batch is written with one ``write`` call, then flushed and fsynced (group commit), so a
    crash leaves at most one partial last line, which ``repair_partial_tail`` removes on the next open.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        repair_partial_tail(path)
        try:
            self._fh = open(path, "ab", buffering=0)  # noqa: SIM115 (owned by the writer until close())
        except OSError as exc:
            raise storage_error(path, exc) from None

    def write_many(self, records: Iterable[Any]) -> None:
        buf = bytearray()
        for rec in records:
            buf += _encoder.encode(rec)
            buf += b"\n"
        if not buf:
            return
        try:
            view = memoryview(buf)
            while view:
                n = self._fh.write(view)
                view = view[n:]
            if self.fsync:
                os.fsync(self._fh.fileno())
        except OSError as exc:
            # A short write leaves a partial tail; cut it now so the file stays valid.
            try:
                repair_partial_tail(self.path)
            except StorageError:
                pass
            raise storage_error(self.path, exc) from None

    def write(self, record: Any) -> None:
        self.write_many((record,))

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:
            pass

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_version(rec: Any, path: Path, lineno: int) -> None:
    version = getattr(rec, "schema_version", None)
    if version is not None and (type(version) is not int or version > SCHEMA_VERSION or version < 1):
        raise InputError(f"{path}:{lineno}: schema_version {version!r} is not one this draftgen reads "
                         f"(1 to {SCHEMA_VERSION}); upgrade draftgen or regenerate the file")


def iter_jsonl(path: Path, type: type[T], *, skip_partial_tail: bool = True) -> Iterator[tuple[int, T]]:
    """Yield (line number, record). A corrupt complete line is an InputError naming file:line.

    An unterminated last line is a crash artefact and is skipped when ``skip_partial_tail``. A record
    whose type has ``schema_version`` and whose line carries an unknown one is an InputError too.
    """
    for lineno, _, rec in _decode_lines(path, type, skip_partial_tail):
        yield lineno, rec


def _decode_lines(path: Path, type: type[T], skip_partial_tail: bool) -> Iterator[tuple[int, int, T]]:
    """The one JSONL decode loop: (line number, byte offset, record) for every non-blank line; a missing
    file yields nothing (see ``iter_jsonl`` for the errors)."""
    decoder = msgspec.json.Decoder(type)
    try:
        fh = open(path, "rb")  # noqa: SIM115 (entered just below)
    except FileNotFoundError:
        return
    with fh:
        lineno = 0
        offset = 0
        for raw in fh:
            lineno += 1
            start = offset
            offset += len(raw)
            if not raw.endswith(b"\n") and skip_partial_tail:
                return
            if not raw.strip():
                continue
            try:
                rec = decoder.decode(raw)
            except msgspec.ValidationError as exc:
                raise InputError(f"{path}:{lineno}: {exc}") from None
            except msgspec.DecodeError as exc:
                raise InputError(f"{path}:{lineno}: corrupt line ({exc}); remove or fix that line") from None
            _check_version(rec, path, lineno)
            yield lineno, start, rec


def raw_ids_len(raw: msgspec.Raw) -> int:
    """Length of a JSON int array left undecoded (``msgspec.Raw``), counted without parsing it."""
    data = bytes(raw)
    if data.strip() in (b"[]", b"null", b""):
        return 0
    return data.count(b",") + 1


class ResumeIndex(msgspec.Struct):
    """What resume needs from one dataset's raw log. ``tracked``: for the ids asked for, the ``created_at``
    of their last record and how many records they have."""

    done: set[str]
    completion_tokens: int = 0
    spend_usd: float = 0.0
    duplicates: int = 0
    tracked: dict[str, tuple[float, int]] = msgspec.field(default_factory=dict)


def scan_responses(path: Path, *, check: Callable[[Provenance | None, str], None] | None = None,
                   track: Collection[str] = ()) -> ResumeIndex:
    """Read the done ids, completion tokens and spend of a raw log (repairing nothing on disk).

    Completion tokens use ``usage.completion_tokens`` when present, else ``len(output_ids)`` (legacy
    SGLang rows). Every record's tokens and spend count, a sample's later records included (a sample the
    audit excluded is generated again, and both were paid for), except the spend of a record kept
    unusable (flagged ``unusable:*``): its attempt booked it in ``logs/attempts.jsonl``
    (``scan_attempt_spend``). ``check(provenance, "file:line")`` is called per record and raises to refuse
    one.
    """
    idx = ResumeIndex(done=set())
    for lineno, row in iter_jsonl(path, ResponseScanView):
        if check is not None:
            check(row.provenance, f"{path}:{lineno}")
        sid = row.sample_id
        if sid in idx.done:
            idx.duplicates += 1
        idx.done.add(sid)
        if track and sid in track:
            _, n = idx.tracked.get(sid, (0.0, 0))
            idx.tracked[sid] = (row.created_at, n + 1)
        if row.usage is not None and row.usage.completion_tokens:
            idx.completion_tokens += row.usage.completion_tokens
        else:
            idx.completion_tokens += raw_ids_len(row.output_ids)
        if row.usage is not None and not any(f.startswith("unusable:") for f in row.recon_flags):
            cost = spend_usd(row.usage.cost, row.usage.is_byok, row.usage.upstream_cost)
            idx.spend_usd += cost if cost > 0 else 0.0  # never a credit (NaN compares False too)
    return idx


def superseded_lines(path: Path) -> set[int]:
    """Line numbers of the records of a raw log that a later record of the same sample supersedes (a
    sample the audit excluded, generated again): readers take each sample's last record. Empty, the usual
    case, when no sample has two records."""
    last: dict[str, int] = {}
    out: set[int] = set()
    for lineno, row in iter_jsonl(path, ResponseKeyView):
        before = last.get(row.sample_id)
        if before is not None:
            out.add(before)
        last[row.sample_id] = lineno
    return out


def scan_attempt_spend(path: Path, settlements: Path) -> AttemptSpend:
    """What the attempts log (``logs/attempts.jsonl``) booked for attempts that left no record: responses
    rejected or unusable, and requests abandoned on the wire (held at their worst case until
    ``logs/settlements.jsonl`` says what they were billed: ``records.attempt_spend``). Each is spend no raw
    log carries."""
    return attempt_spend((a for _, a in iter_jsonl(path, AttemptRecord)),
                         (s for _, s in iter_jsonl(settlements, SettlementRecord)))


def scan_failures(path: Path) -> dict[str, FailureRecord]:
    """Latest failure per sample id."""
    out: dict[str, FailureRecord] = {}
    for _, rec in iter_jsonl(path, FailureRecord):
        out[rec.sample_id] = rec
    return out


class _SampleIdView(msgspec.Struct):
    sample_id: str = ""


def move_records(src: Path, dst: Path, sample_ids: set[str]) -> int:
    """Move the lines of ``src`` whose record's ``sample_id`` is in ``sample_ids`` to the end of ``dst``,
    byte for byte; ``src`` keeps the others, in order. Returns the number of lines moved.

    Crash-safe: the moved lines are appended to ``dst`` and made durable first, then ``src`` is replaced
    atomically by a copy without them. A crash between the two leaves the lines in both; moving them again
    appends only the lines ``dst`` does not hold yet, so each is there once. ``src``'s partial tail (a write
    cut by a crash) is dropped."""
    if not sample_ids or not src.is_file():
        return 0
    repair_partial_tail(src)
    decoder = msgspec.json.Decoder(_SampleIdView)
    have = {_line_key(line) for line in _lines(dst)}
    tmp = temp_beside(src)
    moved = 0
    try:
        with open(tmp, "wb") as keep, open(src, "rb") as fh:
            out: list[bytes] = []
            for line in fh:
                try:
                    sid = decoder.decode(line).sample_id
                except msgspec.DecodeError:
                    sid = ""
                if sid not in sample_ids:
                    keep.write(line)
                    continue
                moved += 1
                if _line_key(line) not in have:
                    out.append(line)
        if not moved:
            tmp.unlink()
            return 0
        _append_lines(dst, out)
        publish(tmp, src)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return moved


def _lines(path: Path) -> Iterator[bytes]:
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        return
    with fh:
        yield from (line for line in fh if line.endswith(b"\n"))


def _line_key(line: bytes) -> bytes:
    return hashlib.sha256(line.rstrip(b"\n")).digest()


def _append_lines(path: Path, lines: list[bytes]) -> None:
    """Append whole lines to ``path`` (its partial tail repaired first) and make them durable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_partial_tail(path)
    try:
        with open(path, "ab") as fh:
            fh.write(b"".join(lines))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise storage_error(path, exc) from None


def iter_responses(path: Path) -> Iterator[ResponseRecord]:
    for _, rec in iter_jsonl(path, ResponseRecord):
        yield rec


def iter_jsonl_offsets(path: Path, type: type[T]) -> Iterator[tuple[int, int, T]]:
    """Like ``iter_jsonl`` (partial tail skipped), yielding (line number, byte offset, record).

    The offsets let ``JsonlReader.at`` re-read one line later without keeping the records in memory.
    """
    return _decode_lines(path, type, True)


def first_records(path: Path, type: type[T], sample_ids: Iterable[str]) -> dict[str, T]:
    """The first record of each of ``sample_ids`` in a JSONL file, as ``type`` (a view with a
    ``sample_id``), found by a byte search: only lines holding a wanted id's JSON string are decoded. It
    stops at the partial tail or once all are found; undecodable lines are skipped (a best-effort lookup
    for display, never for data)."""
    decoder = msgspec.json.Decoder(type)
    tags = {sid: msgspec.json.encode(sid) for sid in sample_ids}
    found: dict[str, T] = {}
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
    except OSError:
        return found
    with fh:
        for line in fh:
            if not line.endswith(b"\n") or len(found) == len(tags):
                break
            for sid, tag in tags.items():
                if sid not in found and tag in line:
                    try:
                        rec = decoder.decode(line)
                    except msgspec.DecodeError:
                        continue
                    if getattr(rec, "sample_id", None) == sid:
                        found[sid] = rec
    return found


class JsonlReader:
    """Random access to the lines of one JSONL file by byte offset (from ``iter_jsonl_offsets``)."""

    def __init__(self, path: Path, type: type[T]) -> None:
        self.path = path
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type)
        try:
            self._fh = open(path, "rb")  # noqa: SIM115 (closed by close())
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None

    def at(self, offset: int) -> Any:
        self._fh.seek(offset)
        raw = self._fh.readline()
        try:
            return self._decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InputError(f"{self.path} (byte {offset}): {exc}; the file changed while it was read") from None

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

