"""Which provider endpoints a run's routing allows, and what a token costs there.

Input: the model's endpoints (``GET /models/{author}/{slug}/endpoints`` → ``backends.EndpointInfo``,
prices in USD per token) and the config's ``routing`` (OpenRouter's ``provider`` object). Output: the
eligible endpoints and the expected price per prompt and completion token.

Matching follows OpenRouter: a routing slug matches an endpoint by its tag (``deepinfra/fp4``), by the
tag's provider part (``deepinfra`` matches every ``deepinfra/…`` variant) or by the provider's display
name, case-insensitively. ``ignore`` removes, ``only`` keeps, ``quantizations`` keeps listed
quantizations, ``max_price`` (USD per million) removes dearer endpoints.

Expected price: with ``order``, the first eligible endpoint in that order; with ``sort: price``, the
cheapest; with ``sort`` throughput/latency (unknown here), the dearest (an upper bound); otherwise
OpenRouter's default load balancing, which picks endpoints with weight 1/price².

Service tiers (``guides/features/service-tiers.mdx``): a tier endpoint is listed with a tier-suffixed tag
(``openai/flex``, ``google-vertex/priority``) and its tier price. It is eligible only when asked for
(``tier_pool``): ``service_tier: flex`` routes to flex endpoints only (to the default ones when there is
none), ``priority``/``fast`` adds the priority ones, and a tier tag named in ``only``/``order`` opts that
endpoint in; otherwise only default-tier endpoints serve.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from draftgen.backends.base import EndpointInfo
from draftgen.config import RoutingConfig, RunConfig

__all__ = [
    "TIERS",
    "PriceEstimate",
    "Prices",
    "eligible_endpoints",
    "endpoint_matches",
    "endpoint_tier",
    "estimate_price",
    "matching_endpoints",
    "routable_endpoints",
    "routed_prices",
    "tier_pool",
]

#: the non-default service tiers whose endpoints carry the tier as the last part of their tag
TIERS = ("flex", "priority")


def endpoint_matches(pattern: str, ep: EndpointInfo) -> bool:
    pat = pattern.lower()
    tag = (ep.tag or "").lower()
    base = tag.split("/", 1)[0]
    return pat in (tag, base, ep.provider_name.lower()) or (bool(tag) and tag.startswith(pat + "/"))


def _any(patterns: list[str] | None, ep: EndpointInfo) -> bool:
    return any(endpoint_matches(p, ep) for p in patterns or [])


def eligible_endpoints(endpoints: list[EndpointInfo], routing: RoutingConfig) -> list[EndpointInfo]:
    """The endpoints OpenRouter may route this config's requests to."""
    out = [ep for ep in endpoints if not _any(routing.ignore, ep)]
    if routing.only is not None:
        out = [ep for ep in out if _any(routing.only, ep)]
    if routing.quantizations is not None:
        allowed = {q.lower() for q in routing.quantizations}
        out = [ep for ep in out if (ep.quantization or "unknown").lower() in allowed]
    if routing.max_price:
        mp = {k: float(v) for k, v in routing.max_price.items()}  # numeric strings too (validated by config)
        out = [ep for ep in out
               if ep.pricing.prompt * 1e6 <= mp.get("prompt", float("inf"))
               and ep.pricing.completion * 1e6 <= mp.get("completion", float("inf"))]
    return out


def matching_endpoints(provider: str, endpoints: list[EndpointInfo]) -> list[EndpointInfo]:
    """Endpoints a response's ``provider`` name can refer to (several when a provider has variants)."""
    return [ep for ep in endpoints if endpoint_matches(provider, ep)]


class PriceEstimate(msgspec.Struct, kw_only=True):
    """USD per token expected for prompt and completion tokens, with the range over eligible endpoints."""

    prompt: float
    completion: float
    request: float = 0.0
    basis: str
    """How the expectation was formed: order | price | upper-bound | load-balance | observed."""
    providers: dict[str, float] = msgspec.field(default_factory=dict)
    """Tag (or provider name) → share of requests expected there."""
    min_completion: float = 0.0
    max_completion: float = 0.0


def _label(ep: EndpointInfo) -> str:
    return ep.tag or ep.provider_name


def _total(ep: EndpointInfo) -> float:
    return ep.pricing.prompt + ep.pricing.completion


def estimate_price(eligible: list[EndpointInfo], routing: RoutingConfig) -> PriceEstimate | None:
    """Expected per-token prices under ``routing``; None when no endpoint is eligible."""
    if not eligible:
        return None
    lo = min(ep.pricing.completion for ep in eligible)
    hi = max(ep.pricing.completion for ep in eligible)

    def single(ep: EndpointInfo, basis: str) -> PriceEstimate:
        return PriceEstimate(prompt=ep.pricing.prompt, completion=ep.pricing.completion, request=ep.pricing.request,
                             basis=basis, providers={_label(ep): 1.0}, min_completion=lo, max_completion=hi)

    if routing.order:
        for pat in routing.order:
            for ep in eligible:
                if endpoint_matches(pat, ep):
                    return single(ep, "order")
    sort = routing.sort
    if sort == "price":
        return single(min(eligible, key=_total), "price")
    if sort in ("throughput", "latency"):
        return single(max(eligible, key=_total), "upper-bound")
    weights = [1.0 / max(_total(ep), 1e-12) ** 2 for ep in eligible]
    total = sum(weights)
    shares = [w / total for w in weights]
    return PriceEstimate(
        prompt=sum(s * ep.pricing.prompt for s, ep in zip(shares, eligible, strict=True)),
        completion=sum(s * ep.pricing.completion for s, ep in zip(shares, eligible, strict=True)),
        request=sum(s * ep.pricing.request for s, ep in zip(shares, eligible, strict=True)),
        basis="load-balance",
        providers={_label(ep): s for s, ep in zip(shares, eligible, strict=True)},
        min_completion=lo,
        max_completion=hi,
    )


@dataclass(frozen=True)
class Prices:
    """USD per token (and per request)."""

    prompt: float = 0.0
    completion: float = 0.0
    request: float = 0.0

    def worst_case(self, prompt_tokens: int, max_tokens: int) -> float:
        return max_tokens * self.completion + prompt_tokens * self.prompt + self.request

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """What a response with these token counts costs at these prices."""
        return completion_tokens * self.completion + prompt_tokens * self.prompt + self.request


def endpoint_tier(ep: EndpointInfo) -> str:
    """``flex`` or ``priority`` for a tier endpoint (its tag ends so), else ``default``."""
    last = (ep.tag or "").rsplit("/", 1)[-1].lower()
    return last if last in TIERS and "/" in (ep.tag or "") else "default"


def tier_pool(endpoints: list[EndpointInfo], service_tier: str | None, named: list[str] | None = None) -> list[EndpointInfo]:
    """The endpoints a request with ``service_tier`` may be served by (module docstring); ``named``: the
    routing's ``only`` and ``order`` slugs (a tier tag there opts its endpoint in)."""
    wanted = {(n or "").lower() for n in named or []}
    default = [e for e in endpoints if endpoint_tier(e) == "default" or (e.tag or "").lower() in wanted]
    if service_tier == "flex":
        flex = [e for e in endpoints if endpoint_tier(e) == "flex"]
        return flex or default
    if service_tier in ("priority", "fast"):
        return default + [e for e in endpoints if endpoint_tier(e) == "priority" and e not in default]
    return default


def routable_endpoints(cfg: RunConfig, endpoints: list[EndpointInfo]) -> list[EndpointInfo]:
    """The endpoints routing may choose: the service tier's pool (``tier_pool``) filtered by
    ``pricing.eligible_endpoints``, and only the ``order`` ones when fallbacks are off."""
    r = cfg.routing
    pool = tier_pool(list(endpoints), cfg.endpoint.service_tier, [*(r.only or []), *(r.order or [])])
    eps = eligible_endpoints(pool, r)
    if r.order and r.allow_fallbacks is False:
        eps = [e for e in eps if any(endpoint_matches(o, e) for o in r.order)]
    return eps


def routed_prices(cfg: RunConfig, endpoints: list[EndpointInfo]) -> tuple[Prices, list[str]]:
    """The worst-case prices over the endpoints routing may choose (``routable_endpoints``); all endpoints
    when the filters leave none."""
    chosen = routable_endpoints(cfg, endpoints) or list(endpoints)
    if not chosen:
        return Prices(), []
    prices = Prices(
        prompt=max(e.pricing.prompt for e in chosen),
        completion=max(max(e.pricing.completion, e.pricing.internal_reasoning) for e in chosen),
        request=max(e.pricing.request for e in chosen),
    )
    return prices, [e.tag or e.provider_name for e in chosen]
