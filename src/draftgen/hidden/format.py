"""The hidden-state format ``draftgen.hidden/1``: one safetensors file per sample, index parts, a manifest.

Layout at a destination root D (a local folder or any fsspec URL: ``s3://bucket/prefix``, ``memory://x``)::

    D/states/<k[:2]>/<k>.safetensors   k = sha256(sample_id)[:24]; tensors:
        input_ids  int64 [T]            exactly the merged row's ids
        loss_mask  uint8 [T]
        aux        [T, n_aux*H]         aux layers concatenated in ascending layer-id order
        final      [T, H]               PRE-norm final state (layer id L)
        aux_scale, final_scale float32 [T, 1]   fp8 only: value = fp8.float() * scale, scale = amax(|row|)/448
      metadata {"schema": "draftgen.hidden/1", "sample_id": ..., "dtype": ...}
    D/index/part-<h>.jsonl   h = sha256(the part's sorted sample ids)[:24]; HiddenIndexRecord lines, one part per batch
    D/manifest.json                                     HiddenManifest, written last

Storage dtype: bf16 (default) | fp16 | fp32 | fp8 (``torch.float8_e4m3fn`` with per-token float32 scales).
One sample's file (what a backend hands over, its stored values, bytes and digests) is ``hidden.codec``'s.

Ownership: ``D/.draftgen-hidden.json`` (``HiddenOwnerMarker``, kind ``hidden-set``) is written FIRST, through
the store's own put (so on object stores too); ``HiddenStore.claim`` refuses a non-empty destination without
it before anything there is written or deleted, and adopts a set made before markers existed (a valid
manifest.json or index part). Temps are removed only in a marked destination, and only names matching
``TEMP_PATTERN`` (the one pattern every draftgen temp file and folder is named by, ``temp_name``).

Atomicity: a sample is DONE when its file is published and listed in some index part. Publishing is
atomic: locally a temp file in the same folder (``.<name>.<16 hex>.tmp``, never read) then ``os.replace``;
on an object store one single put. Index parts and the manifest are published the same way, so a reader
never sees half a file; a published file no index lists is simply redone. The index lists each sample ONCE:
a part is named by the sample ids it lists (``index_part_name``), so a batch written again (a task Ray re-runs)
replaces its own part, and before a run writes anything ``HiddenStore.prune_index`` removes every record that
no longer counts (a sample about to be redone; an earlier record of a sample an older draftgen listed twice).
``HiddenStore.done`` is the union of all parts by sample_id, requiring the file to exist; each record
carries ``row_sha256`` (``row_digest``: the row's ids and mask) and ``file_sha256`` (``bytes_digest``), which
extract compares with the current merged row and (``corrupted``) the file, and ``HiddenSet.read_bytes``, the
one verifying read of a finished set (``hidden.stream.Source`` reads through it), checks against the manifest.
``HiddenStore`` is a ``hidden.stream.Sink``: ``write(batch)`` publishes the batch's files at once
(``PUBLISH_THREADS``), then one index part; ``close(manifest)`` writes the manifest, last. ``D/identity.json`` (HiddenIdentity) names the target
before the first sample; ``hidden.lock`` keeps one writer per destination.

torch, safetensors, numpy and fsspec are optional dependencies (``draftgen[extract]``), imported on use.
Credentials come from the AWS_* variables, AWS_PROFILE or a credentials file, never from ``storage_options``
or the URL (``HiddenStore`` refuses them, as the config loader does) and are never printed.

Storage faults: foreign exceptions raised at this boundary (fsspec/s3fs/botocore/aiohttp, safetensors,
torch, OSError) are translated into one-line draftgen errors naming the path or URL and the fix by ONE
table, ``_FAULTS`` (``storage_faults`` applies it); an exception no row matches propagates unchanged (a bug).
``read_safetensors`` / ``read_torch`` read other safetensors / torch files (connector files, checkpoints)
through the same table; ``atomic_write_bytes`` (``files.atomic_save`` of bytes, which export-hidden uses
itself) is the one local atomic writer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen import __version__
from draftgen.errors import ConfigError, InputError, RunDirError
from draftgen.hidden.codec import SCHEMA, LoadedSample, bytes_digest, decode_sample
from draftgen.hidden.files import (
    TEMP_PATTERN,
    BytesWriter,
    PartsWriter,
    atomic_save,
    atomic_write_bytes,
    is_temp,
    missing_bucket,
    open_temp,
    read_safetensors,
    read_torch,
    require,
    storage_faults,
    temp_name,
    translate_storage_error,
)
from draftgen.records import HiddenIdentity, HiddenIndexRecord, HiddenManifest, HiddenOwnerMarker
from draftgen.records.hidden import OWNER_HIDDEN_SET, OWNER_SCHEMA
from draftgen.rundir import HiddenLayout
from draftgen.store import decode_json, encode_json

if TYPE_CHECKING:

    from draftgen.hidden.stream import StreamSample

__all__ = [
    "IDENTITY",
    "TEMP_PATTERN",
    "HiddenSet",
    "HiddenStore",
    "atomic_write_bytes",
    "index_part_name",
    "is_temp",
    "open_hidden",
    "open_temp",
    "owner_marker",
    "read_owner_marker",
    "read_safetensors",
    "read_torch",
    "require",
    "sample_key",
    "sample_path",
    "storage_faults",
    "temp_name",
    "translate_storage_error",
]

IDENTITY = "identity.json"  # HiddenIdentity, written before the first sample
PUBLISH_THREADS = 8  # files of one batch published at once (bench_extract: write_throughput_vs_sequential)


def owner_marker(kind: str, *, adopted: bool = False) -> bytes:
    """The bytes of a new owner marker of ``kind`` (records.hidden ``OWNER_*``)."""
    m = HiddenOwnerMarker(kind=kind, schema=OWNER_SCHEMA, created_at=round(time.time(), 3),
                          draftgen_version=__version__, adopted=adopted)
    return msgspec.json.format(encode_json(m), indent=2) + b"\n"


def read_owner_marker(data: bytes, kind: str, where: str) -> HiddenOwnerMarker:
    """A marker's record; RunDirError when it is unreadable or marks another kind of folder."""
    try:
        m = decode_json(data, HiddenOwnerMarker, where=where)
    except InputError as exc:
        raise RunDirError(f"{where}: unreadable owner marker ({exc}); move it away or use another folder") from None
    if m.kind != kind:
        raise RunDirError(f"{where}: marks a draftgen {m.kind} folder, not a {kind}; use another folder")
    return m


def sample_key(sample_id: str) -> str:
    return hashlib.sha256(sample_id.encode()).hexdigest()[:24]


def sample_path(sample_id: str) -> str:
    """The sample's file relative to the destination root: ``states/ab/ab....safetensors``."""
    k = sample_key(sample_id)
    return f"{HiddenLayout.states}/{k[:2]}/{k}.safetensors"


def _mtime(info: Mapping[str, Any]) -> float | None:
    """A listing entry's modification time in seconds (local ``mtime``, s3 ``LastModified``, memory
    ``created``), or None when the filesystem gives none."""
    for key in ("mtime", "LastModified", "created"):
        v = info.get(key)
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, datetime):
            return v.timestamp()
    return None


def index_part_name(sample_ids: Iterable[str]) -> str:
    """The index part of a batch, relative to the root: ``index/part-<sha256 of its sorted sample ids>[:24].jsonl``
    (one name per set of samples, so writing a batch again replaces its part)."""
    h = hashlib.sha256("\n".join(sorted(sample_ids)).encode()).hexdigest()[:24]
    return f"{HiddenLayout.index}/part-{h}.jsonl"


class HiddenStore:
    """One hidden-state destination, local path or fsspec URL (see the module docstring)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        from draftgen.secrets import storage_credentials

        why = storage_credentials(url, dict(storage_options or {}), url_key="the hidden-state URL",
                                  options_key="storage_options")
        if why:
            raise ConfigError(why)
        fsspec = require("fsspec", "s3" if "://" in url and not url.startswith("file://") else "extract")
        try:
            with storage_faults(url):
                fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as exc:  # e.g. s3fs missing for s3://
            raise ConfigError(f"hidden_states.output {url!r}: {exc}; pip install 'draftgen[s3]'") from None
        self.url = url
        self.fs = fs
        self.root = str(root).rstrip("/")
        self.local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def where(self, rel: str) -> str:
        """``rel``'s full path or URL (for messages)."""
        return f"{self.url.rstrip('/')}/{rel}" if rel else self.url

    # -- writing
    def _put(self, rel: str, data: bytes | list[Any]) -> None:
        """Publish ``data`` (bytes, or the buffers a file is made of, in order) at ``rel`` atomically."""
        if self.local:
            atomic_save(self.path(rel), BytesWriter(data) if isinstance(data, bytes) else PartsWriter(data))
            return
        with storage_faults(self.where(rel), "write"):  # one put: the object appears whole or not at all
            self.fs.pipe_file(self.path(rel), data if isinstance(data, bytes) else b"".join(data))

    def publish(self, sample_id: str, data: bytes | list[Any]) -> str:
        """Publish one sample's bytes (or ``sample_parts``) atomically; returns its path relative to the root."""
        rel = sample_path(sample_id)
        self._put(rel, data)
        return rel

    def write_index_part(self, records: list[HiddenIndexRecord]) -> str:
        """The index part listing ``records`` (their files already published); returns its relative path. The
        part is named by the sample ids it lists (``index_part_name``): the same batch written again (a task
        Ray re-runs after its actor was killed) replaces its own part instead of listing its samples twice."""
        if not records:
            return ""
        rel = index_part_name(r.sample_id for r in records)
        self._put(rel, b"".join(encode_json(r) + b"\n" for r in records))
        return rel

    def write_manifest(self, m: HiddenManifest) -> None:
        self._put(HiddenLayout.manifest, msgspec.json.format(encode_json(m), indent=2) + b"\n")

    # -- the store as a Sink (``hidden.stream``)
    def write(self, batch: Sequence[StreamSample]) -> None:
        """Publish each sample's file (``PUBLISH_THREADS`` at a time), then ONE index part listing the batch
        (each sample needs its ``record``): a sample is done once listed, so a death before that costs a redo."""
        records: list[HiddenIndexRecord] = []
        for s in batch:
            if s.record is None:
                raise ValueError(f"{s.sample_id}: a sample without its index record cannot be stored")
            records.append(s.record)
        if len(batch) > 1:  # the files at once: their fsyncs (or puts) overlap, near the disk's sequential rate
            with ThreadPoolExecutor(min(PUBLISH_THREADS, len(batch)), thread_name_prefix="draftgen-publish") as ex:
                list(ex.map(lambda s: self._put(s.file, s.data), batch))
        elif batch:
            self._put(batch[0].file, batch[0].data)
        self.write_index_part(records)

    def close(self, manifest: HiddenManifest) -> None:
        """End of the stream: ``manifest.json``, written last."""
        self.write_manifest(manifest)

    # -- reading
    def _list(self, rel: str) -> list[str]:
        with storage_faults(self.where(rel), "list"):
            try:
                return [str(p) for p in self.fs.find(self.path(rel))]
            except FileNotFoundError as exc:
                if missing_bucket(exc):
                    raise
                return []  # nothing written there yet

    def index_parts(self) -> list[str]:
        return sorted(p for p in self._list(HiddenLayout.index)
                      if os.path.basename(p).startswith("part-") and p.endswith(".jsonl"))

    def _parts(self) -> Iterator[tuple[str, float | None, list[tuple[bytes, HiddenIndexRecord]]]]:
        """Every index part in name order: its path relative to the root, its modification time (None:
        unknown) and its (line, record) pairs."""
        info = self._find_detail(HiddenLayout.index)
        for part in self.index_parts():
            rel = part[len(self.root) + 1:]
            with storage_faults(self.where(rel)):
                lines = self.fs.cat_file(part).splitlines()
            recs = [(line, decode_json(line, HiddenIndexRecord, where=f"{self.where(rel)}:{lineno}"))
                    for lineno, line in enumerate(lines, 1) if line.strip()]
            yield rel, _mtime(info.get(rel, {})), recs

    def done(self) -> dict[str, HiddenIndexRecord]:
        """Samples done: listed in some index part and whose published file exists, each sample ONCE (in a
        set an older draftgen wrote, a re-run task may list it twice: the last record, in part name order,
        wins; ``prune_index`` removes the others). ``self.suspect`` holds the sample ids whose file was
        modified after the part listing it was written (or whose times are unknown): ``corrupted`` checks
        their bytes. ``self.listed``: how many records the parts hold in all."""
        out: dict[str, HiddenIndexRecord] = {}
        when: dict[str, float | None] = {}
        self.listed = 0
        for _, mtime, recs in self._parts():
            self.listed += len(recs)
            for _, rec in recs:
                out[rec.sample_id] = rec
                when[rec.sample_id] = mtime
        self.suspect: set[str] = set()
        if out:
            published = self._find_detail(HiddenLayout.states)
            out = {sid: r for sid, r in out.items() if r.file in published}
            for sid, r in out.items():
                file_t, part_t = _mtime(published[r.file]), when[sid]
                if file_t is None or part_t is None or file_t > part_t:
                    self.suspect.add(sid)
        return out

    def prune_index(self, keep: Mapping[str, HiddenIndexRecord]) -> int:
        """Make the index list exactly ``keep`` (a subset of ``done()``: the records still valid), each
        sample once: every other record (an earlier record of a sample listed twice, a record of a sample
        about to be redone or whose file is gone) is removed from its part, each changed part rewritten
        atomically (removed when nothing is left). A kept sample's last record is never touched, so a death
        here leaves each kept sample listed; what is removed was not done anyway. Returns the records removed.
        Call it holding the destination (``hidden.lock``), before anything is written."""
        parts = list(self._parts())
        last = {rec.sample_id: (p, i) for p, (_, _, recs) in enumerate(parts) for i, (_, rec) in enumerate(recs)}
        removed = 0
        for p, (rel, _, recs) in enumerate(parts):
            lines = [line for i, (line, rec) in enumerate(recs)
                     if rec.sample_id in keep and last[rec.sample_id] == (p, i)]
            if len(lines) == len(recs):
                continue
            removed += len(recs) - len(lines)
            if lines:
                self._put(rel, b"".join(line + b"\n" for line in lines))
            else:
                with storage_faults(self.where(rel), "write"):
                    self.fs.rm_file(self.path(rel))
        return removed

    def corrupted(self, done: Mapping[str, HiddenIndexRecord]) -> list[str]:
        """The sample ids of ``done`` (among ``self.suspect``: modified after indexing) whose file bytes no
        longer match the recorded ``file_sha256`` (read and hashed; records without one are not checked)."""
        suspect = getattr(self, "suspect", set(done))
        bad: list[str] = []
        for sid, rec in done.items():
            if sid in suspect and rec.file_sha256 and bytes_digest(self.read_bytes(rec.file)) != rec.file_sha256:
                bad.append(sid)
        return bad

    def _find_detail(self, rel: str) -> dict[str, dict[str, Any]]:
        """``rel``'s files (relative to the root) → their listing info (size, mtime / LastModified)."""
        with storage_faults(self.where(rel), "list"):
            try:
                found = self.fs.find(self.path(rel), detail=True)
            except FileNotFoundError as exc:
                if missing_bucket(exc):
                    raise
                return {}
        return {str(p)[len(self.root) + 1:]: dict(i) for p, i in found.items()}

    def read_identity(self) -> HiddenIdentity | None:
        """``identity.json`` (the target of every sample), or None before the first sample."""
        where = self.where(IDENTITY)
        with storage_faults(where):
            if not self.fs.exists(self.path(IDENTITY)):
                return None
            data = self.fs.cat_file(self.path(IDENTITY))
        return decode_json(data, HiddenIdentity, where=where)

    def write_identity(self, ident: HiddenIdentity) -> None:
        self._put(IDENTITY, msgspec.json.format(encode_json(ident), indent=2) + b"\n")

    def read_bytes(self, rel: str) -> bytes:
        where = self.where(rel)
        with storage_faults(where):
            try:
                data: bytes = self.fs.cat_file(self.path(rel))
            except FileNotFoundError as exc:
                if missing_bucket(exc):
                    raise
                raise InputError(f"{where}: file not found") from None
        return data

    def read_verified(self, rel: str, sha256: str = "") -> bytes:
        """The bytes at ``rel``; with ``sha256`` (the index's / manifest's ``file_sha256``) verified: a
        mismatch is one InputError naming the file and the fix."""
        data = self.read_bytes(rel)
        if sha256 and bytes_digest(data) != sha256:
            raise InputError(f"{self.where(rel)}: changed after extraction (sha256 {bytes_digest(data)[:12]}…, "
                             f"the index recorded {sha256[:12]}…); rerun draftgen extract (it redoes that sample)")
        return data

    def read_sample(self, rel: str, sha256: str = "") -> LoadedSample:
        """The sample at ``rel`` (``read_verified``, decoded)."""
        return decode_sample(self.read_verified(rel, sha256), self.where(rel))

    def has_manifest(self) -> bool:
        with storage_faults(self.where(HiddenLayout.manifest)):
            return bool(self.fs.exists(self.path(HiddenLayout.manifest)))

    def read_manifest(self) -> HiddenManifest:
        where = self.where(HiddenLayout.manifest)
        with storage_faults(where):
            try:
                data = self.fs.cat_file(self.path(HiddenLayout.manifest))
            except FileNotFoundError as exc:
                if missing_bucket(exc):
                    raise
                raise InputError(f"{where}: no manifest; run draftgen extract first (or let it finish)") from None
        return decode_json(data, HiddenManifest, where=where)

    # -- ownership
    def owned(self) -> bool:
        """Whether the destination holds draftgen's owner marker."""
        return bool(self.fs.exists(self.path(HiddenLayout.marker)))

    def claim(self) -> None:
        """Make the destination draftgen's before anything there is written or deleted: a marked one is
        checked, an absent or empty one gets the marker (first write), one made before markers (a valid
        manifest.json or index part) is adopted; any other non-empty destination is refused (RunDirError)."""
        with storage_faults(self.url, "open"):
            self._claim()

    def _claim(self) -> None:
        where = self.where(HiddenLayout.marker)
        if self.owned():
            read_owner_marker(self.fs.cat_file(self.path(HiddenLayout.marker)), OWNER_HIDDEN_SET, where)
            return
        adopted = self._made_by_draftgen()
        if not adopted and not self._is_empty():
            raise RunDirError(f"{self.url}: this destination is not empty and was not made by draftgen (it has no "
                              f"{HiddenLayout.marker}); draftgen writes hidden states only into its own "
                              "destinations: set hidden_states.output (--output) to a new or empty folder")
        self._put(HiddenLayout.marker, owner_marker(OWNER_HIDDEN_SET, adopted=adopted))

    def _made_by_draftgen(self) -> bool:
        """A set written before owner markers: its manifest.json, or its first index part, decodes."""
        try:
            if self.has_manifest():
                return self.read_manifest().schema == SCHEMA
            parts = self.index_parts()
            if parts:
                first = next((ln for ln in self.fs.cat_file(parts[0]).splitlines() if ln.strip()), b"")
                decode_json(first, HiddenIndexRecord, where=parts[0])
                return True
        except (InputError, OSError):
            return False
        return False

    def _is_empty(self) -> bool:
        if self.local:
            if os.path.exists(self.root) and not os.path.isdir(self.root):
                raise RunDirError(f"{self.url}: is a file, not a folder; set hidden_states.output to a folder")
            # a death while the marker itself was written leaves only its temp: still empty
            return not os.path.isdir(self.root) or all(is_temp(n, HiddenLayout.marker) for n in os.listdir(self.root))
        try:
            return not self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return True

    def clean_temps(self) -> int:
        """Remove the temp files a killed local writer left behind (they never count); returns how many.
        Only in a destination that holds draftgen's marker (``claim`` first), only names ``is_temp`` matches."""
        if not self.local or not self.owned():
            return 0
        n = 0
        tops = [os.path.join(self.root, p) for p in os.listdir(self.root)]
        for p in tops + self._list(HiddenLayout.states) + self._list(HiddenLayout.index):
            if is_temp(os.path.basename(p)) and os.path.isfile(p):
                with contextlib.suppress(OSError):
                    os.unlink(p)
                    n += 1
        return n


class HiddenSet:
    """A finished hidden-state destination: its manifest and its samples in manifest (merged train) order."""

    def __init__(self, store: HiddenStore) -> None:
        self.store = store
        self.manifest = store.read_manifest()
        self._sha = {e.file: e.file_sha256 for e in self.manifest.samples if e.file_sha256}

    def __len__(self) -> int:
        return len(self.manifest.samples)

    def read_bytes(self, rel: str) -> bytes:
        """The ONE verifying read (export-hidden, train, ``stream.Source``): the file's bytes, checked against
        the manifest's ``file_sha256``."""
        return self.store.read_verified(rel, self._sha.get(rel, ""))

    def read_sample(self, rel: str) -> LoadedSample:
        """``read_bytes``, decoded."""
        return decode_sample(self.read_bytes(rel), self.store.where(rel))

    def samples(self) -> Iterator[LoadedSample]:
        for e in self.manifest.samples:
            yield self.read_sample(e.file)


def open_hidden(url: str, storage_options: Mapping[str, Any] | None = None) -> HiddenSet:
    """Open a destination ``draftgen extract`` finished (its manifest.json must exist)."""
    return HiddenSet(HiddenStore(url, storage_options))
