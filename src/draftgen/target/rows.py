"""The merged train rows the target runs on: ``read_merged_rows(rd) -> list[ExtractRow]``, for ``draftgen extract``
and ``train --online``; ``read_merged_providers(rd)``: the provider that served each row, with the quantization
its raw record names (extract's provider fidelity).

Reads ``merged/manifest.json`` and the train shards it lists through the one reader of merged Parquet
(``exporters.parquet.read_merged``, as ``records.MergedTokens`` / ``records.MergedProvider``) and, for the
quantizations, ``raw/<dataset>/raw_responses.jsonl`` (the last record of each sample); each sample once
(the first row of an id), in merged order, its ids as int64 and its mask as uint8 numpy arrays. Writes nothing.
numpy and pyarrow are imported on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from draftgen.errors import InputError
from draftgen.exporters.parquet import merged_shards, read_merged
from draftgen.hidden.format import require
from draftgen.records import MergedProvider, MergedTokens, MergeManifest, parse_row_id
from draftgen.store import iter_jsonl, read_json
from draftgen.target import ExtractRow

if TYPE_CHECKING:
    from draftgen.rundir import RunDir

__all__ = ["read_merged_providers", "read_merged_rows"]


def _manifest(rd: RunDir) -> MergeManifest:
    if not rd.merged_manifest.is_file():
        raise InputError(f"{rd.merged_manifest}: no merged data; run draftgen merge first")
    return read_json(rd.merged_manifest, MergeManifest)


class _ServedBy(msgspec.Struct):
    """``ResponseRecord``: who served a sample, and at which quantization (routing metadata, when known)."""

    sample_id: str
    quantization: str | None = None


def _quantizations(rd: RunDir, datasets: set[str]) -> dict[str, str]:
    """Sample id -> the quantization its record names (the last record of a sample: the one merge kept)."""
    out: dict[str, str] = {}
    for name in sorted(datasets):
        path = rd.raw(name)
        if path.is_file():
            for _, rec in iter_jsonl(path, _ServedBy):
                if rec.quantization:
                    out[rec.sample_id] = rec.quantization
                else:
                    out.pop(rec.sample_id, None)
    return out


def read_merged_providers(rd: RunDir) -> dict[str, str]:
    """Row id -> the provider that served it, for the merged train rows whose provider is known; with the
    quantization its raw record names, as ``provider (quantization)``, so that one provider's endpoints at two
    quantizations are two groups."""
    man = _manifest(rd)
    rows = [r for r in read_merged(merged_shards(rd, man, "train"), MergedProvider) if r.provider]
    quant = _quantizations(rd, {r.dataset for r in rows})
    out: dict[str, str] = {}
    for r in rows:
        q = quant.get(parse_row_id(r.sample_id)[0])
        out[r.sample_id] = f"{r.provider} ({q})" if q else str(r.provider)
    return out


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
