"""The batching generation engine behind ``draftgen emulate --model DIR``: a real transformers model on CPU.

One worker thread owns the model. HTTP handlers submit ``GenJob``s (prompt ids, max new tokens, sampling,
whether to capture the prompt's hidden states) and await their ``GenResult``. The worker takes what is
queued (after a short gathering window, skipped while its clients come one at a time: the last batch held
one request; vLLM adds no wait to a lone request), left-pads it into one batch, prefills it in one forward pass and
decodes step by step with a KV cache: one forward per step for the whole batch, logits for the last
position only (``logits_to_keep=1``). Rows leave the batch as they finish (``DynamicCache``
``batch_select_indices``). Greedy rows take the argmax, so a row's ids equal the model's plain greedy
decoding of that prompt alone (up to float rounding between padded and unpadded matmuls); sampled rows
draw from their own seeded ``torch.Generator`` (temperature, top_p, top_k).

Hidden-state capture (extract mode) happens in the prefill: forward hooks record, for each layer id k of
the vLLM convention, the input of decoder layer k (k < L; id 0 = the embeddings) or the output of the last
layer before the final norm (k = L). ``GenResult.hidden`` is then ``[T, n_ids, H]`` in the model dtype, ids
ascending, for the prompt tokens only (``model_extract`` writes it in vLLM's connector format).

A job asking for ``prompt_logprobs`` gets, per prompt position, the log-prob and vocabulary rank of the
prompt token under the prefill's own logits (the final norm and LM head over the same forward that captured
its hidden states), plus the top alternatives, as vLLM computes them.

With a drafter (``SpecDecoder``, ``model_spec``), greedy jobs are decoded one at a time by greedy speculative
verification instead, and their draft/accept counts come back in ``GenResult.spec``.

``perturb_weights``: seeded Gaussian noise on every weight (``emulate --perturb``: a "quantized" provider).

torch and transformers are imported lazily (``draftgen[extract]``).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from draftgen.drafter.speculate import SpecResult

__all__ = ["GenJob", "GenResult", "LoadedModel", "ModelEngine", "load_model", "perturb_weights"]


@dataclass
class GenJob:
    prompt_ids: list[int]
    max_new: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    capture: bool = False
    #: vLLM's ``prompt_logprobs``: None (not asked), the number of top alternatives per prompt position
    #: (0: the prompt token only), or -1 (the whole vocabulary)
    prompt_logprobs: int | None = None
    #: called in the worker thread right after the prefill with the captured states (extract mode takes
    #: its lock and starts the write there, before the response can name the file)
    on_prefill: Callable[[GenJob, torch.Tensor | None], None] | None = None
    future: concurrent.futures.Future[GenResult] = field(default_factory=concurrent.futures.Future)

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature <= 0.0


@dataclass
class GenResult:
    ids: list[int]
    finish_reason: str  # "stop" (an end-of-sequence id, which is the last id) | "length"
    hidden: torch.Tensor | None = None
    spec: SpecResult | None = None  # what speculative decoding did (vLLM's counters, SGLang's meta_info)
    elapsed_s: float = 0.0
    #: per prompt position p (None at p = 0): (token id, logprob, rank) of the prompt token, then the top
    #: alternatives; log p(prompt[p] | prompt[:p]) from the prefill's own logits (``GenJob.prompt_logprobs``)
    prompt_logprobs: list[list[tuple[int, float, int]] | None] | None = None


@dataclass
class LoadedModel:
    model: Any  # a transformers causal LM
    tokenizer: Any
    eos_ids: frozenset[int]
    num_layers: int
    hidden_size: int
    dtype: torch.dtype
    max_len: int
    name: str


def load_model(path: str, *, device: str = "cpu", dtype: str = "auto", threads: int = 2,
               name: str | None = None) -> LoadedModel:
    """Load DIR with transformers (local files only); ConfigError when the extra or the folder is missing."""
    from pathlib import Path

    from draftgen.errors import ConfigError

    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ConfigError("emulate --model needs torch and transformers: install draftgen[extract]") from None
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ConfigError(f"emulate --model {path}: no config.json there; give a transformers model folder")
    if threads > 0:
        torch.set_num_threads(threads)
    dtypes = {"auto": "auto", "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
              "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in dtypes:
        raise ConfigError(f"emulate --dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    model: Any = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtypes[dtype], local_files_only=True)
    model = model.to(device).eval()
    tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    eos: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config, tok):
        v = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(v, int):
            eos.add(v)
        elif isinstance(v, (list, tuple)):
            eos.update(int(x) for x in v)
    cfg = model.config
    text_cfg = getattr(cfg, "text_config", None) or cfg
    max_len = int(getattr(text_cfg, "max_position_embeddings", 0) or 32768)
    return LoadedModel(model=model, tokenizer=tok, eos_ids=frozenset(eos), num_layers=int(text_cfg.num_hidden_layers),
                       hidden_size=int(text_cfg.hidden_size), dtype=next(model.parameters()).dtype,
                       max_len=max_len, name=name or p.resolve().name)


def perturb_weights(model: Any, scale: float, seed: int) -> None:
    """Add seeded Gaussian noise of relative scale ``scale`` to every floating weight of ``model``, in place:
    each tensor w becomes w + scale · rms(w) · N(0, 1) (one ``torch.Generator`` seeded with ``seed``, the
    parameters in ``named_parameters`` order, a tied tensor once): a stand-in for a quantized copy of the
    target, whose outputs really differ from the target's."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if not p.is_floating_point() or p.numel() == 0:
                continue
            rms = p.float().pow(2).mean().sqrt()
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.add_((scale * rms * noise).to(p.device, p.dtype))


class _Capture:
    """Forward hooks recording the vLLM-convention layer ids during one prefill."""

    def __init__(self, lm: LoadedModel, layer_ids: Sequence[int]) -> None:
        self.ids = sorted(set(layer_ids))
        self.got: dict[int, torch.Tensor] = {}
        self.on = False
        layers = lm.model.model.layers
        self._handles: list[Any] = []
        for k in self.ids:
            if k == 0:
                self._handles.append(layers[0].register_forward_pre_hook(self._pre_hook(0), with_kwargs=True))
            else:
                self._handles.append(layers[k - 1].register_forward_hook(self._post_hook(k)))

    def _pre_hook(self, k: int) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self.on:
                self.got[k] = args[0] if args else kwargs["hidden_states"]
        return hook

    def _post_hook(self, k: int) -> Callable[..., None]:
        def hook(mod: Any, args: tuple[Any, ...], out: Any) -> None:
            if self.on:
                self.got[k] = out[0] if isinstance(out, tuple) else out
        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class ModelEngine:
    """The worker thread and its queue. ``submit`` is thread-safe; ``close`` stops the worker."""

    def __init__(self, lm: LoadedModel, *, layer_ids: Sequence[int] = (), max_batch: int = 256,
                 gather_s: float = 0.01, spec: Any = None) -> None:
        self.lm = lm
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.spec = spec  # model_spec.SpecDecoder | None
        self._capture = _Capture(lm, layer_ids) if layer_ids else None
        self._head = _Head(lm.model)
        self._q: queue.Queue[GenJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="draftgen-model-engine", daemon=True)
        self.forwards = 0
        self.batches = 0
        self._last_taken = 0  # requests in the last batch taken (0: none yet)
        self._thread.start()

    @property
    def layer_ids(self) -> list[int]:
        return list(self._capture.ids) if self._capture else []

    def submit(self, job: GenJob) -> concurrent.futures.Future[GenResult]:
        self._q.put(job)
        return job.future

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
        if self._capture is not None:
            self._capture.close()

    # -- worker --------------------------------------------------------------------------------------

    def _run(self) -> None:
        import torch

        while True:
            first = self._q.get()
            if first is None:
                return
            jobs = [first]
            # what is queued is always taken; the window waits for more only after a batch of several
            deadline = time.monotonic() + (0.0 if self._last_taken == 1 else self.gather_s)
            stop = False
            while len(jobs) < self.max_batch:
                try:
                    nxt = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                jobs.append(nxt)
            self._last_taken = len(jobs)
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            try:
                with torch.inference_mode():
                    self._serve(jobs)
            except BaseException as exc:  # a bug or an OOM: every waiting request gets it, the server stays up
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(exc)
            if stop:
                return

    def _serve(self, jobs: list[GenJob]) -> None:
        if self.spec is not None:
            spec_jobs = [j for j in jobs if j.greedy and not j.capture and j.prompt_logprobs is None]
            for j in spec_jobs:
                t0 = time.monotonic()
                res = self.spec.generate(j.prompt_ids, max_new=j.max_new, eos_ids=self.lm.eos_ids)
                res.elapsed_s = time.monotonic() - t0
                j.future.set_result(res)
            served = {id(j) for j in spec_jobs}
            jobs = [j for j in jobs if id(j) not in served]
        if jobs:
            self.batches += 1
            self._generate_batch(jobs)

    def _generate_batch(self, jobs: list[GenJob]) -> None:
        import torch
        from transformers import DynamicCache

        t0 = time.monotonic()
        model = self.lm.model
        dev = next(model.parameters()).device
        n = len(jobs)
        lens = [len(j.prompt_ids) for j in jobs]
        width = max(lens)
        pad = 0
        input_ids = torch.full((n, width), pad, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, j in enumerate(jobs):
            input_ids[i, width - lens[i]:] = torch.tensor(j.prompt_ids, dtype=torch.long)
            attn[i, width - lens[i]:] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        input_ids, attn, pos = input_ids.to(dev), attn.to(dev), pos.to(dev)
        cache = DynamicCache(config=model.config)
        cap = self._capture
        capture = cap is not None and any(j.capture for j in jobs)
        if cap is not None:
            cap.got.clear()
            cap.on = capture
        try:
            out = model.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True)
        finally:
            if cap is not None:
                cap.on = False
        self.forwards += 1
        hidden: list[torch.Tensor | None] = [None] * n
        if capture and cap is not None:
            stacked = torch.stack([cap.got[k] for k in cap.ids], dim=2)  # [n, width, n_ids, H]
            for i, j in enumerate(jobs):
                if j.capture:
                    hidden[i] = stacked[i, width - lens[i]:].to("cpu").clone()
            cap.got.clear()
        for i, j in enumerate(jobs):
            if j.on_prefill is not None:
                j.on_prefill(j, hidden[i])
        prompt_lp = [None if j.prompt_logprobs is None else
                     self._prompt_logprobs(out.last_hidden_state[i, width - lens[i]:], j) for i, j in enumerate(jobs)]
        gens = [_sampler(j, dev) for j in jobs]
        outs: list[list[int]] = [[] for _ in jobs]
        finish = ["length"] * n
        active = list(range(n))  # original index of each row still in the batch
        head = self._head
        last = out.last_hidden_state[:, -1, :]
        while True:
            nxt = head.greedy(last).to("cpu")
            for r, i in enumerate(active):
                if gens[i] is not None:
                    nxt[r] = _pick(head.logits(last[r:r + 1])[0], jobs[i], gens[i])
            toks = nxt.tolist()
            keep: list[int] = []
            for r, i in enumerate(active):
                tok = toks[r]
                outs[i].append(tok)
                if tok in self.lm.eos_ids:
                    finish[i] = "stop"
                elif len(outs[i]) < jobs[i].max_new:
                    keep.append(r)
            if not keep:
                break
            if len(keep) < len(active):
                idx = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(idx)
                attn, pos, nxt = attn[idx], pos[idx], nxt[keep]
                active = [active[r] for r in keep]
            attn = torch.cat([attn, torch.ones((len(active), 1), dtype=attn.dtype, device=dev)], dim=1)
            pos = pos[:, -1:] + 1
            out = model.model(input_ids=nxt.view(-1, 1).to(dev), attention_mask=attn, position_ids=pos, cache=cache,
                              use_cache=True)
            self.forwards += 1
            last = out.last_hidden_state[:, -1, :]
        elapsed = time.monotonic() - t0
        for i, j in enumerate(jobs):
            j.future.set_result(GenResult(ids=outs[i], finish_reason=finish[i], hidden=hidden[i], elapsed_s=elapsed,
                                          prompt_logprobs=prompt_lp[i]))

    def _prompt_logprobs(self, post_norm: torch.Tensor, job: GenJob) -> list[list[tuple[int, float, int]] | None]:
        """vLLM's prompt logprobs of one prompt from its prefill's post-norm states [T, H]: position p gets
        (prompt[p], log p, rank) then the ``job.prompt_logprobs`` best ids (all with -1), position 0 None."""
        import torch

        ids = job.prompt_ids
        top = int(job.prompt_logprobs or 0)
        out: list[list[tuple[int, float, int]] | None] = [None]
        for s in range(0, len(ids) - 1, 256):  # the LM head over the whole vocabulary, a chunk of rows at a time
            logp = torch.log_softmax(self._head.logits(post_norm[s:min(s + 256, len(ids) - 1)]).float(), dim=-1)
            for r in range(logp.shape[0]):
                row, tok = logp[r], ids[s + r + 1]
                lp = float(row[tok])
                entry = [(tok, lp, 1 + int((row > lp).sum()))]
                k = row.numel() if top < 0 else top
                if k:
                    vals, idx = torch.topk(row, min(k, row.numel()))
                    entry += [(int(t), float(v), n + 1) for n, (v, t) in enumerate(zip(vals, idx, strict=True))
                              if int(t) != tok]
                out.append(entry)
        return out


class _Head:
    """The LM head on the final (post-norm) state, computing only what it must.

    All-zero rows of a bias-free linear head give a logit of exactly 0 whatever the input, so when such rows
    exist (a target that can only emit part of its vocabulary) only the other rows are multiplied; greedy
    picks exactly what ``argmax`` over the full logits picks (the first index of the maximum), and sampling
    gets the full logits rebuilt with those zeros. Any other head (bias, soft-capping, scaling) runs as is.
    """

    def __init__(self, model: Any) -> None:
        import torch

        self.head = model.get_output_embeddings()
        w = self.head.weight
        cfg = model.config
        plain = (isinstance(self.head, torch.nn.Linear) and self.head.bias is None
                 and not getattr(cfg, "final_logit_softcapping", None) and getattr(cfg, "logit_scale", None) is None)
        self.vocab = int(w.shape[0])
        self.live: torch.Tensor | None = None
        if plain:
            with torch.inference_mode():
                zero = (w == 0).all(dim=1)
            n_zero = int(zero.sum())
            if n_zero * 2 > self.vocab:
                self.live = torch.nonzero(~zero)[:, 0]
                self.w_live = w[self.live]
                self.first_zero = int(torch.nonzero(zero)[0, 0])

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        import torch

        if self.live is None:
            out: torch.Tensor = self.head(h)
            return out
        full = torch.zeros((h.shape[0], self.vocab), dtype=h.dtype, device=h.device)
        full[:, self.live] = h @ self.w_live.T
        return full

    def greedy(self, h: torch.Tensor) -> torch.Tensor:
        import torch

        if self.live is None:
            return torch.argmax(self.head(h), dim=-1)
        part = h @ self.w_live.T
        best, arg = part.max(dim=-1)
        out = self.live[arg].clone()
        for r in torch.nonzero(best <= 0)[:, 0].tolist():  # a zero row ties or wins: the first index of the max
            if float(best[r]) < 0:
                out[r] = self.first_zero
            else:
                at_zero = self.live[part[r] == 0]
                out[r] = min(self.first_zero, int(at_zero.min()))
        return out


def _sampler(job: GenJob, dev: Any) -> torch.Generator | None:
    import torch

    if job.greedy:
        return None
    g = torch.Generator(device=dev)
    g.manual_seed(job.seed if job.seed is not None else 0)
    return g


def _pick(logits: torch.Tensor, job: GenJob, gen: torch.Generator | None) -> int:
    """Greedy argmax, or a seeded draw with temperature, top_k and top_p."""
    import torch

    if gen is None:
        return int(torch.argmax(logits))
    x = logits.float() / float(job.temperature or 1.0)
    if job.top_k is not None and 0 < job.top_k < x.numel():
        kth = torch.topk(x, job.top_k).values[-1]
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
    probs = torch.softmax(x, dim=-1)
    if job.top_p is not None and 0.0 < job.top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        cut = cum - sp > job.top_p
        sp[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, si, sp)
    return int(torch.multinomial(probs, 1, generator=gen))
