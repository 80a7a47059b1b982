"""Hidden states in the peer trainers' offline formats (``draftgen export-hidden``, and ``draftgen train``).

``export_hidden(source, kinds, out)`` is the entry point; each format is one ``HiddenExporter`` in
``HIDDEN_EXPORTERS`` (a ``draftgen.registry.Registry`` keyed by ``export-hidden --format``), registered with
``@register_hidden_exporter`` like a plugin's would be.

Reads a finished ``draftgen.hidden/1`` set (``extract.format.open_hidden``: manifest + per-sample files,
in manifest = extraction = merged train order) and writes one folder per format, each sample ``i`` being the
i-th sample of the manifest (flagged samples left out unless asked), so provenance holds: every folder
also gets ``sample_ids.jsonl`` (``HiddenExportSample`` lines: index, sample_id, file) and, written last,
``export.json`` (``HiddenExportReport``; a folder whose report matches the same hidden set is up to date).

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

POST-norm = the target's final RMSNorm (``model.norm`` weight and eps, read from the target model folder;
the weight's sha256 must equal the manifest's ``norm_weight_sha256``) applied to the stored pre-norm final.
Files are published atomically (temp + rename). torch/safetensors/datasets are imported on use.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError, InputError
from draftgen.hidden.format import (
    HiddenSet,
    LoadedSample,
    atomic_write_bytes,
    open_hidden,
    require,
    sample_key,
    storage_faults,
)
from draftgen.records import HiddenExportReport, HiddenExportSample, HiddenManifest
from draftgen.registry import Registry
from draftgen.store import atomic_write_json, encode_json, read_json, read_json_object

if TYPE_CHECKING:
    import torch

    from draftgen.config import RunConfig

__all__ = [
    "EXPORT_REPORT",
    "HIDDEN_EXPORTERS",
    "SAMPLE_IDS",
    "ExportContext",
    "FinalNorm",
    "HiddenExporter",
    "default_export_dir",
    "export_hidden",
    "hidden_url",
    "load_final_norm",
    "manifest_fingerprint",
    "register_hidden_exporter",
]

# Names inside an export folder (not run-directory layout names).
EXPORT_REPORT = "export.json"
SAMPLE_IDS = "sample_ids.jsonl"
SPECULATORS_STATES = "hidden_states"
TOKEN_FREQ = "token_freq.pt"
SPECFORGE_GROUP = 2000


@dataclass
class FinalNorm:
    """The target's final RMSNorm: weight (float32) and eps."""

    weight: torch.Tensor
    eps: float

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        th = require("torch")
        xf = x.float()
        out: torch.Tensor = self.weight * (xf * th.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))
        return out


@dataclass
class ExportContext:
    """What an exporter gets: the hidden set, its manifest, the output folder, the samples to write (index,
    sample_id, manifest file) and, for formats that need it, the target's final norm."""

    hidden: HiddenSet
    manifest: HiddenManifest
    out: Path
    selected: list[tuple[int, str, str]]
    dtype: Any  # torch dtype of the written states
    norm: FinalNorm | None = None
    files: list[str] = field(default_factory=list)
    tokens: int = 0

    def samples(self) -> Iterator[tuple[int, LoadedSample]]:
        for i, sid, rel in self.selected:
            s = self.hidden.read_sample(rel)
            if s.sample_id and s.sample_id not in (sid, sid.split("#rep", 1)[0]):  # a repeat reads its base's file
                raise InputError(f"{rel}: holds sample {s.sample_id!r}, the manifest says {sid!r}")
            self.tokens += int(s.input_ids.shape[0])
            yield i, s

    def post_norm(self, final: torch.Tensor) -> torch.Tensor:
        if self.norm is None:
            raise ConfigError("this export needs the target's final norm; give the target model folder")
        return self.norm.apply(final)


@dataclass(frozen=True)
class HiddenExporter:
    """One hidden-state format: ``fn(ctx)`` writes every selected sample under ``ctx.out`` (one per-sample
    file each, ending in ``.safetensors``, ``.ckpt`` or ``.pt``, listed in ``ctx.files`` in sample order);
    ``needs_norm``: it writes post-norm states, so the target's final norm is loaded into ``ctx.norm``."""

    fn: Callable[[ExportContext], None]
    needs_norm: bool = False


#: ``export-hidden --format`` name → its ``HiddenExporter``, in registration order (no config key names
#: these: the CLI's ``--format`` and ``draftgen train``, which writes ``speculators``, do).
HIDDEN_EXPORTERS: Registry[HiddenExporter] = Registry("export-hidden --format", "hidden export format")


def register_hidden_exporter(name: str, *, needs_norm: bool = False,
                             doc: str = "") -> Callable[[Callable[[ExportContext], None]], Callable[[ExportContext], None]]:
    """Register ``fn(ctx)`` as the hidden-state export format ``name`` (written to ``ctx.out``); a name already
    registered is a ConfigError. ``HIDDEN_EXPORTERS.unregister(name)`` removes it again."""

    def deco(fn: Callable[[ExportContext], None]) -> Callable[[ExportContext], None]:
        HIDDEN_EXPORTERS.register(name, HiddenExporter(fn, needs_norm), doc=doc)
        return fn

    return deco


# -- helpers -------------------------------------------------------------------------------------------------


def _torch_save(path: Path, obj: Any) -> None:
    torch = require("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)  # in memory: torch's own file writer reports a full disk as "unexpected pos"
    atomic_write_bytes(path, buf.getvalue())


def _split_aux(s: LoadedSample, n_aux: int) -> torch.Tensor:
    t, width = s.aux.shape
    if width % n_aux:
        raise InputError(f"{s.sample_id}: aux width {width} is not a multiple of {n_aux} layers")
    return s.aux.reshape(t, n_aux, width // n_aux)


def manifest_fingerprint(m: HiddenManifest) -> str:
    return hashlib.sha256(encode_json(m)).hexdigest()[:16]


def norm_weight_digest(weight: torch.Tensor) -> str:
    """sha256 of the norm weight as float32 little-endian bytes (the manifest's ``norm_weight_sha256``)."""
    return hashlib.sha256(weight.detach().float().contiguous().numpy().tobytes()).hexdigest()


def load_final_norm(model_dir: Path, manifest: HiddenManifest | None = None) -> FinalNorm:
    """The final RMSNorm of the target model in ``model_dir`` (config.json + safetensors weights)."""
    st = require("safetensors")
    cfg_path = model_dir / "config.json"
    try:
        cfg = read_json_object(cfg_path)
    except (OSError, ValueError):
        raise InputError(f"{cfg_path}: no readable config.json; give the target model's local folder") from None
    text = cfg.get("text_config") or cfg
    eps = float(text.get("rms_norm_eps", text.get("layer_norm_epsilon", 1e-6)))
    names = ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight")
    weight = None
    for f in sorted(model_dir.glob("*.safetensors")):
        with st.safe_open(str(f), framework="pt") as fh:
            hit = next((n for n in names if n in fh.keys()), None)  # noqa: SIM118 (safe_open has no __contains__)
            if hit:
                weight = fh.get_tensor(hit).float()
                break
    if weight is None:
        raise InputError(f"{model_dir}: no final norm weight ({names[0]}) in its safetensors files")
    if manifest is not None and manifest.norm_weight_sha256:
        # the extractor hashes the weight as the target computed with it (the file's, or rounded to bf16/fp16)
        torch = require("torch")
        cands = [weight, weight.to(torch.bfloat16).float(), weight.to(torch.float16).float()]
        match = next((w for w in cands if norm_weight_digest(w) == manifest.norm_weight_sha256), None)
        digest = norm_weight_digest(weight)
        if match is not None:
            weight = match
        else:
            raise InputError(f"{model_dir}: its final norm weight (sha256 {digest[:12]}…) is not the one the "
                             f"hidden states were extracted with ({manifest.norm_weight_sha256[:12]}…); give "
                             "the same target model folder")
    if manifest is not None and abs(manifest.norm_eps - eps) > 1e-12 * max(1.0, abs(eps)):
        raise InputError(f"{cfg_path}: rms_norm_eps {eps} differs from the manifest's {manifest.norm_eps}")
    return FinalNorm(weight=weight, eps=eps)


def _out_dtype(m: HiddenManifest) -> Any:
    torch = require("torch")
    return {"fp16": torch.float16, "fp32": torch.float32}.get(m.dtype, torch.bfloat16)


# -- the formats ---------------------------------------------------------------------------------------------


@register_hidden_exporter("speculators", doc="speculators 0.9 --data-path: hidden_states/hs_{i}.safetensors "
                          "[T, n_aux+1, H] (pre-norm final last), the Arrow dataset, token_freq.pt")
def export_speculators(ctx: ExportContext) -> None:
    torch = require("torch")
    st = require("safetensors.torch")
    datasets = require("datasets", "hub")
    n_aux = len(ctx.manifest.layer_ids.aux)
    states = ctx.out / SPECULATORS_STATES
    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    freq: dict[int, int] = {}
    for i, s in ctx.samples():
        hs = torch.cat([_split_aux(s, n_aux), s.final[:, None, :]], dim=1).to(ctx.dtype).contiguous()
        tensors = {"hidden_states": hs, "token_ids": s.input_ids.to(torch.int64).contiguous()}
        path = states / f"hs_{i}.safetensors"
        atomic_write_bytes(path, st.save(tensors))
        ctx.files.append(str(path.relative_to(ctx.out)))
        mask = s.loss_mask.to(torch.int64)
        rows["input_ids"].append(s.input_ids.tolist())
        rows["loss_mask"].append(mask.tolist())
        rows["seq_len"].append(int(s.input_ids.shape[0]))
        for tid in s.input_ids[mask.bool()].tolist():
            freq[tid] = freq.get(tid, 0) + 1
    for old in states.glob("hs_*.safetensors"):  # left by an earlier, larger export
        if old.name not in {f"hs_{i}.safetensors" for i, _, _ in ctx.selected}:
            old.unlink()
    _torch_save(ctx.out / TOKEN_FREQ, freq)
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64")),
                                  "loss_mask": datasets.Sequence(datasets.Value("int64")),
                                  "seq_len": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(rows, features=features)
    ds.set_format(type="torch")
    tmp = Path(tempfile.mkdtemp(dir=ctx.out, prefix=".arrow."))
    try:
        ds.save_to_disk(str(tmp))
        for f in tmp.iterdir():
            os.replace(f, ctx.out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ctx.files += [TOKEN_FREQ, "state.json", "dataset_info.json"]


@register_hidden_exporter("specforge", needs_norm=True, doc="SpecForge offline: rows_{g}-{g+2000}/data_{i}.ckpt "
                          "(input_ids, loss_mask, post-norm hidden_state [1,T,H], aux_hidden_state [1,T,3H])")
def export_specforge(ctx: ExportContext) -> None:
    torch = require("torch")
    for i, s in ctx.samples():
        g = (i // SPECFORGE_GROUP) * SPECFORGE_GROUP
        rel = f"rows_{g}-{g + SPECFORGE_GROUP}/data_{i}.ckpt"
        _torch_save(ctx.out / rel, {
            "input_ids": s.input_ids.to(torch.int64),
            "loss_mask": s.loss_mask.to(torch.int64),
            "hidden_state": ctx.post_norm(s.final).to(ctx.dtype)[None].contiguous(),
            "aux_hidden_state": s.aux.to(ctx.dtype)[None].contiguous(),
        })
        ctx.files.append(rel)


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,120}")


def modelopt_name(sample_id: str) -> str:
    """The ``.pt`` file stem of a sample: its id when that is a plain file name, else its sample key."""
    return sample_id if _PLAIN_NAME.fullmatch(sample_id) else sample_key(sample_id)


@register_hidden_exporter("modelopt", needs_norm=True, doc="Model-Optimizer offline: {conversation_id}.pt "
                          "(input_ids, post-norm hidden_states [T,H], aux_hidden_states [T,3H], loss_mask, "
                          "conversation_id)")
def export_modelopt(ctx: ExportContext) -> None:
    torch = require("torch")
    for _i, s in ctx.samples():
        rel = f"{modelopt_name(s.sample_id)}.pt"
        _torch_save(ctx.out / rel, {
            "input_ids": s.input_ids.to(torch.int64),
            "hidden_states": ctx.post_norm(s.final).to(ctx.dtype).contiguous(),
            "aux_hidden_states": s.aux.to(ctx.dtype).contiguous(),
            "loss_mask": s.loss_mask.to(torch.int64),
            "conversation_id": s.sample_id,
        })
        ctx.files.append(rel)


# -- the entry point -----------------------------------------------------------------------------------------


def hidden_url(cfg: RunConfig) -> str:
    """The hidden-state destination a config names (``hidden_states.output``, default ``<run>/hidden``)."""
    from draftgen.rundir import RunDir

    out = cfg.hidden_states.output
    if out is None:
        return str(RunDir(cfg.run_path).hidden)
    return out if "://" in out else str(cfg.path(out))


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


def _up_to_date(out: Path, kind: str, fingerprint: str, include_flagged: bool) -> HiddenExportReport | None:
    path = out / EXPORT_REPORT
    if not path.is_file():
        return None
    try:
        rep = read_json(path, HiddenExportReport)
    except InputError:
        return None
    same = (rep.format == kind and rep.manifest_fingerprint == fingerprint
            and rep.include_flagged == include_flagged)
    return rep if same else None


def export_hidden(source: RunConfig | str, kinds: list[str], out_dir: str | Path | None = None, *,
                  hidden: str | None = None, target_dir: str | Path | None = None,
                  include_flagged: bool = False,
                  storage_options: dict[str, Any] | None = None,
                  echo: Callable[[str], None] | None = None) -> list[HiddenExportReport]:
    """Write the hidden set of ``source`` (a config, or a hidden-set URL/path) in each format of ``kinds``.

    ``out_dir``: the output folder (with several kinds, one subfolder per kind); default
    ``<run>/hidden-exports/<kind>`` for a config. ``hidden``: another hidden set than the config's. ``target_dir``: the target model folder, for the final norm
    (default: ``hidden_states.model``, else the manifest's target name when it is a local folder)."""
    from draftgen.config import RunConfig

    if not kinds:
        raise ConfigError(f"{HIDDEN_EXPORTERS.key}: give at least one of {', '.join(HIDDEN_EXPORTERS.names())}")
    specs = {kind: HIDDEN_EXPORTERS.get(kind) for kind in kinds}  # every name checked before anything is read
    cfg = source if isinstance(source, RunConfig) else None
    url = hidden or (hidden_url(cfg) if cfg is not None else str(source))
    opts = storage_options if storage_options is not None else (
        {k: v for k, v in cfg.hidden_states.storage_options.items()} if cfg is not None else None)
    hset = open_hidden(url, opts)
    m = hset.manifest
    flagged = set() if include_flagged else set(m.checks.flagged_sample_ids)
    selected: list[tuple[int, str, str]] = []
    for e in m.samples:
        if e.sample_id not in flagged:
            selected.append((len(selected), e.sample_id, e.file))
    if not selected:
        raise InputError(f"{url}: no sample to export ({len(m.samples)} in the manifest, {len(flagged)} flagged)")
    fingerprint = manifest_fingerprint(m)
    reports: list[HiddenExportReport] = []
    say = echo or (lambda s: None)
    for kind in kinds:
        if out_dir is None:
            if cfg is None:
                raise ConfigError("give --out: where to write the export (no config names a run directory)")
            out = default_export_dir(cfg, kind)
        else:
            out = Path(out_dir) / kind if len(kinds) > 1 else Path(out_dir)
        done = _up_to_date(out, kind, fingerprint, include_flagged)
        if done is not None:
            say(f"export-hidden {kind}: {out} is up to date ({done.samples} samples)")
            reports.append(done)
            continue
        spec = specs[kind]
        norm = None
        if spec.needs_norm:
            tdir = _target_dir(cfg, m, target_dir)
            if tdir is None:
                raise ConfigError(f"export {kind}: the post-norm final state needs the target model folder: set "
                                  "hidden_states.model or pass --target DIR")
            norm = load_final_norm(tdir, m)
        out.mkdir(parents=True, exist_ok=True)
        (out / EXPORT_REPORT).unlink(missing_ok=True)
        t0 = time.perf_counter()
        ctx = ExportContext(hidden=hset, manifest=m, out=out, selected=selected, dtype=_out_dtype(m), norm=norm)
        with storage_faults(str(out), "write"):  # a full disk: one line naming the folder (the files name theirs)
            spec.fn(ctx)
        listing = b"".join(encode_json(HiddenExportSample(index=i, sample_id=sid, file=f)) + b"\n"
                           for (i, sid, _), f in zip(selected, _files_per_sample(ctx, kind), strict=True))
        atomic_write_bytes(out / SAMPLE_IDS, listing)
        secs = time.perf_counter() - t0
        rep = HiddenExportReport(format=kind, out=str(out), hidden=url, manifest_fingerprint=fingerprint,
                                 samples=len(selected), tokens=ctx.tokens, skipped_flagged=len(flagged),
                                 include_flagged=include_flagged, layer_ids=list(m.layer_ids.aux),
                                 final_layer_id=m.layer_ids.final, dtype=str(ctx.dtype).removeprefix("torch."),
                                 seconds=round(secs, 3))
        atomic_write_json(out / EXPORT_REPORT, rep)
        say(f"export-hidden {kind}: {len(selected)} samples, {ctx.tokens} tokens -> {out} ({secs:.1f} s)")
        reports.append(rep)
    return reports


def _files_per_sample(ctx: ExportContext, kind: str) -> list[str]:
    per = [f for f in ctx.files if f.endswith((".safetensors", ".ckpt", ".pt")) and f != TOKEN_FREQ]
    if len(per) != len(ctx.selected):
        raise RuntimeError(f"export {kind}: wrote {len(per)} sample files for {len(ctx.selected)} samples")
    return per
