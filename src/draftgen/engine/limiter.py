"""Adaptive concurrency for one partition: a slot limiter whose limit follows AIMD in 429 storms.

Invariant: at most ``current`` (``int(limit)``) slots are taken by new acquisitions, not counting the slots
of stalled requests (``stalled``, set by the engine's tail guard: a request that has received nothing for a
while is no load the limit has to throttle, and must not starve the rest), and never more than ``ceiling``
slots in all; ``limit`` stays in ``[floor, ceiling]``.

- A rate-limited response (429, in-flight-budget 402) feeds an exponentially weighted 429 rate. When that
  rate shows a storm (above ``storm_rate``) the limit is multiplied by ``decrease`` at most once per
  ``cooldown_s``, so one burst of 429s from a single provider incident shrinks it once, not hundreds of
  times.
- Every success adds ``recover / limit`` to the limit (``recover`` = 2 % of the ceiling, at least 1), i.e.
  about 2 % of the ceiling per round of ``limit`` completions: recovery is gradual but takes tens of
  rounds, not thousands.
- ``tick`` (called periodically by the engine) also adds ``recover`` every ``recover_after_s`` without a
  429, so a limit shrunk while its slots hang in slow requests still comes back.
- With ``adaptive=False`` the limit stays at the ceiling.

Slots are taken by one producer per partition and released by the sample tasks; waiting is FIFO.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

__all__ = ["AdaptiveLimiter"]


class AdaptiveLimiter:
    def __init__(
        self,
        ceiling: int,
        *,
        adaptive: bool = True,
        floor: int | None = None,
        decrease: float = 0.7,
        storm_rate: float = 0.05,
        cooldown_s: float = 2.0,
        recover_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be >= 1")
        self.ceiling = ceiling
        self.floor = max(1, min(ceiling, floor if floor is not None else max(1, ceiling // 20)))
        self.adaptive = adaptive
        self.limit = float(ceiling)
        self.decrease = decrease
        self.storm_rate = storm_rate
        self.cooldown_s = cooldown_s
        self.recover = max(1.0, 0.02 * ceiling)
        self.clock = clock
        self.in_use = 0
        self.stalled = 0  # slots held by stalled requests (not counted against ``current``)
        self.rate_429 = 0.0  # EWMA of "this response was rate-limited"
        self.decreases = 0
        self._last_decrease = -1e18
        self.recover_after_s = recover_after_s
        self._last_limited = -1e18
        self._last_raise = -1e18
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def current(self) -> int:
        return int(self.limit + 1e-9)

    def _free(self) -> bool:
        """A new acquisition may take a slot now."""
        return self.in_use - min(self.stalled, self.in_use) < self.current and self.in_use < self.ceiling

    def set_stalled(self, n: int) -> None:
        """``n`` of the slots in use are held by stalled requests now."""
        self.stalled = max(0, n)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._free():
            fut = self._waiters.popleft()
            if not fut.done():
                self.in_use += 1
                fut.set_result(None)

    async def acquire(self) -> None:
        if not self._waiters and self._free():
            self.in_use += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # got the slot just as we were cancelled: give it back
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def try_acquire(self) -> bool:
        """A slot now if one is idle and nobody waits for one (a hedge never takes a slot from a waiter)."""
        if self._waiters or not self._free():
            return False
        self.in_use += 1
        return True

    def release(self) -> None:
        self.in_use -= 1
        self._wake()

    def _observe(self, limited: bool) -> None:
        # alpha 0.02: a storm is a sustained share of 429s over the last ~50 responses
        self.rate_429 += 0.02 * ((1.0 if limited else 0.0) - self.rate_429)

    def on_success(self) -> None:
        self._observe(False)
        if self.adaptive and self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + self.recover / max(self.limit, 1.0))
            self._wake()

    def on_other_error(self) -> None:
        self._observe(False)

    def tick(self) -> None:
        """Time-based recovery: no 429 for ``recover_after_s`` → one more step up."""
        if not self.adaptive or self.limit >= self.ceiling:
            return
        now = self.clock()
        if now - max(self._last_limited, self._last_raise) >= self.recover_after_s:
            self._last_raise = now
            self.limit = min(float(self.ceiling), self.limit + self.recover)
            self._wake()

    def on_rate_limited(self) -> bool:
        """Record a rate-limited response; returns True when the limit was decreased."""
        self._observe(True)
        self._last_limited = self.clock()
        if not self.adaptive or self.rate_429 < self.storm_rate:
            return False
        now = self.clock()
        if now - self._last_decrease < self.cooldown_s:
            return False
        self._last_decrease = now
        self.limit = max(float(self.floor), self.limit * self.decrease)
        self.decreases += 1
        return True
