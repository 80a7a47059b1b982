"""The rows and settings half of ``draftgen extract``, shared by the driver (``run``) and every worker.

The merged rows themselves come from ``target.rows.read_merged_rows`` (the one reader of merged Parquet).

- ``split_batches``: windows of merged order, sorted by length inside each, cut at ``hidden_states.batch_tokens``
  padded tokens. The driver cuts the pending rows with this one function whatever the executor (this process,
  ``proc_pool``, ``ray_pool``), so every path captures identical batches and writes identical files;
- ``resume_state``: what the destination already holds for these rows: a sample is done only when published,
  indexed, its merged row still has the recorded ids/mask digest and its file the recorded bytes digest
  (checked for files modified after indexing); weight repeats (``x#repN`` with ``x``'s exact row) alias ``x``;
  ``Resume.keep()`` is what the index keeps (the driver prunes every other record before it writes);
- ``check_settings``: refuses a destination written with other settings (dtype, layer ids, hidden size) or
  from another target (``identity.json``, written here before the first sample): another final norm or
  config.json, or other weights (``target.identity.target_weights``: ``hidden.norm.weights_digest`` of the
  target's folder, compared where both sides have a digest; a set recorded before weights digests gets this
  target's);
- ``check_weights``: the driver's weights check before anything is written, where ``--force`` accepts (and
  records) other weights of the same final norm and config.json.

Reads one stored sample (``check_settings``) and the target's safetensors headers and sampled bytes
(``target_weights``); writes only ``identity.json`` (``check_identity``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from draftgen.errors import RunDirError
from draftgen.hidden.codec import row_digest
from draftgen.hidden.format import HiddenStore
from draftgen.hidden.norm import WeightsDigest, norm_digests
from draftgen.records import HiddenIdentity, HiddenIndexRecord, parse_row_id
from draftgen.target import config_digest, target_folder
from draftgen.target.identity import identity_of, target_weights

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.target import ExtractBackend, ExtractRow

__all__ = ["WINDOW", "Resume", "check_identity", "check_settings", "check_weights", "recorded_identity",
           "repeat_base", "resume_state", "split_batches", "weights_refusal"]

WINDOW = 512  # rows of merged order sorted by length together


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
    others: dict[str, HiddenIndexRecord] = field(default_factory=dict)  # valid records of samples no row has now
    stale: int = 0  # records whose merged row changed since (redone)
    legacy: int = 0  # records without digests (written by an older draftgen; redone)
    corrupt: int = 0  # files changed after indexing (redone)

    def record(self, sample_id: str) -> HiddenIndexRecord | None:
        return self.done.get(self.alias.get(sample_id, sample_id))

    @property
    def replaced(self) -> int:
        return self.stale + self.legacy + self.corrupt

    def keep(self) -> dict[str, HiddenIndexRecord]:
        """The records the index keeps (``HiddenStore.prune_index``): every valid one, each sample once."""
        return {**self.others, **self.done}


def resume_state(store: HiddenStore, rows: Sequence[ExtractRow]) -> Resume:
    """What of ``rows`` the destination already holds validly (see the module docstring)."""
    digests = {r.sample_id: row_digest(r.input_ids, r.loss_mask) for r in rows}
    alias = {r.sample_id: repeat_base(r.sample_id) for r in rows
             if repeat_base(r.sample_id) != r.sample_id and digests.get(repeat_base(r.sample_id)) == digests[r.sample_id]}
    res = Resume(done={}, alias=alias)
    for sid, rec in store.done().items():
        if sid in alias:
            continue  # a repeat: its base's file serves it
        if sid not in digests:
            res.others[sid] = rec  # no longer a merged row: kept while its file is intact
        elif not rec.row_sha256:
            res.legacy += 1
        elif rec.row_sha256 != digests[sid]:
            res.stale += 1
        else:
            res.done[sid] = rec
    for sid in store.corrupted(res.done):
        del res.done[sid]
        res.corrupt += 1
    for sid in store.corrupted(res.others):
        del res.others[sid]
    return res


def _same_target(a: HiddenIdentity, b: HiddenIdentity) -> bool:
    # content identity: the final norm always, config.json when both recorded it; name/revision only without
    # a config digest (the same weights under another path are the same target). The weights: weights_refusal
    if a.norm_weight_sha256 != b.norm_weight_sha256:
        return False
    if a.target.config_sha256 and b.target.config_sha256:
        return a.target.config_sha256 == b.target.config_sha256
    return (a.target.name, a.target.revision) == (b.target.name, b.target.revision)


def _describe(i: HiddenIdentity) -> str:
    rev = f"@{i.target.revision}" if i.target.revision else ""
    cfg = f", config sha256 {i.target.config_sha256[:12]}…" if i.target.config_sha256 else ""
    return f"{i.target.name}{rev} (final norm sha256 {i.norm_weight_sha256[:12]}…{cfg})"


def recorded_identity(store: HiddenStore) -> HiddenIdentity | None:
    """The target the destination's samples come from: ``identity.json``, else (a set written before it)
    its manifest's; None for a new destination."""
    ident = store.read_identity()
    if ident is None and store.has_manifest():
        m = store.read_manifest()
        ident = HiddenIdentity(target=m.target, norm_weight_sha256=m.norm_weight_sha256)
    return ident


def weights_refusal(store: HiddenStore, name: str, why: str) -> RunDirError:
    """The one-line refusal of a target whose weights are not the set's, though its final norm and
    config.json are (``why``: ``WeightsDigest.differs``)."""
    return RunDirError(f"{store.url}: hidden_states.model {name}: its weights differ from those the set was "
                       f"extracted with ({why}), though its final norm and config.json are the same: other "
                       "weights (a fine-tune, a merged adapter) are another target; use another "
                       "hidden_states.output, or pass --force if they are the same weights saved again")


def check_identity(store: HiddenStore, backend: ExtractBackend, weights: WeightsDigest) -> None:
    """Refuse a destination extracted from another target (naming both; the weights by ``weights``, the
    digest of the weights loaded); on a destination without one yet, record ``identity.json`` now, before
    the first sample is written; on one recorded before weights digests, add this target's."""
    mine = identity_of(backend.info, weights)
    theirs = recorded_identity(store)
    if theirs is None:
        store.write_identity(mine)
        return
    if not _same_target(theirs, mine):
        raise RunDirError(f"{store.url}: extracted from {_describe(theirs)}, not {_describe(mine)} "
                          "(hidden_states.model); use another hidden_states.output, or delete that destination "
                          "to start over")
    why = WeightsDigest.of(theirs.target).differs(weights)
    if why:
        raise weights_refusal(store, mine.target.name, why)
    t = theirs.target
    if (weights.sampled and not t.weights_sha256) or (weights.files and not t.files_sha256):
        target = msgspec.structs.replace(t, weights_sha256=t.weights_sha256 or weights.sampled,
                                         files_sha256=t.files_sha256 or weights.files)
        store.write_identity(msgspec.structs.replace(theirs, target=target))


def check_weights(store: HiddenStore, cfg: RunConfig, *, force: bool, echo: Callable[[str], object]) -> None:
    """The driver's check, before anything is written (also of a set that is up to date): the target's
    weights (``target_weights``, read from its local folder; a hub id not downloaded yet is left to the
    workers) must be those the set records. Another final norm or config.json as well: refused as another
    target. The weights alone: refused naming the field (``weights_refusal``), or with ``force`` accepted and
    recorded (identity.json's ``forced``, then the manifest's), the set recording this target's digest from
    now on. A set recorded before weights digests, of the same final norm and config.json: said to be checked
    by those only, and this target's digest recorded in identity.json from now on."""
    theirs = recorded_identity(store)
    mine = target_weights(cfg)
    if theirs is None or mine.sampled is None:
        return  # a new destination (the first worker records the identity), or no local weights yet
    why = WeightsDigest.of(theirs.target).differs(mine)
    legacy = not theirs.target.weights_sha256
    if why is None and not legacy:
        return
    folder = target_folder(cfg)
    name = str(cfg.hidden_states.model)
    if theirs.target.config_sha256 not in (None, config_digest(folder)) or \
            theirs.norm_weight_sha256 not in norm_digests(Path(folder)):
        raise RunDirError(f"{store.url}: extracted from {_describe(theirs)}, not {name} (its final norm or "
                          "config.json differ); use another hidden_states.output, or delete that destination to "
                          "start over")
    if legacy:
        echo(f"extract: {store.url} records no weights digest (made by an older draftgen): checked by its final "
             "norm and config.json only (the same); it records this target's weights digest from now on")
    elif not force:
        raise weights_refusal(store, name, why or "")
    else:
        echo(f"extract: --force: the target's weights differ from the set's ({why}); accepted and recorded "
             "(identity.json and manifest.json: forced)")
        theirs = msgspec.structs.replace(theirs, forced=sorted({*theirs.forced, "weights"}))
    target = msgspec.structs.replace(theirs.target, weights_sha256=mine.sampled, files_sha256=mine.files)
    store.write_identity(msgspec.structs.replace(theirs, target=target))


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
        check_identity(store, backend, target_weights(cfg))
    if done and backend is not None:
        first = next(iter(done.values()))
        s = store.read_sample(first.file)
        info = backend.info
        if s.dtype != hs.dtype or s.aux.shape[-1] != len(info.layers.aux) * info.hidden_size:
            raise RunDirError(f"{store.url}: its samples were written with dtype {s.dtype} and aux width "
                              f"{s.aux.shape[-1]}, not {hs.dtype} and {len(info.layers.aux) * info.hidden_size} "
                              f"(hidden_states.dtype / layer_ids); {fix}")

