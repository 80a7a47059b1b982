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
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from ..config import DatasetConfig
from ..errors import ConfigError, InputError

__all__ = ["SourceRow", "bundled_names", "iter_rows", "source_files", "source_fingerprint", "source_label"]

_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json", ".parquet", ".txt")
_JSON_LIST_KEYS = ("data", "rows", "examples", "train")


@dataclass
class SourceRow:
    where: str
    data: Any = None
    error: str | None = None


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


def iter_rows(ds: DatasetConfig, base_dir: Path) -> Iterator[SourceRow]:
    """Every row of the dataset's source, in a stable order."""
    if ds.hf is not None:
        yield from _iter_hf(ds, base_dir)
        return
    assert ds.path is not None
    if ds.path.startswith("bundled:"):
        res = _bundled(ds.path[len("bundled:"):])
        with res.open("rb") as fh:
            yield from _iter_jsonl_lines(fh, ds.path)
        return
    p = _resolve(ds.path, base_dir)
    if p.is_dir() and _is_hf_disk(p):
        yield from _iter_hf(ds, base_dir, folder=p)
        return
    for f in source_files(ds, base_dir):
        yield from _iter_file(f)


def _iter_file(path: Path) -> Iterator[SourceRow]:
    name = path.name
    try:
        if name.endswith((".jsonl", ".ndjson")):
            with open(path, "rb") as fh:
                yield from _iter_jsonl_lines(fh, str(path))
        elif name.endswith((".jsonl.gz", ".ndjson.gz")):
            with gzip.open(path, "rb") as fh:
                yield from _iter_jsonl_lines(fh, str(path))
        elif name.endswith(".json"):
            yield from _iter_json(path)
        elif name.endswith(".parquet"):
            yield from _iter_parquet(path)
        elif name.endswith(".txt"):
            yield from _iter_text(path)
        else:
            raise InputError(f"{path}: unsupported file type; use .jsonl, .json, .parquet or .txt")
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None


def _iter_jsonl_lines(fh: Any, label: str) -> Iterator[SourceRow]:
    decoder = msgspec.json.Decoder()
    for lineno, raw in enumerate(fh, 1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        where = f"{label}:{lineno}"
        try:
            yield SourceRow(where, decoder.decode(raw))
        except msgspec.DecodeError as exc:
            yield SourceRow(where, error=f"not valid JSON ({exc})")


def _iter_text(path: Path) -> Iterator[SourceRow]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
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


def _iter_json(path: Path) -> Iterator[SourceRow]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    dec = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if not text.startswith("[", i):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); fix the file") from None
        rows = next((doc[k] for k in _JSON_LIST_KEYS if isinstance(doc, dict) and isinstance(doc.get(k), list)), None)
        if rows is None:
            yield SourceRow(f"{path}:1", doc)
        else:
            for k, row in enumerate(rows):
                yield SourceRow(f"{path}[{k}]", row)
        return
    # A JSON array, element by element, so each row keeps its line number.
    i += 1
    line, counted = 1, 0
    while True:
        i = _skip_ws(text, i)
        if i >= len(text):
            raise InputError(f"{path}: the JSON array is not closed; fix the file")
        if text[i] == "]":
            return
        line += text.count("\n", counted, i)
        counted = i
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); fix the file (a JSON array cannot be skipped "
                "row by row; use JSONL for --skip-bad)"
            ) from None
        yield SourceRow(f"{path}:{line}", obj)
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
        elif i < len(text) and text[i] != "]":
            line += text.count("\n", counted, i)
            raise InputError(f"{path}:{line}: expected ',' or ']' between array elements; fix the file")


def _iter_parquet(path: Path) -> Iterator[SourceRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        row = 0
        for batch in pf.iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                yield SourceRow(f"{path}#{row}", rec)
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
