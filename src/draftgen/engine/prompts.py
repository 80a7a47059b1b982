"""Streaming the prepared prompts of one dataset: never the whole file in memory, never a task per prompt.

Reads ``prepared/<dataset>/prompts.jsonl`` (``records.PromptRecord``, one per line). ``count_pending``
makes one light pass (only ``sample_id`` and ``partition`` decoded) to count what is left per partition
for the progress display; ``PromptCursor`` then yields, lazily and in file order, the prompts of one
partition whose id is not done and not yet taken in this run (a duplicated id is taken once).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec

from draftgen.records import PromptRecord
from draftgen.store import iter_jsonl

__all__ = ["PromptCursor", "count_pending", "estimate_prompt_tokens"]


class _PromptScan(msgspec.Struct):
    sample_id: str
    partition: str = "short"


def count_pending(path: Path, done: set[str], done_counts: dict[str, int] | None = None) -> dict[str, int]:
    """Prompts not yet done, per partition (each id counted once); ``done_counts``, when given, receives the
    prompts already done, per partition (a resumed run's progress is shown over the whole set)."""
    seen: set[str] = set()
    counts: dict[str, int] = {}
    for _, row in iter_jsonl(path, _PromptScan):
        sid = row.sample_id
        if sid in seen:
            continue
        seen.add(sid)
        if sid in done:
            if done_counts is not None:
                done_counts[row.partition] = done_counts.get(row.partition, 0) + 1
            continue
        counts[row.partition] = counts.get(row.partition, 0) + 1
    return counts


class PromptCursor:
    """The pending prompts of one dataset and partition, read lazily; ``peek``/``take`` one at a time."""

    def __init__(self, dataset: str, path: Path, partition: str, done: set[str], taken: set[str]) -> None:
        self.dataset = dataset
        self.path = path
        self.partition = partition
        self.done = done
        self.taken = taken  # shared by the dataset's cursors: ids scheduled in this run
        self._it: Iterator[tuple[int, PromptRecord]] | None = None
        self._next: PromptRecord | None = None
        self.exhausted = False
        self.finished_reason: str | None = None

    def peek(self) -> PromptRecord | None:
        if self._next is not None:
            return self._next
        if self.exhausted:
            return None
        if self._it is None:
            self._it = iter_jsonl(self.path, PromptRecord)
        for _, rec in self._it:
            sid = rec.sample_id
            if rec.partition != self.partition or sid in self.done or sid in self.taken:
                continue
            self._next = rec
            return rec
        self.exhausted = True
        self._it = None
        return None

    def take(self) -> PromptRecord:
        rec = self._next
        if rec is None:
            raise RuntimeError("take() without a successful peek()")
        self._next = None
        self.taken.add(rec.sample_id)
        return rec

    def finish(self, reason: str) -> None:
        self.exhausted = True
        self.finished_reason = reason
        self._next = None
        self._it = None


def estimate_prompt_tokens(rec: PromptRecord) -> int:
    """An upper-leaning estimate of a prompt's tokens when prepare did not count them (≈ 2 chars/token)."""
    if rec.prompt_tokens is not None:
        return rec.prompt_tokens
    chars = 0
    for m in rec.messages:
        chars += len(m.content or "") + len(m.reasoning_content or "") + 16
        if m.tool_calls:
            for tc in m.tool_calls:
                if tc.function is not None:
                    chars += len(tc.function.name) + len(tc.function.arguments) + 16
    if rec.tools:
        chars += len(msgspec.json.encode(rec.tools))
    return chars // 2 + 16
