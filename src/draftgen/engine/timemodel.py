"""The time model of a run: how long requests take, shared by ``plan`` before a run and the live ETA during one.

A request takes its time to first token plus its tokens at its stream's rate. A partition keeps ``concurrency``
requests in flight, so what is not sent yet goes out in waves (``wave_time``): every wave but the last lasts
one mean request, the last as long as its slowest request.

The slowest request of a wave (``last_wave_s``) is the median time by which every stream of the wave is done.
Each ``Stream`` says what it has received, its rate (its own once it streams; before that, any of the rates
seen, equally likely) and what is left of its wait for a first token; the ``Lengths`` say how long a sample
is, given that it is at least as long as what its stream has received:

- before a run (``plan``: nothing in flight, no length seen) ``Lengths.unknown``: every request may run to
  ``max_tokens``, and the slowest stream rate is the low end of the rates seen (``slowest_rate``), so the
  last wave lasts ``ttft + max_tokens ÷ slowest rate``;
- during a run (``eta``) ``Lengths.observed``: a Kaplan–Meier estimate over this run's finished lengths and
  the streams in flight, each of them a sample at least as long as what it has received (a censored one: the
  long tail is still on the wire, so the finished lengths alone are the short ones), with what lies beyond
  the longest finished sample at ``max_tokens``.

``eta``: the time left of one partition, the later of its streams in flight all done (``last_wave_s``) and
its samples not sent yet done in waves at the current concurrency (``wave_time``), with the name of the part
that decides it (``Eta.basis``). Reads and writes nothing: plain numbers in, numbers out.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_RATES_FIT", "MIN_RATE_TOKENS", "SLOW_SIGMAS", "Eta", "Lengths", "Stream", "eta", "last_wave_s", "request_s",
           "slowest_rate", "wave_time"]

#: A response shorter than this says little about its stream's rate; its rate is not counted.
MIN_RATE_TOKENS = 64
#: The slowest stream: this many standard deviations under the mean of the log rates seen.
SLOW_SIGMAS = 2.0
#: Rates seen needed to fit their spread (fewer: the slowest one seen).
MIN_RATES_FIT = 5
#: ``last_wave_s`` is found to this relative precision.
PRECISION = 0.01


def slowest_rate(rates: Sequence[float]) -> float:
    """The low end of the rates' log-normal fit (``SLOW_SIGMAS`` under the mean), at most the slowest seen."""
    if len(rates) < MIN_RATES_FIT:
        return min(rates)
    logs = [math.log(r) for r in rates]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    return min(min(rates), math.exp(mean - SLOW_SIGMAS * sd))


def request_s(ttft_s: float, tokens: float, rate: float) -> float:
    """One request: its first token's wait, then ``tokens`` at ``rate`` tokens per second."""
    return ttft_s + tokens / rate


def wave_time(requests: float, concurrency: int, mean_s: float, last_s: float) -> tuple[float, float]:
    """(waves, seconds) of ``requests`` sent ``concurrency`` at a time: ``requests ÷ concurrency`` waves (at
    least 1), each but the last one mean request long, the last ``last_s`` (never shorter than a mean one)."""
    waves = max(1.0, requests / max(concurrency, 1))
    return waves, (waves - 1.0) * mean_s + max(last_s, mean_s)


class Lengths:
    """How long a sample is: ``survival(x)``, the share of samples longer than ``x`` tokens (a step function,
    0 at ``max_tokens``)."""

    def __init__(self, max_tokens: int, at: Sequence[float] = (), surv: Sequence[float] = ()) -> None:
        self.max_tokens = max_tokens
        self._at = list(at)  # the lengths where survival steps down, ascending, all under max_tokens
        self._surv = list(surv)  # survival just after each of them

    @classmethod
    def unknown(cls, max_tokens: int) -> Lengths:
        """Nothing seen: a sample may run to ``max_tokens`` (plan's slowest request)."""
        return cls(max_tokens)

    @classmethod
    def observed(cls, done: Sequence[int], running: Sequence[float], max_tokens: int) -> Lengths:
        """Kaplan–Meier over the finished lengths ``done`` (sorted) and the streams in flight, each at least as
        long as what it has received (``running``); what survives the longest finished length ends at
        ``max_tokens``."""
        censored = sorted(running)
        at: list[float] = []
        surv: list[float] = []
        s = 1.0
        n = len(done) + len(censored) + 1  # and plan's worst case, one sample run to max_tokens: never 0 before
        i = j = 0  # finished lengths and censored ones passed (a censored one at x is still at risk at x)
        while i < len(done):
            x = done[i]
            while j < len(censored) and censored[j] < x:
                j += 1
            k = bisect.bisect_right(done, x, lo=i)
            at_risk = n - i - j
            if x >= max_tokens:
                break
            s *= 1.0 - (k - i) / at_risk
            at.append(float(x))
            surv.append(s)
            i = k
        return cls(max_tokens, at, surv)

    def survival(self, x: float) -> float:
        if x >= self.max_tokens:
            return 0.0
        i = bisect.bisect_right(self._at, x)
        return self._surv[i - 1] if i else 1.0

    def mean(self) -> float:
        """The mean length (the area under the survival curve, up to ``max_tokens``)."""
        area, last, s = 0.0, 0.0, 1.0
        for x, after in zip(self._at, self._surv, strict=True):
            area += s * (x - last)
            last, s = x, after
        return area + s * (self.max_tokens - last)


@dataclass(frozen=True)
class Stream:
    """One request of a wave: tokens received, its rate (one known; several: any of them, equally likely) and
    the seconds left before its first token."""

    received: float
    rates: tuple[float, ...]
    wait_s: float = 0.0


def _done_by(st: Stream, lengths: Lengths, dt: float) -> float:
    """The chance that ``st`` is done ``dt`` seconds from now."""
    s0 = lengths.survival(st.received)
    if s0 <= 0.0:
        return 1.0
    t = dt - st.wait_s
    if t <= 0:
        return 0.0
    left = sum(lengths.survival(st.received + r * t) for r in st.rates) / len(st.rates)
    return 1.0 - left / s0


def _longest_s(st: Stream, lengths: Lengths) -> float:
    """When ``st`` is done for sure: at ``max_tokens`` at its slowest rate."""
    return st.wait_s + max(lengths.max_tokens - st.received, 0.0) / min(st.rates)


def last_wave_s(streams: Sequence[Stream], lengths: Lengths, quantile: float = 0.5) -> float:
    """Seconds until every one of ``streams`` is done with chance ``quantile`` (0 for none)."""
    if not streams:
        return 0.0
    counts = Counter(streams)  # a wave not sent yet is one stream many times over
    hi = max(_longest_s(st, lengths) for st in counts)
    lo = 0.0
    log_q = math.log(quantile)
    while hi - lo > PRECISION * hi:
        mid = (lo + hi) / 2
        log_p = 0.0
        for st, n in counts.items():
            p = _done_by(st, lengths, mid)
            if p <= 0.0:
                log_p = -math.inf
                break
            log_p += n * math.log(p)
            if log_p < log_q:
                break
        if log_p >= log_q:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class Eta:
    """The time left of a partition, and which part of it decides it: ``streams`` (those in flight) or
    ``waves`` (samples not sent yet)."""

    seconds: float
    basis: str


def _spread(rates: Sequence[float], n: int = 32) -> tuple[float, ...]:
    """At most ``n`` of ``rates``, spread evenly over their sorted order (the slowest and fastest kept)."""
    ranked = sorted(rates)
    if len(ranked) <= n:
        return tuple(ranked)
    return tuple(ranked[round(i * (len(ranked) - 1) / (n - 1))] for i in range(n))


def eta(running: Sequence[Stream], queued: int, concurrency: int, lengths: Lengths, rates: Sequence[float],
        ttft_s: float) -> Eta | None:
    """The time left: the streams in flight all done, and ``queued`` samples more sent in waves of
    ``concurrency`` as slots free, each at ``ttft_s`` and any of ``rates``. None with no rate seen yet."""
    if not rates:
        return None
    rates = _spread(rates)
    inflight = last_wave_s(running, lengths)
    if not queued:
        return Eta(inflight, "streams")
    wave = min(queued, max(concurrency, 1))
    fresh = Stream(0.0, rates, ttft_s)
    mean_s = ttft_s + lengths.mean() * sum(1.0 / r for r in rates) / len(rates)
    _, waves_s = wave_time(queued + len(running), concurrency, mean_s, last_wave_s([fresh] * wave, lengths))
    return Eta(inflight, "streams") if inflight >= waves_s else Eta(waves_s, "waves")
