"""``drafter.baselines``: the no-model drafters (copy-last, n-gram prompt lookup) and their replay on a known
greedy continuation.

The replay must count what a server running the same proposer counts: checked against
``drafter.speculate.greedy_speculative_generate`` (the emulator's own speculative decoding) on a small random
Qwen3, whose greedy output repeats itself enough for lookup to be accepted often.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from draftgen.drafter.baselines import NO_MODEL, Counts, PromptLookup, copy_last, prompt_lookup, replay


def test_copy_last_and_lookup_on_known_contexts() -> None:
    assert copy_last([5, 6, 7], 3) == [7, 7, 7]
    # "1 2 3" earlier, the context ends with "1 2": lookup continues with what followed, then keeps going
    assert prompt_lookup([1, 2, 3, 4, 9, 1, 2], 3) == [3, 4, 9]
    # the longest n-gram wins over a more recent shorter one: "8 1 2" → 3, not the later "2 5"
    assert prompt_lookup([8, 1, 2, 3, 2, 5, 8, 1, 2], 1) == [3]
    # the most recent occurrence of the n-gram wins
    assert prompt_lookup([2, 7, 2, 9, 2], 1) == [9]
    # nothing to match: the last token again
    assert prompt_lookup([4, 5, 6], 2) == [6, 6]
    assert sorted(NO_MODEL) == ["copy-last", "lookup"]


def test_the_indexed_lookup_equals_the_one_off_lookup_on_growing_and_new_contexts() -> None:
    import random

    rng = random.Random(3)
    seq = [rng.randrange(6) for _ in range(200)]
    indexed = PromptLookup()
    for end in range(1, 200, 7):
        assert indexed(seq[:end], 3) == prompt_lookup(seq[:end], 3)
    assert indexed([1, 2, 1], 2) == prompt_lookup([1, 2, 1], 2)  # not an extension: indexed afresh


def test_replay_counts_rounds_as_greedy_verification_does() -> None:
    prompt = [1, 2, 3]
    cont = [1, 2, 3, 1, 2, 9, 9, 0]  # 0: the end token
    c = replay(prompt, cont, copy_last, k=2, eos_ids=[0])
    # rounds after cont[0]: drafts [1,1] vs 2 → 0 accepted (emit 2); [2,2] vs 3 → 0; [3,3] vs 1 → 0;
    # [1,1] vs 2 → 0; [2,2] vs 9 → 0; [9,9] vs 9,0 → 1 accepted, then bonus 0 (the end)
    assert (c.drafts, c.accepted, c.accepted_per_pos) == (6, 1, [1, 0]) and c.tokens == 8
    lk = replay(prompt, cont, prompt_lookup, k=3, eos_ids=[0])
    # lookup: after "1" (cont[0]) it proposes 2 3 1 (the prompt's continuation): all accepted, bonus 2
    assert lk.accepted_per_pos[0] >= 1 and lk.acceptance_length is not None and lk.acceptance_length > 2.0


def test_a_cut_continuation_drops_the_rounds_that_reach_past_the_cut_whatever_they_accept() -> None:
    cont = list(range(10, 30))  # never ended, cut at 20 tokens
    full = replay([], cont, copy_last, k=3)
    # rounds start at 1, 2, ...: every draft fails, one token a round; a round is counted while it starts
    # k tokens before the cut (i < 20 - 3)
    assert (full.drafts, full.accepted) == (16, 0)
    assert replay([], cont, copy_last, k=3, ended=True).drafts == 19  # ended: every round is known
    assert replay([], [], copy_last, k=3) == Counts(accepted_per_pos=[0, 0, 0])
    with pytest.raises(ValueError, match="k is 0"):
        replay([], cont, copy_last, k=0)


class _NoModel:
    """A no-model proposer in ``speculate.Proposer``'s shape (the aux states are ignored)."""

    def __init__(self, name: str) -> None:
        self.propose_ids = NO_MODEL[name]()

    def propose(self, context: Sequence[int], aux: Any, k: int) -> list[int]:
        return self.propose_ids(context, k)


@pytest.mark.parametrize("name", ["copy-last", "lookup"])
def test_replay_counts_what_the_servers_speculative_decoding_counts(name: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from draftgen.drafter.speculate import greedy_generate, greedy_speculative_generate

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=16, initializer_range=0.3)
    target = transformers.Qwen3ForCausalLM(cfg).eval()
    k, m = 3, 40
    accepted = 0
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        prompt = [int(t) for t in torch.randint(0, 64, (8,), generator=g)]
        served = greedy_speculative_generate(target, _NoModel(name), prompt, k=k, max_new_tokens=m,
                                             aux_layer_ids=[1, 2, 3])
        cont = greedy_generate(target, prompt, max_new_tokens=m + k)
        assert served.ids == cont[:m]
        r = replay(prompt, cont, NO_MODEL[name](), k=k, max_new=m)
        assert (r.drafts, r.draft_tokens, r.accepted, r.accepted_per_pos) == (
            served.drafts, served.draft_tokens, served.accepted, served.accepted_per_pos)
        accepted += r.accepted
    assert accepted > 0  # the target repeats itself: the comparison saw acceptances, not only misses
