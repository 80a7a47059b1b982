"""Budget governor: per-dataset completion-token budgets and the run's dollar budget, with reservations.

Every admitted request holds a ``Reservation`` until it is settled (its record is booked) or released
(no record): ``tokens`` against its dataset's token budget, ``usd`` against ``max_spend`` and
``worst_usd`` (its worst case, ``max_tokens · completion price + prompt_tokens · prompt price + request
price``) against the account caps.

Tokens (per dataset): ``done`` (completion tokens already in the raw log, from resume plus this run) plus
``reserved`` (the ``tokens`` of every admitted request not yet finished). A request reserving ``r`` tokens
is admitted only if ``done + reserved + r <= budget``; a dataset whose remainder can never admit one
(``done + r > budget``) is finished. What ``r`` is depends on ``budget.token_policy``:

- ``strict``: ``r = max_tokens``. Even if every request in flight runs to ``max_tokens``, ``done`` never
  passes the budget. With a 10M budget and ``max_tokens`` 10,240, at most 976 requests of a dataset are
  in flight, and fewer as tokens are done.
- ``expected`` (the default): ``r`` = the running p90 (``QUANTILE``) of the completion lengths observed
  for that dataset and partition in this run, and ``max_tokens`` until ``MIN_SAMPLES`` (20) responses
  are in (``LengthEstimate``). Admission stops once ``done + reserved`` reaches the budget, so the
  overshoot is at most what was in flight beyond its reservations: ``done - budget <= Σ in flight
  (max_tokens - r) <= concurrency × max_tokens``. With lengths of mean 2,600 and p90 ≈ 5,500, a 10M
  budget admits about 1,800 requests at once instead of 976. ``TokenBudget.overshoot`` is reported.

Dollars (whole run directory): ``prior`` (spend in the raw logs before this run) + ``session`` (spend of
this run: ``usage.cost``, plus ``upstream_cost`` only when ``is_byok``) + ``reserved`` (the ``usd`` of every
admitted request). A request is admitted only if that sum plus its own reservation fits under
``max_spend``. Under ``strict`` the reservation is the worst case, so spend never passes ``max_spend``
by more than the prices were wrong. Under ``expected``, while far from the cap, it is the cost of the
request at the same length estimate, taken at its mean (``prompt · prompt price + mean · completion
price + request price``; ``max_tokens`` while warming up): the dollar budget is one pool over every slot,
and the cost of N requests in flight concentrates at N × mean (its spread grows as √N), so the p90 per
request would hold about twice the money idle (on the reference job, $45 of $100 for one set of 2,500
slots). Near the cap it reserves the worst case: once the money left after reservations
(``max_spend - spent - reserved``) is below ``(1 - QUANTILE) × slots_worst``, the worst case of a tenth
of the configured slots (``slots_worst``: ``Σ partitions concurrency × max_tokens · completion price``,
set by the engine; $8.6 on the reference job), a margin far above the spread of the in-flight total.
Either way spend never passes ``max_spend`` by more than the worst case of the requests
in flight (``slots_worst`` at most, plus their prompts): ``spent <= max_spend + Σ in flight (worst_usd -
usd)``; ``plan`` states that bound. The account caps read at start (key ``limit_remaining``, credits
remaining: ``session_cap``) are always checked against the worst cases (``reserved_worst``), never over.
Releasing a reservation wakes producers waiting for room.

A response without ``usage.cost`` (plain servers, some providers) is priced here when the routed prices
are known (``priced``): ``prompt_tokens · prompt + completion_tokens · completion + request``, stored in
the record's usage with ``cost_computed`` so a resume scan adds it up like a reported cost.

Every billed response is booked: a record's cost when it is written; ``charge`` for one that produced
no record (rejected as invalid, or unusable), at ``billed_cost``: its reported cost, else its usage at
the routed prices (a batch result's: the batch prices), else its text length at those prices
(``TEXT_BYTES_PER_TOKEN``), at most its worst case; the worst case of a request abandoned on the wire (an
interrupt: ``hold_abandoned``, named apart as ``held`` for ``abandoned`` requests until a lookup of its
generation replaces it by its bill, ``settle_abandoned``; ``spent = billed + held``); and what a batch was billed beyond the costs of its results (``intake.unattributed``:
duplicates, results it was not submitted with, prices above the batch prices), charged when it ends. A cost is never
negative (``usage_cost``): a credit from a server is no credit. A sample retried after a billed attempt
reserves again (``rebook``) before its next attempt, so retries of billed rejections keep
``spent + reserved <= max_spend`` too: the overshoot stays within what is in flight.

Caps are named: ``session_cap_source`` says where the account cap came from (the API key's limit, the
account's credits), and ``stop_message`` names the cap a stopped run hit and its fix (``RAISE_BUDGET``:
``budget.max_spend_usd``, or ``--max-spend``; or the key's limit), never ``$None``.

Hedges (``engine.tail``) are requests like any other: each holds a reservation while it is on the wire, so
the bound above holds with them; the losing request of a hedged sample is charged as spent (``charge_loser``:
its reported cost, or for a cancelled stream the prompt and the tokens received at the routed prices), and
``hedge_room`` keeps that extra spend within ``tail.hedge_max_extra_spend`` of the session's spend.

Lengths read at resume are not fed to the estimate (the resume scan keeps totals, not lengths): a resumed
run warms up again over its first ``MIN_SAMPLES`` responses per dataset and partition.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import msgspec

from draftgen.backends.base import Billing
from draftgen.backends.pricing import Prices
from draftgen.records import Usage, spend_usd

__all__ = [
    "MIN_SAMPLES",
    "QUANTILE",
    "RAISE_BUDGET",
    "TEXT_BYTES_PER_TOKEN",
    "Abandoned",
    "Admission",
    "BudgetGovernor",
    "LengthEstimate",
    "Prices",
    "Reservation",
    "TokenBudget",
    "TokenPolicy",
    "usage_cost",
]

TokenPolicy = Literal["strict", "expected"]

#: responses of a dataset and partition observed before their quantile replaces ``max_tokens``
MIN_SAMPLES = 20
#: the quantile of the observed completion lengths each request reserves under ``expected``
QUANTILE = 0.9
#: the fix a stop at the dollar budget names: the config key, and the flag of the commands that spend
RAISE_BUDGET = ("raise budget.max_spend_usd in the config (or pass --max-spend USD to generate or run), "
                "then rerun to resume")
#: text bytes per completion token when a billed response's tokens are known only from its text: fewer
#: than any tokenizer's average (English ≈ 4, CJK ≈ 2-3), so the estimate leans high
TEXT_BYTES_PER_TOKEN = 2


def usage_cost(u: Usage | None) -> float:
    """What a response cost the account: ``cost``, plus the upstream cost only on BYOK responses; never
    negative, never NaN (a negative cost is no credit)."""
    if u is None:
        return 0.0
    cost = spend_usd(u.cost, u.is_byok, u.upstream_cost)
    return cost if math.isfinite(cost) and cost > 0 else 0.0


class Admission(Enum):
    OK = "ok"
    WAIT = "wait"  # may fit once in-flight requests finish
    NEVER = "never"  # cannot fit even with nothing in flight


@dataclass
class TokenBudget:
    budget: int | None
    done: int = 0
    reserved: int = 0

    def check(self, tokens: int) -> Admission:
        """Admission of a request reserving ``tokens`` (``max_tokens`` or the estimate)."""
        if self.budget is None or self.done + self.reserved + tokens <= self.budget:
            return Admission.OK
        return Admission.WAIT if self.reserved > 0 and self.done + tokens <= self.budget else Admission.NEVER

    @property
    def overshoot(self) -> int:
        """Completion tokens done beyond the budget (0 when within it or unbudgeted)."""
        return 0 if self.budget is None else max(0, self.done - self.budget)


@dataclass
class LengthEstimate:
    """Running ``QUANTILE`` of the completion lengths of one dataset and partition (sorted, all kept:
    one int per response)."""

    max_tokens: int
    lengths: list[int] = field(default_factory=list)
    total: int = 0

    def add(self, completion_tokens: int) -> None:
        bisect.insort(self.lengths, max(0, completion_tokens))
        self.total += max(0, completion_tokens)

    @property
    def mean(self) -> int:
        """``max_tokens`` until ``MIN_SAMPLES`` lengths are in; then their mean (1..max_tokens)."""
        n = len(self.lengths)
        if n < MIN_SAMPLES:
            return self.max_tokens
        return max(1, min(self.max_tokens, -(-self.total // n)))

    @property
    def value(self) -> int:
        """``max_tokens`` until ``MIN_SAMPLES`` lengths are in; then their ``QUANTILE`` (1..max_tokens)."""
        n = len(self.lengths)
        if n < MIN_SAMPLES:
            return self.max_tokens
        return max(1, min(self.max_tokens, self.lengths[min(n - 1, int(QUANTILE * n))]))


@dataclass(frozen=True)
class Abandoned:
    """A request abandoned on the wire, booked at its worst case (``held``) until its bill is looked up by its
    ``generation_id`` (None: the server never said it, so it stays held)."""

    sample_id: str
    dataset: str
    held: float
    generation_id: str | None = None
    prior: bool = False  # abandoned by an earlier run (its worst case is in ``prior``)


@dataclass(frozen=True)
class Reservation:
    """What one admitted request holds until settled or released."""

    dataset: str
    tokens: int  # against the dataset's token budget
    usd: float  # against max_spend
    worst_usd: float  # its worst case: against the account caps
    partition: str = ""
    max_tokens: int = 0


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
    #: dollars reserved against ``max_spend`` (the reservations' ``usd``)
    reserved: float = 0.0
    #: the worst cases of the requests in flight (against the account caps)
    reserved_worst: float = 0.0
    tokens: dict[str, TokenBudget] = field(default_factory=dict)
    token_policy: TokenPolicy = "strict"
    #: the completion worst case of a full set of slots (``Σ concurrency × max_tokens · completion price``)
    slots_worst: float = 0.0
    estimates: dict[tuple[str, str], LengthEstimate] = field(default_factory=dict)
    #: what ``session_cap`` is, for messages: "the API key's limit ($5.00)", "the account's credits"
    session_cap_source: str = "the account's limit"
    #: hedges (``engine.tail``): what their losing requests cost (in ``session`` too), and what the hedges on
    #: the wire reserve (in ``reserved`` too)
    hedge_spent: float = 0.0
    hedge_reserved: float = 0.0
    #: requests abandoned on the wire (an interrupt), this run's and earlier runs' not settled yet: the worst
    #: cases they hold (in ``spent`` too: ``prior`` or ``session``) until ``settle_abandoned`` books their bill
    held: float = 0.0
    abandoned: int = 0
    #: this run's abandoned requests whose generation id is known, for ``engine.settle`` to look up
    open_abandoned: list[Abandoned] = field(default_factory=list)
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    # -- dollars ---------------------------------------------------------------------------------------

    @property
    def spent(self) -> float:
        """Everything booked: what was billed plus what abandoned requests hold (``held``)."""
        return self.prior + self.session

    @property
    def billed(self) -> float:
        """What was billed (``spent`` less the worst cases abandoned requests hold)."""
        return max(0.0, self.spent - self.held)

    @property
    def left(self) -> float | None:
        """Dollars of the tightest cap not yet spent, reservations included (``remaining`` + what requests in
        flight reserve against it); None when uncapped. ``spent + left`` never passes ``max_spend``."""
        caps = []
        if self.max_spend is not None:
            caps.append(self.max_spend - self.spent)
        if self.session_cap is not None:
            caps.append(self.session_cap - self.session - max(0.0, self.reserved_worst - self.reserved))
        return max(0.0, min(caps)) if caps else None

    @property
    def remaining(self) -> float | None:
        """Dollars not yet spent or reserved, under the tightest cap (None when uncapped)."""
        caps = []
        if self.max_spend is not None:
            caps.append(self.max_spend - self.spent - self.reserved)
        if self.session_cap is not None:
            caps.append(self.session_cap - self.session - self.reserved_worst)
        return min(caps) if caps else None

    def check_dollars(self, usd: float, worst_usd: float | None = None) -> Admission:
        """Admission of a request reserving ``usd`` against ``max_spend`` and ``worst_usd`` (default
        ``usd``) against the account caps."""
        worst = usd if worst_usd is None else worst_usd
        fits = wait = True
        if self.max_spend is not None:
            rem = self.max_spend - self.spent - self.reserved
            if usd > rem + 1e-12:
                fits = False
                wait = wait and self.reserved > 0 and usd <= rem + self.reserved + 1e-12
        if self.session_cap is not None:
            rem = self.session_cap - self.session - self.reserved_worst
            if worst > rem + 1e-12:
                fits = False
                wait = wait and self.reserved_worst > 0 and worst <= rem + self.reserved_worst + 1e-12
        if fits:
            return Admission.OK
        return Admission.WAIT if wait else Admission.NEVER

    def binding_cap(self, worst_usd: float = 0.0) -> str:
        """Which cap leaves the least room now: ``max_spend`` or ``session`` (the account's)."""
        if self.session_cap is None:
            return "max_spend"
        session_room = self.session_cap - self.session - self.reserved_worst - worst_usd
        if self.max_spend is None:
            return "session"
        spend_room = self.max_spend - self.spent - self.reserved - worst_usd
        return "session" if session_room < spend_room else "max_spend"

    def stop_message(self, usd: float = 0.0, worst_usd: float = 0.0) -> str:
        """Why no (further) request fits, naming the cap: the dollar budget (``budget.max_spend_usd``), or the
        account's cap (the API key's limit, the credits) with the figure read from the server."""
        if self.binding_cap(worst_usd) == "session":
            left = (self.session_cap or 0.0) - self.session - self.reserved_worst
            where = f"over it by ${-left:.4f}" if left < 0 else f"${left:.4f} left for this run"
            need = f", which cannot cover the next request (${worst_usd or usd:.4f})" if worst_usd or usd else ""
            return (f"{self.session_cap_source} is reached ({where}, from the server's account figures{need}); "
                    "raise the key's limit or add credits, then rerun to resume")
        left = max((self.max_spend or 0.0) - self.spent - self.reserved, 0.0)
        need = f" cannot cover the next request (${usd:.4f})" if usd else ""
        return (f"dollar budget: ${left:.4f} left of ${self.max_spend or 0.0:g} (budget.max_spend_usd; "
                f"${self.spent:.4f} spent){need}; {RAISE_BUDGET}")

    def near_cap(self) -> bool:
        """The money left under ``max_spend`` after reservations is below ``(1 - QUANTILE) × slots_worst``:
        reserve worst cases from now on."""
        if self.max_spend is None:
            return False
        return self.max_spend - self.spent - self.reserved < (1.0 - QUANTILE) * self.slots_worst

    # -- estimates -------------------------------------------------------------------------------------

    def estimate(self, dataset: str, partition: str, max_tokens: int) -> int:
        """Tokens a request of this dataset and partition reserves under the token policy."""
        if self.token_policy == "strict":
            return max_tokens
        est = self.estimates.get((dataset, partition))
        if est is None:
            est = self.estimates[(dataset, partition)] = LengthEstimate(max_tokens)
        return min(est.value, max_tokens)

    def reservation(self, dataset: str, partition: str, max_tokens: int, prompt_tokens: int) -> Reservation:
        """What a request would reserve now (nothing is booked; ``check_*`` then ``reserve``): tokens at the
        estimate; dollars at the estimate's mean while far from the cap, else the worst case."""
        tokens = self.estimate(dataset, partition, max_tokens)
        worst = self.prices.worst_case(prompt_tokens, max_tokens)
        usd = worst
        if tokens < max_tokens and not self.near_cap():
            est = self.estimates.get((dataset, partition))
            usd = self.prices.worst_case(prompt_tokens, min(tokens, est.mean if est is not None else max_tokens))
        return Reservation(dataset, tokens, usd, worst, partition, max_tokens)

    def observe(self, dataset: str, partition: str, max_tokens: int, completion_tokens: int) -> None:
        """Feed one finished response's completion length to its estimate."""
        est = self.estimates.get((dataset, partition))
        if est is None:
            est = self.estimates[(dataset, partition)] = LengthEstimate(max_tokens)
        est.add(completion_tokens)

    # -- both ------------------------------------------------------------------------------------------

    def token_budget(self, dataset: str) -> TokenBudget:
        tb = self.tokens.get(dataset)
        if tb is None:
            tb = self.tokens[dataset] = TokenBudget(None)
        return tb

    def reserve(self, dataset: str, tokens: int, usd: float, *, worst_usd: float | None = None) -> None:
        self.token_budget(dataset).reserved += tokens
        self.reserved += usd
        self.reserved_worst += usd if worst_usd is None else worst_usd

    def hold(self, res: Reservation) -> None:
        """Book ``res`` (after its checks passed)."""
        self.reserve(res.dataset, res.tokens, res.usd, worst_usd=res.worst_usd)

    def _unreserve(self, dataset: str, tokens: int, usd: float, worst_usd: float | None) -> TokenBudget:
        tb = self.token_budget(dataset)
        tb.reserved -= tokens
        self.reserved = max(0.0, self.reserved - usd)
        self.reserved_worst = max(0.0, self.reserved_worst - (usd if worst_usd is None else worst_usd))
        return tb

    def settle(self, dataset: str, tokens: int, usd: float, usage: Usage | None,
               completion_tokens: int | None = None, charged: float = 0.0, *, worst_usd: float | None = None) -> float:
        """Release a reservation and book what the request really used. Returns its cost. ``charged``: what
        ``charge`` already booked for this very response (one first rejected, then kept), not booked twice."""
        tb = self._unreserve(dataset, tokens, usd, worst_usd)
        if completion_tokens is None:
            completion_tokens = usage.completion_tokens if usage is not None else 0
        tb.done += completion_tokens
        cost = usage_cost(usage)
        self.session += cost - charged
        self._notify()
        return cost

    def settle_res(self, res: Reservation, usage: Usage | None, completion_tokens: int | None = None,
                   charged: float = 0.0) -> float:
        """``settle`` of ``res``; its completion length also feeds the estimate of its dataset and partition."""
        cost = self.settle(res.dataset, res.tokens, res.usd, usage, completion_tokens, charged, worst_usd=res.worst_usd)
        if completion_tokens is None:
            completion_tokens = usage.completion_tokens if usage is not None else 0
        self.observe(res.dataset, res.partition, res.max_tokens, completion_tokens)
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
        """Book spend that produced no record (a billed response rejected as invalid, a hedge's loser)."""
        if cost > 0 and math.isfinite(cost):
            self.session += cost
            self._notify()

    def hold_abandoned(self, a: Abandoned) -> None:
        """Book a request abandoned on the wire at its worst case (``a.held``: the provider may finish and
        bill it in full), held apart from what was billed until ``settle_abandoned``."""
        if a.held > 0 and math.isfinite(a.held):
            self.charge(a.held)
            self.held += a.held
            self.abandoned += 1
            if a.generation_id is not None:
                self.open_abandoned.append(a)

    def settle_abandoned(self, a: Abandoned, billed: float) -> None:
        """An abandoned request's bill is known: its worst case is replaced by ``billed`` (in ``prior`` when an
        earlier run abandoned it, else in ``session``), and it is no longer open."""
        if a in self.open_abandoned:
            self.open_abandoned.remove(a)
        billed = billed if billed > 0 and math.isfinite(billed) else 0.0
        delta = billed - a.held
        if a.prior:
            self.prior = max(0.0, self.prior + delta)
        else:
            self.session = max(0.0, self.session + delta)
        self.held = max(0.0, self.held - a.held)
        self.abandoned = max(0, self.abandoned - 1)
        self._notify()

    def billed_cost(self, b: Billing, worst_usd: float, prompt_tokens: int = 0, *, prices: Prices | None = None) -> float:
        """What a response that produced no record was billed (see the module docstring); never negative.
        ``prompt_tokens``: the estimate used when its usage names none; ``prices``: the prices it was sold
        at when not the routed ones (a batch result's: the batch prices)."""
        u = b.usage
        if u is not None and b.cost_known:
            return usage_cost(u)
        if prices is None and not self.priced:
            return 0.0
        prices = prices if prices is not None else self.prices
        from_text = -(-b.text_bytes // TEXT_BYTES_PER_TOKEN)
        completion = max(u.completion_tokens if u is not None else 0, from_text)
        prompt = u.prompt_tokens if u is not None and u.prompt_tokens else prompt_tokens
        if not completion and u is None:
            return 0.0
        return max(0.0, min(prices.cost(prompt, completion), worst_usd))

    async def rebook(self, res: Reservation, prompt_tokens: int) -> Reservation | None:
        """A reservation for one more attempt of the request holding ``res`` (whose last attempt was billed):
        ``res`` is swapped for a fresh one when that fits under the caps, waiting while it may; None when
        it never will (``res`` is then still held, for the caller to release)."""
        while True:
            self._unreserve(res.dataset, res.tokens, res.usd, res.worst_usd)
            new = self.reservation(res.dataset, res.partition, res.max_tokens, prompt_tokens)
            new = Reservation(new.dataset, res.tokens, new.usd, new.worst_usd, new.partition, new.max_tokens)
            adm = self.check_dollars(new.usd, new.worst_usd)
            if adm is Admission.OK:
                self.hold(new)
                return new
            self.hold(res)  # nothing changes while waiting: the old one stays held
            if adm is Admission.NEVER:
                return None
            await self.changed()

    def release(self, dataset: str, tokens: int, usd: float, cost: float = 0.0, *,
                worst_usd: float | None = None) -> None:
        """Release a reservation of a request that produced no record (failed or cancelled)."""
        self._unreserve(dataset, tokens, usd, worst_usd)
        self.session += cost
        self._notify()

    def release_res(self, res: Reservation, cost: float = 0.0) -> None:
        self.release(res.dataset, res.tokens, res.usd, cost, worst_usd=res.worst_usd)

    # -- hedges ----------------------------------------------------------------------------------------

    def hedge_room(self, res: Reservation, share: float) -> bool:
        """A hedge reserving ``res`` may go out: it is admitted like any request (tokens and dollars), and what
        hedges cost beyond one request per sample stays within ``share`` of this session's spend, counting
        each hedge on the wire at its reservation (it may be the loser)."""
        if share <= 0 or self.hedge_spent + self.hedge_reserved + res.usd > share * self.session:
            return False
        return (self.token_budget(res.dataset).check(res.tokens) is Admission.OK
                and self.check_dollars(res.usd, res.worst_usd) is Admission.OK)

    def hold_hedge(self, res: Reservation) -> None:
        self.hold(res)
        self.hedge_reserved += res.usd

    def release_hedge(self, res: Reservation) -> None:
        self.hedge_reserved = max(0.0, self.hedge_reserved - res.usd)
        self.release_res(res)

    def charge_loser(self, cost: float) -> None:
        """Book what the losing request of a hedged sample cost (it is no record): extra spend."""
        self.hedge_spent += max(cost, 0.0)
        self.charge(cost)

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
