"""Which layers ``draftgen extract`` captures, in the one convention draftgen stores (vLLM's).

Convention ``vllm-layer-input``: id k (0 < k < L) = the INPUT of decoder layer k = the output of layer k-1
= HF ``output_hidden_states[k]``; id L = the output of the last layer BEFORE the final norm. SGLang's
explicit ids are vLLM id - 1 (SGLang adds 1). Default aux ids for depth L: ``[2, L//2, L-3]`` (EAGLE-3's),
final id L; L >= 8 is needed for three distinct defaults (L=8 → [2, 4, 5]). Pure arithmetic, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from draftgen.errors import ConfigError

__all__ = ["CONVENTION", "LayerIds", "check_layer_ids", "default_aux_ids", "resolve_layer_ids", "to_sglang"]

CONVENTION = "vllm-layer-input"


class LayerIds(msgspec.Struct, frozen=True):
    """Aux ids (ascending, vLLM convention) and the final id (= num_layers)."""

    aux: tuple[int, ...]
    final: int

    @property
    def sglang_aux(self) -> list[int]:
        return to_sglang(self.aux)

    @property
    def hf_hidden_states_index(self) -> list[int]:
        """Indices into HF ``output_hidden_states`` (equal to the vLLM ids for aux; L is post-norm there)."""
        return list(self.aux)


def default_aux_ids(num_layers: int) -> list[int]:
    """EAGLE-3's ``[2, L//2, L-3]``; L >= 8 (fewer layers cannot give three distinct ones)."""
    if num_layers < 8:
        raise ConfigError(f"hidden_states.layer_ids: the target has {num_layers} layers; the default aux ids "
                          "[2, L//2, L-3] need L >= 8, so set hidden_states.layer_ids explicitly")
    return [2, num_layers // 2, num_layers - 3]


def check_layer_ids(ids: Sequence[int], num_layers: int, *, field: str = "hidden_states.layer_ids") -> list[int]:
    """Validated aux ids, ascending: distinct, each 0 < id < L. A problem is a ConfigError naming ``field``."""
    if not ids:
        raise ConfigError(f"{field}: empty; give at least one aux layer id (0 < id < {num_layers})")
    bad = [i for i in ids if not 0 < int(i) < num_layers]
    if bad:
        raise ConfigError(f"{field}: {bad} out of range; ids are vLLM layer-input ids, 0 < id < {num_layers} "
                          f"(the target has {num_layers} layers; id {num_layers} is the final state, always stored)")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{field}: {list(ids)} has duplicates; give distinct ids")
    return sorted(int(i) for i in ids)


def resolve_layer_ids(num_layers: int, aux: Sequence[int] | None = None,
                      *, field: str = "hidden_states.layer_ids") -> LayerIds:
    """The configured aux ids (or the defaults) checked against ``num_layers``."""
    ids = default_aux_ids(num_layers) if aux is None else list(aux)
    return LayerIds(aux=tuple(check_layer_ids(ids, num_layers, field=field)), final=num_layers)


def to_sglang(ids: Sequence[int]) -> list[int]:
    """SGLang's explicit ids for vLLM ids (SGLang captures the input of layer id+1)."""
    return [int(i) - 1 for i in ids]
