"""Drafters with no model (copy-last, n-gram prompt lookup) and their replay on a target's greedy output.

Greedy verification accepts a draft token iff it equals the target's greedy token at that place. So once
the target's greedy continuation of a prompt is known (from the server that serves it, the same pass that
measures a drafter), what a server running a no-model proposer would count is known too, without running
it: ``replay`` walks the continuation in rounds as ``drafter.speculate.greedy_speculative_generate`` does
(the first token from the prefill; each round proposes k tokens, accepts them while they equal the target's
tokens, stopping after an accepted end token, then takes the target's next token), with the same counters
(vLLM's ``spec_decode_*`` meaning).

A continuation cut at ``max_tokens`` (not ended by an end token) leaves the target's tokens after the cut
unknown, while a server counts its last round against them too. ``replay`` then counts only the rounds that
start ``k`` or more tokens before the cut, whatever they accept (a rule on where a round starts, not on its
outcome, so the tail drops out without favouring failures); a continuation that ended with an end token is
replayed whole. ``replay(..., max_new=M)`` on a continuation of M + k tokens or more counts exactly
what the server counts with ``max_tokens`` M (tests/drafter/test_baselines.py checks it against the emulator's
own speculative decoding).

The proposers (each drafts exactly k tokens every round, as an EAGLE drafter does, so their acceptance
lengths are tokens per verification like the drafter's):

- ``copy_last``: the last token, k times;
- ``prompt_lookup`` (prompt lookup decoding, vLLM's ``ngram`` method): token by token, the token that followed
  the most recent earlier occurrence of the longest n-gram (``max_n`` down to 1) ending the context (drafts
  so far included); with no such occurrence, the last token again.

Pure Python; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["LOOKUP_MAX_N", "NO_MODEL", "Counts", "PromptLookup", "Propose", "copy_last", "prompt_lookup", "replay"]

#: a no-model proposer: (verified ids, prompt included; k) -> k draft ids
Propose = Callable[[Sequence[int], int], list[int]]

#: the longest n-gram ``prompt_lookup`` matches (vLLM's ``prompt_lookup_max`` for the ``ngram`` method)
LOOKUP_MAX_N = 3


@dataclass
class Counts:
    """One prompt's speculative counters (vLLM's meaning; ``verify_calls`` = drafts here, one per round)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    tokens: int = 0  # continuation tokens the counted rounds cover (the first one included)

    @property
    def acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None


def copy_last(context: Sequence[int], k: int) -> list[int]:
    """The last token, k times."""
    return [context[-1]] * k


class PromptLookup:
    """n-gram prompt lookup with an index of the context seen so far: a context that extends the last one
    (as replay's do, round after round) is indexed only for its new tokens, so a round costs O(k·max_n)."""

    def __init__(self, max_n: int = LOOKUP_MAX_N) -> None:
        if max_n < 1:
            raise ValueError(f"max_n is {max_n}; it must be 1 or more")
        self.max_n = max_n
        self.seq: list[int] = []
        #: n-gram -> index of the token after its most recent occurrence (only occurrences a token follows)
        self.after: dict[tuple[int, ...], int] = {}

    def _index(self, seq: list[int], table: dict[tuple[int, ...], int]) -> None:
        """Record the n-grams ending at the end of ``seq`` as followed by the token about to be appended."""
        for n in range(1, min(self.max_n, len(seq)) + 1):
            table[tuple(seq[len(seq) - n:])] = len(seq)

    def _next(self, seq: list[int], overlay: dict[tuple[int, ...], int]) -> int:
        for n in range(min(self.max_n, len(seq) - 1), 0, -1):
            key = tuple(seq[len(seq) - n:])
            j = overlay.get(key, self.after.get(key))
            if j is not None:
                return seq[j]
        return seq[-1]

    def __call__(self, context: Sequence[int], k: int) -> list[int]:
        ctx = list(context)
        if ctx[:len(self.seq)] != self.seq:  # not an extension of the last context: index it afresh
            self.seq, self.after = [], {}
        for tok in ctx[len(self.seq):]:
            self._index(self.seq, self.after)
            self.seq.append(tok)
        tmp = list(self.seq)
        overlay: dict[tuple[int, ...], int] = {}
        out: list[int] = []
        for _ in range(k):
            tok = self._next(tmp, overlay)
            out.append(tok)
            self._index(tmp, overlay)
            tmp.append(tok)
        return out


def prompt_lookup(context: Sequence[int], k: int, *, max_n: int = LOOKUP_MAX_N) -> list[int]:
    """k tokens by n-gram prompt lookup over ``context`` (see the module docstring); one-off, unindexed."""
    return PromptLookup(max_n)(context, k)


#: the no-model drafters ``draftgen accept`` reports beside each drafter: name -> a fresh proposer (one per prompt)
NO_MODEL: dict[str, Callable[[], Propose]] = {"copy-last": lambda: copy_last, "lookup": PromptLookup}


def replay(prompt_ids: Sequence[int], continuation: Sequence[int], propose: Propose, *, k: int,
           eos_ids: Sequence[int] = (), ended: bool | None = None, max_new: int | None = None) -> Counts:
    """The counters a server running ``propose`` would report for this prompt (see the module docstring).
    ``ended``: the continuation ended with an end token (default: its last id is in ``eos_ids``);
    ``max_new``: the server's max_tokens, when the continuation reaches past it."""
    if k < 1:
        raise ValueError(f"k is {k}; it must be 1 or more")
    cont = list(continuation)
    eos = set(eos_ids)
    done = ended if ended is not None else bool(cont) and cont[-1] in eos
    stop = min(len(cont), max_new) if max_new is not None else len(cont)
    # rounds starting at i < last_start are wholly known: every token they can compare is in ``cont``
    last_start = stop if done or (max_new is not None and len(cont) >= max_new + k) else len(cont) - k
    c = Counts(accepted_per_pos=[0] * k)
    if not cont or stop < 1:
        return c
    i = 1  # tokens emitted so far; cont[0] came from the prefill
    c.tokens = 1
    if cont[0] in eos:
        return c
    while i < stop and i < last_start:
        drafts = propose([*prompt_ids, *cont[:i]], k)
        if len(drafts) != k:
            raise ValueError(f"the proposer drafted {len(drafts)} tokens; expected k={k}")
        a = 0
        while a < k and i + a < len(cont) and drafts[a] == cont[i + a]:
            a += 1
            if drafts[a - 1] in eos:
                break
        c.drafts += 1
        c.draft_tokens += k
        c.accepted += a
        for j in range(a):
            c.accepted_per_pos[j] += 1
        step = a if a and drafts[a - 1] in eos else a + 1
        c.tokens += min(step, stop - i)
        i += step
        if cont[min(i, len(cont)) - 1] in eos:
            break
    return c
