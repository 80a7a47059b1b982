"""An independent draft LM: the baseline a drafter that reads the target's hidden states has to beat.

A small decoder of the target's own family (transformers' ``Qwen3Model`` from the target's config, with
``layers`` layers and the intermediate size that gives it as many trainable parameters as the EAGLE-3 drafter
it is compared with), reading token ids only: no hidden state of the target. It shares with that drafter what
is not learned there either: the target's input embedding (frozen) and the draft vocabulary, whose logits come
from the target's LM head rows at those ids (frozen). It is trained on the same merged rows (loss on the
completion tokens, ``loss_mask``), the same number of steps of about the same tokens (rows packed into
``batch_tokens``), with AdamW at the same learning rate.

Writes ``<out>/draft-lm.safetensors`` (the trained tensors only) and ``<out>/draftgen-draft-lm.json``
(``DraftLMInfo``: the target, the shape, the draft vocabulary, the steps and losses); ``load_proposer`` rebuilds
it from the target folder and returns a ``drafter.baselines.Propose`` (greedy, k tokens a round, each from a
whole forward over the context) for ``baselines.replay``. Imports torch and transformers (``draftgen[extract]``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftgen.drafter.baselines import Propose
from draftgen.errors import InputError
from draftgen.records import DraftLMInfo
from draftgen.store import atomic_write_json, read_json

__all__ = ["INFO_FILE", "intermediate_for", "load_proposer", "train_draft_lm"]

INFO_FILE = "draftgen-draft-lm.json"
WEIGHTS_FILE = "draft-lm.safetensors"


def _config(target: Path, layers: int, intermediate: int) -> Any:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(target))
    cfg.num_hidden_layers = layers
    cfg.intermediate_size = intermediate
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:layers]
    return cfg


def _per_layer(cfg: Any, intermediate: int) -> int:
    """A Qwen3 decoder layer's parameters: attention, q/k norms, the SwiGLU MLP, two norms."""
    h, hd = cfg.hidden_size, getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    attn = h * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    return int(attn + 2 * hd + 3 * h * intermediate + 2 * h)


def intermediate_for(target: Path, layers: int, params: int) -> int:
    """The intermediate size whose ``layers`` layers and final norm come nearest ``params`` trainable parameters."""
    cfg = _config(target, layers, 1)
    fixed = layers * _per_layer(cfg, 0) + cfg.hidden_size
    share: float = (params - fixed) / (3 * cfg.hidden_size * layers)
    return max(1, round(share))


class _DraftLM:
    """The model and its frozen draft head: ``logits(ids [B, T], mask) -> [B, T, V_draft]``."""

    def __init__(self, target: Path, layers: int, intermediate: int, vocab_ids: Sequence[int], seed: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, Qwen3Model

        torch.manual_seed(seed)
        self.model: Any = Qwen3Model(_config(target, layers, intermediate))
        full: Any = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
        self.model.embed_tokens.weight.data.copy_(full.get_input_embeddings().weight.data)
        self.model.embed_tokens.weight.requires_grad_(False)
        self.vocab = torch.tensor(list(vocab_ids), dtype=torch.long)
        self.head = full.get_output_embeddings().weight.data[self.vocab].clone()
        del full
        self.to_draft = {int(t): i for i, t in enumerate(self.vocab.tolist())}

    def trainable(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def logits(self, ids: Any, mask: Any | None = None) -> Any:
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state @ self.head.T


def _batches(rows: Sequence[tuple[Sequence[int], Sequence[int]]], batch_tokens: int,
             rng: random.Random) -> list[list[int]]:
    """Row indices packed into batches of at most ``batch_tokens`` tokens (a longer row alone), shuffled."""
    order = list(range(len(rows)))
    rng.shuffle(order)
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in order:
        n = len(rows[i][0])
        if cur and used + n > batch_tokens:
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    return out + ([cur] if cur else [])


def _step(lm: _DraftLM, rows: Sequence[tuple[Sequence[int], Sequence[int]]], batch: list[int], opt: Any) -> float:
    """One AdamW step on a padded batch: cross-entropy of each next completion token that is in the draft
    vocabulary (a token outside it cannot be drafted, as for the EAGLE-3 drafter)."""
    import torch
    import torch.nn.functional as F

    width = max(len(rows[i][0]) for i in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    att = torch.zeros(len(batch), width, dtype=torch.long)
    tgt = torch.full((len(batch), width), -100, dtype=torch.long)
    for b, i in enumerate(batch):
        seq, mask = rows[i]
        ids[b, :len(seq)] = torch.tensor(list(seq))
        att[b, :len(seq)] = 1
        for t in range(len(seq) - 1):
            if mask[t + 1] and int(seq[t + 1]) in lm.to_draft:
                tgt[b, t] = lm.to_draft[int(seq[t + 1])]
    logits = lm.logits(ids, att)
    loss: Any = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def train_draft_lm(target: Path, drafter: Path, rows: Sequence[tuple[Sequence[int], Sequence[int]]], out: Path, *,
                   steps: int, batch_tokens: int, lr: float, seed: int = 0, layers: int = 2,
                   echo: Any = print) -> DraftLMInfo:
    """Train the draft LM matched to ``drafter`` (its trainable parameter count and draft vocabulary) on
    ``rows`` ((input ids, loss mask) pairs) for ``steps`` steps; write it to ``out`` (see the module docstring)."""
    import torch
    from safetensors.torch import save_file

    from draftgen.drafter.eagle3 import draft_vocabulary

    if not rows:
        raise InputError("draft LM: no merged rows to train on; run draftgen merge first")
    matched, vocab = draft_vocabulary(drafter)
    inter = intermediate_for(target, layers, matched)
    lm = _DraftLM(target, layers, inter, vocab, seed)
    opt = torch.optim.AdamW(lm.trainable(), lr=lr)
    rng = random.Random(seed)
    losses: list[float] = []
    t0 = time.perf_counter()
    batches: list[list[int]] = []
    while len(losses) < steps:
        if not batches:
            batches = _batches(rows, batch_tokens, rng)
        losses.append(_step(lm, rows, batches.pop(), opt))
        if len(losses) % 50 == 0:
            echo(f"draft LM: step {len(losses)} loss {losses[-1]:.4f}")
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in lm.model.state_dict().items() if k != "embed_tokens.weight"},
              str(out / WEIGHTS_FILE))
    info = DraftLMInfo(target=str(target), layers=layers, intermediate_size=inter,
                       trainable_params=sum(p.numel() for p in lm.trainable()), matched_to=matched,
                       vocab_ids=vocab, steps=steps, batch_tokens=batch_tokens, lr=lr, seed=seed, rows=len(rows),
                       loss_first=round(losses[0], 4), loss_last=round(losses[-1], 4),
                       seconds=round(time.perf_counter() - t0, 1))
    atomic_write_json(out / INFO_FILE, info)
    return info


def load_proposer(folder: Path, target: Path | None = None) -> Propose:
    """The trained draft LM in ``folder`` as a greedy proposer (``target``: where the target lies now, when
    not where it was trained)."""
    import torch
    from safetensors.torch import load_file

    path = folder / INFO_FILE
    if not path.is_file():
        raise InputError(f"{path}: not found; --draft-lm must name a folder `draftgen train --draft-lm` wrote")
    info = read_json(path, DraftLMInfo)
    lm = _DraftLM(target or Path(info.target), info.layers, info.intermediate_size, info.vocab_ids, info.seed)
    missing, unexpected = lm.model.load_state_dict(load_file(str(folder / WEIGHTS_FILE)), strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight"}:
        raise InputError(f"{folder}: the draft LM's weights do not match its info (missing {sorted(missing)[:4]}, "
                         f"unexpected {sorted(unexpected)[:4]})")
    lm.model.eval()

    @torch.inference_mode()
    def propose(context: Sequence[int], k: int) -> list[int]:
        ids = list(context)
        for _ in range(k):
            logits = lm.logits(torch.tensor([ids]))[0, -1]
            ids.append(int(lm.vocab[int(logits.argmax())]))
        return ids[len(context):]

    return propose
