"""The batch journal on disk, the prompts a batch was cut from, and the lines that show batches.

Reads and appends ``openrouter-batches/journal.jsonl`` (``records.BatchEvent``; the path is the caller's,
``rundir.RunDir.batch_journal``): every append is one fsynced line, so what ``engine.batch`` knows about a
batch is on disk before its next step starts. ``load_batches`` folds the journal into one ``BatchView``
per batch (a partial last line, left by a kill, is skipped and repaired by the next append).

``batch_lines`` renders batches for the live display and ``draftgen status``: how many are waiting to be
submitted, submitted, in progress and done, their ages, and the dollars each still reserves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from draftgen.fmt import fmt_duration, fmt_usd
from draftgen.records import BatchEvent, BatchView, PromptIdView, PromptRecord, fold_batches
from draftgen.store import JsonlReader, JsonlWriter, iter_jsonl, iter_jsonl_offsets

__all__ = ["BatchJournal", "batch_lines", "load_batches", "load_prompts"]


def load_batches(path: Path) -> dict[str, BatchView]:
    """Every batch of the journal at ``path`` (none when it does not exist)."""
    if not path.is_file():
        return {}
    return fold_batches(ev for _, ev in iter_jsonl(path, BatchEvent))


class BatchJournal:
    """Appends events to the journal, each fsynced before ``append`` returns."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._writer: JsonlWriter | None = None

    def load(self) -> dict[str, BatchView]:
        return load_batches(self.path)

    def append(self, ev: BatchEvent) -> None:
        if self._writer is None:
            self._writer = JsonlWriter(self.path, fsync=self.fsync)
        self._writer.write(ev)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def load_prompts(path: Path, ids: Iterable[str]) -> dict[str, PromptRecord]:
    """The prompts of ``ids`` in one dataset's ``prompts.jsonl`` (one pass reading ids only, then the
    wanted lines by offset); the first line of a duplicated id wins."""
    wanted = set(ids)
    offsets: dict[str, int] = {}
    for _, off, row in iter_jsonl_offsets(path, PromptIdView):
        if row.sample_id in wanted and row.sample_id not in offsets:
            offsets[row.sample_id] = off
    out: dict[str, PromptRecord] = {}
    if offsets:
        with JsonlReader(path, PromptRecord) as reader:
            for sid, off in offsets.items():
                out[sid] = reader.at(off)
    return out


def _ago(now: float, t: float | None) -> str:
    return fmt_duration(max(0.0, now - t)) if t else "–"


def batch_lines(views: Iterable[BatchView], now: float | None = None, *, limit: int = 8) -> list[str]:
    """A summary line (counts by state, dollars reserved) and one line per open batch (the oldest
    first, at most ``limit``): its OpenRouter id, state, requests done, age and reservation."""
    now = time.time() if now is None else now
    allv = list(views)
    if not allv:
        return []
    opened = [v for v in allv if v.open]
    waiting = sum(1 for v in opened if v.batch_id is None)
    running = sum(1 for v in opened if v.batch_id is not None and v.status in ("in_progress", "finalizing"))
    submitted = len(opened) - waiting - running
    done = [v for v in allv if v.finished]
    reserved = sum(v.reserved_usd for v in opened)
    cost = sum(v.cost or 0.0 for v in done)
    lines = [f"batches: {waiting} waiting to be submitted, {submitted} submitted, {running} in progress, "
             f"{len(done)} done ({fmt_usd(cost)} billed); {fmt_usd(reserved)} reserved"]
    for v in sorted(opened, key=lambda x: x.prepared_at)[:limit]:
        progress = f"{v.completed + v.failed:,}/{len(v.items):,}" + (f" ({v.failed:,} failed)" if v.failed else "")
        lines.append(f"  {v.batch_id or v.key}: {v.state}, {progress} requests, age "
                     f"{_ago(now, v.submitted_at or v.prepared_at)}, {fmt_usd(v.reserved_usd)} reserved"
                     + (f", on {v.provider}" if v.provider else ""))
    if len(opened) > limit:
        lines.append(f"  … and {len(opened) - limit} more open batches")
    return lines
