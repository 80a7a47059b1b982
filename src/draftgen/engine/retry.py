"""Retry policy: which failures get another attempt, and how long to wait before it.

Delay before attempt ``n + 1`` (after ``n`` failed attempts) is "full jitter" exponential backoff:
``uniform(0, min(max_delay, base · multiplier^(n-1)))``. A server's ``Retry-After`` (header or body) is a
floor: the wait is at least that long, plus a little jitter so the retries of one 429 burst do not return
together. Every wait, ``Retry-After`` included, is capped at ``retry.max_delay_s`` (a capped wait lands
in its last tenth, still jittered): a ``Retry-After: 86400`` never parks a sample for a day.

Retryable: ``RetryableAPIError`` (429, 5xx, 408, timeouts, resets, empty 200s, ``finish_reason: error``,
errors in 200 bodies, mid-stream errors), up to ``max_attempts`` attempts in all. Everything else is final
for this run; failure records are retried on the next run.
"""

from __future__ import annotations

import random

from draftgen.config import RetryConfig
from draftgen.errors import APIError, RetryableAPIError

__all__ = ["RetryPolicy"]


class RetryPolicy:
    def __init__(self, cfg: RetryConfig, *, rng: random.Random | None = None) -> None:
        self.max_attempts = cfg.max_attempts
        self.base = cfg.base_delay_s
        self.multiplier = cfg.multiplier
        self.max_delay = cfg.max_delay_s
        self.rng = rng or random.Random()

    def should_retry(self, exc: APIError, attempts: int) -> bool:
        return isinstance(exc, RetryableAPIError) and attempts < self.max_attempts

    def delay(self, attempts: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``attempts`` failed attempts (``attempts`` >= 1)."""
        max_delay = max(0.0, self.max_delay)
        cap = min(max_delay, self.base * self.multiplier ** max(0, attempts - 1))
        wait = self.rng.uniform(0.0, cap)
        if retry_after is not None and retry_after > 0:  # NaN compares False: ignored
            wait = max(wait, retry_after + self.rng.uniform(0.0, min(1.0, 0.1 * retry_after)))
        if wait > max_delay:
            wait = max_delay * self.rng.uniform(0.9, 1.0)
        return wait
