"""The target's own tensors, read tensor by tensor from its local folder: what a capture backend that does not
run the target itself (``vllm``) needs beside the servers' states. Its config (layer count, tied head), the final
norm, the embedding (the aux checks' copy check) and the LM head (the teacher and fidelity checks), the last two
loaded once, on first use, from any thread; ``head_scores``, the log-prob and top-1 of completion ids under a
head, for either backend.

Reads the folder's ``config.json``, ``model.safetensors.index.json`` and shards; writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError
from draftgen.hidden.format import require
from draftgen.store import read_json_object

if TYPE_CHECKING:
    import torch

__all__ = ["TargetWeights", "head_agreement", "head_scores"]


class TargetWeights:
    """The target's config and tensors from ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"hidden_states.model {str(folder)!r}: no config.json there; the vllm backend needs "
                              "the target's local folder (for its layer count, embedding, final norm and lm_head)")
        raw = read_json_object(cfg_path)
        self.config: dict[str, Any] = raw.get("text_config") or raw
        self.tie = bool(raw.get("tie_word_embeddings", self.config.get("tie_word_embeddings", False)))
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        self.where: dict[str, str] = {}
        if index.is_file():
            self.where = dict(read_json_object(index)["weight_map"])
        self._lock = threading.Lock()  # the lazy loads: checks run on several threads at once
        self._embed: torch.Tensor | None = None
        self._head: torch.Tensor | None = None

    def tensor(self, *names: str) -> torch.Tensor:
        """The first of ``names`` the folder's safetensors hold; a ConfigError naming the folder when none."""
        st = require("safetensors")
        for name in names:
            shard = self.where.get(name, "model.safetensors" if not self.where else None)
            if shard is None:
                continue
            with st.safe_open(str(self.folder / shard), framework="pt") as f:
                if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    t: torch.Tensor = f.get_tensor(name)
                    return t
        raise ConfigError(f"hidden_states.model {str(self.folder)!r}: no tensor {' or '.join(names)} in its safetensors")

    def embedding(self) -> torch.Tensor:
        """The input embedding [V, H], loaded once."""
        with self._lock:
            if self._embed is None:
                self._embed = self.tensor("model.embed_tokens.weight")
            return self._embed

    def head(self) -> torch.Tensor:
        """The LM head [V, H] (the embedding when the head is tied), loaded once."""
        with self._lock:
            if self._head is None:
                names = ("lm_head.weight", "model.embed_tokens.weight") if self.tie else ("lm_head.weight",)
                self._head = self.tensor(*names)
            return self._head


def head_scores(logits_of: Callable[[torch.Tensor], torch.Tensor], post: torch.Tensor, targets: torch.Tensor, *,
                top1: bool = True, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(targets) (CPU float32 [N], ``drafter.hf.token_logprobs``) from the logits ``logits_of`` gives for
    ``chunk`` post-norm states at a time, and with ``top1`` whether each target's logit is the largest (a tie
    counts; bool [N], else empty). The one head scoring of the hf and vllm capture backends."""
    th = require("torch")
    from draftgen.drafter.hf import token_logprobs

    out, hit = [], []
    with th.inference_mode():
        for s in range(0, post.shape[0], chunk):
            logits = logits_of(post[s:s + chunk])
            want = targets[s:s + chunk].to(logits.device)
            out.append(token_logprobs(logits, want).cpu())
            if top1:
                hit.append((logits.gather(-1, want[:, None].long())[:, 0] >= logits.amax(-1)).cpu())
    res: torch.Tensor = th.cat(out) if out else th.zeros(0)
    return res, th.cat(hit) if hit else th.zeros(0, dtype=th.bool)


def head_agreement(head: torch.Tensor, norm_weight: torch.Tensor, eps: float, final_pre: torch.Tensor,
                   targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``head_scores`` of the head matrix ``head`` [V, H] (float32, this host's CPU) over the final norm of
    ``final_pre`` [T, H]."""
    from draftgen.drafter.hf import rms_norm

    weight = head.float()
    return head_scores(lambda x: x @ weight.T, rms_norm(final_pre, norm_weight, eps), targets)
