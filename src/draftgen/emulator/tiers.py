"""Service tiers on the emulated ``/chat/completions``: which providers a request's ``service_tier`` may be
served by, and the tier its response echoes.

As OpenRouter documents them (``guides/features/service-tiers.mdx``): ``service_tier`` is ``flex``,
``priority`` (``fast`` is an alias), or ``default``; a tier endpoint (``Provider.tier``) is considered only
when a request asks for it: ``flex`` routes to flex endpoints only, or to the default ones when the model
has none; ``priority`` tries the priority endpoints first, then the default ones; a tier tag in
``provider.only``/``order`` opts that endpoint in. The response echoes the tier that served it at the top
level (``default`` when a request asked for a tier and a default endpoint served it; nothing when the
request asked for none and a default endpoint served it), and it is billed at that endpoint's prices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from draftgen.emulator.envelopes import ApiError
from draftgen.emulator.routing import ProviderPrefs
from draftgen.emulator.scenarios import Provider

__all__ = ["TIER_VALUES", "parse_tier", "tier_pool", "with_echo"]

TIER_VALUES = ("default", "flex", "priority", "fast", "auto")


def parse_tier(body: dict[str, Any]) -> str | ApiError | None:
    """The request's ``service_tier`` (``fast`` read as ``priority``, ``auto`` as none), or a 400."""
    tier = body.get("service_tier")
    if tier is None or tier == "auto":
        return None
    if tier not in TIER_VALUES:
        return ApiError(400, f"service_tier must be one of {', '.join(TIER_VALUES)}; got {tier!r}", "invalid_request")
    return "priority" if tier == "fast" else str(tier)


def tier_pool(providers: Sequence[Provider], tier: str | None, prefs: ProviderPrefs) -> list[Provider]:
    """The providers a request with ``tier`` may be routed to, before its ``provider`` preferences."""
    named = [*(prefs.only or []), *(prefs.order or [])]
    if all(p.tier == "default" for p in providers):
        return list(providers)
    default = [p for p in providers if p.tier == "default" or any(p.tag.lower() == n for n in named)]
    if tier == "flex":
        flex = [p for p in providers if p.tier == "flex"]
        return flex or default
    if tier == "priority":
        return [p for p in providers if p.tier == "priority" and p not in default] + default
    return default


def with_echo(cands: list[Provider], tier: str | None) -> list[Provider]:
    """``cands`` as the response will name them: each with the ``service_tier`` it echoes, when any."""
    if tier is None and all(p.tier == "default" for p in cands):
        return cands
    return [dataclasses.replace(p, echo_tier=p.tier) for p in cands]
