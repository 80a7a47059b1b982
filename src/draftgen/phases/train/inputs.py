"""``train/inputs/``: what speculators reads, WITHOUT a second copy of the hidden states (``draftgen train``).

Reads a finished local ``draftgen.hidden/1`` set as a ``hidden.stream.Source`` (its samples in manifest order,
flagged ones left out; ``Source.token_rows``: only each file's ``input_ids`` and ``loss_mask``, through
safetensors' lazy ``safe_open``) and writes, under ``out``, only what is small:

    dataset_info.json, state.json, data-*.arrow   speculators' Arrow dataset (``datasets.save_to_disk``:
                                                  ``input_ids`` int32, ``loss_mask`` int8, ``seq_len``:
                                                  5 bytes a token on disk, where int64 took 16; the
                                                  torch format hands speculators int64 tensors as before)
    token_freq.pt        ``torch.save`` {token id: count} over loss_mask == 1 (the draft vocabulary)
    draftgen_states.json ``StatesMap``: the set's absolute root, the per-sample state files in dataset order
                         with their sha256 (the manifest's), the aux layer count and the dtype speculators
                         gets the states in
    sample_ids.jsonl     ``HiddenExportSample`` lines (index, sample_id, state file): provenance
    export.json          ``HiddenExportReport`` (format ``speculators-index``), written last

``speculators_runner.py --draftgen-states draftgen_states.json`` is the rest of the Source, in speculators'
own Python: its file transfer reads sample ``i`` from ``root/files[i]``, VERIFIES the bytes against
``sha256[i]`` (a file changed after extraction stops training with a line naming it and the fix) and builds
its ``[T, n_aux+1, H]`` tensor in memory, exactly as the ``speculators`` export (hidden.exports) writes it to
``hs_{i}.safetensors``. Sample ``i`` is the i-th unflagged sample of the manifest, as in that export. A
``hidden_states/`` folder an earlier (copying) draftgen left here is removed. A set on an object store is not
handled here (``build_index`` returns None): ``draftgen train`` then falls back to the full speculators
export (a sink fed by the same Source).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from draftgen.errors import InputError
from draftgen.hidden.exports import (
    EXPORT_REPORT,
    SAMPLE_IDS,
    SPECULATORS_STATES,
    TOKEN_FREQ,
    manifest_fingerprint,
)
from draftgen.hidden.format import HiddenSet, atomic_write_bytes, require, storage_faults
from draftgen.hidden.stream import Source
from draftgen.records import HiddenExportReport, HiddenExportSample
from draftgen.store import atomic_write_json, encode_json, read_json

__all__ = ["INDEX_FORMAT", "STATES_FLAG", "STATES_MAP", "StatesMap", "build_index", "save_dataset", "speculators_dtype"]

INDEX_FORMAT = "speculators-index"
STATES_MAP = "draftgen_states.json"
STATES_FLAG = "--draftgen-states"  # the runner's flag (speculators_runner.STATES_FLAG)


class StatesMap(msgspec.Struct, forbid_unknown_fields=True):
    """``draftgen_states.json``: dataset row ``i`` reads ``root/files[i]`` (a ``draftgen.hidden/1`` file), whose
    bytes must have sha256 ``sha256[i]`` (the manifest's ``file_sha256``; "" = not recorded, not checked)."""

    root: str
    files: list[str]
    n_aux: int
    dtype: str  # torch dtype name the states go to speculators in ("bfloat16", "float16", "float32")
    sha256: list[str] = msgspec.field(default_factory=list)


def speculators_dtype(set_dtype: str) -> str:
    """The dtype of the states speculators gets (the speculators export's: bf16 for an fp8 or bf16 set)."""
    return {"fp16": "float16", "fp32": "float32"}.get(set_dtype, "bfloat16")


def _up_to_date(out: Path, fingerprint: str, root: str) -> HiddenExportReport | None:
    """The index in ``out`` when it is of this set (same manifest) at this place (same root), else None."""
    path = out / EXPORT_REPORT
    if not path.is_file() or not (out / STATES_MAP).is_file():
        return None
    try:
        rep = read_json(path, HiddenExportReport)
        smap = read_json(out / STATES_MAP, StatesMap)
    except InputError:
        return None
    same = rep.format == INDEX_FORMAT and rep.manifest_fingerprint == fingerprint and smap.root == root
    return rep if same else None


def save_dataset(out: Path, rows: dict[str, list[Any]]) -> None:
    """speculators' Arrow dataset (``input_ids`` int32, ``loss_mask`` int8, ``seq_len``) into ``out`` (earlier
    shards replaced). The narrow types are the disk train adds per token (bench_train_disk, bench_online); the
    torch format reads them back as int64 (datasets' default for integers), so speculators sees what it did."""
    datasets = require("datasets", "hub")
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "loss_mask": datasets.Sequence(datasets.Value("int8")),
                                  "seq_len": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(rows, features=features)
    ds.set_format(type="torch")
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".arrow."))
    try:
        ds.save_to_disk(str(tmp))
        for old in out.glob("data-*.arrow"):  # an earlier dataset's shards (their count may differ)
            old.unlink()
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_index(hset: HiddenSet, out: Path, echo: Any = None) -> HiddenExportReport | None:
    """Write ``out`` (see the module docstring) for the local set ``hset``, read as a ``hidden.stream.Source``;
    None when it is not local."""
    if not hset.store.local:
        return None
    torch = require("torch")
    src = Source(hset)
    m = src.manifest
    fingerprint = manifest_fingerprint(m)
    root = os.path.abspath(hset.store.root)
    done = _up_to_date(out, fingerprint, root)
    if done is not None:
        return done
    if not len(src):
        raise InputError(f"{hset.store.url}: no sample to train on ({len(m.samples)} in the manifest, "
                         f"{src.flagged} flagged)")
    out.mkdir(parents=True, exist_ok=True)
    (out / EXPORT_REPORT).unlink(missing_ok=True)
    shutil.rmtree(out / SPECULATORS_STATES, ignore_errors=True)  # an earlier draftgen's full copy
    t0 = time.perf_counter()
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    freq: dict[int, int] = {}
    for _i, _e, ids, mask in src.token_rows():
        ids, mask = ids.to(torch.int64), mask.to(torch.int64)
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append(mask.tolist())
        rows["seq_len"].append(int(ids.shape[0]))
        for tid in ids[mask.bool()].tolist():
            freq[tid] = freq.get(tid, 0) + 1
    with storage_faults(str(out), "write"):
        save_dataset(out, rows)
        buf = io.BytesIO()
        torch.save(freq, buf)
        atomic_write_bytes(out / TOKEN_FREQ, buf.getvalue())
        smap = StatesMap(root=root, files=[e.file for e in src.entries], n_aux=len(m.layer_ids.aux),
                         dtype=speculators_dtype(m.dtype), sha256=[e.file_sha256 for e in src.entries])
        atomic_write_bytes(out / STATES_MAP, encode_json(smap))
        atomic_write_bytes(out / SAMPLE_IDS, b"".join(
            encode_json(HiddenExportSample(index=i, sample_id=e.sample_id, file=e.file)) + b"\n"
            for i, e in enumerate(src.entries)))
    tokens = sum(rows["seq_len"])
    secs = time.perf_counter() - t0
    rep = HiddenExportReport(format=INDEX_FORMAT, out=str(out), hidden=hset.store.url,
                             manifest_fingerprint=fingerprint, samples=len(src), tokens=tokens,
                             skipped_flagged=src.flagged, include_flagged=False, layer_ids=list(m.layer_ids.aux),
                             final_layer_id=m.layer_ids.final, dtype=smap.dtype, seconds=round(secs, 3))
    atomic_write_json(out / EXPORT_REPORT, rep)
    if echo is not None:
        echo(f"train: indexed {len(src)} samples, {tokens} tokens of {hset.store.url} -> {out} "
             f"(states read in place, {secs:.1f} s)")
    return rep
