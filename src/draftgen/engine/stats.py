"""Run counters: what the progress display, the log and the final summary read.

Counting only; drawing lives in ``engine.progress``. Workers bump plain integers on the event loop
thread; a display thread may read them at any time (a momentarily stale number is fine). Throughput is a
sliding window of (time, cumulative tokens, cumulative done) samples taken by the display, in total and
per partition.

Requests on the wire are tracked per partition in ``PartitionCounts.flight`` (``flight.Flight``, hedges
hanging off the flight they hedge): one dict insert when an attempt goes out and one pop when it ends
(response, error or cancel). A dict keeps insertion order, so its first entry is always the oldest request in
flight (an O(1) look-up for the display).

Tokens count when they arrive, not when a response is done: the throughput window's token figure is the
tokens received on the wire (``wire_tokens``: those of attempts that ended, plus what each request in flight
has received so far, estimated from its text at the run's characters per token, ``chars_per_token``, until the
server's own count replaces it), so tok/s and the ETA move while long streams are still running.

What the ETA (``engine.timemodel.eta``) reads beside the streams in flight: per partition its ``max_tokens``,
this run's finished lengths (``lengths``) and the decode rates of its finished streams (``rates``: completion
tokens over the time from first to last data, for responses of at least ``timemodel.MIN_RATE_TOKENS``), and
the run's recent times to first data (``first_data``).

One definition of a run's pace, shared by the display, the final summary and ``status`` (through the
progress record the display writes): ``elapsed`` is the time since this run (this ``generate`` process)
started, ``mean_tok_s`` this run's completion tokens over it; the live rate (``rates``) is the tokens received
on the wire over the last ``RATE_WINDOW_S`` seconds.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from draftgen.engine.budget import BudgetGovernor
from draftgen.engine.flight import Flight
from draftgen.engine.timemodel import MIN_RATE_TOKENS, Eta

__all__ = ["RATE_WINDOW_S", "DatasetCounts", "PartitionCounts", "RunStats", "window_rates"]

#: The live rate (tokens and responses per second) is taken over this many seconds.
RATE_WINDOW_S = 30.0


@dataclass
class DatasetCounts:
    name: str
    to_do: int = 0  # samples this run set out to finish (pending at start, in the selected partitions)
    done_before: int = 0  # already in the raw log at start
    done: int = 0  # finished by this run
    failed: int = 0
    completion_tokens: int = 0  # this run
    prompt_tokens: int = 0
    cost: float = 0.0
    tokens_before: int = 0
    token_budget: int | None = None
    skipped: str | None = None  # why the dataset was skipped or stopped early


Window = deque[tuple[float, int, int]]  # (time, cumulative tokens received on the wire, cumulative done)


def window_rates(w: Window, period: float = RATE_WINDOW_S) -> tuple[float, float] | None:
    """(tokens/s, samples/s) over the last ``period`` seconds of ``w``; None with fewer than two samples."""
    if len(w) < 2:
        return None
    t1, tok1, n1 = w[-1]
    t0, tok0, n0 = w[0]
    for t, tok, n in w:
        if t1 - t <= period:
            t0, tok0, n0 = t, tok, n
            break
    dt = t1 - t0
    # a response's own count replacing its estimate may lower the token figure a little: never below 0
    return (max(0.0, (tok1 - tok0) / dt), (n1 - n0) / dt) if dt > 0 else (0.0, 0.0)


@dataclass
class PartitionCounts:
    """One partition's figures for this run (over every dataset)."""

    name: str
    planned: int = 0  # samples this run set out to finish in this partition
    done_before: int = 0  # samples of the selection in this partition already done when the run started
    done: int = 0  # written to a raw log by this run
    failed: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    retries: int = 0
    #: (dataset, sample_id) → its current attempt on the wire. Insertion order is age order: an entry is
    #: popped when its attempt ends and re-inserted (at the end) by the next attempt.
    flight: dict[tuple[str, str], Flight] = field(default_factory=dict)
    window: Window = field(default_factory=lambda: deque(maxlen=120))
    wire_done: float = 0.0  # tokens received by the attempts that ended (answered, failed or cancelled)
    lengths: list[int] = field(default_factory=list)  # completion lengths of this run's records, sorted
    stalled: int = 0  # requests in flight with no text for the stall time (set by ``tail.TailGuard``)
    stalled_s: float | None = None  # how long the most silent of them has been silent
    max_tokens: int | None = None  # the partition's max_tokens (set by the scheduler)
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=512))  # decode rates of finished streams
    eta_cache: tuple[float, Eta | None] | None = None  # (clock, the ETA computed then): the display's, see progress

    def oldest(self) -> tuple[tuple[str, str], float] | None:
        """The request longest on the wire and when it went out (None when none is)."""
        try:
            for key, fl in self.flight.items():
                return key, fl.started
        except RuntimeError:  # changed under a reader on another thread: no figure this time
            pass
        return None

    def flights(self) -> Iterator[Flight]:
        """Every request on the wire: each sample's attempt, then the hedges hanging off it."""
        for fl in list(self.flight.values()):
            yield fl
            for hf, _ in fl.running_hedges():
                yield hf

    def live_tokens(self, chars_per_token: float) -> float:
        """Tokens received so far by the requests on the wire."""
        return sum(fl.meter.tokens(chars_per_token) for fl in self.flights())


@dataclass
class RunStats:
    clock: Callable[[], float] = time.monotonic
    started: float = field(default_factory=time.monotonic)
    datasets: dict[str, DatasetCounts] = field(default_factory=dict)
    partitions: dict[str, PartitionCounts] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    limit: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    providers: Counter[str] = field(default_factory=Counter)
    ids_source: Counter[str] = field(default_factory=Counter)
    latency_sum: float = 0.0
    spend_prior: float = 0.0
    spend_session: float = 0.0
    reserved: float = 0.0
    remaining: float | None = None
    #: the run's dollar budget, read live by the display and the summary (spent, billed, held, left, reserved
    #: in one consistent reading); None: the figures above
    governor: BudgetGovernor | None = None
    stopping: str | None = None
    cooling: list[str] = field(default_factory=list)  # providers in the run's cool-down now
    cooldowns: Counter[str] = field(default_factory=Counter)  # provider → cool-downs this run
    kept_unusable: Counter[str] = field(default_factory=Counter)  # kind → unusable responses kept as records
    interrupt: str | None = None  # the signal that stopped the run (SIGINT, SIGTERM), set by its handler
    grace_until: float | None = None  # (clock) when an interrupted run cancels what is still in flight
    aborting: bool = False  # a hard stop: what is in flight is being cancelled now
    hedges: int = 0  # second requests sent for samples already on the wire (``tail``)
    hedges_won: int = 0  # ... whose response became the record
    hedge_extra_usd: float = 0.0  # what the losing requests of hedged samples cost (booked in the budget)
    slow_streams: int = 0  # streams cancelled under the rate floor (``tail.min_tokens_per_s``)
    text_chars: int = 0  # characters of text of this run's streamed responses ...
    text_tokens: int = 0  # ... and their completion tokens: the run's characters per token
    first_data: deque[float] = field(default_factory=lambda: deque(maxlen=256))  # recent times to first data
    eta_every_s: float = 2.0  # the display's ETA is computed at most this often (a run scaled down scales it)
    _window: Window = field(default_factory=lambda: deque(maxlen=120))

    def dataset(self, name: str) -> DatasetCounts:
        d = self.datasets.get(name)
        if d is None:
            d = self.datasets[name] = DatasetCounts(name)
        return d

    def partition(self, name: str) -> PartitionCounts:
        p = self.partitions.get(name)
        if p is None:
            p = self.partitions[name] = PartitionCounts(name)
        return p

    @property
    def done(self) -> int:
        return sum(d.done for d in self.datasets.values())

    @property
    def failed(self) -> int:
        return sum(d.failed for d in self.datasets.values())

    @property
    def to_do(self) -> int:
        return sum(d.to_do for d in self.datasets.values())

    @property
    def completion_tokens(self) -> int:
        return sum(d.completion_tokens for d in self.datasets.values())

    @property
    def elapsed(self) -> float:
        """Seconds since this run started (the one definition of elapsed: see the module docstring)."""
        return self.clock() - self.started

    @property
    def mean_tok_s(self) -> float:
        """This run's completion tokens per second of ``elapsed``."""
        el = self.elapsed
        return self.completion_tokens / el if el > 0 else 0.0

    @property
    def chars_per_token(self) -> float:
        """Characters of text per completion token in this run's responses (4 until 1,000 tokens are in)."""
        return self.text_chars / self.text_tokens if self.text_tokens >= 1000 and self.text_chars else 4.0

    def response_in(self, partition: str, completion_tokens: int, chars: int, first_data_s: float | None) -> None:
        """A response became a record: its length, its text per token, its time to first data."""
        bisect.insort(self.partition(partition).lengths, completion_tokens)
        if chars > 0 and completion_tokens > 0:
            self.text_chars += chars
            self.text_tokens += completion_tokens
        if first_data_s is not None:
            self.first_data.append(first_data_s)

    def attempt_ended(self, fl: Flight, completion_tokens: int | None = None) -> None:
        """An attempt left the wire: what it received counts in the wire tokens for good (the server's
        count when it answered, else what arrived)."""
        m = fl.meter
        got = m.tokens(self.chars_per_token)
        pc = self.partition(fl.partition)
        pc.wire_done += float(completion_tokens) if completion_tokens else got
        if completion_tokens and completion_tokens >= MIN_RATE_TOKENS and m.first_at is not None \
                and m.last_at is not None and m.last_at > m.first_at:
            pc.rates.append(completion_tokens / (m.last_at - m.first_at))

    def wire_tokens(self, partition: str | None = None) -> float:
        """Tokens received on the wire so far, in ``partition`` or in all."""
        cpt = self.chars_per_token
        parts = self.partitions.values() if partition is None else [self.partition(partition)]
        return sum(p.wire_done + p.live_tokens(cpt) for p in parts)

    def sample(self) -> None:
        """Record a throughput sample, in total and per partition (called by the display at its own rate): the
        tokens received on the wire, and the samples done."""
        now = self.clock()
        cpt = self.chars_per_token
        total = 0.0
        for p in self.partitions.values():
            wire = p.wire_done + p.live_tokens(cpt)
            total += wire
            p.window.append((now, int(wire), p.done))
        self._window.append((now, int(total), self.done))

    def rates(self, period: float = RATE_WINDOW_S) -> tuple[float, float]:
        """(tokens/s, samples/s) over the last ``period`` seconds of samples."""
        got = window_rates(self._window, period)
        if got is None:
            el = self.elapsed
            return (self.mean_tok_s, self.done / el) if el > 0 else (0.0, 0.0)
        return got
