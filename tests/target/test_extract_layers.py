"""Layer ids: EAGLE-3 defaults, validation naming the field, SGLang/HF equivalents (target.layers)."""

from __future__ import annotations

import pytest

from draftgen.errors import ConfigError
from draftgen.target.layers import (
    CONVENTION,
    check_layer_ids,
    default_aux_ids,
    resolve_layer_ids,
    to_sglang,
)


@pytest.mark.parametrize(("n", "want"), [(8, [2, 4, 5]), (36, [2, 18, 33]), (61, [2, 30, 58]), (32, [2, 16, 29])])
def test_defaults_are_eagle3s(n: int, want: list[int]) -> None:
    assert default_aux_ids(n) == want
    ids = resolve_layer_ids(n)
    assert list(ids.aux) == want and ids.final == n
    assert ids.sglang_aux == [i - 1 for i in want] and ids.hf_hidden_states_index == want
    assert CONVENTION == "vllm-layer-input"


def test_too_few_layers_for_defaults_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"hidden_states\.layer_ids.*L >= 8"):
        default_aux_ids(7)
    assert list(resolve_layer_ids(4, [1, 2]).aux) == [1, 2]  # explicit ids are fine on a shallow model


@pytest.mark.parametrize("ids", [[0, 2], [2, 8], [-1], [3, 3], []])
def test_bad_ids_are_refused_naming_the_field(ids: list[int]) -> None:
    with pytest.raises(ConfigError, match=r"^hidden_states\.layer_ids: "):
        check_layer_ids(ids, 8)


def test_ids_are_sorted_and_sglang_is_minus_one() -> None:
    assert check_layer_ids([5, 2, 4], 8) == [2, 4, 5]
    assert to_sglang([2, 4, 5]) == [1, 3, 4]
