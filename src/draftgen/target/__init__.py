"""The target model, reached and checked: the capture backends of ``draftgen extract`` (and of ``train
--online``), registered by ``hidden_states.backend`` kind, and what the phases share about the target.

``EXTRACT_BACKENDS`` (a ``draftgen.registry.Registry``) maps a kind to an ``ExtractBackendKind``: a factory,
called as ``factory(cfg: RunConfig) -> ExtractBackend``, and its ``ExtractCapabilities``. The built-in kinds
are lazy ``"module:attr"`` entries (``hf.HF_KIND``, ``vllm.VLLM_KIND``), imported when used, so registering
loads nothing; each has a one-line doc for docs/config.md. A plugin registers its own kind here.

An ``ExtractBackend`` loads the target, resolves the layer ids (``layers``) and exposes:

- ``info``: ``TargetInfo`` (name, revision, num_layers, hidden_size, vocab_size, norm weight/eps, layer ids);
- ``capture(rows) -> list[Captured]``: the states of a batch of merged rows, one per row, in row order;
- ``embed(ids) -> Tensor [T, H]`` float32: the input embeddings (the aux-vs-embedding check);
- ``head_logprobs(final_pre, targets) -> Tensor [N]`` float32: log p(target) from the target's own final
  norm + lm_head applied to pre-norm states (the teacher check); ``head_agreement(final_pre, targets)``: the
  same and, bool [N], whether each target is the head's top-1 (a tie counts) (provider fidelity);
- ``reference(row, positions) -> Reference | None``: the target's own log-probs of the next ids at the
  checked positions, independent of ``capture``: a plain forward pass (hf, capability ``reference``: also the
  hidden states at every stored aux id and the post-norm final state) or the serving engine's
  ``prompt_logprobs`` (vllm); and, where the backend can run the target's layers, ``through`` (a stored
  state run on through the remaining layers);
- ``close()``.

With the ``overlap`` capability the checks' calls (``embed``, ``head_logprobs``, ``head_agreement``,
``reference``) may come from another thread while ``capture`` runs.

``model_ref_of(cfg)`` and ``target_folder(cfg)``: what ``hidden_states.model`` names, and its local folder
(a hub id's cache snapshot), where ``config_digest`` and the weights digest (``identity.target_weights``) read.

Modules: ``hf`` and ``vllm`` (the backends; ``answer`` and ``connector``: the vllm backend's answers and
connector folder), ``checks`` (the per-sample and teacher checks), ``layers`` (layer ids and their
convention), ``rows`` (the merged train rows as ``ExtractRow``s), ``identity`` (the target's identity and
weights digest), ``fidelity`` (provider fidelity: the rows measured, each provider's figures and flag; extract
and ``train --online`` both measure it). Here only the target's ``config.json`` (``config_digest``) and, for a hub id, the local
Hugging Face cache (``target_folder``) are read; each module says what it reads. Nothing here imports a
phase: extract and ``train --online`` both stand on it.

Adding a backend is its module plus one ``EXTRACT_BACKENDS.register`` line.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from draftgen.errors import ConfigError
from draftgen.registry import Registry

if TYPE_CHECKING:
    import numpy as np
    import torch

    from draftgen.config import RunConfig
    from draftgen.hidden.codec import Captured
    from draftgen.target.layers import LayerIds

__all__ = [
    "EXTRACT_BACKENDS",
    "ExtractBackend",
    "ExtractBackendKind",
    "ExtractCapabilities",
    "ExtractRow",
    "Reference",
    "TargetInfo",
    "backend_capabilities",
    "config_digest",
    "model_ref_of",
    "open_extract_backend",
    "target_folder",
]


@dataclass(frozen=True)
class ExtractRow:
    """One merged train row: exactly its ids and mask; ``fidelity``: extract measures how well the target agrees
    with its completion (``target.checks.check_fidelity``; chosen by ``target.fidelity``)."""

    sample_id: str
    input_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # uint8 [T]
    fidelity: bool = False


@dataclass
class TargetInfo:
    name: str
    revision: str | None
    num_layers: int
    hidden_size: int
    vocab_size: int
    norm_eps: float
    norm_weight: torch.Tensor  # float32 [H], CPU
    layers: LayerIds
    config_sha256: str | None = None  # sha256 of the target's config.json bytes (None: not found)


def model_ref_of(cfg: RunConfig) -> str:
    """What ``hidden_states.model`` names: a local path (relative to the config file) made absolute, else
    the hub id (or URL) as it is."""
    m = cfg.hidden_states.model
    if not m:
        raise ConfigError("hidden_states.model: not set; give the target's folder or hub id "
                          "(the exact weights that generated the data)")
    return m if "://" in m or not cfg.path(m).exists() else str(cfg.path(m))


def target_folder(cfg: RunConfig) -> str:
    """The local folder of the target: ``hidden_states.model``'s folder, or for a hub id its snapshot in the
    Hugging Face cache (``hidden_states.revision``; looked up locally, never downloaded: the backend loads the
    target first); the id itself when there is none."""
    ref = model_ref_of(cfg)
    if os.path.isdir(ref):
        return ref
    from draftgen.hidden.format import require

    try:
        path = require("transformers.utils.hub").cached_file(ref, "config.json", revision=cfg.hidden_states.revision,
                                                             local_files_only=True)
    except Exception:  # not in the local cache: no digest recorded
        return ref
    return os.path.dirname(path) if path else ref


def config_digest(folder: str | os.PathLike[str]) -> str | None:
    """sha256 of ``folder/config.json``'s bytes (the definition ``train.guards.check_verifier`` compares),
    or None when the folder has no config.json."""
    path = os.path.join(os.fspath(folder), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@dataclass
class Reference:
    """What the teacher check compares one row's stored states with. ``logprobs[i]`` = log p(input_ids[t+1])
    at the i-th checked position t as the target itself gives it (float32 [len(positions)]): its serving
    engine's ``prompt_logprobs`` (``source`` "engine": the vllm backend) or a plain forward pass (``source``
    "forward": hf). A plain forward also gives ``hidden[k]`` = HF ``output_hidden_states[k]`` for each aux id
    and its neighbours k-1, k+1 (up to L-1; and L-1 itself) and ``post_norm`` = ``output_hidden_states[L]`` (after
    the final norm), [T, H] on the model's device, and ``twin``: the aux ids' states and (under L) the post-norm
    final from a second plain forward of the row in another shape (right-padded with an attention mask), whose
    difference from the first is the noise the state comparison's tolerance is calibrated on; that forward runs
    only when a check asks for it (``twin_states``: a state outside the tolerance the rounding floor alone
    gives), so a sample within the floor costs one forward. ``through(layer,
    state)``: the same log-probs when the target runs on from ``state`` [T, H] fed in as the input of decoder
    layer ``layer`` (``drafter.hf.logprobs_through``; a batch [B, T, H] of states gives [B, N] in one forward);
    None when the backend cannot run the target's layers."""

    logprobs: torch.Tensor
    source: str = "forward"
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    post_norm: torch.Tensor | None = None
    through: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    twin: dict[int, torch.Tensor] = field(default_factory=dict)
    twin_forward: Callable[[], dict[int, torch.Tensor]] | None = None

    def twin_states(self) -> dict[int, torch.Tensor]:
        """``twin``, running ``twin_forward`` on the first call that needs it (then kept)."""
        if not self.twin and self.twin_forward is not None:
            self.twin, self.twin_forward = self.twin_forward(), None
        return self.twin


class ExtractBackend(Protocol):
    info: TargetInfo

    def capture(self, rows: Sequence[ExtractRow]) -> list[Captured]: ...

    def embed(self, ids: np.ndarray) -> torch.Tensor: ...

    def head_logprobs(self, final_pre: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def head_agreement(self, final_pre: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``head_logprobs`` and, bool [N], whether each target id is the head's top-1 (a tie counts)."""
        ...

    def reference(self, row: ExtractRow, positions: torch.Tensor) -> Reference | None:
        """The target's own log-probs of ``input_ids[t + 1]`` at each position t of ``positions`` (a plain
        forward pass, or the serving engine's ``prompt_logprobs``), see ``Reference``; None: neither."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExtractCapabilities:
    """``reference``: runs a plain forward pass for the teacher check (hidden states and post-norm state
    besides the log-probs; the vllm backend compares with its engine's log-probs instead); ``device_map``:
    spreads a model over devices; ``needs_gpu``: refuses to run without one; ``overlap``: ``embed``,
    ``head_logprobs`` and ``reference`` may run in another thread while ``capture`` runs (the worker then
    checks and writes batch k while batch k+1 is captured)."""

    reference: bool = True
    device_map: bool = False
    needs_gpu: bool = False
    overlap: bool = False


@dataclass(frozen=True)
class ExtractBackendKind:
    """One ``hidden_states.backend`` kind: how to load it, and what it can do."""

    factory: Callable[[RunConfig], ExtractBackend]
    capabilities: ExtractCapabilities


#: ``hidden_states.backend`` → its kind, lazily imported from the backend's module. One line per backend.
EXTRACT_BACKENDS: Registry[ExtractBackendKind] = Registry("hidden_states.backend", "capture backend")
EXTRACT_BACKENDS.register("hf", "draftgen.target.hf:HF_KIND",
                          doc="transformers forward hooks, on CPU or GPU; device_map for large models")
EXTRACT_BACKENDS.register("vllm", "draftgen.target.vllm:VLLM_KIND",
                          doc="vLLM servers running extract_hidden_states + ExampleHiddenStatesConnector; "
                              "emulate --model rehearses it on CPU")


def _kind(cfg: RunConfig) -> ExtractBackendKind:
    try:
        return EXTRACT_BACKENDS.get(cfg.hidden_states.backend)
    except ImportError as exc:
        raise ConfigError(f"hidden_states.backend {cfg.hidden_states.backend!r}: {exc.name or exc} is not installed; "
                          "pip install 'draftgen[extract]'") from None


def backend_capabilities(cfg: RunConfig) -> ExtractCapabilities:
    """What the configured backend kind can do."""
    return _kind(cfg).capabilities


def open_extract_backend(cfg: RunConfig) -> ExtractBackend:
    """The configured backend, loaded (the target model on its device)."""
    return _kind(cfg).factory(cfg)
