"""Budget governor: per-dataset completion-token budgets and the run's dollar budget, with reservations.

Tokens (per dataset): ``done`` (completion tokens already in the raw log, from resume plus this run) plus
``reserved`` (``max_tokens`` of every admitted request not yet finished). A request is admitted only if
``done + reserved + max_tokens <= budget``; a dataset whose remainder can never admit one is finished.

Dollars (whole run directory): ``prior`` (spend in the raw logs before this run) + ``session`` (spend of
this run: ``usage.cost``, plus ``upstream_cost`` only when ``is_byok``) + ``reserved`` (the worst case of
every admitted request, ``max_tokens · completion price + prompt_tokens · prompt price + request price``).
A request is admitted only if that sum plus its own worst case fits under ``max_spend`` and under the
account caps read at start (key ``limit_remaining``, credits remaining), so spend can never pass the budget
by more than the prices were wrong. Releasing a reservation wakes producers waiting for room.

A response without ``usage.cost`` (plain servers, some providers) is priced here when the routed prices
are known (``priced``): ``prompt_tokens · prompt + completion_tokens · completion + request``, stored in
the record's usage with ``cost_computed`` so a resume scan adds it up like a reported cost.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

import msgspec

from ..records import Usage, spend_usd

__all__ = ["Admission", "BudgetGovernor", "Prices", "TokenBudget", "usage_cost"]


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


def usage_cost(u: Usage | None) -> float:
    """What a response cost the account: ``cost``, plus the upstream cost only on BYOK responses."""
    return 0.0 if u is None else spend_usd(u.cost, u.is_byok, u.upstream_cost)


class Admission(Enum):
    OK = "ok"
    WAIT = "wait"  # may fit once in-flight requests finish
    NEVER = "never"  # cannot fit even with nothing in flight


@dataclass
class TokenBudget:
    budget: int | None
    done: int = 0
    reserved: int = 0

    def check(self, max_tokens: int) -> Admission:
        if self.budget is None or self.done + self.reserved + max_tokens <= self.budget:
            return Admission.OK
        return Admission.WAIT if self.reserved > 0 and self.done + max_tokens <= self.budget else Admission.NEVER


@dataclass
class BudgetGovernor:
    prices: Prices = field(default_factory=Prices)
    #: ``prices`` were read from the provider (else a missing ``usage.cost`` cannot be computed)
    priced: bool = False
    max_spend: float | None = None
    prior: float = 0.0
    #: caps on this session's spend from the account (key limit remaining, credits remaining)
    session_cap: float | None = None
    session: float = 0.0
    reserved: float = 0.0
    tokens: dict[str, TokenBudget] = field(default_factory=dict)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    # -- dollars ---------------------------------------------------------------------------------------

    @property
    def spent(self) -> float:
        return self.prior + self.session

    @property
    def remaining(self) -> float | None:
        """Dollars not yet spent or reserved, under the tightest cap (None when uncapped)."""
        caps = []
        if self.max_spend is not None:
            caps.append(self.max_spend - self.spent - self.reserved)
        if self.session_cap is not None:
            caps.append(self.session_cap - self.session - self.reserved)
        return min(caps) if caps else None

    def check_dollars(self, worst_case: float) -> Admission:
        rem = self.remaining
        if rem is None or worst_case <= rem + 1e-12:
            return Admission.OK
        return Admission.WAIT if self.reserved > 0 and worst_case <= rem + self.reserved else Admission.NEVER

    # -- both ------------------------------------------------------------------------------------------

    def token_budget(self, dataset: str) -> TokenBudget:
        tb = self.tokens.get(dataset)
        if tb is None:
            tb = self.tokens[dataset] = TokenBudget(None)
        return tb

    def reserve(self, dataset: str, max_tokens: int, worst_case: float) -> None:
        self.token_budget(dataset).reserved += max_tokens
        self.reserved += worst_case

    def settle(self, dataset: str, max_tokens: int, worst_case: float, usage: Usage | None,
               completion_tokens: int | None = None, charged: float = 0.0) -> float:
        """Release a reservation and book what the request really used. Returns its cost. ``charged``: what
        ``charge`` already booked for this very response (one first rejected, then kept), not booked twice."""
        tb = self.token_budget(dataset)
        tb.reserved -= max_tokens
        if completion_tokens is None:
            completion_tokens = usage.completion_tokens if usage is not None else 0
        tb.done += completion_tokens
        self.reserved = max(0.0, self.reserved - worst_case)
        cost = usage_cost(usage)
        self.session += cost - charged
        self._notify()
        return cost

    def priced_usage(self, usage: Usage | None, *, prompt_tokens: int, completion_tokens: int) -> Usage | None:
        """``usage`` with its missing cost computed from the prices (``cost_computed``); unchanged when the
        prices are unknown. Without any usage, the cost is computed from the id counts given and stored
        alone (the token counts stay 0: nothing was billed to compare them with)."""
        if not self.priced:
            return usage
        if usage is None:
            return Usage(cost=self.prices.cost(prompt_tokens, completion_tokens), cost_computed=True)
        cost = self.prices.cost(usage.prompt_tokens or prompt_tokens, usage.completion_tokens or completion_tokens)
        return msgspec.structs.replace(usage, cost=cost, cost_computed=True)

    def charge(self, cost: float) -> None:
        """Book spend that produced no record (a billed response rejected as invalid)."""
        if cost > 0:
            self.session += cost
            self._notify()

    def release(self, dataset: str, max_tokens: int, worst_case: float, cost: float = 0.0) -> None:
        """Release a reservation of a request that produced no record (failed or cancelled)."""
        self.token_budget(dataset).reserved -= max_tokens
        self.reserved = max(0.0, self.reserved - worst_case)
        self.session += cost
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def changed(self) -> None:
        """Wait until some reservation is released."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await fut
