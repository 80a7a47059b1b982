"""Leaf helpers over a transformers causal LM, shared by the drafter (``speculate``) and hidden-state capture.

- ``decoder_layers(model, where)``: the decoder layer list (``model.model.layers``), or a ConfigError naming
  the setting ``where`` that gave the model;
- ``rms_norm(x, weight, eps)``: RMSNorm in float32 (the target's final norm, applied to a pre-norm state);
- ``logprobs_through(model, input_ids, layer, state, positions)``: a stored state fed back into the target as
  the input of decoder layer ``layer`` (vLLM convention; ``layer`` = L: the last layer's output, so only the
  final norm and the head remain) and run to the end: log p(input_ids[t+1]) at each position t.

They sit here, below both ``drafter.speculate`` and ``phases.extract`` (capture backends, checks), so the
drafter never imports a phase. torch is imported only inside ``rms_norm``; no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["decoder_layers", "logprobs_through", "rms_norm"]


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


def logprobs_through(model: Any, input_ids: torch.Tensor, layer: int, state: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[t + 1]) at each position t of ``positions`` (float32 [N]) when the target runs from
    ``state`` [T, H] on: ``state`` replaces the input of decoder layer ``layer`` (a forward pre-hook on that
    layer; the layers before it run and are discarded), or, for ``layer`` = L, the last layer's output (a
    forward hook), so that only the final norm and the LM head remain. One sequence, no padding."""
    import torch as th

    layers = decoder_layers(model)
    n = len(layers)
    if not 0 < layer <= n:
        raise ConfigError(f"layer id {layer} is outside 1..{n} (vLLM convention, target of {n} layers)")
    dev = next(model.parameters()).device
    fed = state[None].to(dev, next(model.parameters()).dtype)

    def pre(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args:
            return (fed, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": fed}

    def post(_mod: Any, _args: Any, out: Any) -> Any:
        return (fed, *out[1:]) if isinstance(out, tuple) else fed

    handle = (layers[layer].register_forward_pre_hook(pre, with_kwargs=True) if layer < n
              else layers[n - 1].register_forward_hook(post))
    try:
        with th.inference_mode():
            post_norm = model.model(input_ids=input_ids[None].to(dev), use_cache=False).last_hidden_state[0]
            head = model.get_output_embeddings()
            logits = head(post_norm[positions.to(dev)]).float()
    finally:
        handle.remove()
    targets = input_ids[1:][positions].to(dev)
    out: torch.Tensor = th.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0].cpu()
    return out
