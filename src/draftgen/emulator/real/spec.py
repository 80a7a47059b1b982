"""Speculative decoding in ``draftgen emulate --model DIR --drafter CKPT``: real greedy verification.

``SpecDecoder.load(ckpt, lm, k)`` loads an EAGLE-3 drafter (``draftgen.drafter.eagle3.load_drafter``: a
speculators checkpoint or the flat EAGLE/SGLang format; the target's embedding when the checkpoint has none)
and decodes one greedy request at a time with ``draftgen.drafter.speculate.greedy_speculative_generate``:
the output ids equal plain greedy decoding, and the counts (drafts, draft tokens, accepted tokens, accepted
per position, verification calls) feed vLLM's ``/metrics`` counters and SGLang's ``meta_info``. The drafter's
aux layer ids come from its config (vLLM convention), else ``[2, L//2, L-3]``.

``zero_aux`` (``emulate --zero-aux``): the drafter is fed zeroed aux states instead of the target's, the
zero-aux ablation ``draftgen accept --zero-aux-url`` measures (does the drafter use the hidden states at all?);
the output ids are still plain greedy decoding.

``request_metrics``: one request's counts as vLLM reports them per request with
``--per-request-spec-decode-metrics summary|detailed`` (vLLM PR #48915): the response's top-level
``metrics.speculative_decoding`` (``emulate --per-request-spec-decode-metrics``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from draftgen.emulator.real.engine import GenResult, LoadedModel

if TYPE_CHECKING:
    from draftgen.drafter.speculate import SpecResult

__all__ = ["SPEC_METRICS_MODES", "SpecDecoder", "request_metrics"]

#: vLLM's ``--per-request-spec-decode-metrics`` values
SPEC_METRICS_MODES = ("summary", "detailed")


class _ZeroAux:
    """A drafter fed zeros of the aux states' shape (``speculate.Proposer``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def propose(self, context: Sequence[int], aux: Any, k: int) -> list[int]:
        import torch

        out: list[int] = self.inner.propose(context, torch.zeros_like(aux), k)
        return out


class SpecDecoder:
    def __init__(self, drafter: Any, lm: LoadedModel, *, k: int, aux_layer_ids: list[int],
                 zero_aux: bool = False) -> None:
        self.drafter = _ZeroAux(drafter) if zero_aux else drafter
        self.lm = lm
        self.k = k
        self.aux_layer_ids = aux_layer_ids
        self.zero_aux = zero_aux

    @classmethod
    def load(cls, path: str, lm: LoadedModel, *, k: int, zero_aux: bool = False) -> SpecDecoder:
        from pathlib import Path

        from draftgen.drafter.eagle3 import load_drafter, read_drafter_config
        from draftgen.errors import ConfigError

        if k < 1:
            raise ConfigError(f"emulate --num-speculative-tokens {k}: must be 1 or more")
        if not Path(path).is_dir():
            raise ConfigError(f"emulate --drafter {path}: not a folder; give a drafter checkpoint folder")
        c = read_drafter_config(Path(path))
        emb = lm.model.get_input_embeddings().weight.detach().float().cpu()
        drafter = load_drafter(path, embed_weight=emb)
        L = lm.num_layers
        ids = [int(i) for i in (c.aux_layer_ids or [2, L // 2, L - 3])]
        ids = [i for i in ids if i != L]  # speculators' ids may list the final id too
        return cls(drafter, lm, k=k, aux_layer_ids=ids, zero_aux=zero_aux)

    def generate(self, prompt_ids: list[int], *, max_new: int, eos_ids: Iterable[int]) -> GenResult:
        import torch

        from draftgen.drafter.speculate import greedy_speculative_generate

        with torch.inference_mode():
            r = greedy_speculative_generate(self.lm.model, self.drafter, prompt_ids, k=self.k, max_new_tokens=max_new,
                                            eos_ids=list(eos_ids), aux_layer_ids=self.aux_layer_ids)
        eos = set(eos_ids)
        finish = "stop" if r.ids and r.ids[-1] in eos else "length"
        return GenResult(ids=list(r.ids), finish_reason=finish, spec=r)


def request_metrics(s: SpecResult, k: int, mode: str) -> dict[str, Any]:
    """``metrics.speculative_decoding`` of one request: ``acceptance_histogram[j]`` counts the verify steps that
    accepted exactly ``j`` of the ``k`` drafted tokens (a chain: step accepted j iff positions < j were);
    ``detailed`` adds ``per_step_accepted``. ``mean_acceptance_length`` 1 + accepted / steps (None without a
    step), ``draft_acceptance_rate`` accepted / drafted tokens."""
    hist = [0] * (k + 1)
    for a in s.per_step:
        hist[a] += 1
    out: dict[str, Any] = {
        "mean_acceptance_length": s.acceptance_length,
        "draft_acceptance_rate": s.accepted / s.draft_tokens if s.draft_tokens else None,
        "acceptance_histogram": hist, "num_spec_steps": s.drafts, "num_accepted_draft_tokens": s.accepted,
        "num_draft_tokens": s.draft_tokens, "num_spec_tokens": k}
    if mode == "detailed":
        out["per_step_accepted"] = list(s.per_step)
    return out
