"""Writers of the merge output: Parquet shards + dataset card in merged/, peer formats in exports/; and the one
reader of the shards.

One module per format: ``exporters.parquet`` (the shards, the loop that writes every format of a split, and
``read_merged``: the shards' rows as ``records.MergedParquetRow`` or a view of it, for every phase that reads them),
``exporters.card`` (``merged/README.md``), ``exporters.speculators``, ``exporters.specforge``; the registry of
formats (``EXPORTERS``, a ``draftgen.registry.Registry``) and the row handed over by merge are in
``exporters.base``. This face registers the built-in formats as lazy ``"module:attr"`` entries; a plugin's
format is a row builder plus one ``@register_exporter`` line.
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
    merged_shards,
    parquet_schema,
    read_merged,
    write_split,
)
from draftgen.exporters.speculators import speculators_metadata

# The built-in formats, registered lazily by the call a plugin uses (here, above every format module, so
# that ``base`` imports none of them: importing ``draftgen.exporters.base`` runs this face first).
EXPORTERS.register("speculators", "draftgen.exporters.speculators:SPECULATORS",
                   doc="pre-tokenized rows for ``speculators prepare-data --data exports/speculators/``")
EXPORTERS.register("specforge", "draftgen.exporters.specforge:SPECFORGE",
                   doc="pre-tokenized ``{input_ids, loss_mask}`` JSONL for SpecForge ``data.prompts_path``: the "
                       "exact ids; set its ``data.max_length`` >= ``merge.max_seq_len``")
EXPORTERS.register("specforge-conversations", "draftgen.exporters.specforge:SPECFORGE_CONVERSATIONS",
                   doc="conversation rows for SpecForge ``data.train_data_path``; SpecForge re-renders and "
                       "re-tokenizes them, so their ids are not exact")

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
    "merged_shards",
    "parquet_schema",
    "read_merged",
    "register_exporter",
    "speculators_metadata",
    "write_card",
    "write_split",
]
