"""The rows and settings half of ``draftgen extract``, shared by the driver (``run``) and every worker.

- ``read_merged_rows``: reads ``merged/manifest.json`` and the train shards it lists (``sample_id``,
  ``input_ids``, ``loss_mask``) → the rows in merged order, each sample once;
- ``split_batches``: windows of merged order, sorted by length inside each, cut at ``hidden_states.batch_tokens``
  padded tokens. The driver cuts the pending rows with this one function whatever the executor (this process,
  ``proc_pool``, ``ray_pool``), so every path captures identical batches and writes identical files;
- ``resume_state``: what the destination already holds for these rows: a sample is done only when published,
  indexed, its merged row still has the recorded ids/mask digest and its file the recorded bytes digest
  (checked for files modified after indexing); weight repeats (``x#repN`` with ``x``'s exact row) alias ``x``;
- ``check_settings``: refuses a destination written with other settings (dtype, layer ids, hidden size) or
  from another target (``identity.json``, written here before the first sample).

Reads the merged shards (``read_merged_rows``) and one stored sample (``check_settings``); writes only
``identity.json`` (``check_identity``). numpy and pyarrow are imported on use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from draftgen.errors import InputError, RunDirError
from draftgen.hidden.format import (
    HiddenStore,
    require,
    row_digest,
)
from draftgen.records import HiddenIdentity, HiddenIndexRecord, HiddenTarget, MergeManifest, parse_row_id
from draftgen.store import read_json

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.phases.extract.capture import ExtractBackend, ExtractRow, TargetInfo
    from draftgen.rundir import RunDir

__all__ = ["WINDOW", "Resume", "check_identity", "check_settings", "identity_of",
           "read_merged_rows", "repeat_base", "resume_state", "split_batches"]

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


def repeat_base(sample_id: str) -> str:
    """``x`` for a weight repeat ``x#repN``; the id itself otherwise."""
    return parse_row_id(sample_id)[0]


@dataclass
class Resume:
    """The destination against the current merged rows (``resume_state``)."""

    done: dict[str, HiddenIndexRecord]  # valid records by sample id (aliased repeats not included)
    alias: dict[str, str] = field(default_factory=dict)  # x#repN → x (identical rows: one file)
    stale: int = 0  # records whose merged row changed since (redone)
    legacy: int = 0  # records without digests (written by an older draftgen; redone)
    corrupt: int = 0  # files changed after indexing (redone)

    def record(self, sample_id: str) -> HiddenIndexRecord | None:
        return self.done.get(self.alias.get(sample_id, sample_id))

    @property
    def replaced(self) -> int:
        return self.stale + self.legacy + self.corrupt


def resume_state(store: HiddenStore, rows: Sequence[ExtractRow]) -> Resume:
    """What of ``rows`` the destination already holds validly (see the module docstring)."""
    digests = {r.sample_id: row_digest(r.input_ids, r.loss_mask) for r in rows}
    alias = {r.sample_id: repeat_base(r.sample_id) for r in rows
             if repeat_base(r.sample_id) != r.sample_id and digests.get(repeat_base(r.sample_id)) == digests[r.sample_id]}
    res = Resume(done={}, alias=alias)
    for sid, rec in store.done().items():
        if sid not in digests or sid in alias:
            continue  # no longer a merged row (or a repeat: its base's file serves it)
        if not rec.row_sha256:
            res.legacy += 1
        elif rec.row_sha256 != digests[sid]:
            res.stale += 1
        else:
            res.done[sid] = rec
    for sid in store.corrupted(res.done):
        del res.done[sid]
        res.corrupt += 1
    return res


def identity_of(info: TargetInfo) -> HiddenIdentity:
    """The identity of the target ``info`` describes (name, revision, config.json and final-norm digests)."""
    norm = hashlib.sha256(info.norm_weight.float().numpy().tobytes()).hexdigest()
    return HiddenIdentity(target=HiddenTarget(name=info.name, revision=info.revision,
                                              config_sha256=info.config_sha256), norm_weight_sha256=norm)


def _same_target(a: HiddenIdentity, b: HiddenIdentity) -> bool:
    # content identity: the final norm always, config.json when both recorded it; name/revision only without
    # a config digest (the same weights under another path are the same target)
    if a.norm_weight_sha256 != b.norm_weight_sha256:
        return False
    if a.target.config_sha256 and b.target.config_sha256:
        return a.target.config_sha256 == b.target.config_sha256
    return (a.target.name, a.target.revision) == (b.target.name, b.target.revision)


def _describe(i: HiddenIdentity) -> str:
    rev = f"@{i.target.revision}" if i.target.revision else ""
    cfg = f", config sha256 {i.target.config_sha256[:12]}…" if i.target.config_sha256 else ""
    return f"{i.target.name}{rev} (final norm sha256 {i.norm_weight_sha256[:12]}…{cfg})"


def check_identity(store: HiddenStore, backend: ExtractBackend) -> None:
    """Refuse a destination extracted from another target (naming both); on a destination without one yet,
    record ``identity.json`` now, before the first sample is written."""
    mine = identity_of(backend.info)
    theirs = store.read_identity()
    if theirs is None and store.has_manifest():
        m = store.read_manifest()  # a set written before identity.json: its manifest names the target
        theirs = HiddenIdentity(target=m.target, norm_weight_sha256=m.norm_weight_sha256)
    if theirs is None:
        store.write_identity(mine)
    elif not _same_target(theirs, mine):
        raise RunDirError(f"{store.url}: extracted from {_describe(theirs)}, not {_describe(mine)} "
                          "(hidden_states.model); use another hidden_states.output, or delete that destination "
                          "to start over")


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
    if backend is not None:
        check_identity(store, backend)
    if done and backend is not None:
        first = next(iter(done.values()))
        s = store.read_sample(first.file)
        info = backend.info
        if s.dtype != hs.dtype or s.aux.shape[-1] != len(info.layers.aux) * info.hidden_size:
            raise RunDirError(f"{store.url}: its samples were written with dtype {s.dtype} and aux width "
                              f"{s.aux.shape[-1]}, not {hs.dtype} and {len(info.layers.aux) * info.hidden_size} "
                              f"(hidden_states.dtype / layer_ids); {fix}")

