"""Money and counters: credits, the in-flight budget, generation metadata, and the inspectable state.

``EmulatorState`` is mutated only on the server's event loop; tests read it from another thread
(plain counters, no locks needed for reads). Money rules, as OpenRouter applies them:

- cost = prompt_tokens × prompt price + completion_tokens × completion price (true token counts, the
  serving provider's prices); credits go down by it when a generation completes. Responses with
  ``finish_reason: "error"``, empty 200s and broken connections are not billed.
- affordability is checked up front: prompt + ``max_tokens`` (or, without it, the provider's output
  cap) at the first provider's prices must fit in what remains, else 402 ``payment_required``.
- the optional in-flight budget caps the estimated cost of running requests: over it → 402 with
  ``Retry-After`` and ``limit_source: openrouter_in_flight_budget`` (retryable); a single request
  larger than the whole budget → 402 ``weight_exceeds_budget`` (final).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from draftgen.emulator.envelopes import ApiError, availability

__all__ = ["EmulatorState", "GenerationInfo", "check_affordable", "cost_of", "generation_data", "key_data"]


@dataclass
class GenerationInfo:
    id: str
    model: str
    provider_name: str
    total_cost: float
    tokens_prompt: int
    tokens_completion: int
    tokens_reasoning: int
    finish_reason: str
    streamed: bool
    latency_ms: int
    generation_time_ms: int
    created_at: float
    completed_mono: float
    upstream_id: str = ""
    cancelled: bool = False  # the client went away mid-generation: billed for what was generated until then


GENERATIONS_KEPT = 200_000  # /generation answers for the most recent generations only


@dataclass
class EmulatorState:
    credits_total: float = 100.0
    spend_usd: float = 0.0
    in_flight_usd: float = 0.0
    requests: int = 0  # chat/generate requests received (every endpoint that generates)
    responses_ok: int = 0  # generations delivered in full
    cancelled: int = 0  # generations the client abandoned mid-stream (billed for what was generated)
    tokens_completion: int = 0
    by_provider: Counter[str] = field(default_factory=Counter)  # provider display name → generations served
    by_status: Counter[int] = field(default_factory=Counter)  # HTTP status → responses (200 incl. error bodies)
    by_fault: Counter[str] = field(default_factory=Counter)  # fault kind → times injected
    generations: dict[str, GenerationInfo] = field(default_factory=dict)

    @property
    def credits_remaining(self) -> float:
        return self.credits_total - self.spend_usd

    def record_generation(self, info: GenerationInfo) -> None:
        self.generations[info.id] = info
        if len(self.generations) > GENERATIONS_KEPT:
            del self.generations[next(iter(self.generations))]  # oldest first (insertion order)
        self.spend_usd += info.total_cost
        self.tokens_completion += info.tokens_completion
        if info.cancelled:
            self.cancelled += 1
            return
        self.responses_ok += 1
        self.by_provider[info.provider_name] += 1


def cost_of(prompt_tokens: int, completion_tokens: int, price_prompt: float, price_completion: float) -> float:
    """USD; prices are per million tokens."""
    return (prompt_tokens * price_prompt + completion_tokens * price_completion) / 1e6


def check_affordable(state: EmulatorState, estimate: float, max_tokens: int, price_completion: float,
                     prompt_cost: float, in_flight_budget: float | None, retry_after_s: float) -> ApiError | None:
    remaining = state.credits_remaining
    if remaining <= 0:
        return ApiError(402, "Insufficient credits. Add more using https://openrouter.ai/settings/credits",
                        "payment_required", metadata={"limit_source": "openrouter_credits"})
    if estimate > remaining:
        affordable = max(0, int((remaining - prompt_cost) / (price_completion / 1e6))) if price_completion else 0
        return ApiError(
            402,
            f"This request requires more credits, or fewer max_tokens. You requested up to {max_tokens} tokens, "
            f"but can only afford {affordable}. To increase, visit https://openrouter.ai/settings/credits "
            "and add more credits",
            "payment_required", metadata={"limit_source": "openrouter_credits"},
        )
    if in_flight_budget is not None:
        if estimate > in_flight_budget:
            return ApiError(
                402, "This request is larger than your in-flight spending budget.", "payment_required",
                metadata={"limit_source": "openrouter_in_flight_budget"},
                availability=availability("weight_exceeds_budget", False),
            )
        if state.in_flight_usd + estimate > in_flight_budget:
            return ApiError(
                402, "In-flight spending budget exceeded; retry when running requests finish.", "payment_required",
                metadata={"limit_source": "openrouter_in_flight_budget"},
                availability=availability("in_flight_budget_exceeded", True, retry_after=retry_after_s),
                retry_after_s=retry_after_s,
            )
    return None


def key_data(state: EmulatorState, label: str, is_management: bool) -> dict[str, Any]:
    usage = round(state.spend_usd, 9)
    return {
        "label": label,
        "limit": state.credits_total,
        "limit_remaining": round(state.credits_remaining, 9),
        "limit_reset": None,
        "include_byok_in_limit": False,
        "usage": usage,
        "usage_daily": usage,
        "usage_weekly": usage,
        "usage_monthly": usage,
        "byok_usage": 0,
        "byok_usage_daily": 0,
        "byok_usage_weekly": 0,
        "byok_usage_monthly": 0,
        "is_free_tier": False,
        "is_management_key": is_management,
        "is_provisioning_key": is_management,
        "expires_at": None,
        "creator_user_id": "user_emulator",
        "rate_limit": {"requests": -1, "interval": "10s", "note": "This field is deprecated and safe to ignore."},
    }


def generation_data(g: GenerationInfo) -> dict[str, Any]:
    return {
        "id": g.id,
        "upstream_id": g.upstream_id or g.id.replace("gen-", "chatcmpl-"),
        "total_cost": g.total_cost,
        "cache_discount": None,
        "upstream_inference_cost": g.total_cost,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(g.created_at)),
        "model": g.model,
        "app_id": None,
        "streamed": g.streamed,
        "cancelled": g.cancelled,
        "provider_name": g.provider_name,
        "latency": g.latency_ms,
        "moderation_latency": None,
        "generation_time": g.generation_time_ms,
        "finish_reason": g.finish_reason,
        "native_finish_reason": g.finish_reason,
        "tokens_prompt": g.tokens_prompt,
        "tokens_completion": g.tokens_completion,
        "native_tokens_prompt": g.tokens_prompt,
        "native_tokens_completion": g.tokens_completion,
        "native_tokens_completion_images": None,
        "native_tokens_reasoning": g.tokens_reasoning,
        "native_tokens_cached": 0,
        "num_media_prompt": None,
        "num_media_completion": None,
        "num_search_results": None,
        "origin": "",
        "usage": g.total_cost,
        "is_byok": False,
    }
