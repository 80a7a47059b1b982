"""The ``hidden_states`` config section: the hidden-state disk estimate and ``draftgen extract``.

Kept apart from ``config.py`` for size; ``config.RunConfig.hidden_states`` is this class and
``docs/config.md`` (``docgen``) reads its key docs from this file too. Layer ids are vLLM-convention ids
(``draftgen.target.layers``). Pure data: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from draftgen.config.base import Section

__all__ = ["HiddenStatesConfig"]


class HiddenStatesConfig(Section):
    """Hidden states of the target model: the disk estimate (``plan``, ``merge``) and ``draftgen extract``."""

    hidden_size: int | None = None
    """Target model hidden size (Kimi-K2.5: 7,168) for the disk estimate."""
    slots: int = 4
    """Captured hidden states per token (EAGLE-3: 3 auxiliary layers + the final one)."""
    dtype: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    """Storage dtype of captured hidden states (fp8: e4m3 with a float32 scale per token, half of bf16's disk)."""
    extraction_tokens_per_s: float | None = None
    """Extraction speed assumed for the time estimate; unset, ``plan`` uses the throughput measured by the last ``draftgen extract`` (its manifest.json)."""
    extract: bool = False
    """``draftgen run`` also runs the extract phase after merge (``draftgen extract`` runs it on its own)."""
    backend: str = "hf"
    """Capture backend, one of those registered in ``draftgen.target.EXTRACT_BACKENDS``."""
    model: str | None = None
    """The target model for extraction: a local folder or a hub id (the exact weights that generated the data)."""
    revision: str | None = None
    """Hub revision (commit, tag or branch) of ``model``."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the target runs: ``auto`` is cuda when available, else cpu."""
    compute_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """Dtype the target computes in."""
    device_map: str | None = None
    """Passed to ``from_pretrained(device_map=...)`` for models larger than one device (``auto``)."""
    layer_ids: list[int] | None = None
    """Aux layer ids in the vLLM convention (id k = input of decoder layer k, 0 < k < L); unset: ``[2, L//2, L-3]``. The final state (id L, pre-norm) is always stored."""
    batch_tokens: int = 8192
    """Padded tokens per forward batch (samples sorted by length; a longer sample runs alone)."""
    output: str | None = None
    """Destination: a folder (relative to the config file) or an fsspec URL (``s3://bucket/prefix``); unset: ``<run>/hidden``."""
    storage_options: dict[str, Any] = msgspec.field(default_factory=dict)
    """fsspec options for ``output`` (S3: ``endpoint_url``, ``client_kwargs``, ``config_kwargs``); credentials (``key``, ``secret``, ``token``, a ``user:password@`` in a URL) are refused here: they come from the AWS_* variables, AWS_PROFILE or a credentials file."""
    teacher_fraction: float = 0.05
    """Share of samples whose stored states are checked against the target's own log-probs: a plain forward pass (hf backend: the samples chosen by a hash of sample_id) or the serving engine's ``prompt_logprobs`` (vllm backend: asked for in every extraction request, the checked samples drawn after each answer with a secret, docs/extract.md "The spot check")."""
    teacher_positions: int = 64
    """Teacher check: completion positions scored per checked sample (evenly spaced; 0: all). The LM head over the whole vocabulary is the check's costly part."""
    teacher_min_margin: float | None = 1.0
    """Teacher check: the mean log-prob of the completion ids under the target's head on the stored final state must beat chance (log 1/V) by this many nats (null: not checked)."""
    teacher_tolerance: float | None = None
    """Largest relative difference allowed between stored and plain-forward states (hf backend); unset: calibrated per sample and state, 3 × max(noise, the compute dtype's unit roundoff × √depth) + the storage dtype's, where noise is the difference between the plain forward and a second one of the row right-padded (docs/extract.md, Checks). The log-prob check's tolerance is calibrated per sample too."""
    teacher_through_layers: bool | None = None
    """Teacher check: also run each stored aux slot on through the target's remaining layers and compare the log-probs it gives (``teacher_aux``: an off-by-one layer, aux not captured). The hf backend has the model loaded; the vllm backend loads the target from ``model`` on this host's CPU for it. Unset: on, except a vllm backend whose target's safetensors exceed 4 GiB."""
    min_rel_diff: float = 0.01
    """Aux slots must differ from each other and from the embeddings of the ids by at least this mean relative difference."""
    min_token_norm: float = 1e-4
    """Smallest plausible L2 norm of a stored per-token state."""
    max_token_norm: float = 1e6
    """Largest plausible L2 norm of a stored per-token state."""
    fidelity_samples: int = 64
    """Provider fidelity: samples of each provider (the merged rows' ``provider``) whose stored final state goes through the target's final norm and head to score the provider's completion (mean log p of its ids, share of positions where its id is the target's top-1; ``teacher_positions`` evenly spaced positions each): the first this many by a hash of sample_id, plus every teacher-checked sample; 0: not measured."""
    fidelity_margin: float = 0.02
    """Provider fidelity: a provider is flagged when the 95% bootstrap interval (over samples) of the best provider's top-1 agreement minus its own lies wholly above this margin (a share of positions: 0.02 is 2 points), both providers with at least 5 measured samples (docs/extract.md, Provider fidelity)."""
    fidelity_action: Literal["warn", "exclude"] = "warn"
    """Provider fidelity: ``warn`` reports a flagged provider (extract's output, status, the report); ``exclude`` also leaves its rows out of the set's training samples (train and export-hidden skip them; train.json counts them). ``train --online`` measures it through its first server before training and does the same."""
    max_flagged_fraction: float = 0.001
    """``draftgen extract`` exits 3 when more than this share of samples fails a check (flagged samples are still stored and listed in the manifest)."""
    base_urls: list[str] = msgspec.field(default_factory=list)
    """vllm backend: roots of the servers running extract_hidden_states (http://host:8000 or .../v1); unset: endpoint.base_url and endpoint.base_urls when endpoint.kind is vllm."""
    concurrency: int | None = None
    """vllm backend: requests in flight over all servers (default 8 per server)."""
    connector_dir: str | None = None
    """vllm backend, required: the folder the servers' kv_transfer_config shared_storage_path names, as seen here (relative to the config file), shared between servers and client; only ``<request_id>.safetensors`` files directly in it are read and removed, any other hidden_states_path is refused."""
    devices: list[str] = msgspec.field(default_factory=list)
    """Without Ray, hf backend: one process per entry (`cuda:0`, `cuda:1`, ... each sees only its GPU; or `cpu`), sharing the pending batches; fewer than two entries: one process on `device`."""
    ray: bool = False
    """``draftgen extract`` runs the hf backend on a Ray Data actor pool (``workers`` actors, each loading the target once); needs ``draftgen[ray]``."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``); unset: a local Ray instance started and shut down by ``draftgen extract``."""
    workers: int = 1
    """Ray actors, each with its own copy of the target (with ``ray``)."""
    num_gpus_per_worker: float = 0
    """GPUs Ray reserves for each actor (1 per GPU; more with ``device_map``); 0 on CPU."""
    num_cpus_per_worker: float = 1
    """CPUs Ray reserves for each actor (also its torch thread count)."""
