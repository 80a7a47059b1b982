"""Capture backends of ``draftgen extract``, registered by ``hidden_states.backend`` kind.

``EXTRACT_BACKENDS`` maps a kind to an ``ExtractBackendKind``: a factory (a ``"module:attr"`` string imported
when used, so registering loads nothing), its ``ExtractCapabilities`` and a one-line doc. The factory is
called as ``factory(cfg: RunConfig) -> ExtractBackend``.

An ``ExtractBackend`` loads the target, resolves the layer ids (``extract.layers``) and exposes:

- ``info``: ``TargetInfo`` (name, revision, num_layers, hidden_size, vocab_size, norm weight/eps, layer ids);
- ``capture(rows) -> list[Captured]``: the states of a batch of merged rows, one per row, in row order;
- ``embed(ids) -> Tensor [T, H]`` float32: the input embeddings (the aux-vs-embedding check);
- ``head_logprobs(final_pre, targets) -> Tensor [N]`` float32: log p(target) from the target's own final
  norm + lm_head applied to pre-norm states (the teacher check);
- ``reference(row) -> Reference | None``: a plain forward pass, independent of ``capture`` (capability
  ``reference``): the hidden states at every stored aux id, the post-norm final state and the log-probs of
  the next ids at every position;
- ``close()``.

Adding a backend is its module plus one line in ``EXTRACT_BACKENDS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from draftgen.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from draftgen.config import RunConfig
    from draftgen.hidden.format import Captured
    from draftgen.phases.extract.layers import LayerIds

__all__ = [
    "EXTRACT_BACKENDS",
    "ExtractBackend",
    "ExtractBackendKind",
    "ExtractCapabilities",
    "ExtractRow",
    "Reference",
    "TargetInfo",
    "extract_backend",
    "open_extract_backend",
]


@dataclass(frozen=True)
class ExtractRow:
    """One merged train row: exactly its ids and mask."""

    sample_id: str
    input_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # uint8 [T]


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


@dataclass
class Reference:
    """A plain forward pass over one row: ``hidden[k]`` = HF ``output_hidden_states[k]`` for each aux id
    (float32 [T, H]); ``post_norm`` = ``output_hidden_states[L]`` (after the final norm); ``logprobs[i]`` =
    log p(input_ids[t+1]) at the i-th checked position t (float32 [len(positions)])."""

    hidden: dict[int, torch.Tensor]
    post_norm: torch.Tensor
    logprobs: torch.Tensor


class ExtractBackend(Protocol):
    info: TargetInfo

    def capture(self, rows: Sequence[ExtractRow]) -> list[Captured]: ...

    def embed(self, ids: np.ndarray) -> torch.Tensor: ...

    def head_logprobs(self, final_pre: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def reference(self, row: ExtractRow, positions: torch.Tensor) -> Reference | None:
        """A plain forward pass: hidden states by layer id, the post-norm final state, and the log-probs of
        ``input_ids[t + 1]`` at each position t of ``positions`` (None: the backend cannot run one)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExtractCapabilities:
    """``reference``: can run the plain-forward reference check; ``device_map``: spreads a model over devices;
    ``needs_gpu``: refuses to run without one."""

    reference: bool = True
    device_map: bool = False
    needs_gpu: bool = False


@dataclass(frozen=True)
class ExtractBackendKind:
    factory: str | Callable[[RunConfig], ExtractBackend]  # "module:attr", imported on use
    capabilities: ExtractCapabilities
    doc: str

    def load_factory(self) -> Callable[[RunConfig], ExtractBackend]:
        if not isinstance(self.factory, str):
            return self.factory
        mod, _, attr = self.factory.partition(":")
        f: Callable[[RunConfig], ExtractBackend] = getattr(importlib.import_module(mod), attr)
        return f


#: ``hidden_states.backend`` → factory, capabilities, doc. One line per backend.
EXTRACT_BACKENDS: dict[str, ExtractBackendKind] = {
    "hf": ExtractBackendKind("draftgen.phases.extract.capture.hf:HFExtractBackend", ExtractCapabilities(reference=True, device_map=True),
                             "transformers forward hooks (CPU or GPU; device_map for large models)"),
    "vllm": ExtractBackendKind("draftgen.phases.extract.capture.vllm:VllmExtractBackend",
                               ExtractCapabilities(reference=False, needs_gpu=False),
                               "vLLM servers running extract_hidden_states + ExampleHiddenStatesConnector "
                               "(emulate --model rehearses on CPU)"),
}


def extract_backend(kind: str) -> ExtractBackendKind:
    try:
        return EXTRACT_BACKENDS[kind]
    except KeyError:
        raise ConfigError(f"hidden_states.backend: unknown backend {kind!r}; one of "
                          f"{', '.join(sorted(EXTRACT_BACKENDS))}") from None


def open_extract_backend(cfg: RunConfig) -> ExtractBackend:
    """The configured backend, loaded (the target model on its device)."""
    kind = extract_backend(cfg.hidden_states.backend)
    try:
        factory = kind.load_factory()
    except ImportError as exc:
        raise ConfigError(f"hidden_states.backend {cfg.hidden_states.backend!r}: {exc.name or exc} is not installed; "
                          "pip install 'draftgen[extract]'") from None
    return factory(cfg)
