"""Retry policy: which failures get another attempt, and how long to wait before it.

Delay before attempt ``n + 1`` (after ``n`` failed attempts) is "full jitter" exponential backoff:
``uniform(0, min(max_delay, base · multiplier^(n-1)))``. A server's ``Retry-After`` (header or body) is a
floor: the wait is at least that long, plus a little jitter so the retries of one 429 burst do not return
together. Every wait, ``Retry-After`` included, is capped at ``retry.max_delay_s`` (a capped wait lands
in its last tenth, still jittered): a ``Retry-After: 86400`` never parks a sample for a day.

Retryable: ``RetryableAPIError`` (429, 5xx, 408, timeouts, resets, empty 200s, ``finish_reason: error``,
errors in 200 bodies, mid-stream errors), up to ``max_attempts`` attempts in all. Everything else is final
for this run; failure records are retried on the next run.

Rate limits are waited out, not counted: a ``RateLimited`` error (a 429, the in-flight budget's 402, a
rate limit mid-stream) uses no attempt while the sample's time spent waiting out rate limits stays
within ``retry.rate_limit_wait_s``. Its wait is the server's ``Retry-After`` plus a little jitter (no
exponential growth: the server said when), or, without one, the exponential backoff over the rate
limits so far. Past that budget the rate limit is a failure like any other
(``retries_exhausted:<kind>``). ``rate_limit_wait_s: 0`` counts rate limits as attempts.

``RetryPolicy.decide`` is the one retry decision of a sample's failed attempt (``sample.SampleRunner``):
``Retry`` after a delay, ``Keep`` the sample's last unusable response as its record (retries exhausted,
``quality.keep_unusable``), or ``GiveUp`` with the failure's kind. ``retrying(fn, policy)`` is the same
policy as a loop, for the requests outside generate's scheduler (the vllm capture backend, accept).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from draftgen.config import RetryConfig
from draftgen.engine.assemble import UnusableResponse
from draftgen.errors import APIError, RateLimited, RetryableAPIError

__all__ = ["Decision", "GiveUp", "Keep", "Retry", "RetryPolicy", "retrying"]

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """Another attempt, after ``delay`` seconds; ``rate_limited``: a rate limit waited out (no attempt used,
    ``delay`` taken from the sample's rate-limit time)."""

    delay: float
    rate_limited: bool = False


@dataclass(frozen=True)
class Keep:
    """No more attempts; the sample's last unusable response becomes its record, flagged."""


@dataclass(frozen=True)
class GiveUp:
    """No more attempts; the sample is a failure of ``kind`` (``permanent``: retrying cannot help)."""

    kind: str
    permanent: bool


Decision = Retry | Keep | GiveUp


class RetryPolicy:
    def __init__(self, cfg: RetryConfig, *, rng: random.Random | None = None) -> None:
        self.max_attempts = cfg.max_attempts
        self.base = cfg.base_delay_s
        self.multiplier = cfg.multiplier
        self.max_delay = cfg.max_delay_s
        self.rate_limit_wait = max(0.0, cfg.rate_limit_wait_s)
        self.rng = rng or random.Random()

    def should_retry(self, exc: APIError, attempts: int) -> bool:
        return isinstance(exc, RetryableAPIError) and attempts < self.max_attempts

    def rate_wait(self, exc: APIError, rate_limits: int, rate_waited: float) -> float | None:
        """The wait before retrying a rate limit without using an attempt (``rate_limits`` of them waited out
        already, ``rate_waited`` seconds in all); None when ``exc`` is no rate limit or its time is spent."""
        if not isinstance(exc, RateLimited) or self.rate_limit_wait <= 0:
            return None
        ra = exc.retry_after
        wait = self.delay(1, ra) if ra is not None and ra > 0 else self.delay(rate_limits + 1)
        return wait if rate_waited + wait <= self.rate_limit_wait else None

    def decide(self, exc: APIError, attempts: int, *, keepable: bool = False, rate_limits: int = 0,
               rate_waited: float = 0.0) -> Decision:
        """What follows ``attempts`` attempts, the last failed with ``exc``; ``keepable``: the sample has
        an unusable response it may keep; ``rate_limits`` / ``rate_waited``: the rate limits it waited out
        so far (they are not attempts) and the seconds they took. Draws the jittered delay only for a
        retry."""
        wait = self.rate_wait(exc, rate_limits, rate_waited)
        if wait is not None:
            return Retry(wait, rate_limited=True)
        if self.should_retry(exc, attempts - rate_limits):
            return Retry(self.delay(attempts - rate_limits, exc.retry_after))
        retryable = isinstance(exc, RetryableAPIError)
        if retryable and keepable:
            return Keep()
        # An unusable response is no transient error: the failure says what was wrong with it.
        kind = exc.kind if isinstance(exc, UnusableResponse) else f"retries_exhausted:{exc.kind}" if retryable else exc.kind
        return GiveUp(kind, permanent=not retryable)

    def delay(self, attempts: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``attempts`` failed attempts (``attempts`` >= 1)."""
        max_delay = max(0.0, self.max_delay)
        # the exponent is bounded: a batch polled through a day-long outage fails thousands of times in a row,
        # and multiplier ** 1,100 is no float
        cap = min(max_delay, self.base * self.multiplier ** min(max(0, attempts - 1), 64))
        wait = self.rng.uniform(0.0, cap)
        if retry_after is not None and retry_after > 0:  # NaN compares False: ignored
            wait = max(wait, retry_after + self.rng.uniform(0.0, min(1.0, 0.1 * retry_after)))
        if wait > max_delay:
            wait = max_delay * self.rng.uniform(0.9, 1.0)
        return wait


async def retrying(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, *,
                   on_retry: Callable[[APIError, int, float], object] | None = None) -> T:
    """``await fn()`` until it succeeds, retrying what ``policy.decide`` retries (``RetryableAPIError``
    while attempts remain; rate limits while their time lasts); anything else, and the last retryable
    error, propagate.
    ``on_retry(exc, attempts, delay)`` is told of each retry before its wait."""
    attempts = rate_limits = 0
    rate_waited = 0.0
    while True:
        attempts += 1
        try:
            return await fn()
        except APIError as exc:
            decision = policy.decide(exc, attempts, rate_limits=rate_limits, rate_waited=rate_waited)
            if not isinstance(decision, Retry):
                raise
            if decision.rate_limited:
                rate_limits += 1
                rate_waited += decision.delay
            if on_retry is not None:
                on_retry(exc, attempts, decision.delay)
            await asyncio.sleep(decision.delay)
