"""``plan``'s comparison of the ways to buy the same tokens: synchronous, ``service_tier: flex``, and
OpenRouter's Batch API, side by side: cost, expected time, and whether the model offers that way at all.

Reads what ``plan`` already has (its per-dataset lines, the model's endpoints, the expected sync cost and
time) and the model's ``:batch`` variant endpoints (``backends.openrouter_batch.batch_endpoints_at``,
read at plan time, never assumed); writes nothing.

How each figure is formed:

- sync: ``plan``'s own cost (observed $/sample, else the routed prices) and time (the configured
  concurrency).
- flex: the flex endpoints (``service_tier: flex`` routes only to them, cheapest first;
  ``backends.pricing.tier_pool``); none → requests route at standard prices. Time: at least sync's (flex
  trades latency and availability for price; by how much is not published).
- batch: the batch variant's endpoints the routing allows (``batch_provider``: a setting a batch would
  ignore makes batch unavailable, with the key named); a batch runs on the cheapest of them. Time:
  ``endpoint.batch.expected_hours`` per round of ``max_open`` batches of ``max_requests``; a batch may
  take up to its 24 h window.

Costs other than sync's are sync's cost × the ratio of the mode's prices to the sync prices over the same
tokens, so an observed basis carries over.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import msgspec

from draftgen.backends import EndpointInfo, capabilities
from draftgen.backends.openrouter_batch import batch_endpoints_at, batch_provider
from draftgen.backends.pricing import PriceEstimate, eligible_endpoints, endpoint_tier
from draftgen.config import RunConfig
from draftgen.errors import APIError, AuthError, ConfigError
from draftgen.fmt import fmt_duration, fmt_usd

__all__ = ["ModeLine", "mode_lines", "mode_table", "read_batch_endpoints"]


class ModeLine(msgspec.Struct, kw_only=True):
    mode: str  # sync | flex | batch
    available: bool | None = None  # None: not known (no endpoint list)
    cost_usd: float | None = None
    vs_sync: float | None = None
    time_s: float | None = None
    time_text: str = ""
    note: str = ""


def read_batch_endpoints(cfg: RunConfig, base_urls: list[str] | None) -> tuple[list[EndpointInfo] | None, str | None]:
    """The model's ``:batch`` variant endpoints (empty: it has none), or None and why they are not known
    (an endpoint kind without the Batch API: None and no reason)."""
    if not capabilities(cfg.endpoint.kind).batch_api:
        return None, None
    try:
        return asyncio.run(batch_endpoints_at(cfg, base_urls)), None
    except AuthError:
        raise
    except APIError as exc:
        return None, str(exc)


def _tokens(lines: list[msgspec.Struct]) -> tuple[float, float, int]:
    prompt = output = 0.0
    remaining = 0
    for ln in lines:
        avg_out = getattr(ln, "avg_output_tokens", 0.0)
        expected = getattr(ln, "expected_output_tokens", 0)
        samples = expected / avg_out if avg_out else float(getattr(ln, "remaining", 0))
        prompt += samples * getattr(ln, "avg_prompt_tokens", 0.0)
        output += expected
        remaining += round(samples)
    return prompt, output, remaining


def _cheapest(eps: list[EndpointInfo], prompt: float, output: float) -> tuple[EndpointInfo, float]:
    best = min(eps, key=lambda e: prompt * e.pricing.prompt + output * e.pricing.completion)
    return best, prompt * best.pricing.prompt + output * best.pricing.completion + best.pricing.request


def mode_lines(cfg: RunConfig, *, lines: list[msgspec.Struct], sync_cost: float | None, sync_time_s: float,
               sync_prices: PriceEstimate | None, endpoints: list[EndpointInfo] | None,
               batch_endpoints: list[EndpointInfo] | None, batch_error: str | None = None) -> list[ModeLine]:
    """The three modes for what remains (module docstring)."""
    prompt, output, remaining = _tokens(lines)
    at_sync = (prompt * sync_prices.prompt + output * sync_prices.completion
               + remaining * sync_prices.request) if sync_prices is not None else None

    def scaled(mode_cost: float) -> tuple[float | None, float | None]:
        if not at_sync or sync_cost is None:
            return None, None
        ratio = mode_cost / at_sync
        return sync_cost * ratio, ratio

    out = [ModeLine(mode="sync", available=True, cost_usd=sync_cost, vs_sync=1.0 if sync_cost is not None else None,
                    time_s=sync_time_s, time_text=fmt_duration(sync_time_s),
                    note=f"endpoint.mode: sync{' (this config)' if cfg.endpoint.mode == 'sync' else ''}")]
    flex = ModeLine(mode="flex", time_s=sync_time_s, time_text=f"≥ {fmt_duration(sync_time_s)}")
    if endpoints is None:
        flex.note = "the model's endpoints are not known"
    else:
        tiered = eligible_endpoints([e for e in endpoints if endpoint_tier(e) == "flex"], cfg.routing)
        flex.available = bool(tiered)
        if tiered:
            best, cost = _cheapest(tiered, prompt, output)
            flex.cost_usd, flex.vs_sync = scaled(cost)
            flex.note = f"service_tier: flex, on {best.tag or best.provider_name}; slower, may be refused when busy"
        else:
            flex.cost_usd, flex.vs_sync = sync_cost, 1.0 if sync_cost is not None else None
            flex.note = "no flex endpoint: service_tier flex would be served at standard prices"
    out.append(flex)
    out.append(_batch_line(cfg, prompt, output, remaining, batch_endpoints, batch_error, scaled))
    return out


def _batch_line(cfg: RunConfig, prompt: float, output: float, remaining: int, eps: list[EndpointInfo] | None,
                error: str | None, scaled: Callable[[float], tuple[float | None, float | None]]) -> ModeLine:
    b = cfg.endpoint.batch
    line = ModeLine(mode="batch")
    if eps is None:
        line.note = f"the batch variant could not be read ({error})" if error else "no Batch API for this endpoint kind"
        return line
    line.available = bool(eps)
    if not eps:
        line.note = f"{cfg.model.id} has no :batch variant at OpenRouter"
        return line
    try:
        _, allowed = batch_provider(cfg, eps)
    except ConfigError as exc:
        line.available = False
        line.note = f"refused with this config: {exc}"
        return line
    best, cost = _cheapest(allowed, prompt, output)
    line.cost_usd, line.vs_sync = scaled(cost)
    rounds = max(1, math.ceil(remaining / max(1, b.max_requests * b.max_open)))
    line.time_s = rounds * b.expected_hours * 3600.0
    line.time_text = f"≈ {fmt_duration(line.time_s)}, ≤ {rounds * 24} h"
    batches = max(1, math.ceil(remaining / b.max_requests))
    line.note = (f"endpoint.mode: batch, {batches:,} batches of ≤ {b.max_requests:,} on "
                 f"{best.tag or best.provider_name}; each done within 24 h (endpoint.batch.expected_hours "
                 f"{b.expected_hours:g} h a round)")
    return line


def mode_table(modes: list[ModeLine]) -> list[str]:
    """The comparison as aligned text lines (a header, one line a mode)."""
    head = ("mode", "available", "cost", "vs sync", "expected time", "how")
    rows = [head] + [(m.mode, "?" if m.available is None else "yes" if m.available else "no", fmt_usd(m.cost_usd),
                      "–" if m.vs_sync is None else f"{m.vs_sync:.2f}", m.time_text or "–", m.note) for m in modes]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in rows]
