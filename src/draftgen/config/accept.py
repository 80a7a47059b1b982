"""The ``accept`` section of the run configuration: how ``draftgen accept`` measures a drafter's acceptance on a
live server (``draftgen.phases.accept.run``). Imported by ``draftgen.config`` (the ``RunConfig.accept`` field);
``docs/config.md`` is generated from these docstrings."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["AcceptConfig"]


class AcceptConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """How ``draftgen accept`` measures acceptance of the served drafter on held-out prompts."""

    enabled: bool = False
    """Run ``accept`` as a phase of ``draftgen run``, after ``train``, against ``accept.base_url``;
    ``draftgen accept`` runs it either way."""
    drafter: str | None = None
    """The drafter checkpoint folder the server serves, for the ``accept`` phase of ``draftgen run`` (its
    speculative tokens and offline estimate); default: the run's own ``train/drafter``. ``draftgen accept``
    takes ``--drafter``."""
    base_url: str | None = None
    """The server that serves the target with the drafter, for the ``accept`` phase of ``draftgen run``
    (default: ``endpoint.base_url``, the generation server); ``draftgen accept`` takes ``--base-url``."""
    prompts: int = 20
    """Held-out prompts to send: prepared prompts that are in no merged row, by sample id or by content (the
    same prompt under another dataset name is not held out), taken in a fixed order (by a hash of the sample
    id), spread over the datasets."""
    datasets: list[str] | None = None
    """Datasets to take held-out prompts from (default: every dataset of the config)."""
    max_tokens: int = 256
    """max_tokens of each request (greedy, temperature 0)."""
    concurrency: int = 4
    """Requests in flight at once (the same for the baseline server); with ``one_at_a_time`` on a vLLM server,
    one."""
    one_at_a_time: bool = True
    """vLLM: send the prompts one at a time and read ``/metrics`` around each request, so that each prompt's
    acceptance is known: the 95% interval of the drafter's acceptance length, its paired comparison with the
    no-model drafters and the zero-aux server, and per-dataset figures. Off: ``concurrency`` requests in flight
    and one acceptance length over them all (the no-model drafters keep their intervals). SGLang's
    ``meta_info`` is per request either way."""
    per_request: Literal["auto", "metrics"] = "auto"
    """vLLM: where each prompt's acceptance comes from. ``auto``: the first prompt is sent alone; when its
    response carries ``metrics.speculative_decoding`` (vLLM started with ``--per-request-spec-decode-metrics
    summary``) every prompt's counts are its own response's and the rest go ``concurrency`` at a time;
    otherwise as ``metrics``. ``metrics``: ``GET /metrics`` around each request (``one_at_a_time``)."""
    server: Literal["auto", "vllm", "sglang"] = "auto"
    """How acceptance is read: ``vllm`` (``GET /metrics`` counters before and after), ``sglang`` (per-request
    ``meta_info`` of the native ``/generate``); ``auto`` follows ``endpoint.kind``."""
    baseline_url: str | None = None
    """A second server of the same target without the drafter: tokens/s with and without speculation."""
    zero_aux_url: str | None = None
    """A server of the same target and drafter that feeds the drafter zeroed aux states (``draftgen emulate
    --model T --drafter D --zero-aux``): its acceptance is reported as the ``zero-aux`` ablation, which shows
    whether the drafter uses the target's hidden states at all."""
    draft_lm: str | None = None
    """A draft LM folder (``draftgen train --draft-lm``: a small LM of the drafter's trainable size reading ids
    only) replayed on the target's greedy continuations beside copy-last and lookup, with its paired
    comparison; ``draftgen accept`` takes ``--draft-lm``."""
    offline_cond_acc: list[float] | None = None
    """Per-step conditional accuracies for the offline estimate of a drafter that has no training log here (one
    not under the run's ``train/``, or a run without ``train/log.jsonl``)."""
    concurrencies: list[int] = msgspec.field(default_factory=lambda: [1, 8, 32, 128])
    """Concurrencies (sequences in flight on the server) at which accept gives the drafter's expected speedup
    at every k up to its own, and the k of the largest; k is recommended at ``concurrency`` when it is listed
    here, else at the smallest listed (docs/train.md, "Which k to serve")."""
    draft_step_cost: float = 0.05
    """The cost model's cost of one draft step, in target decode steps (a memory-bound step of the target =
    1). With ``baseline_url`` it is fitted instead, so that the model gives the measured speedup at the served
    k, and this value is not used."""
    saturation_tokens: int = 256
    """The cost model's tokens in one target step at which the accelerator stops being memory-bound: a step
    of n tokens costs max(1, n / saturation_tokens) decode steps (verifying k tokens for c sequences is
    c·(k+1) tokens)."""

    def __post_init__(self) -> None:
        # Invariant: the cost model's parameters give finite, positive step costs. A ValueError here becomes the
        # loader's ConfigError naming the file and the 'accept' section.
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise ValueError(f"accept.concurrencies {self.concurrencies} must list one or more concurrencies >= 1")
        if not 0.0 <= self.draft_step_cost < float("inf"):
            raise ValueError(f"accept.draft_step_cost {self.draft_step_cost} must be >= 0 (a share of a target step)")
        if self.saturation_tokens < 1:
            raise ValueError(f"accept.saturation_tokens {self.saturation_tokens} must be >= 1")
