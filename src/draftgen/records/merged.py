"""The merged data: the Parquet row's columns (listed once), the row (``MergedParquetRow``) and the views of it
that readers take (``MERGED_VIEWS``), ``merged/stats.json`` and ``merged/manifest.json``."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from draftgen.records.base import SCHEMA_VERSION
from draftgen.records.hidden import HiddenStatesReport


class MergedDatasetStats(msgspec.Struct, omit_defaults=True):
    """One dataset's share of merged/ (``dataset`` is "all" for the total)."""

    dataset: str
    records: int = 0  # response records read (distinct sample ids of the prepared set)
    orphans: int = 0  # records whose sample id is not in the current prepared set: never merged
    samples: int = 0  # rows written (weight > 1 repeats count)
    unique_samples: int = 0
    train: int = 0
    validation: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_share: float = 0.0  # reasoning_tokens / completion_tokens
    supervised_tokens: int = 0  # ones in loss_mask
    capped: int = 0  # rows truncated to max_seq_len
    truncated: int = 0  # rows whose generation hit max_tokens (the model's real tokens, kept unless drop_truncated)
    tokens_uncapped: int = 0  # prompt + completion tokens before the cap
    dropped: dict[str, int] = msgspec.field(default_factory=dict)  # reason -> samples
    rounds: dict[str, int] = msgspec.field(default_factory=dict)  # round of generation -> rows (runview.rounds)


class MergeStats(msgspec.Struct, omit_defaults=True):
    datasets: list[MergedDatasetStats]
    total: MergedDatasetStats
    notes: list[str] = msgspec.field(default_factory=list)
    hidden_states: HiddenStatesReport | None = None
    schema_version: int = SCHEMA_VERSION


MANIFEST_LAYOUT = 2


"""``MergeManifest.layout`` that merge writes. 2: file paths relative to the run directory (``merged/…`` and
``exports/…``). 1 (manifests without the field): paths relative to merged/, exports inside merged/."""


class MergedFile(msgspec.Struct):
    path: str  # relative to the run directory (layout 2; relative to merged/ in a layout-1 manifest)
    split: str  # "train" | "validation" | "all" (the dataset card, stats.json)
    kind: str  # "parquet" | "card" | "stats" | an export format (``exporters.EXPORTERS``)
    rows: int
    bytes: int
    sha256: str


class MergeManifest(msgspec.Struct, omit_defaults=True):
    """merged/manifest.json, written last: the merge output is complete iff it exists. It lists every file
    the merge wrote (merged/ and exports/), and the next merge removes exactly those before writing."""

    files: list[MergedFile]
    seed: int
    merge: dict[str, Any]  # the merge config section used
    datasets: list[str]
    profile: str
    forced: list[str] = msgspec.field(default_factory=list)  # provenance differences accepted with --force
    layout: int = 1  # how ``files[].path`` is rooted (MANIFEST_LAYOUT); absent in older manifests
    schema_version: int = SCHEMA_VERSION


class Column(NamedTuple):
    """One column. ``arrow``: its Arrow type (``list<int32>``, ``list<int8>``, ``string``, ``int32``,
    ``bool``), None for a metadata-only field. ``doc``: its line in the dataset card (``{reasoning}`` is
    filled with the run's reasoning masking). ``attr``: the ``exporters.base.MergedRow`` attribute holding its
    value; None where ``export`` computes it (the ids and the mask). ``meta``: its type in speculators'
    ``metadata`` (None: not there), with ``meta_default`` for a missing value (None becomes it) and
    ``meta_attr`` when the metadata reads another attribute than the Parquet column."""

    name: str
    arrow: str | None
    doc: str
    attr: str | None
    meta: type | None = None
    meta_default: Any = msgspec.NODEFAULT
    meta_attr: str | None = None


MERGED_COLUMNS: tuple[Column, ...] = (
    Column("input_ids", "list<int32>", "prompt then completion ids, exact", None),
    Column("loss_mask", "list<int8>", "same length as `input_ids`: 0 over the prompt{reasoning}, "
           "1 over the completion", None),
    # the Parquet column is the row id (``#repN`` on repeats), speculators' metadata the bare sample id
    Column("sample_id", "string", "`#repN` marks a repeat from a dataset weight > 1", "row_id", str,
           meta_attr="sample_id"),
    Column("dataset", "string", "the dataset of the run config", "dataset", str),
    Column("finish_reason", "string", "as the server reported it", "finish_reason", str, ""),
    Column("provider", "string", "the provider that served it", "provider", str, ""),
    Column("ids_source", "string", "`exact`, `logprobs` or `reconstructed`", "ids_source", str, "exact"),
    Column("prompt_len", "int32", "prompt tokens", "prompt_len", int, 0),
    Column("completion_len", "int32", "completion tokens (after the cap)", "completion_len", int, 0),
    Column("reasoning_len", "int32", "reasoning tokens of the completion (after the cap)", "reasoning_len",
           int, 0),
    Column("capped", "bool", "cut to `merge.max_seq_len`", "capped", bool, False),
    Column("is_tool_call", None, "the completion calls a tool", "is_tool_call", bool, False),
)


REPEAT_MARK = "#rep"  # row id = sample id + "#rep<N>" for the Nth repeat a dataset weight > 1 made


def row_id(sample_id: str, copy: int = 0) -> str:
    """The merged row's id (its ``sample_id`` column): the sample id, with ``#repN`` on the Nth repeat."""
    return sample_id if copy == 0 else f"{sample_id}{REPEAT_MARK}{copy}"


def parse_row_id(rid: str) -> tuple[str, int]:
    """(sample id, repeat number) of a merged row id: ``("x", 2)`` for ``x#rep2``, ``("x", 0)`` for ``x``."""
    base, mark, n = rid.rpartition(REPEAT_MARK)
    if mark and base and n.isdigit() and int(n) > 0:
        return base, int(n)
    return rid, 0


class MergedParquetRow(msgspec.Struct, kw_only=True):
    """One row of ``merged/<split>-NNNNN-of-MMMMM.parquet``: the columns of ``MERGED_COLUMNS`` that have an
    Arrow type, in order (a test keeps the two equal). ``sample_id`` is the row id (``parse_row_id``)."""

    input_ids: list[int]
    loss_mask: list[int]
    sample_id: str
    dataset: str
    finish_reason: str | None
    provider: str | None
    ids_source: str
    prompt_len: int
    completion_len: int
    reasoning_len: int
    capped: bool


class MergedRowId(msgspec.Struct):
    """A view of ``MergedParquetRow`` (``exporters.parquet.read_merged`` reads only its fields' columns): the
    row id (accept's held-out prompts)."""

    sample_id: str


class MergedTokens(msgspec.Struct):
    """A view of ``MergedParquetRow``: the row id, its exact ids and loss mask (extract, train --online)."""

    sample_id: str
    input_ids: list[int]
    loss_mask: list[int]


class MergedLengths(msgspec.Struct):
    """A view of ``MergedParquetRow``: the prompt and completion lengths (the report's length chart)."""

    prompt_len: int
    completion_len: int


class MergedProvider(msgspec.Struct):
    """A view of ``MergedParquetRow``: the row id, its dataset and the provider that served it (extract's provider
    fidelity)."""

    sample_id: str
    dataset: str
    provider: str | None


MERGED_VIEWS: tuple[type[msgspec.Struct], ...] = (MergedParquetRow, MergedRowId, MergedTokens, MergedLengths,
                                                  MergedProvider)
"""What ``read_merged`` yields: the whole row or a view, each field one of the row's (a test keeps them so)."""


def parquet_columns() -> tuple[Column, ...]:
    """The columns of the Parquet files, in order."""
    return tuple(c for c in MERGED_COLUMNS if c.arrow is not None)


def _meta_field(c: Column) -> tuple[str, Any] | tuple[str, Any, Any]:
    return (c.name, c.meta) if c.meta_default is msgspec.NODEFAULT else (c.name, c.meta, c.meta_default)


# Every key is always written (no omit_defaults): Arrow's JSON reader infers one schema per chunk.
SpeculatorsMetadata: type[msgspec.Struct] = msgspec.defstruct(
    "SpeculatorsMetadata", [_meta_field(c) for c in MERGED_COLUMNS if c.meta is not None], module="draftgen.records")


SpeculatorsMetadata.__doc__ = ("``metadata`` of a speculators export row: the columns of ``MERGED_COLUMNS`` "
                               "with a ``meta`` type, None written as their default.")
