"""The hidden-state set as a stream: a ``Sink`` takes batches of samples, a ``Source`` yields them back.

A sample on the stream is a ``StreamSample``: its id, its file (relative to the set's root), the file's
``draftgen.hidden/1`` bytes (``codec.encode_sample``: what is published and hashed, encoded once) and its
position; ``decode()`` gives its tensors (``LoadedSample``, float32). Samples extract makes also carry their
``HiddenIndexRecord`` (length, loss tokens, failed checks, teacher result, row and file digests).

- ``Sink``: ``write(batch)`` publishes a batch (in order), ``close(manifest)`` ends the stream with the set's
  ``HiddenManifest``. ``HiddenStore`` is one: ``write`` publishes each file atomically then ONE index part
  listing the batch (a sample is done once listed), ``close`` writes ``manifest.json`` last. The hidden
  exports (``hidden.exports``: speculators, specforge, modelopt) are sinks fed by a Source.
- ``Source`` (``open_source``): a finished set's samples in manifest (= merged train) order, flagged ones
  left out unless asked, and always the rows of a provider the extract's fidelity check flagged with
  ``fidelity_action: exclude`` (the manifest's ``checks.fidelity``: ``ProviderFidelity.excluded_sample_ids``),
  each file's bytes VERIFIED against the manifest's ``file_sha256`` before it is
  yielded (a changed file is one InputError naming it) and its header's sample id checked on decode.
  ``batches(n)`` groups them; ``token_rows()`` reads only each file's ``input_ids`` and ``loss_mask``
  (a local set: safetensors' lazy reader; the bytes are verified by whoever reads them in full). An online
  trainer consumes the same stream: iterate a Source (or feed a Sink from extract's own batches).
- ``hidden_url``: the ONE rule for where a config's set is (extract, export-hidden, train, the vllm backend).

Reads through ``HiddenStore`` only; writes nothing itself. torch and safetensors are imported on use.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from draftgen.errors import InputError
from draftgen.hidden.codec import SCHEMA, LoadedSample, decode_sample
from draftgen.hidden.format import HiddenSet, HiddenStore, require, storage_faults
from draftgen.records import HiddenIndexRecord, HiddenManifest, HiddenSampleEntry, parse_row_id

if TYPE_CHECKING:
    import torch

    from draftgen.config import RunConfig

__all__ = ["Sink", "Source", "StreamSample", "hidden_url", "open_source"]


def hidden_url(cfg: RunConfig, given: str | None = None) -> str:
    """Where a config's hidden set is: ``given`` (``train.hidden``) or ``hidden_states.output``; a URL
    (``scheme://``) as it is, a path made absolute from the config file's folder; default ``<run>/hidden``."""
    from draftgen.rundir import RunDir

    out = given or cfg.hidden_states.output
    if not out:
        return str(RunDir(cfg.run_path).hidden)
    return out if "://" in out else str(cfg.path(out).resolve())


@dataclass
class StreamSample:
    """One sample on the stream (see the module docstring). ``index``: its position in the stream (a
    Source's: the i-th selected sample of the manifest); ``record``: set by extract, None from a Source."""

    sample_id: str
    file: str
    data: bytes
    length: int
    index: int = 0
    record: HiddenIndexRecord | None = None
    where: str = ""  # the file's full path or URL, for errors

    def decode(self) -> LoadedSample:
        """The sample's tensors (aux/final dequantized to float32); the file must hold this sample (a weight
        repeat ``x#repN`` holds ``x``)."""
        s = decode_sample(self.data, self.where or self.file)
        if s.sample_id and s.sample_id not in (self.sample_id, parse_row_id(self.sample_id)[0]):
            raise InputError(f"{self.where or self.file}: holds sample {s.sample_id!r}, the manifest says "
                             f"{self.sample_id!r}; rerun draftgen extract")
        return s


class Sink(Protocol):
    """Takes batches of samples, in order, and closes with the set's manifest (see the module docstring)."""

    def write(self, batch: Sequence[StreamSample]) -> None: ...

    def close(self, manifest: HiddenManifest) -> None: ...


class Source:
    """A finished set's samples, verified, in manifest order (see the module docstring). ``entries``: the
    selected manifest entries (sample ``i`` is ``entries[i]``); ``flagged``: how many sample ids the
    manifest flags (left out unless ``include_flagged``); ``excluded``: provider -> its samples left out
    because the fidelity check flagged it (``fidelity_action: exclude``)."""

    def __init__(self, hset: HiddenSet, *, include_flagged: bool = False) -> None:
        self.hidden = hset
        self.store: HiddenStore = hset.store
        self.url = hset.store.url
        self.manifest = hset.manifest
        self.include_flagged = include_flagged
        flagged = set() if include_flagged else set(self.manifest.checks.flagged_sample_ids)
        self.flagged = len(flagged)
        fid = self.manifest.checks.fidelity
        dropped = {sid: p.provider for p in (fid.providers if fid is not None else []) for sid in p.excluded_sample_ids}
        self.excluded: dict[str, int] = {}
        self.entries: list[HiddenSampleEntry] = []
        for e in self.manifest.samples:
            if e.sample_id in dropped:
                self.excluded[dropped[e.sample_id]] = self.excluded.get(dropped[e.sample_id], 0) + 1
            elif e.sample_id not in flagged:
                self.entries.append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def sample(self, i: int) -> StreamSample:
        """Sample ``i``, its bytes verified (``HiddenSet.read_bytes``)."""
        e = self.entries[i]
        return StreamSample(sample_id=e.sample_id, file=e.file, data=self.hidden.read_bytes(e.file),
                            length=e.length, index=i, where=self.store.where(e.file))

    def __iter__(self) -> Iterator[StreamSample]:
        for i in range(len(self.entries)):
            yield self.sample(i)

    def batches(self, size: int) -> Iterator[list[StreamSample]]:
        """The samples in order, ``size`` at a time (the last batch may be shorter)."""
        batch: list[StreamSample] = []
        for s in self:
            batch.append(s)
            if len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    def token_rows(self) -> Iterator[tuple[int, HiddenSampleEntry, torch.Tensor, torch.Tensor]]:
        """(index, entry, input_ids, loss_mask) of each sample, reading only those two tensors of a local
        set's files (a remote set's files are read whole, and verified)."""
        for i, e in enumerate(self.entries):
            if not self.store.local:
                s = self.sample(i).decode()
                yield i, e, s.input_ids, s.loss_mask
                continue
            ids, mask = _ids_and_mask(self.store.path(e.file), e.sample_id)
            yield i, e, ids, mask


def _ids_and_mask(path: str, sample_id: str) -> tuple[Any, Any]:
    st = require("safetensors")
    with storage_faults(path), st.safe_open(path, framework="pt") as fh:
        meta = fh.metadata() or {}
        names = set(fh.keys())
        if meta.get("schema") != SCHEMA or not {"input_ids", "loss_mask", "aux", "final"} <= names:
            raise InputError(f"{path}: not a {SCHEMA} sample file; rerun draftgen extract for it")
        if meta.get("sample_id") and meta["sample_id"] not in (sample_id, parse_row_id(sample_id)[0]):
            raise InputError(f"{path}: holds sample {meta['sample_id']!r}, the manifest says {sample_id!r}")
        return fh.get_tensor("input_ids"), fh.get_tensor("loss_mask")


def open_source(url: str, storage_options: Mapping[str, Any] | None = None, *,
                include_flagged: bool = False) -> Source:
    """The Source of the finished set at ``url`` (its manifest.json must exist)."""
    return Source(HiddenSet(HiddenStore(url, storage_options)), include_flagged=include_flagged)
