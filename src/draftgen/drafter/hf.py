"""Leaf helpers over a transformers causal LM, shared by the drafter (``speculate``) and hidden-state capture.

- ``decoder_layers(model, where)``: the decoder layer list (``model.model.layers``), or a ConfigError naming
  the setting ``where`` that gave the model;
- ``rms_norm(x, weight, eps)``: RMSNorm in float32 (the target's final norm, applied to a pre-norm state);
- ``logprobs_through(model, input_ids, layer, state, positions)``: a stored state fed back into the target as
  the input of decoder layer ``layer`` (vLLM convention; ``layer`` = L: the last layer's output, so only the
  final norm and the head remain) and run to the end: log p(input_ids[t+1]) at each position t; the layers
  before ``layer`` do not run, and the model is not changed (safe beside another thread's forward);
- ``token_logprobs(logits, targets)``: log-softmax at the target ids only, a few rows at a time.

They sit here, below both ``drafter.speculate`` and ``phases.extract`` (capture backends, checks), so the
drafter never imports a phase. torch is imported only inside ``rms_norm``; no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["decoder_layers", "logprobs_through", "rms_norm", "token_logprobs"]

_LSE_ELEMENTS = 1 << 20  # logits per float32 chunk in ``token_logprobs`` (4 MiB)


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


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[..., targets] in float32 (``logits`` [..., V] in any float dtype, ``targets`` [...]):
    torch's own float32 log-softmax of a few rows at a time (``_LSE_ELEMENTS``: the chunk stays in cache; the
    [..., V] log-softmax of the whole batch is never written). The same kernel as the reference log-probs it is
    compared with: a hand-written log-sum-exp differed from it by up to 1e-4 nats over a 151k vocabulary, the
    fp32 checks' whole tolerance."""
    import torch as th  # logits is a tensor: torch is already loaded

    flat = logits.reshape(-1, logits.shape[-1])
    want = targets.reshape(-1, 1).to(flat.device)
    step = max(1, _LSE_ELEMENTS // max(flat.shape[-1], 1))
    parts = [th.log_softmax(flat[s:s + step].float(), dim=-1).gather(-1, want[s:s + step])[:, 0]
             for s in range(0, flat.shape[0], step)]
    out: torch.Tensor = th.cat(parts) if parts else th.zeros(0, device=flat.device)
    return out.reshape(targets.shape)


def _standin(layer: Any, forward: Any) -> Any:
    """A shallow copy of decoder ``layer`` (its attributes: a model's loop may read them) whose forward is
    ``forward``; the layer itself is left as it is."""
    import copy

    twin = copy.copy(layer)
    twin.forward = forward
    return twin


def _skip(*_args: Any, **_kwargs: Any) -> tuple[None]:
    # a layer before the fed one: computes nothing; a 1-tuple suits both layer-output conventions (a loop
    # that takes out[0], or one that hands the output on to the next layer, here a stand-in again)
    return (None,)


def _from_layer(base: Any, layers: Any, layer: int, fed: torch.Tensor) -> Any:
    """A shallow copy of the base model ``base`` whose decoder layers before ``layer`` are stand-ins that
    compute nothing and whose layer ``layer`` runs on ``fed`` (whatever it is handed): the layers from
    ``layer`` on, the final norm, the mask and rotary embeddings are the model's own, at their own indices."""
    import copy

    import torch as th

    real = layers[layer]

    def fed_forward(*args: Any, **kwargs: Any) -> Any:
        if args:
            return real.forward(fed, *args[1:], **kwargs)
        return real.forward(**{**kwargs, "hidden_states": fed})

    twin = copy.copy(base)
    twin._modules = dict(base._modules)  # the copy's own module table: the base model keeps its layers
    stand = [_standin(layers[i], _skip) for i in range(layer)] + [_standin(real, fed_forward)]
    twin._modules["layers"] = th.nn.ModuleList([*stand, *list(layers)[layer + 1:]])
    return twin


def logprobs_through(model: Any, input_ids: torch.Tensor, layer: int, state: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[t + 1]) at each position t of ``positions`` (float32 [N]) when the target runs from
    ``state`` [T, H] on: ``state`` is the input of decoder layer ``layer`` (the layers before it do not run),
    or, for ``layer`` = L, the last layer's output, so that only the final norm and the LM head remain. One
    sequence, no padding. ``state`` may be a batch [B, T, H] of states of that sequence (→ [B, N]), run in
    one forward. ``model`` is not changed (no hook, no swapped layer: a shallow copy of its base model runs),
    so a forward another thread runs on it meanwhile is untouched."""
    import torch as th

    layers = decoder_layers(model)
    n = len(layers)
    if not 0 < layer <= n:
        raise ConfigError(f"layer id {layer} is outside 1..{n} (vLLM convention, target of {n} layers)")
    param = next(model.parameters())
    fed = (state if state.dim() == 3 else state[None]).to(param.device, param.dtype)
    ids = input_ids[None].expand(fed.shape[0], -1).to(param.device)
    with th.inference_mode():
        if layer == n:
            post_norm = model.model.norm(fed)
        else:
            post_norm = _from_layer(model.model, layers, layer, fed)(input_ids=ids, use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(post_norm[:, positions.to(param.device)])
    out = token_logprobs(logits, input_ids[1:][positions][None].expand(fed.shape[0], -1)).cpu()
    return out if state.dim() == 3 else out[0]
