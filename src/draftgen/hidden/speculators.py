"""speculators' inputs besides the hidden states: the one writer, for ``train/inputs/`` (``phases.train.inputs``),
``train/online/`` (``phases.train.online``) and the ``speculators`` export (``hidden.exports``).

``SpeculatorsInputs`` takes the samples in dataset order (``add``: a sample's exact ids and loss mask, and for
the listing its sample id and state file) and ``write`` publishes, in a folder ``out``:

    token_freq.pt        ``torch.save`` {token id: count} over the ids whose loss_mask is not 0 (the draft
                         vocabulary), in order of first appearance
    dataset_info.json, state.json, data-NNNNN-of-NNNNN.arrow
                         speculators' Arrow dataset (``datasets.save_to_disk``, torch format) of ``input_ids``,
                         ``loss_mask`` and ``seq_len``: ``input_ids`` int32 and ``loss_mask`` int8 when
                         ``narrow`` (train's own inputs: 5 bytes a token on disk where int64 took 16; the
                         torch format hands speculators int64 tensors all the same), int64 both otherwise (the
                         export, as speculators' own data generation writes it)
    sample_ids.jsonl     ``HiddenExportSample`` lines (index, sample_id, state file; ``sample_ids``), when
                         ``write`` is given ``listing=True`` (the export writes it for every format itself)

Each file goes through ``save(rel, write)`` (``write(tmp)`` fills the temp path the file is published from):
by default atomically in place (``hidden.files.atomic_save``), the shards of an earlier dataset there removed
first (their count may differ); the export passes its own (``ExportContext.save``: listed, sized, digested).
The dataset is built in a temp folder of draftgen's temp pattern inside ``out``, removed afterwards.
torch and datasets are imported on use.
"""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from draftgen.hidden.files import BytesWriter, atomic_save, require, storage_faults, temp_name
from draftgen.records import HiddenExportSample
from draftgen.store import encode_json

__all__ = ["ARROW_FILES", "ARROW_SHARD", "SAMPLE_IDS", "TOKEN_FREQ", "Save", "SpeculatorsInputs", "sample_ids",
           "torch_bytes"]

TOKEN_FREQ = "token_freq.pt"
SAMPLE_IDS = "sample_ids.jsonl"
ARROW_FILES = ("state.json", "dataset_info.json")  # besides the data-NNNNN-of-NNNNN.arrow shards
ARROW_SHARD = re.compile(r"data-\d{5}-of-\d{5}\.arrow")

#: ``save(rel, write)``: publish ``out/rel``, ``write(tmp)`` filling the temp path it is renamed from
Save = Callable[[str, Callable[[str], None]], None]


def torch_bytes(obj: Any) -> bytes:
    """``torch.save(obj)``'s bytes, made in memory (torch's own file writer reports a full disk as
    "unexpected pos")."""
    torch = require("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def sample_ids(entries: Iterable[tuple[str, str]]) -> bytes:
    """``sample_ids.jsonl``: one ``HiddenExportSample`` line per (sample id, state file), indexed in order."""
    return b"".join(encode_json(HiddenExportSample(index=i, sample_id=sid, file=file)) + b"\n"
                    for i, (sid, file) in enumerate(entries))


class SpeculatorsInputs:
    """The samples of one dataset, in order, and ``write`` (see the module docstring)."""

    def __init__(self, *, narrow: bool) -> None:
        self.narrow = narrow
        self.rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
        self.freq: dict[int, int] = {}
        self.entries: list[tuple[str, str]] = []  # (sample id, state file) of each row

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def tokens(self) -> int:
        return sum(self.rows["seq_len"])

    def add(self, ids: Sequence[int], mask: Sequence[int], sample_id: str = "", file: str = "") -> None:
        """The next row: its exact ids and loss mask (Python ints), and its sample id and state file for the
        listing ("" where there is none)."""
        self.rows["input_ids"].append(ids)
        self.rows["loss_mask"].append(mask)
        self.rows["seq_len"].append(len(ids))
        for tid, m in zip(ids, mask, strict=True):
            if m:
                self.freq[tid] = self.freq.get(tid, 0) + 1
        self.entries.append((sample_id, file))

    def write(self, out: Path, save: Save | None = None, *, listing: bool = False) -> None:
        """``token_freq.pt``, the Arrow dataset and, with ``listing``, ``sample_ids.jsonl`` into ``out``, each file
        through ``save`` (default: atomically in place, an earlier dataset's shards removed)."""
        put = save or _in_place(out)
        put(TOKEN_FREQ, BytesWriter(torch_bytes(self.freq)))
        self._dataset(out, put, replace=save is None)
        if listing:
            put(SAMPLE_IDS, BytesWriter(sample_ids(self.entries)))

    def _dataset(self, out: Path, put: Save, *, replace: bool) -> None:
        datasets = require("datasets", "hub")
        ids, mask = ("int32", "int8") if self.narrow else ("int64", "int64")
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value(ids)),
                                      "loss_mask": datasets.Sequence(datasets.Value(mask)),
                                      "seq_len": datasets.Value("int64")})
        ds = datasets.Dataset.from_dict(self.rows, features=features)
        ds.set_format(type="torch")
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / temp_name("arrow")  # a temp folder: the same pattern, removed by a rerun after a death
        tmp.mkdir()
        try:
            with storage_faults(str(out), "write"):
                ds.save_to_disk(str(tmp))
            if replace:
                for old in out.iterdir():  # an earlier dataset's shards (their count may differ)
                    if ARROW_SHARD.fullmatch(old.name):
                        old.unlink()
            for f in sorted(tmp.iterdir()):

                def move(dst: str, src: Path = f) -> None:
                    os.replace(src, dst)

                put(f.name, move)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _in_place(out: Path) -> Save:
    def put(rel: str, write: Callable[[str], None]) -> None:
        atomic_save(out / rel, write)

    return put
