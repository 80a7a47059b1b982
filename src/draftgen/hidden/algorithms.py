"""The drafter algorithms one hidden-state capture can train (``train.algorithm``), and the layers each takes.

Every algorithm below trains with speculators 0.9 on the same data: the merged rows, aux hidden states at some
target layers (vLLM convention: id k = the input of decoder layer k) and the final state (id L). speculators
takes the final state PRE-norm for all of them and applies the target's own final norm itself (its frozen
``verifier_norm``, loaded from the target) before the target's LM head: so every algorithm trains against the
post-norm target distribution, which TorchSpec#169 found DFlash/DSpark trainers skipping. The stored set keeps
the pre-norm final state; ``hidden.exports`` derives the post-norm one for trainers that want it stored.

``ALGORITHMS`` maps a name to its ``Algorithm``: speculators' ``--speculator-type`` and extra flags, and its
layer rule:

- ``eagle3`` (EAGLE-3), ``eagle3.1`` (EAGLE-3 with per-layer ``--fc-norm``), ``peagle`` (P-EAGLE): three aux
  layers, EAGLE-3's ``[2, L//2, L-3]``;
- ``dflash``, ``dflash2``, ``dspark``, ``xpress`` (the DFlash family, speculators' default 5 draft layers):
  five aux layers, z-lab DFlash's rule (``build_target_layer_ids``: HF layer outputs evenly spaced over
  1..L-3, i.e. vLLM ids ``1 + round(1 + i·(L-4)/4)``; Qwen3-8B, L = 36: ``[2, 10, 18, 26, 34]``, the ids its
  drafters are trained with).

speculators' seventh type, ``mtp``, fine-tunes a target's own native MTP layers from the last layer's state; it
needs a target that has them (DeepSeek, Qwen3-Next, Qwen3.5), so it is not offered here.

A set can feed an algorithm when its stored aux ids hold that algorithm's layers (``feeds``); ``train.layer_ids``
picks others from the set (``select``). ``union_aux`` is the superset that feeds several at once;
``bytes_per_token`` the disk each choice costs. Pure data and arithmetic: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from draftgen.errors import ConfigError
from draftgen.hidden.estimate import DTYPE_BYTES

__all__ = ["ALGORITHMS", "Algorithm", "algorithm", "bytes_per_token", "default_aux", "feeds", "feeds_lines",
           "select", "union_aux"]


@dataclass(frozen=True)
class Algorithm:
    """One ``train.algorithm``. ``speculator_type`` and ``flags``: what ``speculators train`` gets;
    ``rule``: its default layers ("eagle3" three, "dflash" five); ``emulated``: ``draftgen emulate --drafter``
    serves it (greedy verification on CPU), so ``accept`` measures it there; ``vllm``: its vLLM
    ``--speculative-config`` (DRAFT and K filled in by ``serve_line``; None: no method was verified, the
    checkpoint is served as it is); ``sglang``: its SGLang ``--speculative-algorithm``, or None where no SGLang
    flag serving it was verified (docs/algorithms.md); ``full_vocab``: speculators trains it
    over the target's whole vocabulary (``train.draft_vocab_size`` does not apply); ``cpu_attn``: the draft
    attention without a GPU (P-EAGLE's masks leave padding rows with nothing to attend: speculators' eager
    attention turns them into NaN losses, SDPA into zeros as FlexAttention does on a GPU)."""

    name: str
    speculator_type: str
    flags: tuple[str, ...]
    rule: str
    emulated: bool
    vllm: str | None
    sglang: str | None
    doc: str
    full_vocab: bool = False  # drafts over the target's whole vocabulary (no d2t/t2d draft vocabulary)
    cpu_attn: str = "eager"  # draft attention without a GPU (FlexAttention has no CPU backward)

    @property
    def n_aux(self) -> int:
        return 3 if self.rule == "eagle3" else 5

    @property
    def block(self) -> bool:
        """A block drafter (DFlash family): it drafts a whole block in one pass, measured as ``eal``."""
        return self.rule == "dflash"

    def serve_line(self, target: str, drafter: str, k: int) -> str:
        """``vllm serve`` with this drafter (k speculative tokens); without a known ``--speculative-config``
        method, the speculators checkpoint itself (its config names the target and the algorithm)."""
        if self.vllm is None:
            return f"vllm serve {drafter}"
        spec = self.vllm.replace("DRAFT", drafter).replace("K", str(k))
        return f"vllm serve {target} --speculative-config '{spec}'"


_EAGLE = '{"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": K}'
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("eagle3", "eagle3", (), "eagle3", True, _EAGLE, "EAGLE3", "EAGLE-3 (speculators' default)"),
    Algorithm("eagle3.1", "eagle3", ("--fc-norm", "--no-norm-before-fc"), "eagle3", True, _EAGLE, "EAGLE3",
              "EAGLE-3.1: a norm per aux layer before the fc (fc_norm), post-norm feedback (norm_output)"),
    Algorithm("peagle", "peagle", (), "eagle3", True,
              '{"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": K, "parallel_drafting": true}',
              None, "P-EAGLE: K draft tokens in one forward pass (mask tokens after the anchor)",
              cpu_attn="sdpa"),
    Algorithm("dflash", "dflash", (), "dflash", False,
              '{"method": "dflash", "model": "DRAFT", "num_speculative_tokens": K}', "DFLASH",
              "DFlash: block diffusion drafter"),
    Algorithm("dflash2", "dflash2", (), "dflash", False, None, None,
              "DFlash-2: DFlash with non-causal sliding-window blocks, over the whole target vocabulary",
              full_vocab=True),
    Algorithm("dspark", "dspark", (), "dflash", False,
              '{"method": "dspark", "model": "DRAFT", "num_speculative_tokens": K}', None,
              "DSpark: DFlash backbone + Markov head + confidence head"),
    Algorithm("xpress", "xpress", (), "dflash", False, None, None,
              "XPress: DFlash-family drafter with a low-rank expressive head"),
)}


def algorithm(name: str, *, field: str = "train.algorithm") -> Algorithm:
    """The algorithm called ``name``; a ConfigError naming ``field`` and the choices otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(f"{field} {name!r} is not one of {', '.join(ALGORITHMS)}") from None


def default_aux(name: str, num_layers: int) -> list[int]:
    """The aux ids (vLLM convention, ascending) ``name`` takes from a target of ``num_layers`` layers."""
    alg = algorithm(name)
    L = num_layers
    if alg.rule == "eagle3":
        ids = [2, L // 2, L - 3]
    else:  # z-lab DFlash: HF layers round(1 + i*(L-4)/(n-1)) → vLLM ids one above (Python's round, as theirs)
        n = alg.n_aux
        ids = [1 + round(1 + i * (L - 4) / (n - 1)) for i in range(n)]
    if L < 8 or len(set(ids)) != len(ids) or not all(0 < i < L for i in ids):
        raise ConfigError(f"train.algorithm {name}: a target of {L} layers has no {alg.n_aux} distinct default "
                          "layers; give them in train.layer_ids")
    return sorted(ids)


def union_aux(names: Iterable[str], num_layers: int) -> list[int]:
    """The aux ids that feed every algorithm of ``names`` (their default layers together)."""
    return sorted({i for n in names for i in default_aux(n, num_layers)})


def feeds(stored_aux: Sequence[int], num_layers: int) -> list[str]:
    """The algorithms whose default layers a set storing ``stored_aux`` holds."""
    have = set(stored_aux)
    out = []
    for name in ALGORITHMS:
        try:
            if set(default_aux(name, num_layers)) <= have:
                out.append(name)
        except ConfigError:
            continue
    return out


def select(name: str, stored_aux: Sequence[int], num_layers: int,
           chosen: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """(aux ids, their slot indices in the stored set) that ``name`` trains on: ``chosen``
    (``train.layer_ids``) or its defaults, each of which the set must hold (a ConfigError naming the missing
    ids and what the set can feed otherwise)."""
    ids = sorted(int(i) for i in chosen) if chosen else default_aux(name, num_layers)
    stored = list(stored_aux)
    missing = [i for i in ids if i not in stored]
    if missing:
        can = ", ".join(feeds(stored, num_layers)) or "none of the algorithms by their defaults"
        raise ConfigError(
            f"train.algorithm {name} takes aux layers {ids} but the hidden set stores {stored} (missing {missing}); "
            f"it feeds {can}. Extract again with hidden_states.layer_ids holding {union_aux([name], num_layers)} "
            "(a superset feeds several algorithms), or pick stored layers with train.layer_ids")
    return ids, [stored.index(i) for i in ids]


def bytes_per_token(n_aux: int, hidden_size: int, dtype: str) -> int:
    """Disk per token of a set storing ``n_aux`` aux layers plus the final state (fp8: + its float32 scales)."""
    scales = 2 * 4 if dtype == "fp8" else 0
    return (n_aux + 1) * hidden_size * DTYPE_BYTES[dtype] + scales


def feeds_lines(stored_aux: Sequence[int], num_layers: int, hidden_size: int, dtype: str, tokens: int) -> list[str]:
    """What a set storing ``stored_aux`` can train, and the disk each layer choice costs for ``tokens`` tokens:
    one line for the set, one per algorithm family (the lines ``plan`` and ``extract`` print)."""
    from draftgen.hidden.estimate import format_bytes

    can = feeds(stored_aux, num_layers)
    out = [f"layers {list(stored_aux)} + final {num_layers}: feeds {', '.join(can) or 'no algorithm by its defaults'}"
           f" ({format_bytes(bytes_per_token(len(stored_aux), hidden_size, dtype) * tokens)})"]
    for names in (("eagle3", "eagle3.1", "peagle"), ("dflash", "dflash2", "dspark", "xpress")):
        try:
            ids = default_aux(names[0], num_layers)
        except ConfigError:
            continue
        size = format_bytes(bytes_per_token(len(ids), hidden_size, dtype) * tokens)
        out.append(f"  {'/'.join(names)}: layers {ids} + final, {size} alone")
    both = union_aux(ALGORITHMS, num_layers) if num_layers >= 8 else []
    if both:
        size = format_bytes(bytes_per_token(len(both), hidden_size, dtype) * tokens)
        out.append(f"  every algorithm from one capture: hidden_states.layer_ids {both}, {size}")
    return out
