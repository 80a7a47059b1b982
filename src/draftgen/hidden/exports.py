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

Ownership: a folder is draftgen's once it holds ``.draftgen-export.json`` (``HiddenOwnerMarker``), written
first; a non-empty folder without it is refused before anything is written or deleted, unless its valid
``export.json`` shows an export made before markers (adopted). ``export.json`` lists every file its export
wrote (``files``): the next export removes exactly those and overwrites nothing else. ``.draftgen-export.pending``
lists what the export in progress began writing, so a rerun after a death removes it, and the death's temps.

POST-norm = the target's final RMSNorm (``hidden.norm``: ``model.norm`` weight and eps, read from the target
model folder; the weight's sha256 must equal the manifest's ``norm_weight_sha256``) applied to the stored
pre-norm final.
Files are published atomically (temp ``.<name>.<hex>.tmp`` + rename). torch/safetensors/datasets are imported on use.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from draftgen.errors import ConfigError, InputError, RunDirError
from draftgen.hidden.files import BytesWriter, atomic_save, file_digest
from draftgen.hidden.format import (
    LoadedSample,
    is_temp,
    owner_marker,
    read_owner_marker,
    require,
    sample_key,
    temp_name,
)
from draftgen.hidden.norm import FinalNorm, load_final_norm
from draftgen.hidden.stream import Sink, Source, StreamSample, hidden_url, open_source
from draftgen.records import HiddenExportReport, HiddenExportSample, HiddenManifest
from draftgen.records.hidden import OWNER_HIDDEN_EXPORT
from draftgen.registry import Registry
from draftgen.store import encode_json, iter_jsonl, read_json

if TYPE_CHECKING:
    import torch

    from draftgen.config import RunConfig

__all__ = [
    "EXPORT_JOURNAL",
    "EXPORT_MARKER",
    "EXPORT_REPORT",
    "HIDDEN_EXPORTERS",
    "SAMPLE_IDS",
    "ExportContext",
    "ExportSink",
    "HiddenExporter",
    "claim_export",
    "default_export_dir",
    "export_hidden",
    "manifest_fingerprint",
    "register_hidden_exporter",
]

# Names inside an export folder (not run-directory layout names).
EXPORT_MARKER = ".draftgen-export.json"  # the owner marker, written first
EXPORT_JOURNAL = ".draftgen-export.pending"  # files the export in progress has begun writing, one a line
EXPORT_REPORT = "export.json"
SAMPLE_IDS = "sample_ids.jsonl"
SPECULATORS_STATES = "hidden_states"
TOKEN_FREQ = "token_freq.pt"
SPECFORGE_GROUP = 2000
EXPORT_BATCH = 8  # samples a sink gets at a time (their decoded states are held together)
_ARROW_FILES = ("state.json", "dataset_info.json")  # besides data-NNNNN-of-NNNNN.arrow
_ARROW_SHARD = re.compile(r"data-\d{5}-of-\d{5}\.arrow")


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
    torch = require("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)  # in memory: torch's own file writer reports a full disk as "unexpected pos"
    return BytesWriter(buf.getvalue())


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
        self.rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
        self.freq: dict[int, int] = {}

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
            mask = s.loss_mask.to(torch.int64)
            self.rows["input_ids"].append(s.input_ids.tolist())
            self.rows["loss_mask"].append(mask.tolist())
            self.rows["seq_len"].append(int(s.input_ids.shape[0]))
            for tid in s.input_ids[mask.bool()].tolist():
                self.freq[tid] = self.freq.get(tid, 0) + 1

    def close(self, manifest: HiddenManifest) -> None:
        datasets = require("datasets", "hub")
        ctx = self.ctx
        ctx.save(TOKEN_FREQ, _torch_writer(self.freq))
        features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64")),
                                      "loss_mask": datasets.Sequence(datasets.Value("int64")),
                                      "seq_len": datasets.Value("int64")})
        ds = datasets.Dataset.from_dict(self.rows, features=features)
        ds.set_format(type="torch")
        tmp = ctx.out / temp_name("arrow")  # a temp folder: the same pattern, removed by a rerun after a death
        tmp.mkdir()
        try:
            ds.save_to_disk(str(tmp))
            for f in sorted(tmp.iterdir()):

                def move(dst: str, src: Path = f) -> None:
                    os.replace(src, dst)

                ctx.save(f.name, move)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


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


def _read_report(out: Path) -> HiddenExportReport | None:
    try:
        return read_json(out / EXPORT_REPORT, HiddenExportReport) if (out / EXPORT_REPORT).is_file() else None
    except InputError:
        return None


def _up_to_date(out: Path, kind: str, fingerprint: str, include_flagged: bool) -> HiddenExportReport | None:
    rep = _read_report(out)
    same = rep is not None and (rep.format == kind and rep.manifest_fingerprint == fingerprint
                                and rep.include_flagged == include_flagged)
    return rep if same else None


# -- ownership of an export folder (module docstring) -------------------------------------------------------


def claim_export(out: Path) -> list[str]:
    """Make ``out`` an export folder of draftgen's before anything there is written or deleted, and return
    what earlier exports there wrote (the files the next export removes). Refuses (RunDirError, nothing
    touched) a file, a folder with another kind of marker, and a non-empty folder without the marker unless
    its ``export.json`` is valid (an export made before markers: adopted, the marker written)."""
    marker = out / EXPORT_MARKER
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: is a file, not a folder; give --out a new or empty folder")
    if marker.is_file():
        read_owner_marker(marker.read_bytes(), OWNER_HIDDEN_EXPORT, str(marker))
    else:
        legacy = _read_report(out)
        # only the temp of a marker whose write died: still empty
        if legacy is None and out.is_dir() and not all(is_temp(p.name, EXPORT_MARKER) for p in out.iterdir()):
            raise RunDirError(f"{out}: this folder is not empty and was not made by draftgen (it has no "
                              f"{EXPORT_MARKER}); export-hidden writes only into its own folders: give --out a "
                              "new or empty folder")
        out.mkdir(parents=True, exist_ok=True)
        atomic_save(marker, BytesWriter(owner_marker(OWNER_HIDDEN_EXPORT, adopted=legacy is not None)))
    return _previous_files(out)


def _previous_files(out: Path) -> list[str]:
    """The files earlier exports into ``out`` wrote: the last ``export.json``'s listing (for one made
    before listings: its sample files and the names its format writes), plus the pending journal."""
    rep = _read_report(out)
    files: list[str] = []
    if rep is not None:
        files = list(rep.files) or _legacy_files(out, rep)
    journal = out / EXPORT_JOURNAL
    if journal.is_file():
        files += [ln for ln in journal.read_text(encoding="utf-8", errors="replace").splitlines() if ln]
    return list(dict.fromkeys(files))


def _legacy_files(out: Path, rep: HiddenExportReport) -> list[str]:
    files = [SAMPLE_IDS, EXPORT_REPORT]
    with contextlib.suppress(InputError, OSError):
        files += [s.file for _, s in iter_jsonl(out / SAMPLE_IDS, HiddenExportSample)]
    if rep.format == "speculators":
        files += [TOKEN_FREQ, *_ARROW_FILES, *sorted(p.name for p in out.iterdir() if _ARROW_SHARD.fullmatch(p.name))]
    return files


def _inside(out: Path, rel: str) -> Path | None:
    """``out/rel`` when ``rel`` is a plain relative path below ``out`` (a listing never reaches outside)."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        return None
    return out / rel


def _clean_temps(out: Path, listed: list[str]) -> None:
    """Remove draftgen's temps (``is_temp``, files or folders) in ``out`` and in the folders of ``listed``."""
    folders = {out} | {p.parent for p in (_inside(out, r) for r in listed) if p is not None}
    for folder in folders:
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if not is_temp(p.name):
                continue
            with contextlib.suppress(OSError):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()


def _remove_listed(out: Path, listed: list[str]) -> None:
    """Remove exactly the listed files still present (then their folders, once empty); the listing stays
    in the journal until they are gone, so a death here leaves nothing unlisted."""
    journal = out / EXPORT_JOURNAL
    atomic_save(journal, BytesWriter("".join(f"{r}\n" for r in listed).encode()))
    folders: set[Path] = set()
    for rel in listed:
        path = _inside(out, rel)
        if path is None or not (path.is_file() or path.is_symlink()):
            continue
        path.unlink()
        folders.update(q for q in path.parents if q != out and out in q.parents)
    for folder in sorted(folders, key=lambda q: -len(q.parts)):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty one: a file draftgen did not write keeps its folder
    journal.unlink()


def _out_folder(cfg: RunConfig | None, out_dir: str | Path | None, kind: str, n_kinds: int) -> Path:
    if out_dir is None:
        if cfg is None:
            raise ConfigError("give --out: where to write the export (no config names a run directory)")
        return default_export_dir(cfg, kind)
    return Path(out_dir) / kind if n_kinds > 1 else Path(out_dir)


def _keep_up_to_date(out: Path, done: HiddenExportReport) -> None:
    """An up-to-date folder is claimed too (an export made before markers is adopted) and loses a death's temps."""
    _clean_temps(out, claim_export(out))
    if done.files:  # a death after export.json, before the journal went: all it lists is listed there
        (out / EXPORT_JOURNAL).unlink(missing_ok=True)


def _claim_and_clear(out: Path) -> None:
    """Before an export writes into ``out``: claim it, remove leftover temps and what earlier exports
    listed (their ``export.json`` first, so the folder never looks up to date half-cleared)."""
    listed = claim_export(out)
    _clean_temps(out, listed)
    if EXPORT_REPORT in listed:
        listed = [EXPORT_REPORT] + [r for r in listed if r != EXPORT_REPORT]
    _remove_listed(out, listed)


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
    """One format into ``out``. A folder whose ``export.json`` matches the set is verified (``_broken``): intact,
    it is up to date; else what is broken is rewritten from the set (``_repair``), or, when that cannot be
    done file by file, the whole export is written again. Any other folder is cleared and written."""
    m = src.manifest
    done = _up_to_date(out, kind, fingerprint, src.include_flagged)
    broken: dict[str, str] = {}
    if done is not None:
        _keep_up_to_date(out, done)
        broken = _broken(out, done)
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
        what = _describe_broken(broken, done)
        fixed = _repair(ExportContext(source=src, manifest=m, out=out, dtype=_out_dtype(m), norm=norm,
                                      written=list(done.files)), spec, done, broken)
        if fixed is not None:
            say(f"export-hidden {kind}: {out}: {what}; rewrote them from the hidden set: up to date "
                f"({fixed.samples} samples)")
            return fixed
        say(f"export-hidden {kind}: {out}: {what}; writing the whole export again")
    _claim_and_clear(out)
    ctx = ExportContext(source=src, manifest=m, out=out, dtype=_out_dtype(m), norm=norm)
    return _write_export(ctx, spec, kind, url, fingerprint, say)


def _broken(out: Path, rep: HiddenExportReport) -> dict[str, str]:
    """The files ``rep`` lists that ``out`` no longer holds as written: rel → ``missing`` or ``changed`` (a
    link where the file was; another size; or, for a file modified since export.json was written, another
    sha256: the rule extract's resume follows, so an intact folder is verified without reading its files).
    An export made before sizes and digests were recorded is checked for existence only."""
    since = (out / EXPORT_REPORT).stat().st_mtime_ns
    broken: dict[str, str] = {}
    for rel in rep.files or _legacy_files(out, rep):
        path = _inside(out, rel)
        if rel == EXPORT_REPORT or path is None:
            continue
        if path.is_symlink() or (path.exists() and not path.is_file()):
            broken[rel] = "changed"
        elif not path.exists():
            broken[rel] = "missing"
        else:
            st, size, sha = path.stat(), rep.sizes.get(rel), rep.sha256.get(rel)
            if (size is not None and st.st_size != size) or (
                    sha and st.st_mtime_ns >= since and file_digest(path)[1] != sha):
                broken[rel] = "changed"
    return broken


def _describe_broken(broken: dict[str, str], rep: HiddenExportReport, most: int = 5) -> str:
    parts = []
    for why in ("missing", "changed"):
        rels = [r for r, w in broken.items() if w == why]
        if rels:
            more = f" and {len(rels) - most} more" if len(rels) > most else ""
            parts.append(f"{why}: {', '.join(rels[:most])}{more}")
    of = f" of {len(rep.files)}" if rep.files else ""
    return f"{len(broken)}{of} listed files broken ({'; '.join(parts)})"


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
    _publish_report(ctx.out, rep)
    return rep


def _publish_report(out: Path, rep: HiddenExportReport) -> None:
    """``export.json``, atomically; then the journal goes (every file it names is listed there now)."""
    atomic_save(out / EXPORT_REPORT, BytesWriter(msgspec.json.format(encode_json(rep), indent=2) + b"\n"))
    (out / EXPORT_JOURNAL).unlink(missing_ok=True)


def _recorded(ctx: ExportContext, files: Sequence[str]) -> tuple[dict[str, int], dict[str, str]]:
    """The size and sha256 of each of ``files`` but export.json: as ``save`` wrote it, else read back (what a
    plugin's sink wrote itself)."""
    sizes: dict[str, int] = {}
    sha: dict[str, str] = {}
    for rel in files:
        path = _inside(ctx.out, rel)
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
    listing = b"".join(encode_json(HiddenExportSample(index=i, sample_id=e.sample_id, file=f)) + b"\n"
                       for i, (e, f) in enumerate(zip(src.entries, _files_per_sample(ctx, kind), strict=True)))
    ctx.save(SAMPLE_IDS, BytesWriter(listing))
    secs = time.perf_counter() - t0
    files = list(dict.fromkeys([*ctx.written, *ctx.files, EXPORT_REPORT]))  # ctx.files: a plugin's own writes
    sizes, sha = _recorded(ctx, files)
    m = ctx.manifest
    rep = HiddenExportReport(format=kind, out=str(ctx.out), hidden=url, manifest_fingerprint=fingerprint,
                             samples=len(src), tokens=ctx.tokens, skipped_flagged=src.flagged,
                             include_flagged=src.include_flagged, layer_ids=list(m.layer_ids.aux),
                             final_layer_id=m.layer_ids.final, dtype=str(ctx.dtype).removeprefix("torch."),
                             seconds=round(secs, 3), files=files, sizes=sizes, sha256=sha)
    _publish_report(ctx.out, rep)
    say(f"export-hidden {kind}: {len(src)} samples, {ctx.tokens} tokens -> {ctx.out} ({secs:.1f} s)")
    return rep


def _files_per_sample(ctx: ExportContext, kind: str) -> list[str]:
    per = [f for f in ctx.files if f.endswith((".safetensors", ".ckpt", ".pt")) and f != TOKEN_FREQ]
    if len(per) != len(ctx.source):
        raise RuntimeError(f"export {kind}: wrote {len(per)} sample files for {len(ctx.source)} samples")
    return per
