"""Training the learned tiny target (``drafter.learned``): run in a child process by ``build_learned_target``.

``python -m draftgen.drafter.learned_train OUT [--key=value ...]`` trains by ``learned.RECIPE`` (keys override
it) and writes the target folder and its ``draftgen-target.json``; it prints the info as JSON.

How: a compact copy of Qwen3's forward (``compact``: the same RMSNorm, per-head q/k norms, RoPE, SwiGLU MLP,
untied head) over the ids the language uses plus one *other* row, trained with AdamW on freshly drawn samples
(loss on the answer tokens, a cosine schedule), evaluated on fresh prompts (exact greedy answers per task, and
how many ran on without ending), then widened (``widen``) into a full-vocabulary ``Qwen3ForCausalLM``:
embedding and head rows at the language's ids, the other row's head weights at every other id (a logit that
training pushes below the answers', since no answer holds it). tests/drafter/test_learned_target.py checks the
widened model's logits equal the compact one's. Imports torch at module level (``draftgen[extract]``).
"""

from __future__ import annotations

import hashlib
import math
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from draftgen.drafter import tinylang
from draftgen.drafter.learned import (
    ENDOFTEXT,
    IM_END,
    INFO_FILE,
    RECIPE,
    LearnedRecipe,
    LearnedTargetInfo,
    answer_ids,
    chat_ids,
    compared,
    file_sha256,
    language_ids,
    learned_tokenizer,
)
from draftgen.errors import ConfigError
from draftgen.store import atomic_write_json

__all__ = ["Compact", "Layer", "RMSNorm", "compact", "evaluate", "main", "train_compact", "train_target",
           "weights_sha256", "widen"]


# -- the compact model (Qwen3's forward over the language's ids) ---------------------------------------------


class RMSNorm(nn.Module):
    """transformers' Qwen3RMSNorm (eps 1e-6), float32."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def _rotate(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(nn.Module):
    """A Qwen3 decoder layer, its projections flat (transformers nests them under self_attn. and mlp.)."""

    def __init__(self, r: LearnedRecipe) -> None:
        super().__init__()
        h, f, self.heads, self.hd = r.hidden, r.intermediate, r.heads, r.hidden // r.heads
        self.q_proj, self.k_proj = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.v_proj, self.o_proj = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.hd), RMSNorm(self.hd)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h), RMSNorm(h)
        self.gate_proj, self.up_proj = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(h).view(b, t, self.heads, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(b, t, self.heads, self.hd)).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        out: Tensor = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return out


class Compact(nn.Module):
    """Qwen3 over ``vocab`` ids, batch-first, causal, no padding mask (rows are right-padded and the loss
    ignores the padding); weights drawn N(0, 0.02) under the caller's seed."""

    def __init__(self, r: LearnedRecipe, vocab: int) -> None:
        super().__init__()
        hd = r.hidden // r.heads
        self.embed_tokens = nn.Embedding(vocab, r.hidden)
        self.layers = nn.ModuleList([Layer(r) for _ in range(r.layers)])
        self.norm = RMSNorm(r.hidden)
        self.lm_head = nn.Linear(r.hidden, vocab, bias=False)
        self.register_buffer("inv_freq", 1.0 / r.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd),
                             persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: Tensor) -> Tensor:
        inv: Tensor = self.inv_freq  # type: ignore[assignment]
        f = torch.arange(ids.shape[1], dtype=torch.float32)[:, None] * inv[None]
        e = torch.cat([f, f], dim=-1)
        cos, sin = e.cos(), e.sin()
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        out: Tensor = self.lm_head(self.norm(x))
        return out


def compact(recipe: LearnedRecipe, vocab: int) -> Compact:
    return Compact(recipe, vocab)


# -- training ---------------------------------------------------------------------------------------------


class _Batches:
    """Fresh samples, ``batch`` rows a step, drawn over the tasks in turn; drawn eight batches at a time and
    grouped by length (less padding), the groups in a seeded order. Rows: compact ids, labels -100 off the answer."""

    def __init__(self, tok: Any, index: dict[int, int], recipe: LearnedRecipe) -> None:
        self.tok, self.index, self.recipe = tok, index, recipe
        self.rng = random.Random(f"learned-target:{recipe.seed}")
        self.pool: list[list[tuple[list[int], int]]] = []
        self.drawn = 0

    def _sample(self) -> tuple[list[int], int]:
        task = tinylang.TASKS[self.drawn % len(tinylang.TASKS)]
        self.drawn += 1
        p = tinylang.draw(task, self.rng)
        prompt = chat_ids(self.tok, p)
        return [self.index[t] for t in prompt + answer_ids(self.tok, tinylang.solve(p))], len(prompt)

    def next(self) -> tuple[Tensor, Tensor]:
        if not self.pool:
            rows = sorted((self._sample() for _ in range(8 * self.recipe.batch)), key=lambda r: len(r[0]))
            self.pool = [rows[i:i + self.recipe.batch] for i in range(0, len(rows), self.recipe.batch)]
            self.rng.shuffle(self.pool)
        rows = self.pool.pop()
        width = max(len(r) for r, _ in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for j, (r, plen) in enumerate(rows):
            ids[j, :len(r)] = torch.tensor(r)
            labels[j, plen:len(r)] = torch.tensor(r[plen:])
        return ids, labels


def train_compact(recipe: LearnedRecipe, tok: Any, used: list[int], echo: Any) -> tuple[Compact, float, float]:
    """The compact model trained by ``recipe``; (model, final loss, seconds)."""
    torch.manual_seed(recipe.seed)
    index = {t: i for i, t in enumerate(used)}
    model = compact(recipe, len(used) + 1)  # + the other row
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=recipe.weight_decay)
    batches = _Batches(tok, index, recipe)
    t0 = time.perf_counter()
    loss_v = float("nan")
    for step in range(recipe.steps):
        lr = recipe.lr * min(1.0, (step + 1) / recipe.warmup) * 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, labels = batches.next()
        logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = float(loss.detach())
        if step % 50 == 0 or step == recipe.steps - 1:
            echo(f"learned target: step {step + 1}/{recipe.steps} loss {loss_v:.4f} "
                 f"({time.perf_counter() - t0:.0f} s)")
    model.eval()
    return model, loss_v, time.perf_counter() - t0


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the state's tensors, names sorted (the checksum ``learned.RECORDED`` holds)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def evaluate(model: Compact, tok: Any, used: list[int], recipe: LearnedRecipe) -> tuple[dict[str, float], int]:
    """Greedy answers of the compact model to fresh prompts (``eval_seed``): exact accuracy per task, and how
    many ran past their answer's length without the end token. Prompts of one length decode as one batch."""
    index = {t: i for i, t in enumerate(used)}
    end = index[IM_END]
    rng = random.Random(f"learned-eval:{recipe.eval_seed}")
    groups: dict[int, list[tuple[str, list[int], list[int]]]] = {}
    for task in tinylang.TASKS:
        for _ in range(recipe.eval_per_task):
            p = tinylang.draw(task, rng)
            ids = [index[t] for t in chat_ids(tok, p)]
            groups.setdefault(len(ids), []).append((task, ids, [index[t] for t in answer_ids(tok, tinylang.solve(p))]))
    right = {t: 0 for t in tinylang.TASKS}
    unended = 0
    with torch.no_grad():
        for rows in groups.values():
            seq = torch.tensor([r[1] for r in rows])
            steps = max(len(r[2]) for r in rows) + 4
            for _ in range(steps):
                seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
            for (task, ids, answer), row in zip(rows, seq.tolist(), strict=True):
                out = row[len(ids):]
                cut = out[:out.index(end) + 1] if end in out else out
                right[task] += cut == answer
                unended += end not in out[:len(answer) + 4]
    return {t: round(right[t] / recipe.eval_per_task, 4) for t in tinylang.TASKS}, unended


# -- the full-vocabulary Qwen3 -------------------------------------------------------------------------------


def widen(model: Compact, used: list[int], recipe: LearnedRecipe) -> Any:
    """The compact model as a ``Qwen3ForCausalLM`` over the whole Qwen3 vocabulary: the language's ids take
    their rows; every other id the other row (the compact vocabulary's last)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from draftgen.drafter.tiny import QWEN3_VOCAB

    cfg = Qwen3Config(
        vocab_size=QWEN3_VOCAB, hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads, num_key_value_heads=recipe.heads,
        head_dim=recipe.hidden // recipe.heads, max_position_embeddings=4096, tie_word_embeddings=False,
        rms_norm_eps=1e-6, bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": recipe.rope_theta})
    hf: Any = Qwen3ForCausalLM(cfg)
    hf.eval()
    src = model.state_dict()
    rows = torch.tensor(used)
    other = len(used)
    with torch.no_grad():
        for name, t in hf.model.state_dict().items():
            if name == "embed_tokens.weight":
                t.copy_(src[name][other].expand_as(t))
                t[rows] = src[name][:other]
            else:  # transformers nests the projections under self_attn./mlp.; the compact layer does not
                t.copy_(src[name.replace("self_attn.", "").replace("mlp.", "")])
        w = hf.lm_head.weight
        w.copy_(src["lm_head.weight"][other].expand_as(w))
        w[rows] = src["lm_head.weight"][:other]
    hf.generation_config.do_sample = False
    hf.generation_config.eos_token_id = [IM_END, ENDOFTEXT]
    return hf


def _check_template(out: Path, tok: Any) -> None:
    """The chat template renders a prompt of the language as ``chat_ids`` assumes (a changed tokenizer or template
    would make the target answer prompts it never saw)."""
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    prompt = tinylang.draw("sort", random.Random(0))
    text = hf_tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                      add_generation_prompt=True, enable_thinking=False)
    got = list(hf_tok.encode(text, add_special_tokens=False))
    if got != chat_ids(tok, prompt):
        raise ConfigError(f"{out}: the bundled Qwen3 chat template no longer renders the tiny language's prompts "
                          "as drafter.learned.chat_ids does; update _HEAD/_TAIL")


def train_target(out_dir: Path, recipe: LearnedRecipe = RECIPE, echo: Any = print) -> LearnedTargetInfo:
    """Train the target in this process and write its folder (``build_learned_target`` runs this in a child)."""
    from draftgen.drafter.tiny import write_qwen3_tokenizer

    torch.set_num_threads(recipe.threads)
    tok = learned_tokenizer()
    used = language_ids(tok)
    model, loss, seconds = train_compact(recipe, tok, used, echo)
    accuracy, unended = evaluate(model, tok, used, recipe)
    sha = weights_sha256(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    widen(model, used, recipe).save_pretrained(str(out_dir))
    write_qwen3_tokenizer(out_dir)
    _check_template(out_dir, tok)
    info = compared(LearnedTargetInfo(
        recipe=asdict(recipe), sha256=sha, model_sha256=file_sha256(out_dir / "model.safetensors"),
        recorded_sha256="", matches_recorded=None, torch=str(torch.__version__), train_seconds=round(seconds, 1),
        final_loss=round(loss, 5), accuracy=accuracy, unended=unended))
    atomic_write_json(out_dir / INFO_FILE, info)
    return info


def main(argv: list[str] | None = None) -> int:
    """``python -m draftgen.drafter.learned_train OUT [--key=value ...]``: train into OUT (recipe keys override)."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m draftgen.drafter.learned_train OUT_DIR [--steps=N ...]", file=sys.stderr)
        return 2
    over: dict[str, Any] = {}
    for a in args[1:]:
        key, _, value = a.removeprefix("--").partition("=")
        cur = getattr(RECIPE, key)
        over[key] = type(cur)(value)
    info = train_target(Path(args[0]), LearnedRecipe(**{**asdict(RECIPE), **over}),
                        echo=lambda s: print(s, file=sys.stderr, flush=True))
    print(msgspec.json.encode(info).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
