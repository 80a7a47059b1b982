"""A sample's state across its attempts, and the typed outcomes of one attempt.

Pure state, no I/O: ``Sample`` (the prompt, the request, the providers to avoid, the attempt on the wire),
``Lease`` (the partition slot and the budget reservation it holds) and the outcomes (``Usable``,
``Unusable``, ``Rejected``, ``Lost``, ``Finished``) that ``sample.SampleRunner`` and the hedge race
(``hedge.HedgeRace``) pass between them. ``Host`` is what a sample needs of the engine that runs it.

Invariant: ``Lease.close`` releases what is still held exactly once (the reservation unless it was
settled, the slot if held); ``Lease.response_in`` frees the slot as soon as a response is in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from draftgen.backends.base import Completion, CompletionRequest
from draftgen.engine.assemble import UnusableResponse
from draftgen.engine.budget import BudgetGovernor, Reservation
from draftgen.engine.flight import Flight
from draftgen.engine.limiter import AdaptiveLimiter
from draftgen.engine.plans import PartitionPlan
from draftgen.engine.stats import RunStats
from draftgen.errors import APIError
from draftgen.records import PromptRecord

__all__ = ["Attempt", "Built", "Finished", "Host", "Lease", "Lost", "Rejected", "Response", "Sample", "Unusable",
           "Usable"]


class Host(Protocol):
    """What a sample needs from the engine that runs it: whether the run is stopping, and a way to stop it."""

    @property
    def stopping(self) -> bool: ...

    def request_stop(self, reason: str, *, exit_code: int = 1, hard: bool = False, grace: bool = False) -> None: ...


# -- outcomes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    """A response that is in: when its attempt started and ended (wall clock), what was booked for it
    already (a rejected response's billed cost), and for a kept unusable one, its kind."""

    comp: Completion
    latency: float
    started: float
    ended: float
    charged: float = 0.0
    unusable: str | None = None
    hedge: bool = False  # the response of a hedge (a second request for the sample)


@dataclass(frozen=True)
class Usable:
    """A response that passed the checks on the wire's answer: build its record."""

    response: Response


@dataclass(frozen=True)
class Unusable:
    """A response that is no record (reasoning dropped, an excluded provider): retried elsewhere, or kept."""

    exc: UnusableResponse
    response: Response


@dataclass(frozen=True)
class Rejected:
    """A failed attempt: an API error, or a response with more tokens than it was allowed."""

    exc: APIError


@dataclass(frozen=True)
class Lost:
    """A request cancelled because another request of the same sample answered first (recorded, booked)."""


@dataclass(frozen=True)
class Finished:
    """Nothing more to do: the record is on its sink, or the sample's failure is."""


Attempt = Usable | Unusable | Rejected
Built = Finished | Rejected


# -- the slot and the reservation --------------------------------------------------------------------------


class Lease:
    """The partition slot and the budget reservation one sample holds (both taken by the producer)."""

    def __init__(self, part: PartitionPlan, limiter: AdaptiveLimiter, res: Reservation, governor: BudgetGovernor,
                 stats: RunStats) -> None:
        self.part, self.limiter, self.res, self.governor, self.stats = part, limiter, res, governor, stats
        self.slot = True
        self.settled = False

    def response_in(self, *, success: bool) -> None:
        """Free the slot now that a response is in (``success``: it counts for the adaptive limit)."""
        lim = self.limiter
        self.slot = False
        if success:
            lim.on_success()
        lim.release()
        self.stats.in_flight[self.part.name] = lim.in_use
        self.stats.limit[self.part.name] = lim.current

    async def retake(self) -> None:
        """A slot again, for an attempt after the slot was freed."""
        await self.limiter.acquire()
        self.slot = True
        self.stats.in_flight[self.part.name] = self.limiter.in_use

    def close(self) -> None:
        """Release what is still held: the reservation unless it was settled, the slot if held."""
        if not self.settled:
            self.governor.release_res(self.res)
            self.stats.reserved = self.governor.reserved
        if self.slot:
            self.limiter.release()
            self.stats.in_flight[self.part.name] = self.limiter.in_use


@dataclass
class Sample:
    """One sample's state across its attempts."""

    dataset: str
    prompt: PromptRecord
    lease: Lease
    req: CompletionRequest
    flight: dict[tuple[str, str], Flight]
    attempts: int = 0
    avoid: list[str] = field(default_factory=list)  # providers it must not go back to (they returned it unusable)
    kept: Response | None = None  # its last unusable response
    rate_limits: int = 0  # rate limits waited out (no attempts)
    rate_waited: float = 0.0  # seconds they took
    billed: bool = False  # its last attempt was billed: reserve again before the next
    current: Flight | None = None  # its attempt on the wire

    @property
    def key(self) -> tuple[str, str]:
        return self.dataset, self.prompt.sample_id

    @property
    def part(self) -> PartitionPlan:
        return self.lease.part
