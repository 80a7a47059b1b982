"""Which of a dataset's unique prompts prepare keeps, and the round that drew each: the seeded bottom-k sample
of ``max_samples`` and each started round's adds (``runview.rounds.started_draws``). Pure computation; no I/O.

Every prompt has a sample key, ``sha256(seed, content hash)``; the draws go in sample-key order:

- round 1: the ``max_samples`` prompts of the smallest keys;
- each started round after it, in round order: for a dataset its line adds by sample key, the next
  ``added`` prompts no earlier round drew; for one its line adds per tag (``RoundDraw.by_tag``), for each tag
  in sorted order the next ``by_tag[tag]`` prompts carrying that tag (``records.tag_keys``: the untagged ones
  under ``UNTAGGED``) that no earlier round, nor an earlier tag of this round, drew. A prompt of several
  tags is drawn once; a tag with fewer prompts left than its add gives what it has.

A round's draw depends only on the rounds before it, so a later round never moves an earlier prompt to
another round. Memory: with M prompts drawn in all (``max_samples`` plus every round's adds), the j-th
prompt a draw takes from a pool (all prompts, or those of one tag) is at most the M-th smallest key of that
pool (fewer than M prompts were taken before it), so one bounded max-heap of M per pool holds every candidate:
the pool of all prompts, and one per tag a started round adds by.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

from draftgen.datasets import CutPrompt
from draftgen.records import tag_keys
from draftgen.runview.rounds import RoundDraw

__all__ = ["Draw", "Picked"]


@dataclass(order=True)
class Picked:
    """One unique prompt: its sample key (negated: the heaps are max-heaps), its place in the source, where it
    is, its content key, the prompt itself, its tags and the round that drew it."""

    neg_key: int
    order: int
    where: str = field(compare=False)
    hash: str = field(compare=False)
    cut: CutPrompt = field(compare=False)
    tags: list[str] | None = field(default=None, compare=False)
    round: int = field(default=1, compare=False)


class Draw:
    """The draw of one dataset: ``offer`` every unique prompt in source order, then ``picked``. ``first``:
    ``max_samples`` (None: every prompt, in round 1); ``rounds``: the started rounds' draws, round 2 first."""

    def __init__(self, first: int | None, rounds: list[RoundDraw]) -> None:
        self.first, self.rounds = first, rounds
        # M, the prompts drawn in all (a round's per-tag adds sum to its ``added``; the larger taken regardless)
        self.limit = None if first is None else first + sum(max(r.added, sum(r.by_tag.values())) for r in rounds)
        self.pool: list[Picked] = []  # a max-heap on the key when limited; else every prompt
        self.by_tag: dict[str, list[Picked]] = {t: [] for r in rounds for t in r.by_tag}
        self.seen = 0
        self.seen_by_tag: Counter[str] = Counter()

    def offer(self, item: Picked) -> None:
        self.seen += 1
        keys = tag_keys(item.tags)
        self.seen_by_tag.update(keys)
        if self.limit is None:
            self.pool.append(item)
            return
        _push(self.pool, item, self.limit)
        for t in keys:
            heap = self.by_tag.get(t)
            if heap is not None:
                _push(heap, item, self.limit)

    def picked(self) -> list[Picked]:
        """The prompts drawn, each with its round, in source order."""
        if self.first is None:
            return list(self.pool)
        taken: dict[int, Picked] = {}
        pools = {None: _Ranked(self.pool)} | {t: _Ranked(h) for t, h in self.by_tag.items()}
        pools[None].take(self.first, 1, taken)
        for n, r in enumerate(self.rounds, start=2):
            if r.by_tag:
                for t in sorted(r.by_tag):
                    pools[t].take(r.by_tag[t], n, taken)
            else:
                pools[None].take(r.added, n, taken)
        return sorted(taken.values(), key=lambda p: p.order)

    def not_selected(self, picked: list[Picked]) -> tuple[int, dict[str, int]]:
        """The unique prompts left out, in all and per tag key (``records.tag_keys``)."""
        drawn: Counter[str] = Counter()
        for p in picked:
            drawn.update(tag_keys(p.tags))
        return self.seen - len(picked), {t: n - drawn[t] for t, n in sorted(self.seen_by_tag.items())}


def _push(heap: list[Picked], item: Picked, limit: int) -> None:
    """Keep ``item`` in the bounded max-heap ``heap`` when it is among the ``limit`` smallest keys so far."""
    if len(heap) < limit:
        heapq.heappush(heap, item)
    elif item.neg_key > heap[0].neg_key:
        heapq.heapreplace(heap, item)


class _Ranked:
    """A pool in sample-key order with a cursor: every prompt before it is drawn (by this pool or another)."""

    def __init__(self, heap: list[Picked]) -> None:
        self.items = sorted(heap, key=lambda p: (-p.neg_key, p.order))
        self.at = 0

    def take(self, n: int, round_: int, taken: dict[int, Picked]) -> None:
        """Draw the next ``n`` prompts not yet drawn into ``taken``, in round ``round_``."""
        while n > 0 and self.at < len(self.items):
            p = self.items[self.at]
            self.at += 1
            if p.order not in taken:
                p.round = round_
                taken[p.order] = p
                n -= 1
