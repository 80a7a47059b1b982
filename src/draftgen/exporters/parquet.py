"""Writers of the merge output: Parquet shards + dataset card in merged/, peer formats in exports/.

Reads the selected, shuffled rows that ``merge`` hands over (``MergedRow``: where each sample's ids sit in
one Arrow list array, its lengths and metadata, and the byte offsets of its raw response and prepared
prompt lines) and writes, per split (``train``, ``validation``), at the paths ``rundir.RunDir`` spells:

- ``merged/<split>-NNNNN-of-MMMMM.parquet``: the columns of ``records.merged.MERGED_COLUMNS`` (``input_ids``
  list<int32>, ``loss_mask`` list<int8>: 0 over the prompt, 1 over the completion, 0 over the reasoning too
  with ``mask_reasoning``; then the row's id, lengths and metadata). The schema, the arrays and the card's
  column list are built from that table. zstd, row groups of at most 2,048 rows, shards of at most 256M tokens.
- ``merged/README.md`` (``write_card``): the Hugging Face dataset card; its YAML ``configs`` list the shards
  of each split, so ``datasets.load_dataset("<run>/merged")`` and ``datasets.load_dataset("parquet",
  data_dir="<run>/merged")`` both load every row and nothing else (merged/ holds no other data file).
- one folder per export format in ``merge.exports`` (``EXPORTERS``: a format is a row builder plus one
  registration line), ``exports/<format>/train.jsonl`` and
  ``exports/validation/<format>/validation.jsonl``:

  ``speculators``  ``records.SpeculatorsRow`` ``{id, primary_id, input_ids, loss_mask, text, metadata}``, as
                   vllm-project/speculators' ``regenerate-responses`` writes it; ``text`` = the exact decode of
                   ``input_ids`` (special tokens kept). ``speculators prepare-data --data exports/speculators/``
                   reads the folder (every ``*.json``/``*.jsonl`` in it, hence one folder per split) and keeps
                   ``input_ids`` and ``loss_mask`` as they are: exact ids.
  ``specforge``    ``records.SpecForgePromptRow`` ``{id, input_ids, loss_mask}``: the pre-tokenized JSONL that
                   sgl-project/SpecForge's ``data.prompts_path`` takes (``specforge/data/prompt_builder.py``):
                   exact ids. SpecForge cuts rows to ``data.max_length`` (default 2048): set it to at least
                   ``merge.max_seq_len``.
  ``specforge-conversations``
                   ``records.SpecForgeConversationRow`` ``{id, conversations, tools, status}`` for SpecForge's
                   ``data.train_data_path``: the prepared prompt's messages plus the regenerated assistant turn
                   (a sample cut by ``max_seq_len`` carries the text of its kept ids only). SpecForge renders it
                   with its own chat template and **re-tokenizes** it, so its ids are not draftgen's exact ids;
                   use ``specforge`` unless a conversation form is needed. Rows with an empty assistant
                   ``content`` (SpecForge's validator rejects them) are left out, with a note.

  The pre-tokenized formats leave out rows without a supervised token (both consumers drop them), with a
  note; every other row is the Parquet row, ids and mask identical, in the same order.

Rows are streamed in chunks (Arrow ``take`` on the shared id array), so memory stays bounded by a chunk.
Every file is written under a temp name and renamed; the caller writes ``merged/manifest.json`` last.

The one reader of the shards, for every phase that reads merged rows: ``merged_shards`` (the shards a
``MergeManifest`` lists, where ``RunDir.merged_listed`` says they lie) and ``read_merged(paths, view)``: the
rows as ``records.MergedParquetRow`` or one of its views (``records.MERGED_VIEWS``), reading only the view's
columns, ``CHUNK_ROWS`` rows at a time."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from draftgen.errors import InputError, StorageError
from draftgen.exporters.base import (
    EXPORTERS,
    ExportContext,
    Exporter,
    MergedRow,
    RowReaders,
    RowSource,
    check_exports,
    loss_mask_bytes,
)
from draftgen.records import (
    MERGED_VIEWS,
    MergedFile,
    MergeManifest,
    parquet_columns,
)
from draftgen.rundir import RunDir
from draftgen.store import JsonlWriter, publish
from draftgen.tokens import Profile

CHUNK_ROWS = 2048

PARQUET = "parquet"  # MergedFile.kind of a shard

V = TypeVar("V", bound=msgspec.Struct)


CHUNK_TOKENS = 16 << 20


SHARD_TOKENS = 256 << 20


def _chunks(rows: Sequence[MergedRow]) -> Iterator[Sequence[MergedRow]]:
    start, tokens = 0, 0
    for i, row in enumerate(rows):
        tokens += row.total_len
        if i + 1 - start >= CHUNK_ROWS or tokens >= CHUNK_TOKENS:
            yield rows[start:i + 1]
            start, tokens = i + 1, 0
    if start < len(rows) or not rows:
        yield rows[start:]


def _shards(rows: Sequence[MergedRow]) -> list[Sequence[MergedRow]]:
    out: list[Sequence[MergedRow]] = []
    start, tokens = 0, 0
    for i, row in enumerate(rows):
        if tokens and tokens + row.total_len > SHARD_TOKENS:
            out.append(rows[start:i])
            start, tokens = i, 0
        tokens += row.total_len
    out.append(rows[start:])
    return out


def _arrow_type(name: str) -> Any:
    import pyarrow as pa

    if name.startswith("list<"):
        return pa.list_(_arrow_type(name[5:-1]))
    return {"string": pa.string(), "int32": pa.int32(), "int8": pa.int8(), "bool": pa.bool_()}[name]


def parquet_schema() -> Any:
    """The Arrow schema of the merged Parquet files, from ``records.merged.MERGED_COLUMNS``."""
    import pyarrow as pa

    return pa.schema([(c.name, _arrow_type(c.arrow)) for c in parquet_columns() if c.arrow is not None])


def _table(chunk: Sequence[MergedRow], ids: Any, mask_reasoning: bool) -> Any:
    import pyarrow as pa

    schema = parquet_schema()
    offsets = [0]
    mask = bytearray()
    for r in chunk:
        mask += loss_mask_bytes(r, mask_reasoning)
        offsets.append(len(mask))
    values = pa.Array.from_buffers(pa.int8(), len(mask), [None, pa.py_buffer(bytes(mask))])
    computed = {  # the columns without a MergedRow attribute
        "input_ids": ids.take(pa.array([r.buf_index for r in chunk], pa.int64())).cast(schema.field("input_ids").type),
        "loss_mask": pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values),
    }
    cols = [computed[c.name] if c.attr is None else pa.array(list(map(attrgetter(c.attr), chunk)), schema.field(c.name).type)
            for c in parquet_columns()]
    return pa.Table.from_arrays(cols, schema=schema)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def file_entry(rd: RunDir, path: Path, split: str, kind: str, rows: int) -> MergedFile:
    """The manifest entry of a written file (path relative to the run directory, size, sha256)."""
    return MergedFile(path=path.relative_to(rd.root).as_posix(), split=split, kind=kind, rows=rows,
                      bytes=path.stat().st_size, sha256=file_digest(path))


@dataclass
class _Out:
    """One open export file of a split."""

    kind: str  # the format's merge.exports name
    exporter: Exporter
    tmp: Path
    final: Path
    writer: JsonlWriter
    rows: int = 0
    left_out: Counter[str] = field(default_factory=Counter)


_NO_SUPERVISED = "no supervised token in loss_mask, which the consumer drops"


def write_split(
    rows: Sequence[MergedRow],
    split: str,
    rd: RunDir,
    ids: Any,
    *,
    profile: Profile,
    sources: dict[str, RowSource],
    exports: Sequence[str],
    mask_reasoning: bool,
    note: Callable[[str], None],
) -> list[MergedFile]:
    """Write one split's Parquet shards (merged/) and exports (exports/); returns the files written."""
    import pyarrow.parquet as pq

    check_exports(exports)
    files: list[MergedFile] = []
    shards = _shards(rows)
    outs: list[_Out] = []
    tmp_paths: list[Path] = []
    readers = RowReaders(sources)
    ctx = ExportContext(profile=profile, readers=readers)
    try:
        for kind in exports:
            final = rd.export_file(kind, split)
            tmp = final.with_name(f".{final.name}.tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            tmp_paths.append(tmp)
            outs.append(_Out(kind, EXPORTERS.get(kind), tmp, final, JsonlWriter(tmp, fsync=False)))
        for s, shard in enumerate(shards):
            final = rd.merged_shard(split, s, len(shards))
            tmp = final.with_name(f".{final.name}.tmp")
            tmp_paths.append(tmp)
            with pq.ParquetWriter(tmp, parquet_schema(), compression="zstd") as pw:
                for chunk in _chunks(shard):
                    table = _table(chunk, ids, mask_reasoning)
                    pw.write_table(table, row_group_size=max(len(chunk), 1))
                    if outs:
                        _export_chunk(ctx, outs, chunk, table.column("input_ids").to_pylist(), mask_reasoning)
            publish(tmp, final)
            files.append(file_entry(rd, final, split, PARQUET, len(shard)))
        for out in outs:
            out.writer.close()
            publish(out.tmp, out.final)
            files.append(file_entry(rd, out.final, split, out.kind, out.rows))
    except OSError as exc:  # pyarrow's IO errors are OSErrors too (disk full while writing Parquet)
        raise StorageError(f"{rd.root}: write failed ({exc.strerror or exc}); free space and rerun merge") from None
    finally:
        readers.close()
        for out in outs:
            out.writer.close()
        for tmp in tmp_paths:
            tmp.unlink(missing_ok=True)
    for out in outs:
        for reason, n in sorted(out.left_out.items()):
            note(f"{out.final.relative_to(rd.root).as_posix()}: {n:,} rows left out ({reason})")
    return files


def _export_chunk(ctx: ExportContext, outs: list[_Out], chunk: Sequence[MergedRow], id_lists: list[list[int]],
                  mask_reasoning: bool) -> None:
    batches: list[list[msgspec.Struct]] = [[] for _ in outs]
    for row, row_ids in zip(chunk, id_lists, strict=True):
        mask = list(loss_mask_bytes(row, mask_reasoning))
        supervised = 1 in mask
        for out, batch in zip(outs, batches, strict=True):
            if out.exporter.pretokenized and not supervised:
                out.left_out[_NO_SUPERVISED] += 1
                continue
            rec = out.exporter.build(ctx, row, row_ids, mask)
            if isinstance(rec, str):
                out.left_out[rec] += 1
            else:
                batch.append(rec)
    for out, batch in zip(outs, batches, strict=True):
        out.writer.write_many(batch)
        out.rows += len(batch)


def merged_shards(rd: RunDir, manifest: MergeManifest, split: str | None = None) -> list[Path]:
    """The Parquet shards ``manifest`` lists, of ``split`` (every split when None), in path order, where they
    lie (``RunDir.merged_listed``: the manifest's layout rule)."""
    return [rd.merged_listed(manifest, f.path) for f in sorted(manifest.files, key=attrgetter("path"))
            if f.kind == PARQUET and (split is None or f.split == split)]


def read_merged(paths: Iterable[Path], view: type[V]) -> Iterator[V]:
    """The rows of the merged shards ``paths``, in file then row order, as ``view``: ``MergedParquetRow`` or
    one of its views (``records.MERGED_VIEWS``), reading only the view's columns, ``CHUNK_ROWS`` rows at a
    time. A shard that cannot be read (missing, not Parquet, without one of those columns) is an InputError
    naming it."""
    import pyarrow as pa

    if view not in MERGED_VIEWS:
        raise TypeError(f"read_merged: {view.__name__} is not a view of the merged row (records.MERGED_VIEWS)")
    names = list(view.__struct_fields__)
    for path in paths:
        batches = _batches(path, names)
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException) as exc:
                raise InputError(f"{path}: cannot read its {', '.join(names)} column(s) ({exc}); run "
                                 "`draftgen merge` again") from None
            if batch is None:
                break
            columns = [batch.column(n).to_pylist() for n in names]
            for values in zip(*columns, strict=True):
                yield view(**dict(zip(names, values, strict=True)))


def _batches(path: Path, names: list[str]) -> Iterator[Any]:
    import pyarrow.parquet as pq

    shard = pq.ParquetFile(path)
    missing = [n for n in names if n not in shard.schema_arrow.names]  # iter_batches would leave them out
    if missing:
        raise InputError(f"{path}: no {', '.join(missing)} column(s), not a merged shard of this draftgen; run "
                         "`draftgen merge` again")
    yield from shard.iter_batches(batch_size=CHUNK_ROWS, columns=names)
