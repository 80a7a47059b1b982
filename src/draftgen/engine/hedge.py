"""The hedge race: a second request for a stalled attempt, and which of the two becomes the sample's outcome.

Reads the samples running (``live``, kept by ``sample.SampleRunner``) and the attempt on the wire
(``flight.Flight``); writes ``AttemptRecord`` rows through the runner (``Wire.record``) and books extra spend
on the ``BudgetGovernor``. Three things, each one method:

- ``hedge`` (called by ``tail.TailGuard``) sends the same request again for a stalled attempt, avoiding its
  provider, on an idle slot with a reservation of its own; it says no when there is no idle slot, the budget
  or ``tail.hedge_max_extra_spend`` does not allow it. A hedge's slot and reservation are released when it
  leaves the wire; the sample's own stay with the sample.
- ``outcome`` settles an attempt that was hedged: the first usable response is its outcome, the other request
  is cancelled (``Lost``: recorded ``hedge_lost``, its cost booked as extra spend by
  ``BudgetGovernor.charge_loser``), and a usable response that came second is discarded the same way
  (``discard``). No hedge is left running when it returns.
- ``cancelled`` turns a request the engine cancelled into its outcome: a hedge that stalled in its turn
  (``stalled``), a stream under the rate floor (``slow_stream``), both retried elsewhere, or the loser of a
  race (``Lost``).

Invariants: at most one record per sample reaches its sink however many of its requests answered (the
runner's ``Sinks.claim`` is the last word); every losing request's cost is booked once, as extra spend
(``RunStats.hedge_extra_usd``, in the session's spend too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol

import msgspec

from draftgen.backends.base import Completion, CompletionRequest
from draftgen.backends.errors import attribute
from draftgen.engine.budget import BudgetGovernor, Reservation, usage_cost
from draftgen.engine.flight import Flight
from draftgen.engine.outcomes import Attempt, Host, Lost, Rejected, Response, Sample, Unusable, Usable
from draftgen.engine.progress import RunLog
from draftgen.engine.prompts import estimate_prompt_tokens
from draftgen.engine.retry import RetryPolicy
from draftgen.engine.stats import RunStats
from draftgen.engine.tail import TailPolicy
from draftgen.errors import APIError, RetryableAPIError

__all__ = ["HedgeRace", "Wire"]


class Wire(Protocol):
    """What the race needs of the sample runner: one request on the wire with the checks on its response
    (``call``: a hedge's response goes through the same ``intake.check_response`` as any), and the runner's books (attempt records, provider health, the providers a request avoids)."""

    async def call(self, s: Sample, req: CompletionRequest, fl: Flight) -> Attempt | Lost: ...

    def record(self, s: Sample, started: float, outcome: str, provider: str | None, comp: Completion | None = None,
               cost: float = 0.0, ended: float | None = None, *, hedge: bool = False) -> None: ...

    def judge(self, provider: str | None, outcome: APIError | str | None) -> None: ...

    def avoid(self, avoid: list[str], provider: str | None) -> None: ...

    def ignore_for(self, avoid: list[str]) -> list[str] | None: ...


class HedgeRace:
    """Hedges of stalled attempts and the race each one starts (see the module docstring)."""

    def __init__(self, wire: Wire, *, host: Host, governor: BudgetGovernor, policy: RetryPolicy, stats: RunStats,
                 log: RunLog, tail: TailPolicy) -> None:
        self.wire, self.host, self.governor, self.policy = wire, host, governor, policy
        self.stats, self.log, self.tail = stats, log, tail
        self.live: dict[tuple[str, str], Sample] = {}  # the samples running, by key (the runner keeps it)
        self.hedging: set[asyncio.Task[Attempt | Lost]] = set()  # hedges on the wire: the host cancels them at the end

    def cancelled(self, s: Sample, fl: Flight, started: float) -> Rejected | Lost:
        """A request the engine cancelled: under the rate floor (retried elsewhere), or beaten by another
        request of its sample (its cost so far booked as extra spend)."""
        m, cpt = fl.meter, self.stats.chars_per_token
        if fl.reason == "stalled":  # a hedge that stalled in its turn
            exc = attribute(RetryableAPIError(
                f"stalled (a hedge with no text for {fl.silent_s(time.monotonic()):.0f}s; cancelled)", kind="stalled"),
                m.provider)
            self.wire.record(s, started, exc.kind, m.provider, hedge=fl.hedge)
            self.wire.judge(m.provider, exc)
            return Rejected(exc)
        if fl.reason == "slow_stream":
            t = self.tail
            got = f"{m.tokens(cpt):,.0f} tokens" if m.first_at is not None else "no data since the request went out"
            exc = attribute(RetryableAPIError(
                f"slow_stream ({got} in {time.monotonic() - fl.started:.0f}s: under "
                f"tail.min_tokens_per_s {t.min_tokens_per_s:g} over tail.slow_window_s {t.slow_window_s:g}s; "
                "retried on another provider)", kind="slow_stream"), m.provider)
            self.wire.record(s, started, exc.kind, m.provider, hedge=fl.hedge)
            self.wire.judge(m.provider, exc)
            return Rejected(exc)
        gov = self.governor
        cost = gov.prices.cost(estimate_prompt_tokens(s.prompt), round(m.tokens(cpt))) if gov.priced else 0.0
        self._lose(cost)
        self.wire.record(s, started, "hedge_lost", m.provider, cost=cost, hedge=fl.hedge)
        return Lost()

    def _lose(self, cost: float) -> None:
        """Book what the losing request of a hedged sample cost."""
        self.governor.charge_loser(cost)
        self.stats.hedge_extra_usd += max(cost, 0.0)
        self.stats.spend_session = self.governor.session
        self.stats.remaining = self.governor.remaining

    def hedge(self, fl: Flight) -> bool:
        """Send the request of the stalled attempt ``fl`` again, avoiding its provider, on an idle slot with a
        reservation of its own (``tail.TailGuard`` calls this). False when it cannot go out now: no idle slot,
        the budget, or the cap on hedges' extra spend."""
        s = self.live.get(fl.key)
        if s is None or s.current is not fl or self.host.stopping:
            return False
        lim = s.lease.limiter
        if not lim.try_acquire():
            return False
        gov = self.governor
        res = gov.reservation(s.dataset, s.part.name, s.part.max_tokens, estimate_prompt_tokens(s.prompt))
        if not gov.hedge_room(res, self.tail.hedge_max_extra_spend):
            lim.release()
            return False
        gov.hold_hedge(res)
        avoid = list(s.avoid)
        self.wire.avoid(avoid, fl.meter.provider)
        hf = Flight(fl.key, fl.partition, time.monotonic(), hedge=True)
        req = msgspec.structs.replace(s.req, provider_ignore=self.wire.ignore_for(avoid), meter=hf.meter)
        task = asyncio.get_running_loop().create_task(self._hedge(s, fl, hf, req, res))
        fl.hedges.append((hf, task))
        self.hedging.add(task)
        task.add_done_callback(self.hedging.discard)
        st = self.stats
        st.hedges += 1
        st.in_flight[s.part.name], st.reserved = lim.in_use, gov.reserved
        self.log.write(f"hedge {s.dataset}/{s.prompt.sample_id} attempt {s.attempts}: no text for "
                       f"{fl.silent_s(time.monotonic()):.1f}s{' from ' + fl.meter.provider if fl.meter.provider else ''}; "
                       "the same request goes out again on another provider")
        return True

    async def _hedge(self, s: Sample, fl: Flight, hf: Flight, req: CompletionRequest, res: Reservation) -> Attempt | Lost:
        """One hedge on the wire; a usable response first cancels the request it hedges."""
        lim = s.lease.limiter
        try:
            out = await self.wire.call(s, req, hf)
            if isinstance(out, Usable) and fl.winner is None:
                fl.winner = out
                fl.cancel("hedge_lost")
            elif not isinstance(out, Usable | Lost):  # failed: the next hedge of ``fl`` after a retry delay
                fl.next_hedge = time.monotonic() + self.policy.delay(len(fl.hedges), out.exc.retry_after)
            return out
        finally:
            lim.release()
            self.governor.release_hedge(res)
            self.stats.in_flight[s.part.name], self.stats.reserved = lim.in_use, self.governor.reserved

    async def outcome(self, s: Sample, fl: Flight, out: Attempt | Lost) -> Attempt:
        """The outcome of an attempt that was hedged: the first usable response (the request's own, or a
        hedge's); else, while a hedge is still on the wire, that hedge's; else the request's own failure.
        Every other usable response is discarded (``discard``), and no hedge is left running."""
        if isinstance(out, Usable) and fl.winner is None:
            for hf, _ in fl.running_hedges():
                hf.cancel("hedge_lost")
            await self._settle(s, fl, keep=out)
            return out
        if isinstance(out, Unusable):
            s.kept = out.response
            self.wire.avoid(s.avoid, out.response.comp.provider)
        running = fl.running_hedges()
        if fl.winner is None and running:
            hf, task = running[-1]
            s.flight[s.key] = hf  # the hedge carries the attempt on: in the table for the display and the guard
            try:
                await asyncio.wait([task])
            finally:
                s.flight.pop(s.key, None)
        if isinstance(fl.winner, Usable):
            await self._settle(s, fl, keep=fl.winner, own=out)
            self.stats.hedges_won += 1
            return fl.winner
        await self._settle(s, fl, keep=None)
        last = [t.result() for _, t in fl.hedges if not t.cancelled()]
        if not isinstance(out, Lost | Usable):
            return out if not running else self._last_failure([out, *last])
        return self._last_failure(last)

    @staticmethod
    def _last_failure(outs: Sequence[Attempt | Lost]) -> Attempt:
        """The latest outcome that is a failure (a race with no usable response has one)."""
        fails = [o for o in outs if isinstance(o, Unusable | Rejected)]
        return fails[-1] if fails else Rejected(RetryableAPIError("hedged request cancelled", kind="hedge_lost"))

    async def _settle(self, s: Sample, fl: Flight, *, keep: Usable | None, own: Attempt | Lost | None = None) -> None:
        """Wait for the hedges of ``fl`` to leave the wire; discard every usable response but ``keep``."""
        tasks = [t for _, t in fl.hedges]
        if tasks:
            await asyncio.wait(tasks)
        for out in [own, *(t.result() for t in tasks if not t.cancelled())]:
            if isinstance(out, Usable) and out is not keep:
                self.discard(s, out.response)

    def discard(self, s: Sample, r: Response) -> None:
        """A usable response that lost its race: no record; its cost is booked as extra spend."""
        cost = usage_cost(r.comp.usage)
        self._lose(cost)
        self.wire.record(s, r.started, "hedge_lost", r.comp.provider, r.comp, cost, ended=r.ended, hedge=r.hedge)
