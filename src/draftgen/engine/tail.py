"""The tail of a run: requests that stop making progress on the wire, and what the engine does about them.

Reads the requests on the wire (``stats.PartitionCounts.flight``: each ``flight.Flight`` with the
``WireMeter`` its backend updates) and writes only their figures (``PartitionCounts.stalled``,
``stalled_s``). ``TailGuard.tick``, called by the scheduler a few times a second, does three things (the
knobs are ``tail.*``, ``TailPolicy``):

- **Stalls**: a request with no text for ``stall_after`` (``stall_s``, or 4 × the run's p95 time to first
  data when that is longer; 30 s until 20 responses are in) is stalled. The display counts them, with the
  longest silence, and the partition's limiter does not count their slots against its adaptive limit (only
  against the configured concurrency), so requests that hang do not starve the rest.
- **Slow streams**: a stream that has received fewer than ``min_tokens_per_s`` × the elapsed time over the
  last ``slow_window_s`` or more is cancelled (``slow_stream``, a retryable error attributed to its
  provider), and the sample's next attempt avoids that provider. A streamed request that has sent no data
  at all is judged by the same floor, its window counted from when it went out: no first byte in
  ``slow_window_s`` is cancelled the same way (whatever the connection still sends: headers, keep-alive
  comments). A request that does not stream (``streamed`` false) has no data until its body is in, so the
  floor never judges it before.
- **Hedges**: once a partition has no prompt left to start (its producer is done) and it has idle slots,
  its stalled requests, oldest first, may be sent again on another provider (``hedge`` is
  ``hedge.HedgeRace.hedge``, which takes the slot and the reservation, and says no when the budget or
  ``hedge_max_extra_spend`` does). At most one hedge of a request is on the wire at a time, at most
  ``MAX_HEDGES`` per attempt, and a hedge that failed is followed by the next only after a retry delay
  (``Flight.next_hedge``). A hedge that stalls itself is cancelled (``stalled``, retryable): when the request
  it hedged is still on the wire, the next hedge follows; when that request has ended, the sample retries.

The race between a request and its hedge is ``hedge.HedgeRace``'s: the first usable response becomes the
record, the other request is cancelled and its cost booked as extra spend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from draftgen.engine.flight import Flight
from draftgen.engine.stats import RunStats

__all__ = ["MAX_HEDGES", "STALL_FACTOR", "TailGuard", "TailPolicy"]

#: a request is stalled after this many times the run's p95 time to first data (when longer than ``stall_s``)
STALL_FACTOR = 4.0
#: the stall time while fewer than ``MIN_SAMPLES`` responses give the run's own time to first data
DEFAULT_STALL_S = 30.0
MIN_SAMPLES = 20
#: hedges of one attempt, one at a time (a hedge that failed is followed by the next after a retry delay)
MAX_HEDGES = 4


@dataclass(frozen=True)
class TailPolicy:
    """``tail.*`` as the engine uses it (see ``config.tail.TailConfig``)."""

    min_tokens_per_s: float = 2.0
    slow_window_s: float = 60.0
    stall_s: float = 2.0
    hedge_max_extra_spend: float = 0.03
    warmup_stall_s: float = DEFAULT_STALL_S  # the stall time until ``MIN_SAMPLES`` responses are in
    streamed: bool = True  # requests stream (``endpoint.stream``): one with no data for a window is slow too


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


class TailGuard:
    """Stall marking, the rate floor and hedging, over every partition's requests on the wire."""

    def __init__(self, policy: TailPolicy, stats: RunStats, *, hedge: Callable[[Flight], bool],
                 drained: Callable[[str], bool], stalled: Callable[[str, int], None] = lambda part, n: None) -> None:
        self.policy = policy
        self.stats = stats
        self.hedge = hedge  # send a hedge of this flight; False when it cannot go out now
        self.drained = drained  # this partition has no prompt left to start
        self.on_stalled = stalled  # this partition has this many stalled requests now (its limiter)

    def stall_after(self) -> float:
        """Seconds without text after which a request is stalled."""
        fd = list(self.stats.first_data)
        learned = STALL_FACTOR * _p95(fd) if len(fd) >= MIN_SAMPLES else self.policy.warmup_stall_s
        return max(self.policy.stall_s, learned)

    def tick(self, now: float, *, hedging: bool = True) -> None:
        """One look at every request on the wire (``now``: ``time.monotonic()``); ``hedging``: hedges may go
        out (not while the run is stopping)."""
        stall = self.stall_after()
        cpt = self.stats.chars_per_token
        for name, pc in self.stats.partitions.items():
            stalled: list[Flight] = []
            silence: float | None = None
            for fl in list(pc.flights()):
                if self.slow(fl, now, cpt):
                    if fl.cancel("slow_stream"):
                        self.stats.slow_streams += 1
                    continue
                quiet = fl.silent_s(now)
                if quiet < stall:
                    continue
                if fl.hedge:  # a hedge that stalls too is no help: cancelled, the next goes out after a delay
                    fl.cancel("stalled")
                    continue
                stalled.append(fl)
                silence = quiet if silence is None else max(silence, quiet)
            pc.stalled, pc.stalled_s = len(stalled), silence
            self.on_stalled(name, len(stalled))
            if hedging and stalled and self.policy.hedge_max_extra_spend > 0 and self.drained(name):
                self._hedge(stalled, now)

    def _hedge(self, stalled: list[Flight], now: float) -> None:
        """Hedge the stalled requests, oldest first, until one cannot go out."""
        for fl in sorted(stalled, key=lambda f: f.started):
            if not fl.open or fl.running_hedges() or len(fl.hedges) >= MAX_HEDGES or now < fl.next_hedge:
                continue
            if not self.hedge(fl):
                return

    def slow(self, fl: Flight, now: float, chars_per_token: float) -> bool:
        """Whether ``fl``'s stream has stayed under the rate floor for the window. Keeps checkpoints of what
        it had received every half window, the rate being taken from the newest one a window old or more.
        With no data yet, zero tokens since the request went out: slow once that is a whole window ago."""
        floor, window = self.policy.min_tokens_per_s, self.policy.slow_window_s
        m = fl.meter
        if floor <= 0 or window <= 0 or not fl.open:
            return False
        if m.first_at is None:
            return self.policy.streamed and now - fl.started >= window
        got = m.tokens(chars_per_token)
        marks = fl.marks
        if not marks:
            marks.append((m.first_at, 0.0))
        if now - marks[-1][0] >= window / 2:
            marks.append((now, got))
        ref = None
        for t, k in marks:
            if now - t >= window:
                ref = (t, k)
        return ref is not None and got - ref[1] < floor * (now - ref[0])
