"""Provider routing: the request's ``provider`` object → the providers to try, in order.

Honoured fields: ``order``, ``only``, ``ignore``, ``sort`` (price | throughput | latency, or
``{by: …}``), ``allow_fallbacks`` (default true), ``quantizations``, ``require_parameters``,
``max_price`` {prompt, completion} in USD per million tokens (numbers, or numeric strings as OpenRouter's
OpenAPI spec types them: ``{"completion": "2.5"}``). A slug matches a provider by tag
(``deepinfra/fp4``), by base slug (``deepinfra`` matches every ``deepinfra/…`` variant) or by display
name, case-insensitively. Model suffixes ``:nitro`` / ``:floor`` mean sort by throughput / price.

Invariants: an ignored provider, or one outside ``only``, is never returned. With neither ``order``
nor ``sort``, the first provider is drawn weighted by 1/price² (deterministically, from the request
hash) and the rest follow by price, as OpenRouter's default load balancing. With ``allow_fallbacks``
false only the providers in ``order`` (else the primary one) are tried. No provider left → an ``ApiError``: 404 ``no_endpoints`` when
``require_parameters`` removed the last ones, else 503 ``constraint_filtered``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from draftgen.emulator.envelopes import ApiError, availability
from draftgen.emulator.scenarios import ALL_PARAMETERS, Provider

__all__ = ["ProviderPrefs", "parse_prefs", "route", "used_parameters"]


@dataclass
class ProviderPrefs:
    order: list[str] | None = None
    only: list[str] | None = None
    ignore: list[str] | None = None
    sort: str | None = None
    allow_fallbacks: bool = True
    quantizations: list[str] | None = None
    require_parameters: bool = False
    max_price: dict[str, float] | None = None


def _bad(msg: str) -> ApiError:
    return ApiError(400, msg, "invalid_request")


def _str_list(obj: dict[str, Any], key: str) -> list[str] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _Invalid(_bad(f"provider.{key} must be a list of strings"))
    return [x.lower() for x in v]


class _Invalid(Exception):
    def __init__(self, err: ApiError) -> None:
        super().__init__(err.message)
        self.err = err


def parse_prefs(obj: Any, model_suffix: str = "") -> ProviderPrefs | ApiError:
    """Validate the request's ``provider`` object (None → defaults)."""
    prefs = ProviderPrefs()
    if model_suffix == "nitro":
        prefs.sort = "throughput"
    elif model_suffix == "floor":
        prefs.sort = "price"
    if obj is None:
        return prefs
    if not isinstance(obj, dict):
        return _bad("provider must be an object")
    try:
        prefs.order = _str_list(obj, "order")
        prefs.only = _str_list(obj, "only")
        prefs.ignore = _str_list(obj, "ignore")
        prefs.quantizations = _str_list(obj, "quantizations")
    except _Invalid as exc:
        return exc.err
    sort = obj.get("sort")
    if isinstance(sort, dict):
        sort = sort.get("by")
    if sort is not None:
        if sort not in ("price", "throughput", "latency", "exacto"):
            return _bad(f"provider.sort must be price, throughput or latency, got {sort!r}")
        prefs.sort = "price" if sort == "exacto" else sort
    af = obj.get("allow_fallbacks")
    if af is not None:
        if not isinstance(af, bool):
            return _bad("provider.allow_fallbacks must be a boolean")
        prefs.allow_fallbacks = af
    rp = obj.get("require_parameters")
    if rp is not None:
        if not isinstance(rp, bool):
            return _bad("provider.require_parameters must be a boolean")
        prefs.require_parameters = rp
    mp = obj.get("max_price")
    if mp is not None:
        if not isinstance(mp, dict):
            return _bad("provider.max_price must be an object of prices (USD per million tokens)")
        prices: dict[str, float] = {}
        for k, v in mp.items():
            price = _price_value(v)
            if price is None:
                return _bad(f"provider.max_price.{k} must be a non-negative number or numeric string "
                            f"(USD per million tokens), got {v!r}")
            prices[str(k)] = price
        prefs.max_price = prices
    return prefs


def _price_value(v: Any) -> float | None:
    """A max_price value as a float: a number or a numeric string (``"2.5"``, ``"1e3"``), finite and >= 0."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return None
    try:
        price = float(v.strip() if isinstance(v, str) else v)
    except (ValueError, OverflowError):
        return None
    return price if math.isfinite(price) and price >= 0 else None


def used_parameters(body: dict[str, Any]) -> set[str]:
    """The request parameters ``require_parameters`` checks (present and not null)."""
    used = {p for p in ALL_PARAMETERS if body.get(p) is not None}
    if body.get("max_completion_tokens") is not None:
        used.add("max_tokens")
    if body.get("logprobs") is False:
        used.discard("logprobs")
    return used


def matches(pattern: str, p: Provider) -> bool:
    tag = p.tag.lower()
    return pattern in (tag, p.slug.lower(), p.name.lower()) or tag.startswith(pattern + "/")


def _any(patterns: Iterable[str], p: Provider) -> bool:
    return any(matches(x, p) for x in patterns)


def _mean(r: tuple[float, float]) -> float:
    return (r[0] + r[1]) / 2


def _price(p: Provider) -> float:
    return p.price_prompt + p.price_completion


def route(providers: Sequence[Provider], prefs: ProviderPrefs, used: set[str], u: float,
          model: str) -> list[Provider] | ApiError:
    """Providers to try in order, or the error OpenRouter returns when none is left."""
    cands = list(providers)
    if prefs.ignore:
        cands = [p for p in cands if not _any(prefs.ignore, p)]
    if prefs.only is not None:
        cands = [p for p in cands if _any(prefs.only, p)]
    if prefs.quantizations is not None:
        cands = [p for p in cands if p.quantization.lower() in prefs.quantizations]
    if prefs.max_price:
        mp = prefs.max_price
        cands = [p for p in cands if p.price_prompt <= mp.get("prompt", float("inf"))
                 and p.price_completion <= mp.get("completion", float("inf"))]
    if not cands:
        return ApiError(503, f"No allowed providers are available for the selected model ({model}).",
                        "provider_unavailable",
                        availability=availability("constraint_filtered", False, requested_models=[model],
                                                  constraint="provider"))
    if prefs.require_parameters:
        cands = [p for p in cands if used <= set(p.supported_parameters)]
        if not cands:
            return ApiError(404, "No endpoints found that can handle the requested parameters.", "not_found",
                            availability=availability("no_endpoints", False, requested_models=[model],
                                                      constraint="require_parameters"))

    ordered: list[Provider] = []
    if prefs.order:
        for pat in prefs.order:
            for p in cands:
                if matches(pat, p) and p not in ordered:
                    ordered.append(p)
        rest = [p for p in cands if p not in ordered]
        if not ordered and not prefs.allow_fallbacks:
            return ApiError(503, f"No allowed providers are available for the selected model ({model}).",
                            "provider_unavailable",
                            availability=availability("constraint_filtered", False, requested_models=[model],
                                                      constraint="order"))
    else:
        rest = cands
    if prefs.sort == "price":
        rest = sorted(rest, key=_price)
    elif prefs.sort == "throughput":
        rest = sorted(rest, key=lambda p: -_mean(p.tokens_per_s))
    elif prefs.sort == "latency":
        rest = sorted(rest, key=lambda p: _mean(p.ttft_s))
    elif not prefs.order:
        rest = _load_balance(rest, u)
    if prefs.allow_fallbacks:
        return ordered + rest
    # Without fallbacks only the custom order (or else the primary provider) is tried.
    return ordered if ordered else rest[:1]


def _load_balance(cands: list[Provider], u: float) -> list[Provider]:
    by_price = sorted(cands, key=_price)
    weights = [1.0 / max(_price(p), 1e-9) ** 2 for p in by_price]
    r = u * sum(weights)
    first = by_price[-1]
    for p, w in zip(by_price, weights, strict=True):
        r -= w
        if r < 0:
            first = p
            break
    return [first] + [p for p in by_price if p is not first]
