"""Run counters: what the progress display, the log and the final summary read.

Counting only; drawing lives in ``engine.progress``. Workers bump plain integers on the event loop
thread; a display thread may read them at any time (a momentarily stale number is fine). Throughput is a
sliding window of (time, cumulative tokens, cumulative done) samples taken by the display.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["DatasetCounts", "RunStats"]


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


@dataclass
class RunStats:
    clock: Callable[[], float] = time.monotonic
    started: float = field(default_factory=time.monotonic)
    datasets: dict[str, DatasetCounts] = field(default_factory=dict)
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
    _window: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=120))

    def dataset(self, name: str) -> DatasetCounts:
        d = self.datasets.get(name)
        if d is None:
            d = self.datasets[name] = DatasetCounts(name)
        return d

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
        """Record a throughput sample (called by the display at its own rate)."""
        self._window.append((self.clock(), self.completion_tokens, self.done))

    def rates(self, period: float = 30.0) -> tuple[float, float]:
        """(tokens/s, samples/s) over the last ``period`` seconds of samples."""
        w = self._window
        if len(w) < 2:
            el = self.elapsed
            return (self.completion_tokens / el, self.done / el) if el > 0 else (0.0, 0.0)
        t1, tok1, n1 = w[-1]
        t0, tok0, n0 = w[0]
        for t, tok, n in w:
            if t1 - t <= period:
                t0, tok0, n0 = t, tok, n
                break
        dt = t1 - t0
        return ((tok1 - tok0) / dt, (n1 - n0) / dt) if dt > 0 else (0.0, 0.0)

    def eta(self) -> float | None:
        _, per_s = self.rates()
        left = self.to_do - self.done - self.failed
        if per_s <= 0 or left <= 0:
            return None
        return left / per_s
