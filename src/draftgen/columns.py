"""The columns of the merged Parquet row, listed once.

``MERGED_COLUMNS`` is the one list of the columns of ``merged/<split>-NNNNN-of-MMMMM.parquet``, in order.
``export`` builds from it the Arrow schema, the arrays of each chunk and the dataset card's column list;
``SpeculatorsMetadata`` (the ``metadata`` of a speculators export row, ``records.SpeculatorsRow``) is
generated here from the columns that carry a ``meta`` type. Adding a column is one ``Column`` line (plus
the ``export.MergedRow`` attribute it reads, which tests/test_export.py checks exists).

Reads and writes nothing; imports only msgspec (``records`` imports it, so it sits below every module).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

__all__ = ["MERGED_COLUMNS", "Column", "SpeculatorsMetadata", "parquet_columns"]


class Column(NamedTuple):
    """One column. ``arrow``: its Arrow type (``list<int32>``, ``list<int8>``, ``string``, ``int32``,
    ``bool``), None for a metadata-only field. ``doc``: its line in the dataset card (``{reasoning}`` is
    filled with the run's reasoning masking). ``attr``: the ``export.MergedRow`` attribute holding its
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
