"""Writers of the merge output: Parquet shards + dataset card in merged/, peer formats in exports/.

One module per format: ``exporters.parquet`` (the shards, and the loop that writes every format of a split),
``exporters.card`` (``merged/README.md``), ``exporters.speculators``, ``exporters.specforge``; the registry of
formats (``EXPORTERS``, a ``draftgen.registry.Registry``) and the row handed over by merge are in
``exporters.base``, which registers the built-in formats as lazy ``"module:attr"`` entries; a plugin's format
is a row builder plus one ``@register_exporter`` line.
"""

from __future__ import annotations

from draftgen.exporters.base import (
    EXPORTERS,
    Builder,
    ExportContext,
    Exporter,
    MergedRow,
    RowReaders,
    RowSource,
    check_exports,
    export_usage,
    loss_mask_bytes,
    register_exporter,
)
from draftgen.exporters.card import write_card
from draftgen.exporters.parquet import (
    CHUNK_ROWS,
    CHUNK_TOKENS,
    SHARD_TOKENS,
    file_digest,
    file_entry,
    parquet_schema,
    write_split,
)
from draftgen.exporters.speculators import speculators_metadata

__all__ = [
    "CHUNK_ROWS",
    "CHUNK_TOKENS",
    "EXPORTERS",
    "SHARD_TOKENS",
    "Builder",
    "ExportContext",
    "Exporter",
    "MergedRow",
    "RowReaders",
    "RowSource",
    "check_exports",
    "export_usage",
    "file_digest",
    "file_entry",
    "loss_mask_bytes",
    "parquet_schema",
    "register_exporter",
    "speculators_metadata",
    "write_card",
    "write_split",
]
