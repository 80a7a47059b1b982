"""Greedy speculative decoding of a transformers target with an EAGLE-3 drafter, with vLLM's counters.

``greedy_speculative_generate(target, drafter, prompt_ids, k=..., max_new_tokens=..., eos_ids=...,
aux_layer_ids=...)`` runs chain speculation:

1. prefill: one target forward over the prompt gives the first token (greedy) and the aux states;
2. each round the drafter proposes k tokens from the verified sequence (aux state of position t paired with
   token t+1, the last pair being the newest verified token), the target scores sequence + drafts in one
   forward (one verification), drafts are accepted while each equals the target's greedy token, and the
   target's token after the last accepted one is appended as well (the bonus token).

The emitted ids are therefore exactly plain greedy decoding of the target (cut at ``max_new_tokens`` or
after the first id in ``eos_ids``). Counters keep vLLM's meaning (``vllm:spec_decode_*``): a draft is one
proposal of k tokens, ``draft_tokens`` counts proposed tokens, ``accepted`` accepted ones, and
``accepted_per_pos[i]`` the drafts whose token i was accepted; every round proposes k tokens, also near
the end (acceptance stops after an accepted end token). SGLang's ``spec_verify_ct`` is ``verify_calls``.

Aux states are captured with hooks in the vLLM convention: id k < L = the input of decoder layer k (a
forward pre-hook), id L = the output of the last layer before the final norm. Each target forward recomputes
the whole sequence (tiny models, short outputs). No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from draftgen.drafter.hf import decoder_layers
from draftgen.errors import ConfigError

__all__ = ["AuxCapture", "Proposer", "SpecResult", "greedy_generate", "greedy_speculative_generate",
           "target_forward"]


class Proposer(Protocol):
    """Anything that drafts: given the verified ids (all of them, prompt included) and the target's aux
    states for all but the last, return k target ids. ``Eagle3Drafter`` is one."""

    def propose(self, context: Sequence[int], aux: Tensor, k: int) -> list[int]: ...


@dataclass
class SpecResult:
    ids: list[int]  # generated ids (completion only), == plain greedy decoding
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    verify_calls: int = 0
    per_step: list[int] = field(default_factory=list)  # accepted draft tokens of each verify step, in order

    @property
    def acceptance_length(self) -> float | None:
        """vLLM's mean acceptance length, 1 + accepted / drafts (None without drafts)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None


class AuxCapture:
    """Hooks that capture the aux states of ``layer_ids`` (vLLM convention) on every target forward."""

    def __init__(self, target: Any, layer_ids: Sequence[int]) -> None:
        layers = decoder_layers(target, "the target model")
        n = len(layers)
        bad = [i for i in layer_ids if not 0 < i <= n]
        if bad:
            raise ConfigError(f"aux layer ids {bad} are outside 1..{n} (vLLM convention, target of {n} layers)")
        self.ids = sorted(layer_ids)
        self.got: dict[int, Tensor] = {}
        self.handles: list[Any] = []
        for i in self.ids:
            if i < n:
                self.handles.append(layers[i].register_forward_pre_hook(self._pre(i), with_kwargs=True))
            else:
                self.handles.append(layers[n - 1].register_forward_hook(self._post(i)))

    def _pre(self, i: int) -> Any:
        def hook(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.got[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    def _post(self, i: int) -> Any:
        def hook(_mod: Any, _args: Any, out: Any) -> None:
            self.got[i] = out[0] if isinstance(out, tuple) else out
        return hook

    def take(self) -> Tensor:
        """The captured states of the last forward, [T, n_aux*H] (ascending ids, batch row 0)."""
        missing = [i for i in self.ids if i not in self.got]
        if missing:
            raise ConfigError(f"aux layers {missing} were not captured (the decoder layer hooks did not fire)")
        out = torch.cat([self.got[i][0] for i in self.ids], dim=-1)
        self.got.clear()
        return out

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


@torch.no_grad()
def target_forward(target: Any, ids: Sequence[int], keep: int, cap: AuxCapture | None = None) -> tuple[
        Tensor, Tensor | None]:
    """(logits of the last ``keep`` positions [keep, V], aux [T, n_aux*H] or None) of one full forward."""
    out = target(input_ids=torch.tensor([list(ids)]), use_cache=False, logits_to_keep=keep)
    return out.logits[0], (cap.take() if cap is not None else None)


@torch.no_grad()
def greedy_generate(target: Any, prompt_ids: Sequence[int], *, max_new_tokens: int,
                    eos_ids: Sequence[int] = ()) -> list[int]:
    """Plain greedy decoding (full recompute per token): the reference the speculative output must equal."""
    seq, eos = list(prompt_ids), set(eos_ids)
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits, _ = target_forward(target, seq, 1)
        tok = int(logits[-1].argmax())
        out.append(tok)
        seq.append(tok)
        if tok in eos:
            break
    return out


@torch.no_grad()
def greedy_speculative_generate(target: Any, drafter: Proposer, prompt_ids: Sequence[int], *, k: int,
                                max_new_tokens: int, eos_ids: Sequence[int] = (),
                                aux_layer_ids: Sequence[int]) -> SpecResult:
    """Chain speculation with greedy verification; see the module docstring for the counters' meaning."""
    if k < 1:
        raise ConfigError(f"k (num_speculative_tokens) is {k}; it must be 1 or more")
    if not prompt_ids:
        raise ConfigError("the prompt is empty; speculative decoding needs at least one prompt token")
    res = SpecResult(ids=[], accepted_per_pos=[0] * k)
    if max_new_tokens < 1:
        return res
    eos = set(eos_ids)
    cap = AuxCapture(target, aux_layer_ids)
    try:
        logits, aux = target_forward(target, prompt_ids, 1, cap)
        assert aux is not None
        seq = list(prompt_ids)  # verified ids whose aux states are known
        nxt = int(logits[-1].argmax())  # verified id without aux yet
        res.ids.append(nxt)
        if nxt in eos or len(res.ids) >= max_new_tokens:
            return res
        while True:
            context = [*seq, nxt]
            drafts = [int(t) for t in drafter.propose(context, aux[: len(seq)], k)]
            if len(drafts) != k:
                raise ConfigError(f"the drafter proposed {len(drafts)} tokens; expected k={k}")
            logits, aux = target_forward(target, context + drafts, k + 1, cap)
            assert aux is not None
            preds = [int(t) for t in logits.argmax(-1)]  # target's greedy token after context + drafts[:i]
            a = 0
            while a < k and drafts[a] == preds[a]:
                a += 1
                if drafts[a - 1] in eos:
                    break
            res.drafts += 1
            res.draft_tokens += k
            res.accepted += a
            res.verify_calls += 1
            res.per_step.append(a)
            for i in range(a):
                res.accepted_per_pos[i] += 1
            new = drafts[:a] if a and drafts[a - 1] in eos else [*drafts[:a], preds[a]]
            for tok in new:
                res.ids.append(tok)
                if tok in eos or len(res.ids) >= max_new_tokens:
                    return res
            seq = context + drafts[:a]
            nxt = preds[a]
    finally:
        cap.close()
