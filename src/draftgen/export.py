"""Writers of the merge output: Parquet shards + dataset card in merged/, peer formats in exports/.

Reads the selected, shuffled rows that ``merge`` hands over (``MergedRow``: where each sample's ids sit in
one Arrow list array, its lengths and metadata, and the byte offsets of its raw response and prepared
prompt lines) and writes, per split (``train``, ``validation``), at the paths ``rundir.RunDir`` spells:

- ``merged/<split>-NNNNN-of-MMMMM.parquet``: the columns of ``columns.MERGED_COLUMNS`` (``input_ids``
  list<int32>, ``loss_mask`` list<int8>: 0 over the prompt, 1 over the completion, 0 over the reasoning too
  with ``mask_reasoning``; then the row's id, lengths and metadata). The schema, the arrays and the card's
  column list are built from that table. zstd, row groups of at most 2,048 rows, shards of at most 256M tokens.
- ``merged/README.md`` (``write_card``): the Hugging Face dataset card; its YAML ``configs`` list the shards
  of each split, so ``datasets.load_dataset("<run>/merged")`` and ``datasets.load_dataset("parquet",
  data_dir="<run>/merged")`` both load every row and nothing else (merged/ holds no other data file).
- one folder per export format in ``merge.exports`` (``EXPORTERS``, filled by ``@register_exporter``: a
  format is a row builder plus that one line), ``exports/<format>/train.jsonl`` and
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
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from .columns import MERGED_COLUMNS, SpeculatorsMetadata, parquet_columns
from .errors import ConfigError, StorageError
from .records import (
    MergedFile,
    PromptRecord,
    ResponseRecord,
    SpecForgeConversationRow,
    SpecForgeMessage,
    SpecForgePromptRow,
    SpeculatorsRow,
    Tool,
    ToolCall,
)
from .rundir import RunDir
from .store import JsonlReader, JsonlWriter, atomic_write_bytes, publish
from .tokens import Profile

__all__ = [
    "CHUNK_ROWS",
    "EXPORTERS",
    "SHARD_TOKENS",
    "Builder",
    "ExportContext",
    "Exporter",
    "MergedRow",
    "RowSource",
    "check_exports",
    "export_usage",
    "exporter",
    "file_digest",
    "file_entry",
    "loss_mask_bytes",
    "parquet_schema",
    "register_exporter",
    "speculators_metadata",
    "write_card",
    "write_split",
]

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


def _arrow_type(name: str) -> Any:
    import pyarrow as pa

    if name.startswith("list<"):
        return pa.list_(_arrow_type(name[5:-1]))
    return {"string": pa.string(), "int32": pa.int32(), "int8": pa.int8(), "bool": pa.bool_()}[name]


def parquet_schema() -> Any:
    """The Arrow schema of the merged Parquet files, from ``columns.MERGED_COLUMNS``."""
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


# -- the export formats ----------------------------------------------------------------------------------


@dataclass
class ExportContext:
    """What a row builder may use besides the row: the target's profile, and the row's response and prompt
    records read back from disk by byte offset (only when asked: most formats need the ids alone)."""

    profile: Profile
    readers: _Readers

    def response(self, row: MergedRow) -> ResponseRecord:
        return self.readers.response(row)

    def prompt(self, row: MergedRow) -> PromptRecord | None:
        return self.readers.prompt(row)


# A builder turns one merged row (its ids and loss mask as lists) into the format's record, or returns the
# reason it is left out of that format.
Builder = Callable[[ExportContext, MergedRow, list[int], list[int]], "msgspec.Struct | str"]


@dataclass(frozen=True)
class Exporter:
    """One peer format: its ``merge.exports`` name (also its folder under exports/) and row builder."""

    name: str
    build: Builder
    pretokenized: bool  # rows carry input_ids + loss_mask: rows without a supervised token are left out
    usage: str  # how the consumer reads it; {dir} and {file} are the train split's folder and file
    doc: str = ""  # one line for docs/config.md (``merge.exports``)


EXPORTERS: dict[str, Exporter] = {}
"""The export formats by ``merge.exports`` name, in registration order: the one list of them (config
validation, docs/config.md, merge and the dataset card read it). A format is a builder + ``@register_exporter``."""


def exporter(name: str) -> Exporter:
    """The registered format ``name``; a ConfigError naming ``merge.exports`` and the registered formats."""
    try:
        return EXPORTERS[name]
    except KeyError:
        raise ConfigError(f"merge.exports {name!r} is not registered; use one of {', '.join(EXPORTERS)} "
                          "(see docs/config.md)") from None


def register_exporter(name: str, *, pretokenized: bool, usage: str, doc: str = "") -> Callable[[Builder], Builder]:
    """Register the decorated builder as export format ``name`` (written to ``exports/<name>/<split>.jsonl``).

    ``pretokenized``: its rows carry ``input_ids`` + ``loss_mask``, so rows without a supervised token are
    left out. ``usage``: how its consumer reads it (``{dir}``/``{file}``: the train split's folder and file).
    ``EXPORTERS.pop(name)`` removes it again."""
    def deco(build: Builder) -> Builder:
        if name in EXPORTERS:
            raise ValueError(f"export format {name!r} is registered twice")
        EXPORTERS[name] = Exporter(name, build, pretokenized, usage, doc)
        return build

    return deco


def speculators_metadata(row: MergedRow) -> msgspec.Struct:
    """``SpeculatorsMetadata`` of a row: each of its columns read from the row, None as the column's default."""
    values: dict[str, Any] = {}
    for c in _META_COLUMNS:
        v = getattr(row, c.meta_attr or c.attr or c.name)
        values[c.name] = c.meta_default if v is None else v
    return SpeculatorsMetadata(**values)


_META_COLUMNS = tuple(c for c in MERGED_COLUMNS if c.meta is not None)


@register_exporter("speculators", pretokenized=True, usage="speculators prepare-data --data {dir}/",
                   doc="pre-tokenized rows for ``speculators prepare-data --data exports/speculators/``")
def _speculators(ctx: ExportContext, row: MergedRow, ids: list[int], mask: list[int]) -> msgspec.Struct | str:
    return SpeculatorsRow(id=row.row_id, primary_id=row.sample_id, input_ids=ids, loss_mask=mask,
                          text=ctx.profile.tokenizer.decode(ids), metadata=speculators_metadata(row))


@register_exporter("specforge", pretokenized=True, usage="SpecForge data.prompts_path: {file}",
                   doc="pre-tokenized ``{input_ids, loss_mask}`` JSONL for SpecForge ``data.prompts_path``: the "
                       "exact ids; set its ``data.max_length`` >= ``merge.max_seq_len``")
def _specforge(ctx: ExportContext, row: MergedRow, ids: list[int], mask: list[int]) -> msgspec.Struct | str:
    return SpecForgePromptRow(id=row.row_id, input_ids=ids, loss_mask=mask)


def _json_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _tool_calls_text(calls: list[ToolCall] | None) -> str:
    """OpenAI tool calls, every key written (the records omit defaults such as ``type``)."""
    return _json_text([{"id": c.id, "type": c.type,
                        "function": {"name": c.function.name if c.function else "",
                                     "arguments": c.function.arguments if c.function else ""}}
                       for c in calls or []])


def _tools_text(tools: list[Tool] | None) -> str:
    """OpenAI tool definitions as the chat template sees them (``type`` written; absent fields left out)."""
    out = []
    for t in tools or []:
        entry: dict[str, Any] = {"type": t.type}
        if t.function is not None:
            entry["function"] = msgspec.to_builtins(t.function)
        out.append(entry)
    return _json_text(out)


def _message(role: str, content: str | None, reasoning: str | None, tool_calls: list[ToolCall] | None,
             tool_call_id: str | None) -> SpecForgeMessage:
    return SpecForgeMessage(role=role, content=content or "", reasoning_content=reasoning or "",
                            tool_calls=_tool_calls_text(tool_calls), tool_call_id=tool_call_id or "")


@register_exporter("specforge-conversations", pretokenized=False,
                   usage="SpecForge data.train_data_path: {file} (re-tokenized by SpecForge: not the exact ids)",
                   doc="conversation rows for SpecForge ``data.train_data_path``; SpecForge re-renders and "
                       "re-tokenizes them, so their ids are not exact")
def _specforge_conversation(ctx: ExportContext, row: MergedRow, ids: list[int],
                            mask: list[int]) -> msgspec.Struct | str:
    prompt = ctx.prompt(row)
    if prompt is None:
        return "no prepared prompt to take the messages from"
    rec = ctx.response(row)
    reasoning, content = rec.reasoning, rec.content
    if row.capped or (content is None and reasoning is None):
        parsed = ctx.profile.parse_output(ids[row.prompt_len:])
        reasoning, content = parsed.reasoning, parsed.content
    conv = [_message(m.role, m.content, m.reasoning_content, m.tool_calls, m.tool_call_id) for m in prompt.messages]
    conv.append(_message("assistant", content, reasoning, None if row.capped else rec.tool_calls, None))
    if any(m.role == "assistant" and not m.content.strip() for m in conv):
        return "an assistant turn with empty content, which SpecForge rejects"
    return SpecForgeConversationRow(id=row.row_id, conversations=conv, tools=_tools_text(prompt.tools))


def check_exports(names: Sequence[str]) -> None:
    """Every name is a registered format (``exporter``); merge calls this before it removes anything."""
    for name in names:
        exporter(name)


@dataclass
class _Out:
    """One open export file of a split."""

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
    readers = _Readers(sources)
    ctx = ExportContext(profile=profile, readers=readers)
    try:
        for kind in exports:
            final = rd.export_file(kind, split)
            tmp = final.with_name(f".{final.name}.tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            tmp_paths.append(tmp)
            outs.append(_Out(exporter(kind), tmp, final, JsonlWriter(tmp, fsync=False)))
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
            files.append(file_entry(rd, final, split, "parquet", len(shard)))
        for out in outs:
            out.writer.close()
            publish(out.tmp, out.final)
            files.append(file_entry(rd, out.final, split, out.exporter.name, out.rows))
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


def export_usage(rd: RunDir, kind: str) -> str:
    """How the consumer of an export format reads the train split, with this run's paths."""
    return exporter(kind).usage.format(dir=rd.export_dir(kind).relative_to(rd.root).as_posix(),
                                        file=rd.export_file(kind, "train").relative_to(rd.root).as_posix())


# -- the dataset card ------------------------------------------------------------------------------------


def write_card(rd: RunDir, files: Sequence[MergedFile], *, model: str, profile: str, tokenizer_sha256: str,
               seed: int, mask_reasoning: bool) -> MergedFile:
    """Write merged/README.md, the Hugging Face dataset card: YAML front matter whose ``configs`` name
    each split's shards (so the folder loads with ``datasets.load_dataset``), then what the columns mean."""
    import yaml

    shards: dict[str, list[str]] = {}
    rows: Counter[str] = Counter()
    for f in files:
        if f.kind == "parquet":
            shards.setdefault(f.split, []).append(Path(f.path).name)
            rows[f.split] += f.rows
    front = {"configs": [{"config_name": "default", "default": True,
                          "data_files": [{"split": s, "path": names} for s, names in shards.items()]}]}
    exports = sorted({f.kind for f in files if f.kind in EXPORTERS})
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip("\n"),
        "---",
        "",
        "# draftgen training data",
        "",
        f"Drafter (EAGLE-3) training rows: prompts and `{model}`'s regenerated responses as exact token ids "
        f"(profile `{profile}`, tokenizer sha256 `{tokenizer_sha256}`), written by `draftgen merge` "
        f"(seed {seed}).",
        "",
        "| split | rows | shards |",
        "|---|---|---|",
        *(f"| {s} | {rows[s]:,} | {len(names)} |" for s, names in shards.items()),
        "",
        "Columns:",
        "",
        *(f"- `{c.name}` ({c.arrow}): " + c.doc.format(reasoning=" and the reasoning" if mask_reasoning else "")
          for c in parquet_columns()),
        "",
        "Load: `datasets.load_dataset(\"path/to/merged\")` or "
        "`datasets.load_dataset(\"parquet\", data_dir=\"path/to/merged\")`.",
        "",
        "`manifest.json` lists every file of this merge with its size and sha256; `stats.json` has the "
        "per-dataset counts and what was left out, and why.",
    ]
    if exports:
        lines += ["", "The same rows in peer trainers' formats (paths relative to the run directory):", ""]
        lines += [f"- `{k}`: {export_usage(rd, k)}" for k in exports]
    atomic_write_bytes(rd.dataset_card, ("\n".join(lines) + "\n").encode())
    return file_entry(rd, rd.dataset_card, "all", "card", sum(rows.values()))
