"""``train/inputs/``: what speculators reads, WITHOUT a second copy of the hidden states (``draftgen train``).

Reads a finished local ``draftgen.hidden/1`` set as a ``hidden.stream.Source`` (its samples in manifest order,
flagged ones left out; ``Source.token_rows``: only each file's ``input_ids`` and ``loss_mask``, through
safetensors' lazy ``safe_open``) and writes, under ``out``, only what is small:

    token_freq.pt, dataset_info.json, state.json, data-*.arrow, sample_ids.jsonl
                         speculators' inputs, written by the one writer of them (``hidden.speculators``,
                         narrow: ``input_ids`` int32, ``loss_mask`` int8): the draft vocabulary's token
                         counts, the Arrow dataset, and the listing (index, sample_id, state file)
    draftgen_states.json ``StatesMap``: the set's absolute root, the per-sample state files in dataset order
                         with their sha256 (the manifest's), the aux layer count and the dtype speculators
                         gets the states in
    export.json          ``HiddenExportReport`` (format ``speculators-index``), written last

``speculators_runner.py --draftgen-states draftgen_states.json`` is the rest of the Source, in speculators'
own Python: its file transfer reads sample ``i`` from ``root/files[i]``, VERIFIES the bytes against
``sha256[i]`` (a file changed after extraction stops training with a line naming it and the fix) and builds
its ``[T, n_aux+1, H]`` tensor in memory, exactly as the ``speculators`` export (hidden.exports) writes it to
``hs_{i}.safetensors``. Sample ``i`` is the i-th unflagged sample of the manifest, as in that export (the rows of
a provider the extract's fidelity check flagged, under ``fidelity_action: exclude``, are left out too). A
``hidden_states/`` folder an earlier (copying) draftgen left here is removed. A set on an object store is not
handled here (``build_index`` returns None): ``draftgen train`` then falls back to the full speculators
export (a sink fed by the same Source).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

from draftgen.errors import InputError
from draftgen.hidden.export_folder import EXPORT_REPORT
from draftgen.hidden.exports import SPECULATORS_STATES, manifest_fingerprint
from draftgen.hidden.format import HiddenSet, atomic_write_bytes, require, storage_faults
from draftgen.hidden.speculators import SpeculatorsInputs
from draftgen.hidden.stream import Source
from draftgen.records import HiddenExportReport
from draftgen.store import atomic_write_json, encode_json, read_json

__all__ = ["INDEX_FORMAT", "STATES_FLAG", "STATES_MAP", "StatesMap", "build_index", "speculators_dtype"]

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
                         f"{src.flagged} flagged, {sum(src.excluded.values())} of providers excluded by the "
                         "fidelity check)")
    out.mkdir(parents=True, exist_ok=True)
    (out / EXPORT_REPORT).unlink(missing_ok=True)
    shutil.rmtree(out / SPECULATORS_STATES, ignore_errors=True)  # an earlier draftgen's full copy
    t0 = time.perf_counter()
    inputs = SpeculatorsInputs(narrow=True)
    for _i, e, ids, mask in src.token_rows():
        inputs.add(ids.to(torch.int64).tolist(), mask.to(torch.int64).tolist(), e.sample_id, e.file)
    with storage_faults(str(out), "write"):
        inputs.write(out, listing=True)
        smap = StatesMap(root=root, files=[e.file for e in src.entries], n_aux=len(m.layer_ids.aux),
                         dtype=speculators_dtype(m.dtype), sha256=[e.file_sha256 for e in src.entries])
        atomic_write_bytes(out / STATES_MAP, encode_json(smap))
    tokens = inputs.tokens
    secs = time.perf_counter() - t0
    rep = HiddenExportReport(format=INDEX_FORMAT, out=str(out), hidden=hset.store.url,
                             manifest_fingerprint=fingerprint, samples=len(src), tokens=tokens,
                             skipped_flagged=src.flagged, include_flagged=False, excluded_fidelity=src.excluded,
                             layer_ids=list(m.layer_ids.aux),
                             final_layer_id=m.layer_ids.final, dtype=smap.dtype, seconds=round(secs, 3))
    atomic_write_json(out / EXPORT_REPORT, rep)
    if echo is not None:
        echo(f"train: indexed {len(src)} samples, {tokens} tokens of {hset.store.url} -> {out} "
             f"(states read in place, {secs:.1f} s)")
        for provider, n in src.excluded.items():
            echo(f"train: left out {n} samples of provider {provider}: the extract's fidelity check flagged it "
                 "(hidden_states.fidelity_action: exclude)")
    return rep
