"""Writers of merged/: Parquet shards for training and the peer toolchains' JSONL formats.

Reads the selected, shuffled rows that ``merge`` hands over (``MergedRow``: where each sample's ids sit in
one Arrow list array, its lengths and metadata, and the byte offsets of its raw response and prepared
prompt lines) and writes, per split (``train``, ``validation``):

- ``<split>-NNNNN-of-MMMMM.parquet``: ``input_ids`` list<int32>, ``loss_mask`` list<int8> (0 over the prompt,
  1 over the completion; 0 over the reasoning too with ``mask_reasoning``), ``sample_id``, ``dataset``,
  ``finish_reason``, ``provider``, ``ids_source``, ``prompt_len``, ``completion_len``, ``reasoning_len``,
  ``capped``. zstd, row groups of at most 2,048 rows, shards of at most 256M tokens; loads with
  ``datasets.load_dataset("parquet", data_files=...)``.
- ``speculators/<split>.jsonl``: ``records.SpeculatorsRow`` ``{id, input_ids, loss_mask, text, metadata}`` with
  ``text`` = the exact decode of ``input_ids`` (special tokens kept), as vllm-project/speculators writes it.
- ``specforge/<split>.jsonl``: ``records.SpecForgeRow`` ``{id, conversations: [{role, content,
  reasoning_content}]}``: the prepared prompt's messages plus the regenerated assistant turn. A sample cut
  by ``max_seq_len`` carries the text of its kept ids only.

Rows are streamed in chunks (Arrow ``take`` on the shared id array), so memory stays bounded by a chunk.
Every file is written under a temp name and renamed; the caller writes ``manifest.json`` last.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StorageError
from .records import (
    MergedFile,
    PromptRecord,
    ResponseRecord,
    SpecForgeMessage,
    SpecForgeRow,
    SpeculatorsMetadata,
    SpeculatorsRow,
)
from .store import JsonlReader, JsonlWriter, publish
from .tokens import Profile

__all__ = ["CHUNK_ROWS", "SHARD_TOKENS", "MergedRow", "RowSource", "file_digest", "loss_mask_bytes", "write_split"]

CHUNK_ROWS = 2048
CHUNK_TOKENS = 16 << 20
SHARD_TOKENS = 256 << 20


@dataclass(slots=True)
class MergedRow:
    dataset: str
    sample_id: str
    buf_index: int  # row of the shared Arrow list array holding prompt + (capped) completion ids
    prompt_len: int
    completion_len: int  # after the cap
    reasoning_len: int  # after the cap
    uncapped_len: int  # prompt + completion before the cap
    capped: bool
    finish_reason: str | None
    provider: str | None
    ids_source: str
    is_tool_call: bool
    raw_offset: int  # byte offset of the response line in raw_responses.jsonl
    prompt_offset: int  # byte offset in prepared prompts.jsonl; -1 when there is none
    key: str  # dedupe key
    copy: int = 0  # > 0 for repeats made by weight > 1

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.completion_len

    @property
    def row_id(self) -> str:
        return self.sample_id if self.copy == 0 else f"{self.sample_id}#rep{self.copy}"


@dataclass
class RowSource:
    """Where a dataset's lines are, for the exports that need text."""

    raw_path: Path
    prompts_path: Path | None


def loss_mask_bytes(row: MergedRow, mask_reasoning: bool) -> bytes:
    r = row.reasoning_len
    return (b"\x00" * row.prompt_len + (b"\x00" if mask_reasoning else b"\x01") * r
            + b"\x01" * (row.completion_len - r))


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


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("sample_id", pa.string()),
        ("dataset", pa.string()),
        ("finish_reason", pa.string()),
        ("provider", pa.string()),
        ("ids_source", pa.string()),
        ("prompt_len", pa.int32()),
        ("completion_len", pa.int32()),
        ("reasoning_len", pa.int32()),
        ("capped", pa.bool_()),
    ])


def _table(chunk: Sequence[MergedRow], ids: Any, mask_reasoning: bool) -> Any:
    import pyarrow as pa

    input_ids = ids.take(pa.array([r.buf_index for r in chunk], pa.int64())).cast(pa.list_(pa.int32()))
    offsets = [0]
    mask = bytearray()
    for r in chunk:
        mask += loss_mask_bytes(r, mask_reasoning)
        offsets.append(len(mask))
    values = pa.Array.from_buffers(pa.int8(), len(mask), [None, pa.py_buffer(bytes(mask))])
    loss_mask = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    cols = [
        input_ids,
        loss_mask,
        pa.array([r.row_id for r in chunk], pa.string()),
        pa.array([r.dataset for r in chunk], pa.string()),
        pa.array([r.finish_reason for r in chunk], pa.string()),
        pa.array([r.provider for r in chunk], pa.string()),
        pa.array([r.ids_source for r in chunk], pa.string()),
        pa.array([r.prompt_len for r in chunk], pa.int32()),
        pa.array([r.completion_len for r in chunk], pa.int32()),
        pa.array([r.reasoning_len for r in chunk], pa.int32()),
        pa.array([r.capped for r in chunk], pa.bool_()),
    ]
    return pa.Table.from_arrays(cols, schema=_schema())


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _finish(tmp: Path, final: Path, merged_dir: Path, split: str, kind: str, rows: int) -> MergedFile:
    publish(tmp, final)
    return MergedFile(path=str(final.relative_to(merged_dir)), split=split, kind=kind, rows=rows,
                      bytes=final.stat().st_size, sha256=file_digest(final))


class _Readers:
    """One open reader per file, opened on first use."""

    def __init__(self, sources: dict[str, RowSource]) -> None:
        self.sources = sources
        self._open: dict[Path, JsonlReader] = {}

    def get(self, path: Path, type: type[Any]) -> JsonlReader:
        r = self._open.get(path)
        if r is None:
            r = self._open[path] = JsonlReader(path, type)
        return r

    def response(self, row: MergedRow) -> ResponseRecord:
        rec: ResponseRecord = self.get(self.sources[row.dataset].raw_path, ResponseRecord).at(row.raw_offset)
        return rec

    def prompt(self, row: MergedRow) -> PromptRecord | None:
        path = self.sources[row.dataset].prompts_path
        if path is None or row.prompt_offset < 0:
            return None
        rec: PromptRecord = self.get(path, PromptRecord).at(row.prompt_offset)
        return rec

    def close(self) -> None:
        for r in self._open.values():
            r.close()


def _specforge_row(row: MergedRow, readers: _Readers, profile: Profile, ids: list[int]) -> SpecForgeRow | None:
    prompt = readers.prompt(row)
    if prompt is None:
        return None
    rec = readers.response(row)
    reasoning, content = rec.reasoning, rec.content
    if row.capped or (content is None and reasoning is None):
        parsed = profile.parse_output(ids[row.prompt_len:])
        reasoning, content = parsed.reasoning, parsed.content
    conv = [
        SpecForgeMessage(role=m.role, content=m.content, reasoning_content=m.reasoning_content,
                         tool_calls=m.tool_calls, tool_call_id=m.tool_call_id)
        for m in prompt.messages
    ]
    conv.append(SpecForgeMessage(role="assistant", content=content or "", reasoning_content=reasoning or None,
                                 tool_calls=None if row.capped else rec.tool_calls))
    return SpecForgeRow(id=row.row_id, conversations=conv)


def write_split(
    rows: Sequence[MergedRow],
    split: str,
    merged_dir: Path,
    ids: Any,
    *,
    profile: Profile,
    sources: dict[str, RowSource],
    exports: Sequence[str],
    mask_reasoning: bool,
    note: Callable[[str], None],
) -> list[MergedFile]:
    """Write one split's Parquet shards and exports; returns the files written."""
    import pyarrow.parquet as pq

    files: list[MergedFile] = []
    shards = _shards(rows)
    writers: dict[str, JsonlWriter] = {}
    tmp_paths: dict[str, tuple[Path, Path]] = {}
    for kind in exports:
        final = merged_dir / kind / f"{split}.jsonl"
        tmp = final.with_name(f".{final.name}.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        tmp_paths[kind] = (tmp, final)
        writers[kind] = JsonlWriter(tmp, fsync=False)
    readers = _Readers(sources)
    counts = dict.fromkeys(exports, 0)
    no_prompt = 0
    try:
        for s, shard in enumerate(shards):
            final = merged_dir / f"{split}-{s:05d}-of-{len(shards):05d}.parquet"
            tmp = final.with_name(f".{final.name}.tmp")
            tmp_paths[f"parquet:{s}"] = (tmp, final)
            with pq.ParquetWriter(tmp, _schema(), compression="zstd") as pw:
                for chunk in _chunks(shard):
                    table = _table(chunk, ids, mask_reasoning)
                    pw.write_table(table, row_group_size=max(len(chunk), 1))
                    if not writers:
                        continue
                    id_lists: list[list[int]] = table.column("input_ids").to_pylist()
                    if "speculators" in writers:
                        out_s = []
                        texts = [profile.tokenizer.decode(ids) for ids in id_lists]
                        for r, row_ids, text in zip(chunk, id_lists, texts, strict=True):
                            meta = SpeculatorsMetadata(
                                sample_id=r.sample_id, dataset=r.dataset, finish_reason=r.finish_reason,
                                provider=r.provider, ids_source=r.ids_source, prompt_len=r.prompt_len,
                                completion_len=r.completion_len, reasoning_len=r.reasoning_len,
                                capped=r.capped, is_tool_call=r.is_tool_call,
                            )
                            mask = list(loss_mask_bytes(r, mask_reasoning))
                            out_s.append(SpeculatorsRow(id=r.row_id, input_ids=row_ids, loss_mask=mask,
                                                        text=text, metadata=meta))
                        writers["speculators"].write_many(out_s)
                        counts["speculators"] += len(out_s)
                    if "specforge" in writers:
                        out_f = []
                        for r, row_ids in zip(chunk, id_lists, strict=True):
                            conv = _specforge_row(r, readers, profile, row_ids)
                            if conv is None:
                                no_prompt += 1
                            else:
                                out_f.append(conv)
                        writers["specforge"].write_many(out_f)
                        counts["specforge"] += len(out_f)
            files.append(_finish(tmp, final, merged_dir, split, "parquet", len(shard)))
        for kind, w in writers.items():
            w.close()
            tmp, final = tmp_paths[kind]
            files.append(_finish(tmp, final, merged_dir, split, kind, counts[kind]))
    except OSError as exc:  # pyarrow's IO errors are OSErrors too (disk full while writing Parquet)
        raise StorageError(f"{merged_dir}: write failed ({exc.strerror or exc}); free space and rerun merge") from None
    finally:
        readers.close()
        for w in writers.values():
            w.close()
        for tmp, _ in tmp_paths.values():
            tmp.unlink(missing_ok=True)
    if no_prompt:
        note(f"specforge/{split}.jsonl: {no_prompt} samples left out (no prepared prompt to take the messages from)")
    return files
