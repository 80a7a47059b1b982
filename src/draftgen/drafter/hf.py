"""Leaf helpers over a transformers causal LM, shared by the drafter (``speculate``) and hidden-state capture.

- ``decoder_layers(model, where)``: the decoder layer list (``model.model.layers``), or a ConfigError naming
  the setting ``where`` that gave the model;
- ``rms_norm(x, weight, eps)``: RMSNorm in float32 (the target's final norm, applied to a pre-norm state).

They sit here, below both ``drafter.speculate`` and ``phases.extract`` (capture backends, checks), so the
drafter never imports a phase. torch is imported only inside ``rms_norm``; no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["decoder_layers", "rms_norm"]


def decoder_layers(model: Any, where: str = "hidden_states.model") -> Any:
    """The decoder layer list of an HF causal LM (``model.model.layers``); ``where`` names the setting."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ConfigError(f"{where}: {type(model).__name__} has no model.layers; draftgen supports "
                          "decoder-only causal LMs laid out as model.model.layers (Llama, Qwen2/3, ...)")
    return layers


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * weight."""
    import torch as th  # x is a tensor: torch is already loaded

    xf = x.float()
    out: torch.Tensor = xf * th.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float().to(xf.device)
    return out
