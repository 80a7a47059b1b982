"""An EAGLE-3 drafter in plain torch, computing exactly speculators 0.9.0's Eagle3 draft forward (and its
P-EAGLE variant, ``PEagleDrafter``).

Reads a checkpoint folder in either format:

- speculators (``config.json`` with ``speculators_model_type: "eagle3"``, the draft layer's settings under
  ``transformer_layer_config``; ``model.safetensors`` with ``embed_tokens``, ``fc``, ``layers.N.*``, ``norm``,
  ``lm_head``, ``d2t``, ``t2d`` and optional ``input_norm`` / ``fc_norm.i``);
- flat EAGLE/SGLang (``architectures: ["LlamaForCausalLMEagle3"]``, settings at the top level, aux ids in
  ``eagle_config``; tensors ``midlayer.*`` for layer 0). ``norm_before_residual`` defaults to False there,
  as vLLM reads flat configs.

The forward (speculators ``models/eagle3/core.py`` and ``model_definitions.py``):

- fused = fc(aux) with aux [T, n_aux*H] (ascending layer ids), after ``input_norm`` (norm_before_fc) over the
  whole concatenation or ``fc_norm[i]`` per aux chunk;
- position t of step 0 takes (fused[t], embed(token t+1)) at position id t+1; the first layer splits
  x = cat(embed, hidden), normalises the halves with ``input_layernorm`` / ``hidden_norm``, attends with
  q/k/v over 2H, and adds the residual ``hidden`` (the normalised one when norm_before_residual);
  further layers are plain pre-norm decoder layers;
- logits = lm_head(norm(h)); with norm_output the normalised h is also what the next step gets;
- step j > 0 at position t takes (h from step j-1 at t, embed(token t+1+j)) at position id t+1+j and attends
  the step-0 keys of positions <= t plus its own earlier steps' keys at t (speculators' extended mask).
- a draft id i is target id ``i + d2t[i]``; the embedding is the target vocabulary's.

P-EAGLE (``speculators_model_type: "peagle"``, speculators ``models/peagle/core.py``) drafts all k tokens in
ONE forward pass: the context rows as step 0 (causal), then k-1 rows at the last position's "rollout", each
the ``mask_token_id`` embedding with the learned ``mask_hidden`` in place of the aux states (through the same
input norm and fc), at position ids anchor+1 .. anchor+k-1; a rollout row attends every context row and the
rollout rows up to its own depth (``create_peagle_mask_mod``). Row anchor+d's argmax is draft d+1.

Everything runs in float32 unless a dtype is given. Imports torch at module level: import this module only
where torch is installed (``draftgen[extract]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from draftgen.errors import ConfigError, InputError
from draftgen.store import read_json_object

__all__ = ["DrafterConfig", "Eagle3Drafter", "KVCache", "PEagleDrafter", "draft_vocabulary", "load_drafter",
           "read_drafter_config"]

_ACTS: dict[str, Callable[[Tensor], Tensor]] = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


@dataclass
class DrafterConfig:
    """The draft model's shape and EAGLE-3 switches, read from either checkpoint format."""

    arch: str  # "llama" | "qwen3" (qwen3 adds per-head q_norm / k_norm)
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_dim: int
    intermediate_size: int
    num_layers: int
    vocab_size: int  # target vocabulary (embedding rows)
    draft_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    num_aux: int = 3
    aux_layer_ids: list[int] | None = None  # as the checkpoint states them (speculators: vLLM convention)
    format: str = "speculators"  # "speculators" | "eagle"
    parallel: bool = False  # P-EAGLE: all draft tokens in one pass (mask_token_id + mask_hidden rows)
    mask_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _rope_theta(d: dict[str, Any]) -> float:
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if isinstance(rp, dict) and "sliding_attention" in rp:  # speculators' flatten_rope_parameters
        rp = rp["sliding_attention"]
    kind = rp.get("rope_type", rp.get("type", "default")) if isinstance(rp, dict) else "default"
    if kind not in ("default", None):
        raise ConfigError(f"drafter rope type {kind!r} is not supported (only the default RoPE)")
    theta = rp.get("rope_theta") if isinstance(rp, dict) else None
    return float(theta if theta is not None else d.get("rope_theta", 10000.0))


def _layer_config(d: dict[str, Any], **kw: Any) -> DrafterConfig:
    arch = str(d.get("model_type", "llama"))
    if arch not in ("llama", "qwen3"):
        raise ConfigError(f"drafter layer model_type {arch!r} is not supported (llama or qwen3)")
    h, nh = int(d["hidden_size"]), int(d["num_attention_heads"])
    head_dim = d.get("head_dim")
    # speculators builds its rotary embedding from a config whose hidden_size is doubled
    rope_dim = int(head_dim) if head_dim else 2 * h // nh
    return DrafterConfig(
        arch=arch, hidden_size=h, num_heads=nh, num_kv_heads=int(d.get("num_key_value_heads") or nh),
        head_dim=int(head_dim or h // nh), rope_dim=rope_dim, intermediate_size=int(d["intermediate_size"]),
        num_layers=int(d.get("num_hidden_layers", 1)), vocab_size=int(d["vocab_size"]),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(d),
        attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)),
        hidden_act=str(d.get("hidden_act", "silu")), **kw)


def read_drafter_config(folder: Path) -> DrafterConfig:
    """The drafter settings of a checkpoint folder (either format)."""
    path = folder / "config.json"
    try:
        d = read_json_object(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; --drafter must name a checkpoint folder "
                         "(speculators or EAGLE format) holding config.json and model.safetensors") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from None
    try:
        kind = d.get("speculators_model_type")
        if kind is not None:
            if kind not in ("eagle3", "peagle"):
                raise ConfigError(f"{path}: speculators_model_type {kind!r}; only eagle3 (EAGLE-3, EAGLE-3.1) and "
                                  "peagle (P-EAGLE) drafters are served here")
            tl = d["transformer_layer_config"]
            ids = d.get("eagle_aux_hidden_state_layer_ids")
            mask = d.get("mask_token_id")
            return _layer_config(
                tl, draft_vocab_size=int(d.get("draft_vocab_size", tl["vocab_size"])),
                norm_before_residual=bool(d.get("norm_before_residual", False)),
                norm_before_fc=bool(d.get("norm_before_fc", False)), fc_norm=bool(d.get("fc_norm", False)),
                norm_output=bool(d.get("norm_output", False)), num_aux=len(ids) if ids else 3,
                aux_layer_ids=list(ids) if ids else None, format="speculators", parallel=kind == "peagle",
                mask_token_id=int(mask) if mask is not None else None)
        eagle = d.get("eagle_config") or {}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or d.get("eagle_aux_hidden_state_layer_ids")
        return _layer_config(
            d, draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
            norm_before_residual=bool(d.get("norm_before_residual", False)),
            norm_before_fc=bool(d.get("norm_before_fc", False)), fc_norm=bool(d.get("fc_norm", False)),
            norm_output=bool(d.get("norm_output", False)), num_aux=len(ids) if ids else 3,
            aux_layer_ids=list(ids) if ids else None, format="eagle")
    except KeyError as exc:
        raise InputError(f"{path}: missing key {exc}; not an EAGLE-3 drafter config") from None


class RMSNorm(nn.Module):
    """transformers' Llama/Qwen3 RMSNorm (float32 statistics, weight applied in the input dtype)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def _rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class KVCache:
    """Per-layer keys and values ([kv_heads, n, head_dim], RoPE applied) of everything drafted so far."""

    def __init__(self, num_layers: int) -> None:
        self.k: list[Tensor | None] = [None] * num_layers
        self.v: list[Tensor | None] = [None] * num_layers

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        pk, pv = self.k[layer], self.v[layer]
        self.k[layer] = k if pk is None else torch.cat([pk, k], dim=1)
        self.v[layer] = v if pv is None else torch.cat([pv, v], dim=1)
        kk, vv = self.k[layer], self.v[layer]
        assert kk is not None and vv is not None
        return kk, vv


class _Attention(nn.Module):
    def __init__(self, c: DrafterConfig, in_dim: int) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(in_dim, c.num_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(in_dim, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(in_dim, c.num_kv_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if c.arch == "qwen3":
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: KVCache | None,
                layer: int) -> Tensor:
        c, n = self.c, x.shape[0]
        q = self.q_proj(x).view(n, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(n, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(n, c.num_kv_heads, c.head_dim).transpose(0, 1)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 1), k.transpose(0, 1)  # [heads, n, d]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.append(layer, k, v)
        rep = c.num_heads // c.num_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        scores = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(c.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).transpose(0, 1).reshape(n, c.num_heads * c.head_dim)
        return self.o_proj(out)  # type: ignore[no-any-return]


class _MLP(nn.Module):
    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        if c.hidden_act not in _ACTS:
            raise ConfigError(f"drafter hidden_act {c.hidden_act!r} is not supported ({', '.join(_ACTS)})")
        self.act: Callable[[Tensor], Tensor] = _ACTS[c.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # type: ignore[no-any-return]


class _Layer(nn.Module):
    """A decoder layer; the first one (``first``) is EAGLE-3's: 2H input, ``hidden_norm``."""

    def __init__(self, c: DrafterConfig, first: bool) -> None:
        super().__init__()
        self.c, self.first = c, first
        self.self_attn = _Attention(c, 2 * c.hidden_size if first else c.hidden_size)
        self.mlp = _MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: KVCache | None,
                layer: int) -> Tensor:
        if self.first:
            embeds, hidden = torch.split(x, self.c.hidden_size, dim=-1)
            residual = hidden
            hidden = self.hidden_norm(hidden)
            if self.c.norm_before_residual:
                residual = hidden
            h = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        else:
            residual, h = x, self.input_layernorm(x)
        x = residual + self.self_attn(h, cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))  # type: ignore[no-any-return]


class Eagle3Drafter(nn.Module):
    """The drafter. ``fuse`` maps aux states to the fc output; ``step0`` runs a whole prefix; ``chain``
    drafts k tokens greedily from a prefix; ``ttt_forward`` reproduces speculators' teacher-forced forward."""

    def __init__(self, c: DrafterConfig, fc_in: int) -> None:
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.fc = nn.Linear(fc_in, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([_Layer(c, i == 0) for i in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.input_norm: RMSNorm | None = RMSNorm(fc_in, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc_norm: nn.ModuleList | None = None
        if c.fc_norm:
            self.fc_norm = nn.ModuleList([RMSNorm(fc_in // c.num_aux, c.rms_norm_eps) for _ in range(c.num_aux)])
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.rope_dim, 2, dtype=torch.float) / c.rope_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    # -- pieces
    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        inv: Tensor = self.inv_freq  # type: ignore[assignment]
        freqs = positions.float()[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        dt = self.fc.weight.dtype
        return emb.cos().to(dt)[None], emb.sin().to(dt)[None]

    def fuse(self, aux: Tensor) -> Tensor:
        """fc over the aux states [T, n_aux*H] (after input_norm / fc_norm)."""
        x = aux.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            x = torch.cat([n(ch) for n, ch in zip(self.fc_norm, x.chunk(len(self.fc_norm), dim=-1), strict=True)],
                          dim=-1)
        return self.fc(x)  # type: ignore[no-any-return]

    def _run(self, hidden: Tensor, ids: Tensor, positions: Tensor, mask: Tensor | None,
             cache: KVCache | None) -> tuple[Tensor, Tensor]:
        """One step over n rows: (hidden for the next step, logits over the draft vocabulary)."""
        x = torch.cat([self.embed_tokens(ids), hidden], dim=-1)
        cos, sin = self._rope(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
        if self.c.norm_output:
            x = self.norm(x)
            return x, self.lm_head(x)
        return x, self.lm_head(self.norm(x))

    def to_target(self, draft_ids: Tensor) -> Tensor:
        """Draft-vocabulary ids to target ids (``i + d2t[i]``)."""
        d2t: Tensor = self.d2t  # type: ignore[assignment]
        return draft_ids + d2t[draft_ids]

    # -- inference
    @torch.no_grad()
    def step0(self, aux: Tensor, next_ids: Tensor, cache: KVCache | None = None,
              start: int = 0) -> tuple[Tensor, Tensor]:
        """Step 0 over positions start..start+T-1: row t pairs aux[t] with next_ids[t] (= token t+1) at
        position id t+1; causal attention (plus whatever ``cache`` already holds). Returns (hidden, logits)."""
        n = aux.shape[0]
        positions = torch.arange(start + 1, start + n + 1)
        past = 0 if cache is None or cache.k[0] is None else int(cache.k[0].shape[1])  # type: ignore[union-attr]
        mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)[None]
        return self._run(self.fuse(aux), next_ids, positions, mask, cache)

    @torch.no_grad()
    def chain(self, aux: Tensor, next_ids: Tensor, k: int, *, forced: Sequence[int] | None = None) -> tuple[
            list[int], list[Tensor]]:
        """Draft k target ids after the prefix (aux [T, n_aux*H], next_ids [T]): step 0 over the prefix, then
        k-1 chain steps at the last position, each fed the previous step's hidden and drafted token (or
        ``forced[j-1]`` when given, for teacher-forced comparisons). Returns (target ids, logits per step)."""
        cache = KVCache(len(self.layers))
        hidden, logits = self.step0(aux, next_ids, cache)
        h, lg = hidden[-1:], logits[-1]
        pos = aux.shape[0]  # position id of the last row
        out: list[int] = []
        all_logits = [lg]
        for j in range(k):
            tok = int(self.to_target(lg.argmax(-1, keepdim=True))[0])
            out.append(tok)
            if j == k - 1:
                break
            fed = tok if forced is None else int(forced[j])
            h, lgs = self._run(h, torch.tensor([fed]), torch.tensor([pos + 1 + j]), None, cache)
            lg = lgs[-1]
            all_logits.append(lg)
        return out, all_logits

    def propose(self, context: Sequence[int], aux: Tensor, k: int) -> list[int]:
        """``speculate.Proposer``: k target ids after ``context`` (verified ids; aux covers all but the last)."""
        if aux.shape[0] != len(context) - 1:
            raise ValueError(f"aux has {aux.shape[0]} rows for {len(context)} context ids; expected one fewer")
        return self.chain(aux, torch.tensor(list(context[1:])), k)[0]

    @torch.no_grad()
    def ttt_forward(self, aux: Tensor, input_ids: Tensor, steps: int) -> list[Tensor]:
        """speculators' teacher-forced forward (Eagle3DraftModel.forward without loss): input_ids[t] is the
        token paired with aux[t]; step j feeds input_ids shifted by j (zero-padded). Logits per step [T, V_d]."""
        n = aux.shape[0]
        hidden = self.fuse(aux)
        positions = torch.arange(1, n + 1)
        ids = input_ids
        cache = KVCache(len(self.layers))
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        diag = torch.eye(n, dtype=torch.bool)
        out = []
        for j in range(steps):
            mask = torch.cat([causal] + [diag] * j, dim=1)[None]
            hidden, logits = self._run(hidden, ids, positions, mask, cache)
            out.append(logits)
            ids = torch.cat([input_ids[1 + j:], input_ids.new_zeros(1 + j)])
            positions = positions + 1
        return out


class PEagleDrafter(Eagle3Drafter):
    """P-EAGLE: k draft tokens from one forward pass (see the module docstring)."""

    def __init__(self, c: DrafterConfig, fc_in: int) -> None:
        super().__init__(c, fc_in)
        if c.mask_token_id is None:
            raise ConfigError("P-EAGLE drafter config has no mask_token_id")
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, fc_in))

    @torch.no_grad()
    def parallel(self, aux: Tensor, next_ids: Tensor, k: int) -> tuple[list[int], Tensor]:
        """k target ids after the prefix (aux [T, n_aux*H], next_ids [T] = tokens 1..T) and their logits."""
        n, extra = aux.shape[0], k - 1
        rows = torch.cat([aux.to(self.mask_hidden.dtype), self.mask_hidden[0].expand(extra, -1)])
        mask_id = int(self.c.mask_token_id or 0)
        ids = torch.cat([next_ids, torch.full((extra,), mask_id, dtype=next_ids.dtype)])
        positions = torch.cat([torch.arange(n), n - 1 + torch.arange(1, extra + 1)])
        total = n + extra
        att = torch.zeros(total, total, dtype=torch.bool)
        att[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        att[n:, :n] = True  # the rollout sees every context row (anchor = the last)
        att[n:, n:] = torch.ones(extra, extra, dtype=torch.bool).tril()  # and its own rows up to its depth
        _, logits = self._run(self.fuse(rows), ids, positions, att[None], None)
        out = logits[n - 1:]
        return [int(t) for t in self.to_target(out.argmax(-1))], out

    def propose(self, context: Sequence[int], aux: Tensor, k: int) -> list[int]:
        if aux.shape[0] != len(context) - 1:
            raise ValueError(f"aux has {aux.shape[0]} rows for {len(context)} context ids; expected one fewer")
        return self.parallel(aux, torch.tensor(list(context[1:])), k)[0]


def _read_tensors(folder: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    single = folder / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json_object(index)["weight_map"].values()))
        out: dict[str, Tensor] = {}
        for f in files:
            out.update(load_file(str(folder / f)))
        return out
    raise InputError(f"{folder}: no model.safetensors; --drafter must name a drafter checkpoint folder")


def draft_vocabulary(path: str | Path) -> tuple[int, list[int]]:
    """A drafter checkpoint's trainable parameter count (every tensor but the shared embedding and the
    ``d2t`` / ``t2d`` maps) and its draft vocabulary as target ids (``i + d2t[i]``)."""
    raw = _read_tensors(Path(path))
    params = sum(t.numel() for name, t in raw.items() if not name.endswith(("embed_tokens.weight", "d2t", "t2d")))
    d2t = next((t for name, t in raw.items() if name.endswith("d2t")), None)
    size = read_drafter_config(Path(path)).draft_vocab_size
    offsets = d2t.tolist() if d2t is not None else [0] * size
    return params, [i + int(o) for i, o in enumerate(offsets)]


def load_drafter(path: str | Path, *, embed_weight: Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> Eagle3Drafter:
    """Load a drafter checkpoint (speculators or flat EAGLE format). ``embed_weight``: the target's input
    embedding, used when the checkpoint holds none (EAGLE checkpoints often share the target's)."""
    folder = Path(path)
    c = read_drafter_config(folder)
    raw = _read_tensors(folder)
    sd: dict[str, Tensor] = {}
    for name, t in raw.items():
        name = name.removeprefix("model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        sd[name] = t
    if "fc.weight" not in sd:
        raise InputError(f"{folder}: no fc.weight tensor; not an EAGLE-3 drafter")
    if "embed_tokens.weight" not in sd:
        if embed_weight is None:
            raise InputError(f"{folder}: the checkpoint holds no embed_tokens.weight; pass the target's embedding")
        sd["embed_tokens.weight"] = embed_weight
    sd.pop("t2d", None)
    if "d2t" not in sd:
        sd["d2t"] = torch.zeros(c.draft_vocab_size, dtype=torch.long)
    fc_in = int(sd["fc.weight"].shape[1])
    model = PEagleDrafter(c, fc_in) if c.parallel else Eagle3Drafter(c, fc_in)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise InputError(f"{folder}: weights do not match the config (missing {sorted(missing)[:6]}, "
                         f"unexpected {sorted(unexpected)[:6]})")
    return model.to(dtype).eval()
