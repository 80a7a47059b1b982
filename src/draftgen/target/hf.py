"""The ``hf`` capture backend: the target loaded with transformers, hidden states taken by forward hooks.

Loads ``hidden_states.model`` (a folder or hub id, ``revision``) with ``AutoModelForCausalLM`` in
``compute_dtype`` on ``device`` (or spread by ``device_map``). Hooks, never ``output_hidden_states`` (which
would keep every layer):

- aux id k (vLLM convention): a forward PRE-hook on ``model.model.layers[k]`` takes its input;
- final id L: a forward hook on ``model.model.layers[L-1]`` takes its output (first element of a tuple),
  i.e. the state before the final norm.

Only the base model runs (``model.model``), so no logits are computed while capturing. Rows are batched by
the caller's order (``run`` sorts by length); each batch is right-padded with an attention mask and every
sample is sliced back to its own length, then staged on the device (``target.staging.stage_batch``: rounded to
the storage dtype, the cheap checks' numbers computed there, copied to pinned host memory asynchronously). ``reference`` is a separate plain forward per row (batch of one,
no padding, ``output_hidden_states=True``) and a second one of the row right-padded by a quarter of its length
with an attention mask (another shape: the noise its state comparison is calibrated on; states kept on the
model's device), and runs stored states on through the model's remaining layers
for the teacher check (``drafter.hf.logprobs_through``: on a shallow copy of the base model, so neither the
model nor its hooks change under a capture running meanwhile); the hooks take only the capturing thread's
forward, so a reference forward the checks run in another thread meanwhile (capability ``overlap``) is never
taken.
Nothing here writes a file.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from draftgen.drafter.hf import decoder_layers, logprobs_through, rms_norm
from draftgen.errors import ConfigError
from draftgen.hidden.codec import Captured
from draftgen.hidden.format import require
from draftgen.target import (
    ExtractBackendKind,
    ExtractCapabilities,
    ExtractRow,
    Reference,
    TargetInfo,
    config_digest,
    model_ref_of,
    target_folder,
)
from draftgen.target.layers import resolve_layer_ids
from draftgen.target.staging import stage_batch
from draftgen.target.weights import head_scores

if TYPE_CHECKING:
    import numpy as np
    import torch

    from draftgen.config import RunConfig

__all__ = ["HFExtractBackend", "padded_batch"]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple | list) else out


class HFExtractBackend:
    """See the module docstring."""

    def __init__(self, cfg: RunConfig) -> None:
        hs = cfg.hidden_states
        torch = require("torch")
        transformers = require("transformers")
        if not hs.model:
            raise ConfigError("hidden_states.model: not set; give the target's folder or hub id "
                              "(the exact weights that generated the data)")
        model_ref = model_ref_of(cfg)
        device = hs.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("hidden_states.device: cuda was asked for but torch sees no GPU; use cpu or auto")
        self.dtype = getattr(torch, _DTYPES[hs.compute_dtype])
        self.storage_dtype = hs.dtype
        kw: dict[str, Any] = {"dtype": self.dtype}
        if hs.revision:
            kw["revision"] = hs.revision
        if hs.device_map:
            kw["device_map"] = hs.device_map
        transformers.utils.logging.disable_progress_bar()  # the phase prints its own progress lines
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(model_ref, **kw)
        except OSError as exc:
            raise ConfigError(f"hidden_states.model {hs.model!r}: cannot load ({str(exc).splitlines()[0]}); "
                              "check the folder or hub id (and revision)") from None
        if not hs.device_map:
            model = model.to(device)
        self.model = model.eval()
        self.layers_mod = decoder_layers(model)
        n_layers = len(self.layers_mod)
        layers = resolve_layer_ids(n_layers, hs.layer_ids)
        norm = model.model.norm
        self.norm_eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        self.head = model.get_output_embeddings()
        self.embedding = model.get_input_embeddings()
        self.input_device = self.embedding.weight.device
        self.info = TargetInfo(
            name=hs.model, revision=hs.revision, num_layers=n_layers, hidden_size=int(model.config.hidden_size),
            vocab_size=int(self.head.weight.shape[0]), norm_eps=self.norm_eps,
            norm_weight=norm.weight.detach().float().cpu(), layers=layers,
            config_sha256=config_digest(target_folder(cfg)),
        )
        self.through_layers = hs.teacher_through_layers is not False
        self._grabbed: dict[int, Any] = {}
        self._hooks = [self.layers_mod[k].register_forward_pre_hook(self._pre_hook(k), with_kwargs=True)
                       for k in layers.aux]
        self._hooks.append(self.layers_mod[n_layers - 1].register_forward_hook(self._post_hook(n_layers)))
        self._armed: int | None = None  # the thread whose forward the hooks take (capture), else None

    # -- hooks: store what the layers see in the capturing thread's forward only: a reference forward run
    # by the checks in another thread at the same time (ExtractCapabilities.overlap) is never taken
    def _pre_hook(self, k: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self._armed == threading.get_ident():
                self._grabbed[k] = (args[0] if args else kwargs["hidden_states"]).detach()

        return hook

    def _post_hook(self, k: int) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            if self._armed == threading.get_ident():
                self._grabbed[k] = _first(out).detach()

        return hook

    def capture(self, rows: Sequence[ExtractRow]) -> list[Captured]:
        torch = require("torch")
        if not rows:
            return []
        lengths = [len(r.input_ids) for r in rows]
        ids, mask = padded_batch(rows)
        self._grabbed = {}
        self._armed = threading.get_ident()
        try:
            with torch.inference_mode():
                self.model.model(input_ids=ids.to(self.input_device), attention_mask=mask.to(self.input_device),
                                 use_cache=False)
        finally:
            self._armed = None
        aux_ids, final_id = self.info.layers.aux, self.info.layers.final
        aux_b = [self._grabbed[k] for k in aux_ids]  # each [B, W, H], on the device
        fin_b = self._grabbed[final_id]
        self._grabbed = {}
        # each sample's own rows: its aux layers side by side [T, n_aux*H], its final [T, H]
        with torch.inference_mode():
            aux = [torch.cat([a[i, :n] for a in aux_b], dim=-1) for i, n in enumerate(lengths)]
            final = [fin_b[i, :n] for i, n in enumerate(lengths)]
            if fin_b.device.type == "cpu":  # the host pool stages them (stage_host), beside the next forward
                return [Captured(sample_id=r.sample_id, input_ids=r.input_ids, loss_mask=r.loss_mask, aux=a,
                                 final=f.clone()) for r, a, f in zip(rows, aux, final, strict=True)]
            # an accelerator: staged there (storage dtype, check numbers), then copied to host (target.staging)
            return stage_batch(rows, aux, final, lambda ids: self.embedding(ids.to(self.input_device)),
                               len(aux_ids), self.storage_dtype)

    def embed(self, ids: np.ndarray) -> torch.Tensor:
        th = require("torch")
        with th.inference_mode():
            out: torch.Tensor = self.embedding(th.from_numpy(ids).to(self.input_device)).float().cpu()
        return out

    def _logprobs(self, post_norm: torch.Tensor, targets: torch.Tensor, chunk: int = 256) -> torch.Tensor:
        return self._scores(post_norm, targets, chunk)[0]

    def _scores(self, post_norm: torch.Tensor, targets: torch.Tensor, chunk: int = 256,
                top1: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``target.weights.head_scores`` with the head on its own device and dtype."""
        w = self.head.weight
        return head_scores(lambda x: self.head(x.to(w.device, w.dtype)), post_norm, targets, top1=top1, chunk=chunk)

    def head_logprobs(self, final_pre: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._logprobs(rms_norm(final_pre, self.info.norm_weight, self.norm_eps), targets)

    def head_agreement(self, final_pre: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._scores(rms_norm(final_pre, self.info.norm_weight, self.norm_eps), targets, top1=True)

    def reference(self, row: ExtractRow, positions: torch.Tensor) -> Reference:
        torch = require("torch")
        ids = torch.from_numpy(row.input_ids)[None].to(self.input_device)
        L = self.info.num_layers
        aux = self.info.layers.aux
        with torch.inference_mode():
            hs = self.model.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
            keep = {j for k in aux for j in (k - 1, k, k + 1) if 0 <= j < L} | {L - 1}
            hidden = {j: hs[j][0] for j in sorted(keep)}
            post = hs[L][0]
            del hs
        # log-probs only at the checked positions: the lm_head is the costly part
        logprobs = self._logprobs(post[positions.to(post.device)], torch.from_numpy(row.input_ids[1:])[positions])
        through = partial(logprobs_through, self.model, torch.from_numpy(row.input_ids), positions=positions)
        return Reference(logprobs=logprobs, source="forward", post_norm=post,
                         through=through if self.through_layers else None, hidden=hidden,
                         twin_forward=partial(self._twin, ids, [*aux, L]))

    def _twin(self, ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
        """The states ``layers`` of a second plain forward of ``ids`` [1, T] in another shape: right-padded by
        T//4+1 with an attention mask (``Reference.twin``)."""
        torch = require("torch")
        T = ids.shape[1]
        wide = torch.nn.functional.pad(ids, (0, T // 4 + 1))
        mask = (torch.arange(wide.shape[1], device=ids.device) < T).long()[None]
        with torch.inference_mode():
            hs = self.model.model(input_ids=wide, attention_mask=mask, output_hidden_states=True,
                                  use_cache=False).hidden_states
            return {j: hs[j][0, :T] for j in layers}

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def padded_batch(rows: Sequence[ExtractRow]) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows``' ids right-padded with 0 into one [B, max T] int64 batch, and its attention mask (1 on the ids)."""
    torch = require("torch")
    lengths = [len(r.input_ids) for r in rows]
    ids = torch.zeros((len(rows), max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :lengths[i]] = torch.from_numpy(r.input_ids)
        mask[i, :lengths[i]] = 1
    return ids, mask


#: ``hidden_states.backend`` kind, registered in ``target.EXTRACT_BACKENDS`` by this path.
HF_KIND = ExtractBackendKind(HFExtractBackend, ExtractCapabilities(reference=True, device_map=True, overlap=True))
