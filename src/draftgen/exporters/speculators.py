"""The ``speculators`` export: ``records.SpeculatorsRow`` ``{id, primary_id, input_ids, loss_mask, text, metadata}``,
as vllm-project/speculators' ``regenerate-responses`` writes it; ``text`` = the exact decode of ``input_ids``
(special tokens kept). ``speculators prepare-data --data exports/speculators/`` reads the folder and keeps
``input_ids`` and ``loss_mask`` as they are: exact ids."""

from __future__ import annotations

from typing import Any

import msgspec

from draftgen.exporters.base import ExportContext, Exporter, MergedRow
from draftgen.records import (
    MERGED_COLUMNS,
    SpeculatorsMetadata,
    SpeculatorsRow,
)


def speculators_metadata(row: MergedRow) -> msgspec.Struct:
    """``SpeculatorsMetadata`` of a row: each of its columns read from the row, None as the column's default."""
    values: dict[str, Any] = {}
    for c in _META_COLUMNS:
        v = getattr(row, c.meta_attr or c.attr or c.name)
        values[c.name] = c.meta_default if v is None else v
    return SpeculatorsMetadata(**values)


_META_COLUMNS = tuple(c for c in MERGED_COLUMNS if c.meta is not None)


def build_speculators(ctx: ExportContext, row: MergedRow, ids: list[int], mask: list[int]) -> msgspec.Struct | str:
    return SpeculatorsRow(id=row.row_id, primary_id=row.sample_id, input_ids=ids, loss_mask=mask,
                          text=ctx.profile.tokenizer.decode(ids), metadata=speculators_metadata(row))


#: ``merge.exports: [speculators]`` (registered in ``exporters.base.EXPORTERS`` by this path).
SPECULATORS = Exporter(build_speculators, pretokenized=True, usage="speculators prepare-data --data {dir}/")
