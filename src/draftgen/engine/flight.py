"""One request on the wire (``Flight``): when it went out, what it has received, and how the engine cancels it.

A ``Flight`` is made per attempt by ``sample.SampleRunner`` and lives in its partition's table
(``stats.PartitionCounts.flight``, keyed by ``(dataset, sample_id)``) from the moment the request goes out to
the moment its attempt ends; a hedge (a second request for the same sample, ``tail``) hangs off the flight
it hedges (``hedges``) instead of taking a key of its own. Its ``meter`` is the ``WireMeter`` the backend
updates as data arrives; the display (``progress``) and the tail guard (``tail``) only read it.

Cancelling: the attempt runs inside ``scope()`` (an ``asyncio.timeout`` with no deadline); ``cancel(reason)``
moves that deadline to now, so the request is cancelled where it waits and the attempt sees ``reason``. A
flight is cancelled at most once (the first reason wins), and only while its scope is open.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from draftgen.backends.base import WireMeter

__all__ = ["Flight"]


class Flight:
    """One attempt on the wire (see the module docstring)."""

    __slots__ = ("_scope", "hedge", "hedges", "key", "marks", "meter", "next_hedge", "partition", "reason", "started",
                 "winner")

    def __init__(self, key: tuple[str, str], partition: str, started: float, *, hedge: bool = False) -> None:
        self.key = key
        self.partition = partition
        self.started = started  # time.monotonic() when the request went out
        self.meter = WireMeter()
        self.hedge = hedge  # a second request for a sample already on the wire
        self.reason: str | None = None  # why the engine cancelled it (``slow_stream``, ``hedge_lost``)
        self.hedges: list[tuple[Flight, asyncio.Task[Any]]] = []  # its hedges, in the order they went out
        self.winner: Any = None  # a hedge's usable outcome that beat this flight
        self.next_hedge = 0.0  # (monotonic) no hedge before this: the last one failed
        self.marks: deque[tuple[float, float]] = deque(maxlen=3)  # (time, tokens) checkpoints of the rate floor
        self._scope: asyncio.Timeout | None = None

    def scope(self) -> asyncio.Timeout:
        """The context the request runs in (entered at once, with no await in between); ``cancel`` ends it,
        ``close`` forgets it when the attempt is over."""
        self._scope = asyncio.timeout(None)
        return self._scope

    def close(self) -> None:
        self._scope = None

    @property
    def open(self) -> bool:
        """The request is still on the wire and can be cancelled."""
        return self._scope is not None and self.reason is None

    def cancel(self, reason: str) -> bool:
        """Cancel the request now with ``reason`` (what its attempt records). False when it is not open."""
        if not self.open:
            return False
        self.reason = reason
        assert self._scope is not None
        try:
            self._scope.reschedule(asyncio.get_running_loop().time())
        except RuntimeError:  # its scope has just closed: the attempt ended on its own
            self.reason = None
            return False
        return True

    def silent_s(self, now: float) -> float:
        """Seconds since it last received text or ids (since it went out when none has come yet)."""
        last = self.meter.last_at
        return now - (last if last is not None else self.started)

    def running_hedges(self) -> list[tuple[Flight, asyncio.Task[Any]]]:
        """Its hedges still on the wire."""
        return [(f, t) for f, t in self.hedges if not t.done()]
