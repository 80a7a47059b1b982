"""Run counters: what the progress display, the log and the final summary read.

Counting only; drawing lives in ``engine.progress``. Workers bump plain integers on the event loop
thread; a display thread may read them at any time (a momentarily stale number is fine). Throughput is a
sliding window of (time, cumulative tokens, cumulative done) samples taken by the display, in total and
per partition.

Requests on the wire are tracked per partition in ``PartitionCounts.flight``: one dict insert when an
attempt goes out and one pop when it ends (response, error or cancel). A dict keeps insertion order, so its
first entry is always the oldest request in flight (an O(1) look-up for the display).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["DatasetCounts", "PartitionCounts", "RunStats", "window_rates"]


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


Window = deque[tuple[float, int, int]]  # (time, cumulative completion tokens, cumulative done)


def window_rates(w: Window, period: float = 30.0) -> tuple[float, float] | None:
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
    return ((tok1 - tok0) / dt, (n1 - n0) / dt) if dt > 0 else (0.0, 0.0)


@dataclass
class PartitionCounts:
    """One partition's figures for this run (over every dataset)."""

    name: str
    planned: int = 0  # samples this run set out to finish in this partition
    done: int = 0  # written to a raw log by this run
    failed: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    retries: int = 0
    #: (dataset, sample_id) → when its current attempt went out (``time.monotonic``). Insertion order is age
    #: order: an entry is popped when its attempt ends and re-inserted (at the end) by the next attempt.
    flight: dict[tuple[str, str], float] = field(default_factory=dict)
    window: Window = field(default_factory=lambda: deque(maxlen=120))

    def oldest(self) -> tuple[tuple[str, str], float] | None:
        """The request longest on the wire and when it went out (None when none is)."""
        try:
            for key, since in self.flight.items():
                return key, since
        except RuntimeError:  # changed under a reader on another thread: no figure this time
            pass
        return None


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
    stopping: str | None = None
    cooling: list[str] = field(default_factory=list)  # providers in the run's cool-down now
    cooldowns: Counter[str] = field(default_factory=Counter)  # provider → cool-downs this run
    kept_unusable: Counter[str] = field(default_factory=Counter)  # kind → unusable responses kept as records
    interrupt: str | None = None  # the signal that stopped the run (SIGINT, SIGTERM), set by its handler
    grace_until: float | None = None  # (clock) when an interrupted run cancels what is still in flight
    aborting: bool = False  # a hard stop: what is in flight is being cancelled now
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
        return self.clock() - self.started

    def sample(self) -> None:
        """Record a throughput sample, in total and per partition (called by the display at its own rate)."""
        now = self.clock()
        self._window.append((now, self.completion_tokens, self.done))
        for p in self.partitions.values():
            p.window.append((now, p.completion_tokens, p.done))

    def rates(self, period: float = 30.0) -> tuple[float, float]:
        """(tokens/s, samples/s) over the last ``period`` seconds of samples."""
        got = window_rates(self._window, period)
        if got is None:
            el = self.elapsed
            return (self.completion_tokens / el, self.done / el) if el > 0 else (0.0, 0.0)
        return got

    def eta(self) -> float | None:
        _, per_s = self.rates()
        left = self.to_do - self.done - self.failed
        if per_s <= 0 or left <= 0:
            return None
        return left / per_s
