"""The generation sections: ``reasoning``, ``sampling``, ``partitions``, ``budget``, ``retry`` and ``quality``. Pure data."""

from __future__ import annotations

from typing import Literal

import msgspec

from draftgen.config.base import Section


class ReasoningConfig(Section):
    """OpenRouter's ``reasoning`` object, sent as is (omitted fields are not sent)."""

    effort: Literal["max", "xhigh", "high", "medium", "low", "minimal", "none"] | None = None
    """``max``, ``xhigh``, ``high``, ``medium``, ``low``, ``minimal`` or ``none``."""
    max_tokens: int | None = None
    """Thinking budget in tokens (use either this or ``effort``)."""
    exclude: bool | None = None
    """True: the model reasons but the text is not returned (ids cannot then be rebuilt)."""
    enabled: bool | None = None
    """Switch reasoning on or off where the model allows it."""


class SamplingConfig(Section):
    """Sampling parameters sent with every request (omitted fields are not sent)."""

    temperature: float | None = None
    """Sampling temperature in [0, 2]."""
    top_p: float | None = None
    """Nucleus sampling mass in (0, 1]."""
    seed: int | None = None
    """Request seed (determinism is best-effort upstream)."""
    stop: list[str] | None = None
    """Up to 4 stop strings."""
    logprobs: bool | None = None
    """Ask for per-token logprobs: where a provider returns them, content ids are recovered exactly."""
    top_logprobs: int | None = None
    """Alternatives per position (0–20; needs ``logprobs: true``)."""


class PartitionConfig(Section):
    concurrency: int
    """Requests in flight for this partition (default short 2,000, long 500)."""
    max_tokens: int
    """max_tokens sent for this partition (default short 10,240, long 16,384)."""


PARTITION_DEFAULTS: dict[str, dict[str, int]] = {
    "short": {"concurrency": 2000, "max_tokens": 10240},
    "long": {"concurrency": 500, "max_tokens": 16384},
}


class PartitionsConfig(Section):
    """Requests in flight and max_tokens per partition (the reference run: 2,000/10,240 and 500/16,384)."""

    short: PartitionConfig = msgspec.field(default_factory=lambda: PartitionConfig(**PARTITION_DEFAULTS["short"]))
    long: PartitionConfig = msgspec.field(default_factory=lambda: PartitionConfig(**PARTITION_DEFAULTS["long"]))


class BudgetConfig(Section):
    max_spend_usd: float | None = None
    """Dollar budget for the run directory, hard: each request reserves its cost before it is sent (under ``token_policy: expected``: at the mean observed output length while the money left after reservations is at least the worst case of a tenth of the slots, else max_tokens × price). Spend never passes it by more than the worst case of the requests in flight (strict: never)."""
    token_budget: int | None = None
    """Default per-dataset completion-token budget."""
    token_policy: Literal["strict", "expected"] = "expected"
    """What a request reserves against its dataset's token budget. ``strict``: ``max_tokens``; a request is admitted only if done + reserved + max_tokens <= budget, so the budget is never passed (a 10M budget at max_tokens 10,240 holds at most 976 requests in flight). ``expected``: the running p90 of the completion lengths seen for that dataset and partition (``max_tokens`` until 20 responses are in); admission stops when done + reserved reaches the budget, so the overshoot is at most what was in flight beyond its reservations (≤ concurrency × max_tokens) and is reported."""
    allow_unpriced: bool = False
    """Run with ``max_spend_usd`` even when neither ``usage.cost`` nor the model's prices are known (the dollar budget then cannot be enforced)."""
    key_recheck_s: float = 60.0
    """How often, in seconds, a run reads the API key's limit again (``GET /key``, OpenRouter): a limit lowered mid-run is followed, and a limit reached stops the run naming it. 0: read at the start only."""


class RetryConfig(Section):
    """Retries, backoff and shutdown."""

    max_attempts: int = 6
    """Attempts per sample in one run before it is recorded as a failure (retried on the next run)."""
    base_delay_s: float = 0.5
    """First backoff delay; full jitter is applied; ``Retry-After`` wins when given."""
    multiplier: float = 2.0
    """Backoff growth per attempt."""
    max_delay_s: float = 60.0
    """Longest single backoff wait."""
    adaptive_concurrency: bool = True
    """Shrink the requests in flight during 429 storms and grow back after."""
    shutdown_grace_s: float = 30.0
    """On SIGINT/SIGTERM, how long in-flight requests may finish before the run stops."""
    rate_limit_wait_s: float = 600.0
    """Seconds one sample may spend waiting out rate limits (429, the in-flight budget's 402) before a rate limit counts as its failure; waits for rate limits use none of ``max_attempts`` (each waits the server's ``Retry-After``). 0: rate limits count as attempts like any other failure."""


class QualityConfig(Section):
    """What counts as a usable response, and what happens to a provider that keeps failing."""

    keep_unusable: bool = False
    """Keep responses still unusable after ``retry.max_attempts`` (dropped reasoning, an excluded provider or quantization) as records flagged ``unusable:<reason>``, and merge them; by default they are failures, never merged."""
    provider_window: int = 20
    """Outcomes per provider (the most recent) that its health is judged on."""
    provider_min_outcomes: int = 5
    """A provider is judged only once it has this many outcomes in the window."""
    provider_max_failure_rate: float = 0.5
    """Share of bad outcomes (errors, dropped reasoning, billing far off) that sends a provider to the cool-down."""
    provider_cooldown_s: float = 300.0
    """How long a failing provider stays on the run's ignore list."""
    billing_tolerance: float = 0.05
    """A response whose rebuilt completion length differs from the billed one by more than this share is billed far off."""
    model_aliases: list[str] = msgspec.field(default_factory=list)
    """Other names a response's ``model`` may carry besides ``model.id`` (its versions with a date suffix, e.g. ``moonshotai/kimi-k2.5-0127``, are always accepted); a response naming another model is unusable and retried elsewhere."""
    min_length_fraction: float = 0.5
    """A response cut by the length limit (``finish_reason: length``) at fewer than this share of ``max_tokens`` completion tokens is incomplete, and so is one without a finish reason: both are retried elsewhere."""
