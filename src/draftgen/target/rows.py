"""The merged train rows the target runs on: ``read_merged_rows(rd) -> list[ExtractRow]``, for ``draftgen extract``
and ``train --online``; ``read_merged_providers(rd)``: the provider that served each row (extract's provider
fidelity).

Reads ``merged/manifest.json`` and the train shards it lists through the one reader of merged Parquet
(``exporters.parquet.read_merged``, as ``records.MergedTokens`` / ``records.MergedProvider``); each sample once
(the first row of an id), in merged order, its ids as int64 and its mask as uint8 numpy arrays. Writes nothing.
numpy and pyarrow are imported on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftgen.errors import InputError
from draftgen.exporters.parquet import merged_shards, read_merged
from draftgen.hidden.format import require
from draftgen.records import MergedProvider, MergedTokens, MergeManifest
from draftgen.store import read_json
from draftgen.target import ExtractRow

if TYPE_CHECKING:
    from draftgen.rundir import RunDir

__all__ = ["read_merged_providers", "read_merged_rows"]


def _manifest(rd: RunDir) -> MergeManifest:
    if not rd.merged_manifest.is_file():
        raise InputError(f"{rd.merged_manifest}: no merged data; run draftgen merge first")
    return read_json(rd.merged_manifest, MergeManifest)


def read_merged_providers(rd: RunDir) -> dict[str, str]:
    """Row id -> the provider that served it, for the merged train rows whose provider is known."""
    man = _manifest(rd)
    return {r.sample_id: r.provider for r in read_merged(merged_shards(rd, man, "train"), MergedProvider)
            if r.provider}


def read_merged_rows(rd: RunDir) -> list[ExtractRow]:
    """The merged train rows in merged order (merged/manifest.json lists the shards)."""
    np = require("numpy")
    man = _manifest(rd)
    rows: list[ExtractRow] = []
    seen: set[str] = set()
    for r in read_merged(merged_shards(rd, man, "train"), MergedTokens):
        if r.sample_id in seen:
            continue
        seen.add(r.sample_id)
        rows.append(ExtractRow(sample_id=r.sample_id, input_ids=np.asarray(r.input_ids, dtype=np.int64),
                               loss_mask=np.asarray(r.loss_mask, dtype=np.uint8)))
    if not rows:
        raise InputError(f"{rd.merged}: no train rows; run draftgen merge first (with some usable data)")
    return rows
