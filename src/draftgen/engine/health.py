"""Provider health during a run: who served a response, whether the routing allowed it, and which
providers the run sends to the cool-down.

``RoutingGuard`` knows the model's endpoints (``GET /models/{author}/{slug}/endpoints``) and the
configured routing. From a response's ``provider`` (a display name such as ``DeepInfra``) it gives:

- ``slug``: the routing slug to put in ``provider.ignore`` (the provider part of the endpoint tag,
  ``deepinfra``, which covers every variant since the name does not say which one served; the name
  itself when the endpoint list does not know it);
- ``quantization``: the quantization of the endpoint(s) the name matches, when they agree;
- ``excluded``: why the routing excluded that provider (``routing.ignore``/``only``/``quantizations``,
  or the request's own ``provider.ignore``), None when it was allowed;
- ``leaves_none``: whether ignoring some slugs would leave no endpoint the routing allows (every one
  in ``allowed``; the providers seen so far when the endpoint list is unknown).

``ProviderHealth`` keeps each provider's last ``quality.provider_window`` outcomes (good, or the kind
of a bad one: an error attributed to it, dropped reasoning, an excluded response, billing far off).
Once it has ``provider_min_outcomes`` of them and the bad share reaches ``provider_max_failure_rate``,
the provider goes on the run's ignore list for ``provider_cooldown_s`` (a ``cooldown`` HealthEvent), and
comes back after it (``restored``, on ``tick``). Its window is cleared both times, and outcomes of
requests sent before a cool-down that come back during it are not counted, so it is judged afresh.
The run never ignores every provider the routing allows: if a cool-down would, the least bad of those
providers (lowest bad share) stays, and a note says so.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from draftgen.backends.base import EndpointInfo
from draftgen.backends.pricing import endpoint_matches
from draftgen.records import HealthEvent

__all__ = ["HealthPolicy", "ProviderHealth", "RoutingGuard"]


def _matches(patterns: Iterable[str], ep: EndpointInfo) -> bool:
    return any(endpoint_matches(p, ep) for p in patterns)


class RoutingGuard:
    """The routing a run was configured with, applied to the providers responses come back from."""

    def __init__(
        self,
        endpoints: Sequence[EndpointInfo] | None,
        *,
        allowed: Sequence[EndpointInfo] | None = None,
        ignore: Sequence[str] | None = None,
        only: Sequence[str] | None = None,
        quantizations: Sequence[str] | None = None,
    ) -> None:
        self.endpoints = list(endpoints or [])
        self.allowed = list(allowed) if allowed is not None else list(self.endpoints)
        self.ignore = [x.lower() for x in ignore or []]
        self.only = [x.lower() for x in only] if only is not None else None
        self.quantizations = {q.lower() for q in quantizations} if quantizations is not None else None
        self.seen: dict[str, None] = {}  # provider names seen, in order (the fallback when endpoints are unknown)
        self._cache: dict[str, tuple[list[EndpointInfo], str, str | None]] = {}

    def _lookup(self, provider: str) -> tuple[list[EndpointInfo], str, str | None]:
        hit = self._cache.get(provider)
        if hit is None:
            matched = [ep for ep in self.endpoints if endpoint_matches(provider, ep)]
            bases = {(ep.tag or ep.provider_name).split("/", 1)[0].lower() for ep in matched}
            slug = bases.pop() if len(bases) == 1 else provider.lower()
            pool = [ep for ep in matched if self._why(ep, ()) is None] or matched
            quants = {ep.quantization for ep in pool if ep.quantization}
            hit = (matched, slug, quants.pop() if len(quants) == 1 else None)
            self._cache[provider] = hit
        return hit

    def note(self, provider: str | None) -> None:
        if provider:
            self.seen.setdefault(provider, None)

    def slug(self, provider: str) -> str:
        return self._lookup(provider)[1]

    def quantization(self, provider: str | None) -> str | None:
        return self._lookup(provider)[2] if provider else None

    def _why(self, ep: EndpointInfo, extra: Sequence[str], *, quantization_known: bool = True) -> str | None:
        if _matches(self.ignore, ep):
            return "in routing.ignore"
        if extra and _matches((x.lower() for x in extra), ep):
            return "in this request's provider.ignore"
        if self.only is not None and not _matches(self.only, ep):
            return "not in routing.only"
        if (quantization_known and self.quantizations is not None
                and (ep.quantization or "unknown").lower() not in self.quantizations):
            return f"quantization {ep.quantization or 'unknown'} not in routing.quantizations"
        return None

    def excluded(self, provider: str | None, extra_ignore: Sequence[str] | None = None) -> str | None:
        """Why the routing (configured, plus ``extra_ignore`` sent with the request) excluded ``provider``;
        None when it was allowed or cannot be told. A name with several endpoints is excluded only when
        every one of them is."""
        if not provider:
            return None
        matched = self._lookup(provider)[0]
        extra = list(extra_ignore or ())
        if not matched:
            # Not in the endpoint list: judged by its name alone (its quantization is unknown).
            return self._why(EndpointInfo(provider_name=provider), extra, quantization_known=False)
        reasons = [self._why(ep, extra) for ep in matched]
        if all(r is not None for r in reasons):
            return reasons[0]
        return None

    def leaves_none(self, slugs: Iterable[str]) -> bool:
        """Whether ignoring ``slugs`` leaves no provider the routing allows."""
        pats = [s.lower() for s in slugs]
        if not pats:
            return False
        pool = self.allowed or [EndpointInfo(provider_name=name) for name in self.seen]
        return all(_matches(pats, ep) for ep in pool)


@dataclass(frozen=True)
class HealthPolicy:
    """``quality.*`` as the engine uses it."""

    window: int = 20
    min_outcomes: int = 5
    max_failure_rate: float = 0.5
    cooldown_s: float = 300.0
    billing_tolerance: float = 0.05

    def billing_off(self, rebuilt: int, billed: int) -> bool:
        """A rebuilt completion length far off the billed one (the audit's ``billing_off`` rule)."""
        return billed > 0 and abs(rebuilt - billed) > max(3.0, self.billing_tolerance * billed)


@dataclass
class _Cooling:
    slug: str
    until: float
    share: float


@dataclass
class ProviderHealth:
    """Outcome windows and cool-downs (see the module docstring). Runs on the event loop thread."""

    policy: HealthPolicy
    guard: RoutingGuard
    on_event: Callable[[HealthEvent, str], None] = lambda ev, line: None
    on_note: Callable[[str], None] = lambda line: None
    clock: Callable[[], float] = time.time
    windows: dict[str, deque[str | None]] = field(default_factory=dict)
    cooling: dict[str, _Cooling] = field(default_factory=dict)
    cooldowns: Counter[str] = field(default_factory=Counter)

    def ignore(self) -> list[str]:
        """The slugs every request sent now must carry in ``provider.ignore``."""
        return [c.slug for c in self.cooling.values()]

    def _window(self, provider: str) -> deque[str | None]:
        w = self.windows.get(provider)
        if w is None:
            w = self.windows[provider] = deque(maxlen=max(1, self.policy.window))
        return w

    def outcome(self, provider: str | None, bad: str | None) -> None:
        """One outcome of ``provider``: ``bad`` is the kind of a bad one, None for a good one."""
        if not provider:
            return
        self.guard.note(provider)
        if provider in self.cooling:
            return  # a request sent before its cool-down: it is judged afresh afterwards
        w = self._window(provider)
        w.append(bad)
        n = len(w)
        kinds = Counter(k for k in w if k is not None)
        n_bad = sum(kinds.values())
        if n < self.policy.min_outcomes or not n_bad or n_bad / n < self.policy.max_failure_rate:
            return
        reason = f"{n_bad} of {n} recent outcomes bad: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common())
        self._cool(provider, n_bad / n, reason)

    def _cool(self, provider: str, share: float, reason: str) -> None:
        now = self.clock()
        slug = self.guard.slug(provider)
        others = [c.slug for c in self.cooling.values()]
        if self.guard.leaves_none([*others, slug]):
            rivals = [(c.share, name) for name, c in self.cooling.items()]
            least_share, least = min([*rivals, (share, provider)])
            if least == provider:
                self._window(provider).clear()
                self.on_note(f"provider {provider}: {reason}; not cooled down: it is the least bad of the providers "
                             "the routing allows, and one must stay")
                return
            self._restore(least, now, f"restored early: {provider} is worse ({reason}) and the routing must keep "
                                      f"one provider; {least} is the least bad ({least_share:.0%} bad)")
        until = now + self.policy.cooldown_s
        self.cooling[provider] = _Cooling(slug, until, share)
        self.cooldowns[provider] += 1
        self._window(provider).clear()
        self.on_event(HealthEvent(at=round(now, 4), provider=provider, event="cooldown", reason=reason,
                                  until=round(until, 4)),
                      f"provider {provider} cooled down for {self.policy.cooldown_s:g}s (requests ignore {slug}): "
                      f"{reason}")

    def _restore(self, provider: str, now: float, reason: str) -> None:
        self.cooling.pop(provider, None)
        self._window(provider).clear()
        self.on_event(HealthEvent(at=round(now, 4), provider=provider, event="restored", reason=reason),
                      f"provider {provider} restored: {reason}")

    def tick(self) -> None:
        """Restore the providers whose cool-down is over."""
        if not self.cooling:
            return
        now = self.clock()
        for name, c in list(self.cooling.items()):
            if c.until <= now:
                self._restore(name, now, f"cool-down of {self.policy.cooldown_s:g}s over")
