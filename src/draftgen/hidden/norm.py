"""The target's final RMSNorm, read from its model folder and checked against a hidden set's manifest.

``load_final_norm(model_dir, manifest)`` reads ``config.json`` (``rms_norm_eps``) and the ``model.norm`` weight
from the folder's safetensors; with a manifest, the weight's sha256 (``norm_weight_digest``: float32 bytes,
also as rounded to bf16/fp16 as the target computed with it) must equal the set's ``norm_weight_sha256`` and
its eps the set's ``norm_eps``. ``FinalNorm.apply`` turns stored PRE-norm final states into POST-norm ones
(the specforge and modelopt exports); ``train.guards`` compares a verifier with the set by the same digest.
Reads the model folder; writes nothing. torch and safetensors are imported on use.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftgen.errors import InputError
from draftgen.hidden.format import require
from draftgen.store import read_json_object

if TYPE_CHECKING:
    import torch

    from draftgen.records import HiddenManifest

__all__ = ["FinalNorm", "load_final_norm", "norm_weight_digest"]


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
