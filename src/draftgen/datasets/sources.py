"""Prompt sources: where a dataset's rows come from, read one row at a time.

``DatasetConfig.path`` may be:

- a file: ``.jsonl`` / ``.ndjson`` (one JSON value per line; ``.gz`` allowed), ``.json`` (an array of rows,
  or an object whose ``data``/``rows``/``examples``/``train`` key holds one), ``.parquet``, or ``.txt`` (one
  plain prompt per non-empty line);
- a folder of such files (recursive, sorted; when some file names start with the split name, e.g.
  ``train-00000.parquet``, only those are read), or a folder written by ``datasets.save_to_disk``;
- ``bundled:<name>``: a prompt set shipped with draftgen (``draftgen/data/prompts/<name>.jsonl``).

``DatasetConfig.hf`` is a Hugging Face dataset name or local folder, read through the optional ``datasets``
package (imported only here, only when used).

Rows are yielded as ``SourceRow(where, data, error)``: ``where`` is ``file:line`` (JSONL, JSON arrays,
text), ``file#row`` (Parquet, 0-based) or ``hf:name[split]#row``; ``error`` is set when the row itself could
not be decoded, so the caller decides whether to stop or skip. A file that cannot be read at all is an
InputError.

Files are streamed, never read whole (except a JSON document that is not an array), and no row is held
beyond ``max_line_bytes`` (``line_byte_limit``: 32 bytes per token of the context length, at least 8 MiB):
a longer JSONL/text line is skipped to its newline without being kept and comes back as an error row; a
longer Parquet row is measured in Arrow before it becomes Python objects; a longer JSON array element
stops the read (an array cannot be resynchronised). Hugging Face datasets are read row by row as the
``datasets`` package yields them.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from draftgen.config import DatasetConfig
from draftgen.errors import ConfigError, InputError

__all__ = ["BYTES_PER_TOKEN", "MIN_LINE_BYTES", "SourceRow", "bundled_names", "iter_rows", "line_byte_limit",
           "source_files", "source_fingerprint", "source_label", "source_where"]

#: a prompt row may take this many bytes per token of the context length (JSON escapes, markup, answers)
BYTES_PER_TOKEN = 32
#: the byte limit of one row is never below this
MIN_LINE_BYTES = 8 << 20
_CHUNK = 1 << 20

_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json", ".parquet", ".txt")
_JSON_LIST_KEYS = ("data", "rows", "examples", "train")


@dataclass
class SourceRow:
    where: str
    data: Any = None
    error: str | None = None
    #: what to do about ``error``, when not the generic "fix or pass --skip-bad"
    fix: str | None = None


def line_byte_limit(context_length: int) -> int:
    """The most bytes one source row (a JSONL line, a JSON array element, a Parquet row) may take."""
    return max(context_length * BYTES_PER_TOKEN, MIN_LINE_BYTES)


_DEFAULT_LINE_BYTES = line_byte_limit(131_072)
_TOO_LONG_FIX = (f"raise model.context_length if such rows are real prompts (a row may take {BYTES_PER_TOKEN} "
                 "bytes per token of it), or pass --skip-bad to skip them")


def _too_long(where: str, size: int, limit: int, what: str = "line") -> SourceRow:
    return SourceRow(where, error=f"the {what} is {size:,} bytes, over the limit of {limit:,} bytes for one row",
                     fix=_TOO_LONG_FIX)


def _bundled_dir() -> Any:
    return resources.files("draftgen") / "data" / "prompts"


def bundled_names() -> list[str]:
    """Names usable as ``path: bundled:<name>``."""
    return sorted(p.name[: -len(".jsonl")] for p in _bundled_dir().iterdir() if p.name.endswith(".jsonl"))


def _bundled(name: str) -> Any:
    res = _bundled_dir() / f"{name}.jsonl"
    if not res.is_file():
        raise ConfigError(f"bundled:{name}: no such bundled prompt set; bundled sets: {', '.join(bundled_names())}")
    return res


def _is_hf_disk(folder: Path) -> bool:
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def source_files(ds: DatasetConfig, base_dir: Path) -> list[Path]:
    """The local files a ``path`` source reads, in reading order (empty for bundled/hf sources)."""
    if ds.path is None or ds.path.startswith("bundled:"):
        return []
    p = _resolve(ds.path, base_dir)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise ConfigError(f"datasets ({ds.name}): path {ds.path!r} not found (resolved to {p})")
    if _is_hf_disk(p):
        return []
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(_SUFFIXES) and not f.name.startswith("."))
    split = [f for f in files if f.name.startswith(ds.split) or ds.split in f.relative_to(p).parts[:-1]]
    files = split or files
    if not files:
        raise ConfigError(f"datasets ({ds.name}): folder {p} holds no .jsonl, .json, .parquet or .txt files")
    return files


def _resolve(path: str, base_dir: Path) -> Path:
    q = Path(path).expanduser()
    return q if q.is_absolute() else base_dir / q


def source_where(ds: DatasetConfig, base_dir: Path) -> str:
    """The source as a user can find it: the resolved local path, else ``bundled:<name>`` / ``hf:…``."""
    if ds.path is not None and not ds.path.startswith("bundled:"):
        return str(_resolve(ds.path, base_dir))
    return source_label(ds)


def source_label(ds: DatasetConfig) -> str:
    if ds.hf is not None:
        return f"hf:{ds.hf}" + (f"/{ds.hf_subset}" if ds.hf_subset else "") + f"[{ds.split}]"
    return str(ds.path)


def source_fingerprint(ds: DatasetConfig, base_dir: Path) -> str:
    """Changes when the source's bytes may have changed (file size and mtime; bundled: content)."""
    h = hashlib.sha256(source_label(ds).encode())
    if ds.path is not None and ds.path.startswith("bundled:"):
        h.update(_bundled(ds.path[len("bundled:"):]).read_bytes())
    elif ds.path is not None:
        p = _resolve(ds.path, base_dir)
        files = source_files(ds, base_dir) or sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def iter_rows(ds: DatasetConfig, base_dir: Path, *, max_line_bytes: int = _DEFAULT_LINE_BYTES) -> Iterator[SourceRow]:
    """Every row of the dataset's source, in a stable order; a row over ``max_line_bytes`` is an error row."""
    if ds.hf is not None:
        yield from _iter_hf(ds, base_dir)
        return
    assert ds.path is not None
    if ds.path.startswith("bundled:"):
        res = _bundled(ds.path[len("bundled:"):])
        with res.open("rb") as fh:
            yield from _iter_jsonl_lines(fh, ds.path, max_line_bytes)
        return
    p = _resolve(ds.path, base_dir)
    if p.is_dir() and _is_hf_disk(p):
        yield from _iter_hf(ds, base_dir, folder=p)
        return
    for f in source_files(ds, base_dir):
        yield from _iter_file(f, max_line_bytes)


def _iter_file(path: Path, limit: int = _DEFAULT_LINE_BYTES) -> Iterator[SourceRow]:
    name = path.name
    try:
        if name.endswith((".jsonl", ".ndjson")):
            with open(path, "rb") as fh:
                yield from _iter_jsonl_lines(fh, str(path), limit)
        elif name.endswith((".jsonl.gz", ".ndjson.gz")):
            with gzip.open(path, "rb") as fh:
                yield from _iter_jsonl_lines(fh, str(path), limit)
        elif name.endswith(".json"):
            yield from _iter_json(path, limit)
        elif name.endswith(".parquet"):
            yield from _iter_parquet(path, limit)
        elif name.endswith(".txt"):
            yield from _iter_text(path, limit)
        else:
            raise InputError(f"{path}: unsupported file type; use .jsonl, .json, .parquet or .txt")
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None


def _bounded_lines(fh: Any, limit: int) -> Iterator[tuple[int, bytes | None, int]]:
    """``(lineno, line, size)`` for each line of a binary file, reading at most ``limit`` + 1 bytes of a
    line at once. A line longer than ``limit`` (newline excluded) comes as ``(lineno, None, size)``: the
    rest of it is read in chunks and dropped up to the next newline, so it is never held whole."""
    lineno = 0
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield lineno, raw, len(raw)
            continue
        size = len(raw)
        del raw
        while True:
            part = fh.readline(_CHUNK)
            if part.endswith(b"\n"):
                size += len(part) - 1
                break
            size += len(part)
            if not part:
                break
        yield lineno, None, size


def _iter_jsonl_lines(fh: Any, label: str, limit: int = _DEFAULT_LINE_BYTES) -> Iterator[SourceRow]:
    decoder = msgspec.json.Decoder()
    for lineno, raw, size in _bounded_lines(fh, limit):
        where = f"{label}:{lineno}"
        if raw is None:
            yield _too_long(where, size, limit)
            continue
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            yield SourceRow(where, decoder.decode(raw))
        except msgspec.DecodeError as exc:
            yield SourceRow(where, error=f"not valid JSON ({exc})")
        except RecursionError:
            yield SourceRow(where, error="the JSON is nested too deeply to read")


def _iter_text(path: Path, limit: int = _DEFAULT_LINE_BYTES) -> Iterator[SourceRow]:
    with open(path, "rb") as fh:
        for lineno, raw, size in _bounded_lines(fh, limit):
            where = f"{path}:{lineno}"
            if raw is None:
                yield _too_long(where, size, limit)
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield SourceRow(where, error="not UTF-8 text")
                continue
            text = text[:-1] if text.endswith("\n") else text
            text = text[:-1] if text.endswith("\r") else text
            if text.strip():
                yield SourceRow(where, text)


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


class _JsonText:
    """A UTF-8 file read as text in chunks; ``buf`` holds what is not consumed yet. ``line_at(i)`` is the
    1-based line of ``buf[i]``; ``drop(i)`` forgets ``buf[:i]``."""

    def __init__(self, fh: Any, path: Path) -> None:
        self.fh, self.path = fh, path
        self.dec = codecs.getincrementaldecoder("utf-8-sig")()
        self.buf = ""
        self.eof = False
        self._line, self._counted = 1, 0  # line number at buf[_counted]

    def more(self, size: int | None = None) -> bool:
        """Read about ``size`` (default: a chunk) more bytes; False at the end of the file."""
        if self.eof:
            return False
        data = self.fh.read(size or _CHUNK)
        try:
            self.buf += self.dec.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            line = self.line_at(len(self.buf)) + data[: exc.start].count(b"\n")
            raise InputError(f"{self.path}:{line}: not UTF-8 text") from None
        self.eof = not data
        return True

    def line_at(self, i: int) -> int:
        if i < self._counted:  # only error paths look back
            return self._line - self.buf.count("\n", i, self._counted)
        self._line += self.buf.count("\n", self._counted, i)
        self._counted = i
        return self._line

    def drop(self, i: int) -> None:
        self.line_at(i)
        self.buf = self.buf[i:]
        self._counted = 0

    def skip_ws(self, i: int) -> int:
        """The index of the next non-blank character (reading on as needed); ``len(buf)`` at the end."""
        while True:
            i = _skip_ws(self.buf, i)
            if i < len(self.buf) or not self.more():
                return i


_NUMBER_TAIL = re.compile(r"[0-9.eE+\-]*\Z")


def _maybe_cut(exc: json.JSONDecodeError, text: str) -> bool:
    """Whether a decode error may only mean that the buffer ends inside the value."""
    return exc.pos >= len(text) - 12 or exc.msg.startswith("Unterminated string")


def _iter_json(path: Path, limit: int = _DEFAULT_LINE_BYTES) -> Iterator[SourceRow]:
    with open(path, "rb") as fh:
        src = _JsonText(fh, path)
        i = src.skip_ws(0)
        if not src.buf.startswith("[", i):
            while src.more():  # a single document (an object holding the rows): it is read whole
                pass
            yield from _json_document(path, src.buf)
            return
        yield from _json_array(src, i + 1, limit)


def _json_document(path: Path, text: str) -> Iterator[SourceRow]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); fix the file") from None
    except RecursionError:
        raise InputError(f"{path}: the JSON is nested too deeply to read; fix the file") from None
    rows = next((doc[k] for k in _JSON_LIST_KEYS if isinstance(doc, dict) and isinstance(doc.get(k), list)), None)
    if rows is None:
        yield SourceRow(f"{path}:1", doc)
    else:
        for k, row in enumerate(rows):
            yield SourceRow(f"{path}[{k}]", row)


def _element_too_long(path: Path, line: int, limit: int) -> InputError:
    return InputError(
        f"{path}:{line}: this array element is over the limit of {limit:,} bytes for one row; raise "
        f"model.context_length if such rows are real prompts (a row may take {BYTES_PER_TOKEN} bytes per token "
        "of it), or convert the file to JSONL to skip such rows with --skip-bad"
    )


def _json_array(src: _JsonText, i: int, limit: int) -> Iterator[SourceRow]:
    """The elements of a JSON array (``src.buf[i]`` follows its ``[``), element by element, so each row
    keeps its line number and only the element being decoded is held."""
    path = src.path
    dec = json.JSONDecoder()
    while True:
        i = src.skip_ws(i)
        if i >= len(src.buf):
            raise InputError(f"{path}: the JSON array is not closed; fix the file")
        if src.buf[i] == "]":
            return
        if i >= _CHUNK:
            src.drop(i)
            i = 0
        line = src.line_at(i)
        while True:
            try:
                obj, end = dec.raw_decode(src.buf, i)
                # A number is whole only once something that cannot continue it follows ("1" of "1.5e3").
                cut = isinstance(obj, (int, float)) and not isinstance(obj, bool) and _NUMBER_TAIL.match(src.buf, end)
                if src.eof or (end < len(src.buf) and not cut):
                    break
            except json.JSONDecodeError as exc:
                if src.eof or not _maybe_cut(exc, src.buf):
                    raise InputError(
                        f"{path}:{src.line_at(exc.pos)}: not valid JSON ({exc.msg}); fix the file (a JSON array "
                        "cannot be skipped row by row; use JSONL for --skip-bad)"
                    ) from None
            except RecursionError:
                raise InputError(f"{path}:{line}: this array element is nested too deeply to read; fix the file") from None
            held = len(src.buf) - i
            if held > limit:
                raise _element_too_long(path, line, limit)
            # The element is cut: read on, doubling (so decoding stays linear) but not far past the limit.
            src.more(max(_CHUNK, min(held, limit + 1 - held)))
        if end - i > limit:
            raise _element_too_long(path, line, limit)
        yield SourceRow(f"{path}:{line}", obj)
        i = src.skip_ws(end)
        if i < len(src.buf) and src.buf[i] == ",":
            i += 1
        elif i < len(src.buf) and src.buf[i] != "]":
            raise InputError(f"{path}:{src.line_at(i)}: expected ',' or ']' between array elements; fix the file")


def _iter_parquet(path: Path, limit: int = _DEFAULT_LINE_BYTES) -> Iterator[SourceRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        row = 0
        for batch in pf.iter_batches(batch_size=256):
            if batch.nbytes <= limit:  # no row of it can be over the limit
                for rec in batch.to_pylist():
                    yield SourceRow(f"{path}#{row}", rec)
                    row += 1
                continue
            for k in range(batch.num_rows):  # measure each row in Arrow before it becomes Python objects
                one = batch.slice(k, 1)
                size = one.nbytes
                yield (_too_long(f"{path}#{row}", size, limit, "row") if size > limit
                       else SourceRow(f"{path}#{row}", one.to_pylist()[0]))
                row += 1
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None


def _iter_hf(ds: DatasetConfig, base_dir: Path, folder: Path | None = None) -> Iterator[SourceRow]:
    label = source_label(ds) if folder is None else f"hf:{folder}[{ds.split}]"
    try:
        import datasets as hfds
    except ModuleNotFoundError:
        raise ConfigError(
            f"datasets ({ds.name}): reading {label} needs the 'datasets' package; "
            "install it with `pip install 'draftgen[hub]'`"
        ) from None
    name = ds.hf or ""
    if folder is None:
        local = _resolve(name, base_dir)
        if local.is_dir():
            folder = local if _is_hf_disk(local) else None
            name = str(local)
    try:
        if folder is not None:
            data = hfds.load_from_disk(str(folder))
            if isinstance(data, hfds.DatasetDict):
                if ds.split not in data:
                    raise InputError(f"{label}: no split {ds.split!r}; splits: {', '.join(data)}")
                data = data[ds.split]
        else:
            data = hfds.load_dataset(name, ds.hf_subset, split=ds.split)
    except InputError:
        raise
    except Exception as exc:  # datasets raises many unrelated types (hub, fsspec, arrow): one message
        raise InputError(f"{label}: could not load the dataset ({type(exc).__name__}: {str(exc)[:200]})") from None
    for k, rec in enumerate(data):
        yield SourceRow(f"{label}#{k}", rec)
