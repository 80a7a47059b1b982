"""Hidden states in the peer trainers' offline formats (``draftgen export-hidden``, and ``draftgen train``).

``export_hidden(source, kinds, out)`` is the entry point; each format is one ``HiddenExporter`` in
``HIDDEN_EXPORTERS`` (a ``draftgen.registry.Registry`` keyed by ``export-hidden --format``), registered with
``@register_hidden_exporter`` like a plugin's would be.

Each format is a SINK fed by a ``hidden.stream.Source``: the finished ``draftgen.hidden/1`` set's samples,
each file's bytes verified, in manifest = extraction = merged train order, ``EXPORT_BATCH`` at a time
(``ExportSink.write``), then ``ExportSink.close`` for what needs them all (speculators' Arrow dataset and
token counts). One folder per format, each sample ``i`` being the i-th sample of the manifest (flagged
samples left out unless asked), so provenance holds: every folder
also gets ``sample_ids.jsonl`` (``HiddenExportSample`` lines: index, sample_id, file) and, written last,
``export.json`` (``HiddenExportReport``: every file written, with its size and sha256). A rerun into a folder
whose report matches the same hidden set verifies what it lists (each file there, of its size, and of its
sha256 when modified since the export) and, when something is broken, rewrites those files from the set
(a per-sample file through the format's own sink; anything else by writing the whole export again),
saying what it repaired; an intact folder is up to date.

- ``speculators`` (speculators 0.9 ``--data-path``): ``hidden_states/hs_{i}.safetensors`` with
  ``hidden_states`` [T, n_aux+1, H] (aux slots ascending, then the PRE-norm final; speculators applies the
  verifier norm itself) and ``token_ids`` int64 [T], in the model dtype (bf16 for an fp8 set); the HF Arrow
  dataset (``datasets.save_to_disk``: ``input_ids`` int64, ``loss_mask`` int64, ``seq_len``; torch format);
  ``token_freq.pt`` (``torch.save`` {token id: count} over loss_mask == 1).
- ``specforge`` (SpecForge offline ``build_offline_eagle3_dataset``): ``rows_{g}-{g+2000}/data_{i}.ckpt``
  (``torch.save`` dict: ``input_ids`` [T], ``loss_mask`` [T], ``hidden_state`` [1, T, H] POST-norm,
  ``aux_hidden_state`` [1, T, n_aux*H]).
- ``modelopt`` (Model-Optimizer offline EAGLE-3 ``.pt``): ``{conversation_id}.pt`` (``torch.save`` dict:
  ``input_ids`` [T], ``hidden_states`` [T, H] POST-norm, ``aux_hidden_states`` [T, n_aux*H], ``loss_mask``
  [T], ``conversation_id``); the file name is the sample_id when it is a plain name, else its sample key.

The export folder itself (its ownership marker, the listing the next export removes, the journal of an export
in progress, and the verification of a rerun) is ``hidden.export_folder``'s; the speculators format's Arrow
dataset, ``token_freq.pt`` and the ``sample_ids.jsonl`` listing are written by ``hidden.speculators``, the one
writer of speculators' inputs (``train`` uses it too).

POST-norm = the target's final RMSNorm (``hidden.norm``: ``model.norm`` weight and eps, read from the target
model folder; the weight's sha256 must equal the manifest's ``norm_weight_sha256``) applied to the stored
pre-norm final.
Files are published atomically (temp ``.<name>.<hex>.tmp`` + rename). torch/safetensors/datasets are imported on use.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from draftgen.errors import ConfigError, InputError, RunDirError
from draftgen.hidden.codec import LoadedSample
from draftgen.hidden.export_folder import (
    EXPORT_JOURNAL,
    EXPORT_MARKER,
    EXPORT_REPORT,
    broken_files,
    claim_and_clear,
    describe_broken,
    inside,
    keep_up_to_date,
    publish_report,
    up_to_date,
)
from draftgen.hidden.files import BytesWriter, atomic_save, file_digest
from draftgen.hidden.format import require, sample_key
from draftgen.hidden.norm import FinalNorm, load_final_norm
from draftgen.hidden.speculators import SAMPLE_IDS, TOKEN_FREQ, SpeculatorsInputs, sample_ids, torch_bytes
from draftgen.hidden.stream import Sink, Source, StreamSample, hidden_url, open_source
from draftgen.records import HiddenExportReport, HiddenExportSample, HiddenManifest
from draftgen.registry import Registry
from draftgen.store import encode_json, iter_jsonl

if TYPE_CHECKING:
    import torch

    from draftgen.config import RunConfig

# The names of an export folder a plugin's sink and its tests read (their homes: export_folder, speculators).
__all__ = [
    "EXPORT_JOURNAL",
    "EXPORT_MARKER",
    "EXPORT_REPORT",
    "HIDDEN_EXPORTERS",
    "SAMPLE_IDS",
    "SPECULATORS_STATES",
    "TOKEN_FREQ",
    "ExportContext",
    "ExportSink",
    "HiddenExporter",
    "default_export_dir",
    "export_hidden",
    "manifest_fingerprint",
    "modelopt_name",
    "register_hidden_exporter",
]

SPECULATORS_STATES = "hidden_states"  # the speculators export's folder of per-sample files
SPECFORGE_GROUP = 2000
EXPORT_BATCH = 8  # samples a sink gets at a time (their decoded states are held together)


@dataclass
class ExportContext:
    """What a format's sink gets: the Source (the set's samples, verified, in manifest order; sample ``i``
    goes to export index ``i``), its manifest, the output folder and, for formats that need it, the target's
    final norm. ``files``: the per-sample files written, in sample order (``sample_ids.jsonl`` lists them)."""

    source: Source
    manifest: HiddenManifest
    out: Path
    dtype: Any  # torch dtype of the written states
    norm: FinalNorm | None = None
    files: list[str] = field(default_factory=list)
    tokens: int = 0
    written: list[str] = field(default_factory=list)  # every file ``save`` wrote, in order
    digests: dict[str, tuple[int, str]] = field(default_factory=dict)  # rel → (size, sha256) of what save wrote

    def save(self, rel: str, write: Callable[[str], None]) -> None:
        """Publish ``out/rel`` atomically through ``write(tmp)``, listed for the next export to remove, and
        note its size and sha256 (``export.json`` records them; a rerun verifies them). A file already there
        is not draftgen's (not in ``written``: the previous listing was removed, or a repair lists what it
        may replace): refused, left alone."""
        path = self.out / rel
        if rel not in self.written and (path.exists() or path.is_symlink()):
            raise RunDirError(f"{path}: exists and no earlier export into {self.out} wrote it; draftgen does not "
                              "overwrite a file it did not write: move it away, or give --out a new folder")
        with open(self.out / EXPORT_JOURNAL, "a", encoding="utf-8") as fh:  # before the write: a death keeps it
            fh.write(rel + "\n")
        atomic_save(path, write)
        if rel not in self.written:
            self.written.append(rel)
        data = write.data if isinstance(write, BytesWriter) else None
        self.digests[rel] = (len(data), hashlib.sha256(data).hexdigest()) if data is not None else file_digest(path)

    def post_norm(self, final: torch.Tensor) -> torch.Tensor:
        if self.norm is None:
            raise ConfigError("this export needs the target's final norm; give the target model folder")
        return self.norm.apply(final)


class ExportSink:
    """One format's sink (``hidden.stream.Sink``): ``write(batch)`` gets the Source's samples in order
    (``s.index``: the export index, ``s.sample_id``, ``s.decode()``: the tensors) and writes one per-sample
    file each (ending in ``.safetensors``, ``.ckpt`` or ``.pt``) through ``ctx.save``, listed in
    ``ctx.files`` in sample order, so a death mid-export leaves nothing a rerun cannot remove;
    ``close(manifest)`` writes what needs every sample (the default: nothing)."""

    def __init__(self, ctx: ExportContext) -> None:
        self.ctx = ctx

    def write(self, batch: Sequence[StreamSample]) -> None:
        raise NotImplementedError

    def close(self, manifest: HiddenManifest) -> None:
        return None


@dataclass(frozen=True)
class HiddenExporter:
    """One hidden-state format: ``sink(ctx)`` makes its ``ExportSink``; ``needs_norm``: it writes post-norm
    states, so the target's final norm is loaded into ``ctx.norm``."""

    sink: Callable[[ExportContext], ExportSink]
    needs_norm: bool = False


#: ``export-hidden --format`` name → its ``HiddenExporter``, in registration order (no config key names
#: these: the CLI's ``--format`` and ``draftgen train``, which writes ``speculators``, do).
HIDDEN_EXPORTERS: Registry[HiddenExporter] = Registry("export-hidden --format", "hidden export format")

S = TypeVar("S", bound=type[ExportSink])


def register_hidden_exporter(name: str, *, needs_norm: bool = False, doc: str = "") -> Callable[[S], S]:
    """Register the ``ExportSink`` subclass it decorates as the hidden-state export format ``name`` (written
    to ``ctx.out``); a name already registered is a ConfigError. ``HIDDEN_EXPORTERS.unregister(name)``
    removes it again."""

    def deco(cls: S) -> S:
        HIDDEN_EXPORTERS.register(name, HiddenExporter(cls, needs_norm), doc=doc)
        return cls

    return deco


# -- helpers -------------------------------------------------------------------------------------------------


def _torch_writer(obj: Any) -> BytesWriter:
    return BytesWriter(torch_bytes(obj))


def _split_aux(s: LoadedSample, n_aux: int) -> torch.Tensor:
    t, width = s.aux.shape
    if width % n_aux:
        raise InputError(f"{s.sample_id}: aux width {width} is not a multiple of {n_aux} layers")
    return s.aux.reshape(t, n_aux, width // n_aux)


def manifest_fingerprint(m: HiddenManifest) -> str:
    return hashlib.sha256(encode_json(m)).hexdigest()[:16]


def _out_dtype(m: HiddenManifest) -> Any:
    torch = require("torch")
    return {"fp16": torch.float16, "fp32": torch.float32}.get(m.dtype, torch.bfloat16)


# -- the formats ---------------------------------------------------------------------------------------------


@register_hidden_exporter("speculators", doc="speculators 0.9 --data-path: hidden_states/hs_{i}.safetensors "
                          "[T, n_aux+1, H] (pre-norm final last), the Arrow dataset, token_freq.pt")
class SpeculatorsSink(ExportSink):
    def __init__(self, ctx: ExportContext) -> None:
        super().__init__(ctx)
        self.inputs = SpeculatorsInputs(narrow=False)

    def write(self, batch: Sequence[StreamSample]) -> None:
        torch = require("torch")
        st = require("safetensors.torch")
        ctx = self.ctx
        n_aux = len(ctx.manifest.layer_ids.aux)
        for item in batch:
            s = item.decode()
            hs = torch.cat([_split_aux(s, n_aux), s.final[:, None, :]], dim=1).to(ctx.dtype).contiguous()
            tensors = {"hidden_states": hs, "token_ids": s.input_ids.to(torch.int64).contiguous()}
            rel = f"{SPECULATORS_STATES}/hs_{item.index}.safetensors"
            ctx.save(rel, BytesWriter(st.save(tensors)))  # bytes in memory, as save_file writes them
            ctx.files.append(rel)
            self.inputs.add(s.input_ids.tolist(), s.loss_mask.to(torch.int64).tolist())

    def close(self, manifest: HiddenManifest) -> None:
        self.inputs.write(self.ctx.out, self.ctx.save)  # sample_ids.jsonl: written for every format


@register_hidden_exporter("specforge", needs_norm=True, doc="SpecForge offline: rows_{g}-{g+2000}/data_{i}.ckpt "
                          "(input_ids, loss_mask, post-norm hidden_state [1,T,H], aux_hidden_state [1,T,3H])")
class SpecForgeSink(ExportSink):
    def write(self, batch: Sequence[StreamSample]) -> None:
        torch = require("torch")
        ctx = self.ctx
        for item in batch:
            s, i = item.decode(), item.index
            g = (i // SPECFORGE_GROUP) * SPECFORGE_GROUP
            rel = f"rows_{g}-{g + SPECFORGE_GROUP}/data_{i}.ckpt"
            ctx.save(rel, _torch_writer({
                "input_ids": s.input_ids.to(torch.int64),
                "loss_mask": s.loss_mask.to(torch.int64),
                "hidden_state": ctx.post_norm(s.final).to(ctx.dtype)[None].contiguous(),
                "aux_hidden_state": s.aux.to(ctx.dtype)[None].contiguous(),
            }))
            ctx.files.append(rel)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,120}")


def modelopt_name(sample_id: str) -> str:
    """The ``.pt`` file stem of a sample: its id when that is a plain file name, else its sample key."""
    return sample_id if _PLAIN_NAME.fullmatch(sample_id) else sample_key(sample_id)


@register_hidden_exporter("modelopt", needs_norm=True, doc="Model-Optimizer offline: {conversation_id}.pt "
                          "(input_ids, post-norm hidden_states [T,H], aux_hidden_states [T,3H], loss_mask, "
                          "conversation_id)")
class ModelOptSink(ExportSink):
    def write(self, batch: Sequence[StreamSample]) -> None:
        torch = require("torch")
        ctx = self.ctx
        for item in batch:
            s = item.decode()
            rel = f"{modelopt_name(item.sample_id)}.pt"
            ctx.save(rel, _torch_writer({
                "input_ids": s.input_ids.to(torch.int64),
                "hidden_states": ctx.post_norm(s.final).to(ctx.dtype).contiguous(),
                "aux_hidden_states": s.aux.to(ctx.dtype).contiguous(),
                "loss_mask": s.loss_mask.to(torch.int64),
                "conversation_id": item.sample_id,
            }))
            ctx.files.append(rel)


# -- the entry point -----------------------------------------------------------------------------------------


def default_export_dir(cfg: RunConfig, kind: str) -> Path:
    from draftgen.rundir import RunDir

    return RunDir(cfg.run_path).hidden_exports / kind


def _target_dir(cfg: RunConfig | None, manifest: HiddenManifest, given: str | Path | None) -> Path | None:
    if given is not None:
        return Path(given)
    if cfg is not None and cfg.hidden_states.model and cfg.path(cfg.hidden_states.model).is_dir():
        return cfg.path(cfg.hidden_states.model)
    p = Path(manifest.target.name)
    return p if p.is_dir() else None


def _out_folder(cfg: RunConfig | None, out_dir: str | Path | None, kind: str, n_kinds: int) -> Path:
    if out_dir is None:
        if cfg is None:
            raise ConfigError("give --out: where to write the export (no config names a run directory)")
        return default_export_dir(cfg, kind)
    return Path(out_dir) / kind if n_kinds > 1 else Path(out_dir)


def export_hidden(source: RunConfig | str, kinds: list[str], out_dir: str | Path | None = None, *,
                  hidden: str | None = None, target_dir: str | Path | None = None,
                  include_flagged: bool = False,
                  storage_options: dict[str, Any] | None = None,
                  echo: Callable[[str], None] | None = None) -> list[HiddenExportReport]:
    """Write the hidden set of ``source`` (a config, or a hidden-set URL/path) in each format of ``kinds``.

    ``out_dir``: the output folder (with several kinds, one subfolder per kind); default
    ``<run>/hidden-exports/<kind>`` for a config. ``hidden``: another hidden set than the config's. ``target_dir``: the target model folder, for the final norm
    (default: ``hidden_states.model``, else the manifest's target name when it is a local folder).
    Each folder must be draftgen's, new or empty (see the module docstring: ownership)."""
    from draftgen.config import RunConfig

    if not kinds:
        raise ConfigError(f"{HIDDEN_EXPORTERS.key}: give at least one of {', '.join(HIDDEN_EXPORTERS.names())}")
    specs = {kind: HIDDEN_EXPORTERS.get(kind) for kind in kinds}  # every name checked before anything is read
    cfg = source if isinstance(source, RunConfig) else None
    url = hidden or (hidden_url(cfg) if cfg is not None else str(source))
    opts = storage_options if storage_options is not None else (
        {k: v for k, v in cfg.hidden_states.storage_options.items()} if cfg is not None else None)
    src = open_source(url, opts, include_flagged=include_flagged)
    m = src.manifest
    if not len(src):
        raise InputError(f"{url}: no sample to export ({len(m.samples)} in the manifest, {src.flagged} flagged)")
    fingerprint = manifest_fingerprint(m)
    say = echo or (lambda s: None)
    return [_export_one(cfg, src, specs[kind], kind, _out_folder(cfg, out_dir, kind, len(kinds)), url, fingerprint,
                        target_dir, say)
            for kind in kinds]


def _export_one(cfg: RunConfig | None, src: Source, spec: HiddenExporter, kind: str, out: Path, url: str,
                fingerprint: str, target_dir: str | Path | None, say: Callable[[str], None]) -> HiddenExportReport:
    """One format into ``out``. A folder whose ``export.json`` matches the set is verified (``broken_files``): intact,
    it is up to date; else what is broken is rewritten from the set (``_repair``), or, when that cannot be
    done file by file, the whole export is written again. Any other folder is cleared and written."""
    m = src.manifest
    done = up_to_date(out, kind, fingerprint, src.include_flagged)
    broken: dict[str, str] = {}
    if done is not None:
        keep_up_to_date(out, done)
        broken = broken_files(out, done)
        if not broken:
            say(f"export-hidden {kind}: {out} is up to date ({done.samples} samples)")
            return done
    norm = None
    if spec.needs_norm:
        tdir = _target_dir(cfg, m, target_dir)
        if tdir is None:
            raise ConfigError(f"export {kind}: the post-norm final state needs the target model folder: set "
                              "hidden_states.model or pass --target DIR")
        norm = load_final_norm(tdir, m)
    if done is not None:
        what = describe_broken(broken, done)
        fixed = _repair(ExportContext(source=src, manifest=m, out=out, dtype=_out_dtype(m), norm=norm,
                                      written=list(done.files)), spec, done, broken)
        if fixed is not None:
            say(f"export-hidden {kind}: {out}: {what}; rewrote them from the hidden set: up to date "
                f"({fixed.samples} samples)")
            return fixed
        say(f"export-hidden {kind}: {out}: {what}; writing the whole export again")
    claim_and_clear(out)
    ctx = ExportContext(source=src, manifest=m, out=out, dtype=_out_dtype(m), norm=norm)
    return _write_export(ctx, spec, kind, url, fingerprint, say)


def _repair(ctx: ExportContext, spec: HiddenExporter, done: HiddenExportReport,
            broken: dict[str, str]) -> HiddenExportReport | None:
    """Rewrite the broken per-sample files from the set (the samples ``sample_ids.jsonl`` maps them to, through
    the format's own sink) and record their new sizes and digests in ``export.json``; None, having written
    nothing, when something else is broken (``sample_ids.jsonl``, a file made from every sample: the Arrow
    dataset, ``token_freq.pt``) or the export predates listings: then the whole export is written again."""
    if not done.files or SAMPLE_IDS in broken:
        return None
    try:
        index = {s.file: s.index for _, s in iter_jsonl(ctx.out / SAMPLE_IDS, HiddenExportSample)}
    except InputError:
        return None
    if not all(rel in index for rel in broken):
        return None
    sink = spec.sink(ctx)
    todo = sorted(index[rel] for rel in broken)
    for k in range(0, len(todo), EXPORT_BATCH):
        sink.write([ctx.source.sample(i) for i in todo[k:k + EXPORT_BATCH]])
    if sorted(ctx.files) != sorted(broken):
        raise RuntimeError(f"export: rewrote {sorted(ctx.files)[:3]} for {sorted(broken)[:3]}: the format names its "
                           "files otherwise than its export did")
    sizes, sha = _recorded(ctx, ctx.files)
    rep = msgspec.structs.replace(done, sizes={**done.sizes, **sizes}, sha256={**done.sha256, **sha})
    publish_report(ctx.out, rep)
    return rep


def _recorded(ctx: ExportContext, files: Sequence[str]) -> tuple[dict[str, int], dict[str, str]]:
    """The size and sha256 of each of ``files`` but export.json: as ``save`` wrote it, else read back (what a
    plugin's sink wrote itself)."""
    sizes: dict[str, int] = {}
    sha: dict[str, str] = {}
    for rel in files:
        path = inside(ctx.out, rel)
        if rel == EXPORT_REPORT or path is None:
            continue
        got = ctx.digests.get(rel) or (file_digest(path) if path.is_file() else None)
        if got is not None:
            sizes[rel], sha[rel] = got
    return sizes, sha


def _write_export(ctx: ExportContext, spec: HiddenExporter, kind: str, url: str, fingerprint: str,
                  say: Callable[[str], None]) -> HiddenExportReport:
    """Stream the Source through the format's sink into the cleared folder, then ``sample_ids.jsonl`` and,
    last, ``export.json`` listing every file written (the journal goes once the listing is published)."""
    t0 = time.perf_counter()
    src = ctx.source
    sink: Sink = spec.sink(ctx)
    for batch in src.batches(EXPORT_BATCH):
        sink.write(batch)
        ctx.tokens += sum(s.length for s in batch)
    sink.close(ctx.manifest)
    listing = sample_ids((e.sample_id, f) for e, f in zip(src.entries, _files_per_sample(ctx, kind), strict=True))
    ctx.save(SAMPLE_IDS, BytesWriter(listing))
    secs = time.perf_counter() - t0
    files = list(dict.fromkeys([*ctx.written, *ctx.files, EXPORT_REPORT]))  # ctx.files: a plugin's own writes
    sizes, sha = _recorded(ctx, files)
    m = ctx.manifest
    rep = HiddenExportReport(format=kind, out=str(ctx.out), hidden=url, manifest_fingerprint=fingerprint,
                             samples=len(src), tokens=ctx.tokens, skipped_flagged=src.flagged,
                             include_flagged=src.include_flagged, excluded_fidelity=src.excluded,
                             layer_ids=list(m.layer_ids.aux),
                             final_layer_id=m.layer_ids.final, dtype=str(ctx.dtype).removeprefix("torch."),
                             seconds=round(secs, 3), files=files, sizes=sizes, sha256=sha)
    publish_report(ctx.out, rep)
    say(f"export-hidden {kind}: {len(src)} samples, {ctx.tokens} tokens -> {ctx.out} ({secs:.1f} s)")
    return rep


def _files_per_sample(ctx: ExportContext, kind: str) -> list[str]:
    per = [f for f in ctx.files if f.endswith((".safetensors", ".ckpt", ".pt")) and f != TOKEN_FREQ]
    if len(per) != len(ctx.source):
        raise RuntimeError(f"export {kind}: wrote {len(per)} sample files for {len(ctx.source)} samples")
    return per
