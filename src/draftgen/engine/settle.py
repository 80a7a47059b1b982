"""Settling requests abandoned on the wire: their worst case replaced by what the server says it billed.

A request cancelled by an interrupt is held at its worst case (``BudgetGovernor.hold_abandoned``, an
``abandoned`` attempt in ``logs/attempts.jsonl`` with its generation id when the server sent one). Where the
API keeps a record of each generation (OpenRouter's ``GET /generation?id=``, ``Backend.get_generation``), that
record says what it was billed: ``settle`` looks each one up, books the bill in place of the hold
(``BudgetGovernor.settle_abandoned``) and appends a ``SettlementRecord`` to ``logs/settlements.jsonl``, which
every later reader (the budget at resume, ``status``, the report: ``records.attempt_spend``) applies.

OpenRouter answers 404 for about a second after a generation ends; a lookup is retried every ``RETRY_S``
until ``wait_s`` has passed, then the request stays held (the next run looks again: ``open_abandoned``). A
request whose generation id was never received (cancelled before the response's headers) cannot be looked
up and stays held at its worst case; so does every one on a server without generation records.

Reads ``logs/attempts.jsonl`` and ``logs/settlements.jsonl`` (``open_abandoned``); writes
``logs/settlements.jsonl``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from draftgen.backends.base import Backend
from draftgen.engine.budget import Abandoned, BudgetGovernor
from draftgen.engine.progress import RunLog
from draftgen.errors import APIError
from draftgen.records import AttemptRecord, SettlementRecord, spend_usd
from draftgen.store import JsonlWriter, iter_jsonl

__all__ = ["RETRY_S", "SETTLE_WAIT_S", "SettleResult", "open_abandoned", "settle"]

#: seconds between lookups of a generation the server does not know yet
RETRY_S = 0.5
#: how long the end of an interrupted run waits for the bills of what it abandoned (OpenRouter's lag is ~1 s)
SETTLE_WAIT_S = 3.0
#: lookups on the wire at once
_PARALLEL = 16


class SettleResult:
    """What one ``settle`` did: ``settled`` requests and the dollars their holds released (``released``:
    held minus billed), ``left`` still held (unknown ids, or the server never answered in time), ``error``:
    the last lookup error, if any."""

    def __init__(self) -> None:
        self.settled = 0
        self.released = 0.0
        self.left = 0
        self.error: str | None = None

    def line(self) -> str | None:
        """One line for the log and the console; None when there was nothing to settle."""
        if not self.settled and not self.left:
            return None
        out = (f"settled {self.settled:,} abandoned requests from GET /generation "
               f"(${self.released:.4f} of their worst case released)")
        if self.left:
            out += f"; {self.left:,} still held at their worst case"
            out += f" ({self.error})" if self.error else " (the server has no bill for them yet)"
        return out


def open_abandoned(attempts: Path, settlements: Path) -> list[Abandoned]:
    """The abandoned attempts of earlier runs with a generation id and no settlement yet (``prior``)."""
    done = {s.generation_id for _, s in iter_jsonl(settlements, SettlementRecord)}
    return [Abandoned(a.sample_id, a.dataset, a.cost, a.generation_id, prior=True)
            for _, a in iter_jsonl(attempts, AttemptRecord)
            if a.outcome == "abandoned" and a.cost > 0 and a.generation_id and a.generation_id not in done]


async def settle(backend: Backend, governor: BudgetGovernor, items: list[Abandoned], settlements: Path, *,
                 wait_s: float, log: RunLog | None = None) -> SettleResult:
    """Look each of ``items`` up (``Backend.get_generation``) for up to ``wait_s`` seconds; book and record
    each bill found (saying so in ``log``); ``BudgetGovernor.settle_abandoned`` books it."""
    result = SettleResult()
    deadline = time.monotonic() + max(0.0, wait_s)
    gate = asyncio.Semaphore(_PARALLEL)

    async def one(a: Abandoned) -> SettlementRecord | None:
        assert a.generation_id is not None
        while True:
            try:
                async with gate:
                    g = await backend.get_generation(a.generation_id)
            except APIError as exc:
                result.error = f"GET /generation: {exc}"
                return None
            if g is not None:
                billed = spend_usd(g.total_cost, g.is_byok, g.upstream_inference_cost)
                return SettlementRecord(generation_id=a.generation_id, sample_id=a.sample_id, dataset=a.dataset,
                                        held_usd=a.held, billed_usd=round(max(0.0, billed), 9), at=round(time.time(), 3))
            if time.monotonic() + RETRY_S > deadline:
                return None
            await asyncio.sleep(RETRY_S)

    found = await asyncio.gather(*(one(a) for a in items if a.generation_id))
    records = []
    for a, rec in zip([a for a in items if a.generation_id], found, strict=True):
        if rec is None:
            result.left += 1
            continue
        governor.settle_abandoned(a, rec.billed_usd)
        result.settled += 1
        result.released += a.held - rec.billed_usd
        records.append(rec)
    result.left += sum(1 for a in items if not a.generation_id)
    if records:
        with JsonlWriter(settlements) as w:
            w.write_many(records)
    line = result.line()
    if log is not None and line:
        log.write(line)
    return result
