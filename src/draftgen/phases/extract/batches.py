"""The batch half of ``draftgen extract``, shared by the one-process driver (``run``) and the pools' workers.

- ``read_merged_rows``: reads ``merged/manifest.json`` and the train shards it lists (``sample_id``,
  ``input_ids``, ``loss_mask``) → the rows in merged order, each sample once;
- ``split_batches``: windows of merged order, sorted by length inside each, cut at ``hidden_states.batch_tokens``
  padded tokens. Every path (one process, ``proc_pool``, ``ray_pool``) cuts the pending rows with this one
  function, so they capture identical batches and write identical files;
- ``check_settings``: refuses a destination written with other settings (dtype, layer ids, hidden size);
- ``extract_batch``: one batch → capture → encode → check → publish each file → ONE index part.

Reads the merged shards (``read_merged_rows``) and one stored sample (``check_settings``); writes sample files
and index parts through ``HiddenStore`` (``extract_batch``). numpy and pyarrow are imported on use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from draftgen.errors import InputError, RunDirError
from draftgen.hidden.format import HiddenStore, decode_sample, encode_sample, require
from draftgen.records import HiddenIndexRecord, MergeManifest
from draftgen.store import read_json

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.config.hidden import HiddenStatesConfig
    from draftgen.phases.extract.capture import ExtractBackend, ExtractRow
    from draftgen.rundir import RunDir

__all__ = ["WINDOW", "check_settings", "extract_batch", "read_merged_rows", "split_batches"]

WINDOW = 512  # rows of merged order sorted by length together


def read_merged_rows(rd: RunDir) -> list[ExtractRow]:
    """The merged train rows in merged order (merged/manifest.json lists the shards)."""
    np = require("numpy")
    pq = require("pyarrow.parquet")
    from draftgen.phases.extract.capture import ExtractRow

    if not rd.merged_manifest.is_file():
        raise InputError(f"{rd.merged_manifest}: no merged data; run draftgen merge first")
    man = read_json(rd.merged_manifest, MergeManifest)
    files = sorted(f.path for f in man.files if f.split == "train" and f.kind == "parquet")
    rows: list[ExtractRow] = []
    seen: set[str] = set()
    for rel in files:
        path = (rd.root if man.layout >= 2 else rd.merged) / rel
        t = pq.read_table(path, columns=["sample_id", "input_ids", "loss_mask"])
        for sid, ids, mask in zip(t.column("sample_id").to_pylist(), t.column("input_ids").to_pylist(),
                                  t.column("loss_mask").to_pylist(), strict=True):
            if sid in seen:
                continue
            seen.add(sid)
            rows.append(ExtractRow(sample_id=sid, input_ids=np.asarray(ids, dtype=np.int64),
                                   loss_mask=np.asarray(mask, dtype=np.uint8)))
    if not rows:
        raise InputError(f"{rd.merged}: no train rows; run draftgen merge first (with some usable data)")
    return rows


def split_batches(rows: Sequence[ExtractRow], batch_tokens: int) -> Iterator[list[ExtractRow]]:
    """Windows of merged order, each sorted by length (longest first), cut into batches whose padded size
    (rows × longest) stays within ``batch_tokens``; a longer row runs alone."""
    for w in range(0, len(rows), WINDOW):
        window = sorted(rows[w:w + WINDOW], key=lambda r: -len(r.input_ids))
        batch: list[ExtractRow] = []
        for r in window:
            width = len(batch[0].input_ids) if batch else len(r.input_ids)
            if batch and (len(batch) + 1) * width > batch_tokens:
                yield batch
                batch = []
            batch.append(r)
        if batch:
            yield batch


def check_settings(store: HiddenStore, done: dict[str, HiddenIndexRecord], cfg: RunConfig,
                    backend: ExtractBackend | None) -> None:
    """Refuse to mix samples made with other settings into one destination (field named). Without ``backend``
    only the manifest's dtype and layer ids are checked; with one, also its layers and one done sample's bytes."""
    hs = cfg.hidden_states
    fix = "use another hidden_states.output, or delete that destination to start over"
    if store.has_manifest():
        m = store.read_manifest()
        if m.dtype != hs.dtype:
            raise RunDirError(f"{store.url}: written with hidden_states.dtype {m.dtype}, not {hs.dtype}; {fix}")
        if backend is not None:
            info = backend.info
            if list(info.layers.aux) != m.layer_ids.aux or info.hidden_size != m.hidden_size:
                raise RunDirError(f"{store.url}: written with hidden_states.layer_ids {m.layer_ids.aux} (hidden "
                                  f"{m.hidden_size}), not {list(info.layers.aux)} (hidden {info.hidden_size}); {fix}")
        elif hs.layer_ids is not None and sorted(hs.layer_ids) != m.layer_ids.aux:
            raise RunDirError(f"{store.url}: written with hidden_states.layer_ids {m.layer_ids.aux}, not "
                              f"{sorted(hs.layer_ids)}; {fix}")
    if done and backend is not None:
        first = next(iter(done.values()))
        s = store.read_sample(first.file)
        info = backend.info
        if s.dtype != hs.dtype or s.aux.shape[-1] != len(info.layers.aux) * info.hidden_size:
            raise RunDirError(f"{store.url}: its samples were written with dtype {s.dtype} and aux width "
                              f"{s.aux.shape[-1]}, not {hs.dtype} and {len(info.layers.aux) * info.hidden_size} "
                              f"(hidden_states.dtype / layer_ids); {fix}")


def extract_batch(be: ExtractBackend, store: HiddenStore, hs: HiddenStatesConfig, batch: Sequence[ExtractRow],
                  timings: dict[str, float]) -> tuple[list[HiddenIndexRecord], int]:
    """One batch, the same in one process and in a pool's worker (``worker.ExtractActor``): capture → encode → check the
    bytes → publish each file → ONE index part listing them. Returns the records and the bytes written;
    adds seconds to ``timings`` (capture/check/encode/publish)."""
    from draftgen.phases.extract.checks import check_sample, teacher_selected

    t = time.monotonic()
    caps = be.capture(batch)
    timings["capture"] += time.monotonic() - t
    records: list[HiddenIndexRecord] = []
    written = 0
    for row, c in zip(batch, caps, strict=True):
        t = time.monotonic()
        data = encode_sample(c, hs.dtype)
        timings["encode"] += time.monotonic() - t
        t = time.monotonic()
        res = check_sample(decode_sample(data), row, be, hs, teacher=teacher_selected(row.sample_id,
                                                                                  hs.teacher_fraction))
        timings["check"] += time.monotonic() - t
        t = time.monotonic()
        rel = store.publish(row.sample_id, data)
        timings["publish"] += time.monotonic() - t
        written += len(data)
        records.append(HiddenIndexRecord(sample_id=row.sample_id, file=rel, length=len(row.input_ids),
                                         n_loss=int(row.loss_mask.sum()), failed=res.failed, teacher=res.teacher))
    t = time.monotonic()
    store.write_index_part(records)
    timings["publish"] += time.monotonic() - t
    return records, written
