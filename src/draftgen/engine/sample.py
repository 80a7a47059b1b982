"""One sample's state machine: its slot and reservation, attempts until a usable outcome, one record.

Reads a ``PromptRecord`` with the partition slot and budget reservation the producer took for it
(``scheduler``); writes its ``ResponseRecord`` or ``FailureRecord``, and one ``AttemptRecord`` per attempt,
through ``Sinks``. Three layers, each owning one thing:

- ``SampleRunner.run`` owns the ``Lease`` (slot and reservation): on every path (written, failed,
  cancelled, an internal error) the reservation is settled or released exactly once, the slot is
  released once, and the sample leaves the requests in flight.
- ``_until_done`` loops over outcomes until the sample is written or given up. Every failed outcome goes
  through ``_decide`` once: the run's stop rules, then the one retry decision (``RetryPolicy.decide``):
  wait out the backoff and attempt again, keep the last unusable response, or record the failure.
- ``_attempt`` is one request and the checks on its response (``call``: ``intake.check_response``, the one
  intake of every path), returning a typed outcome (``outcomes``):
  ``Usable`` (build it), ``Unusable`` (retry elsewhere: its provider is avoided, the response may be kept)
  or ``Rejected`` (an API error, more tokens than asked for, or a stream cancelled under the rate floor,
  ``slow_stream``, whose provider is avoided too). ``_finish`` frees the slot, builds the record in the CPU
  pool and writes it: ``Finished``, or ``Rejected`` when the text rebuilt too long.
- Hedges (``hedge.HedgeRace``, the runner's ``race``): a second request for a stalled attempt, and the race
  that settles which response is the attempt's outcome; the runner is its ``Wire`` (``call``, ``record``,
  ``judge``, ``avoid``, ``ignore_for``).

Invariants: the slot is freed as soon as a response is in, before its record is built, and taken again
before a further attempt; a response that is not written as a record still has its billed cost booked
(``_charge``: a rejected completion, or an error whose body said what it was billed, ``errors.billing_of``),
and a request abandoned on the wire (cancelled: an interrupt) is held at its worst case
(``BudgetGovernor.hold_abandoned``), as an ``abandoned`` attempt in ``logs/attempts.jsonl``, with its generation
id when known, that the next run's budget reads and ``engine.settle`` settles; an attempt after a
billed one first reserves again (``BudgetGovernor.rebook``); a kept unusable response writes no
``AttemptRecord`` of its own (its attempt has one already) and feeds no provider health; at most one record
per sample reaches its sink (``Sinks.claim`` is the last word), however many requests of it answered. Rate
limits are waited out on their own time budget (``RetryPolicy.decide``), not on the attempts.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from functools import partial
from typing import Any, Literal

from draftgen.backends.base import Backend, Billing, Completion, CompletionRequest
from draftgen.backends.errors import attribute, billing_of, provider_of
from draftgen.engine.assemble import Assembler, UnusableResponse, check_record_tokens
from draftgen.engine.budget import Abandoned, BudgetGovernor, Reservation, usage_cost
from draftgen.engine.flight import Flight
from draftgen.engine.health import ProviderHealth
from draftgen.engine.hedge import HedgeRace
from draftgen.engine.intake import check_response
from draftgen.engine.limiter import AdaptiveLimiter
from draftgen.engine.outcomes import (
    Attempt,
    Built,
    Finished,
    Host,
    Lease,
    Lost,
    Rejected,
    Response,
    Sample,
    Unusable,
    Usable,
)
from draftgen.engine.plans import EngineOptions, PartitionPlan
from draftgen.engine.progress import RunLog
from draftgen.engine.prompts import estimate_prompt_tokens
from draftgen.engine.retry import Keep, Retry, RetryPolicy
from draftgen.engine.sinks import Sinks
from draftgen.engine.stats import RunStats
from draftgen.engine.usable import record_flags
from draftgen.errors import (
    APIError,
    AuthError,
    DraftgenError,
    PaymentRequired,
    RateLimited,
    RetryableAPIError,
)
from draftgen.records import AttemptRecord, FailureRecord, PromptRecord, ResponseRecord

__all__ = ["SampleRunner"]

_CONNECT_KINDS = {"connect_error", "connect_timeout"}


_Next = Literal["attempt", "keep", "stop"]


# -- the runner --------------------------------------------------------------------------------------------


class SampleRunner:
    def __init__(self, *, host: Host, backend: Backend, assembler: Assembler, governor: BudgetGovernor,
                 policy: RetryPolicy, stats: RunStats, log: RunLog, health: ProviderHealth | None,
                 options: EngineOptions, sinks: Sinks, cpu: Executor | None,
                 backoff: set[asyncio.Task[Any]]) -> None:
        self.host, self.backend, self.assembler, self.governor = host, backend, assembler, governor
        self.policy, self.stats, self.log, self.health = policy, stats, log, health
        self.options, self.sinks, self.cpu = options, sinks, cpu
        self.backoff = backoff  # tasks waiting out a retry's delay: the host cancels them when it stops
        self.connect_failures = 0
        self.successes = 0
        self.last_success = time.monotonic()
        #: hedges of stalled attempts and their races; its ``live`` holds the samples running, by key
        self.race = HedgeRace(self, host=host, governor=governor, policy=policy, stats=stats, log=log,
                              tail=options.tail)

    async def run(self, part: PartitionPlan, limiter: AdaptiveLimiter, alive: asyncio.Semaphore, dataset: str,
                  prompt: PromptRecord, res: Reservation) -> None:
        """One sample, from the slot and reservation the producer took to its record or failure."""
        lease = Lease(part, limiter, res, self.governor, self.stats)
        flight = self.stats.partition(part.name).flight
        key = (dataset, prompt.sample_id)
        s: Sample | None = None
        try:
            req = await self._request(prompt, part.max_tokens)
            avoid: list[str] = []
            for prov in self.options.avoid.get((dataset, prompt.sample_id), ()):
                self.avoid(avoid, prov)
            s = self.race.live[key] = Sample(dataset, prompt, lease, req, flight, avoid=avoid)
            await self._until_done(s)
        finally:
            flight.pop(key, None)  # cancelled or failed on the wire: no longer in flight
            self.race.live.pop(key, None)
            if s is not None and s.current is not None:  # cancelled with hedges on the wire: they go too
                for _, task in s.current.running_hedges():
                    task.cancel()
            lease.close()
            alive.release()

    async def _request(self, prompt: PromptRecord, max_tokens: int) -> CompletionRequest:
        prompt_ids = None
        if self.options.needs_prompt_ids:
            prompt_ids = await asyncio.get_running_loop().run_in_executor(self.cpu, self.assembler.prompt_ids, prompt)
        return CompletionRequest(sample_id=prompt.sample_id, messages=prompt.messages, max_tokens=max_tokens,
                                 tools=prompt.tools, prompt_ids=prompt_ids)

    async def _until_done(self, s: Sample) -> None:
        """Outcomes until the sample is written or given up; every failed one goes through ``_decide``."""
        kept: Response | None = None  # set by a ``keep``: written instead of a further attempt
        while True:
            out: Attempt | Built
            if kept is not None:
                out = await self._finish(s, kept)
            else:
                out = await self._attempt(s)
                if isinstance(out, Usable):
                    out = await self._finish(s, out.response)
                elif isinstance(out, Unusable):
                    s.kept = out.response
                    comp = out.response.comp
                    for prov in comp.providers or ([comp.provider] if comp.provider else []):
                        self.avoid(s.avoid, prov)
                elif out.exc.kind in ("slow_stream", "stalled"):  # retried on another provider
                    self.avoid(s.avoid, provider_of(out.exc))
            kept = None
            if isinstance(out, Finished):
                return
            step = await self._decide(s, out.exc)
            if step == "stop":
                return
            if step == "keep":
                kept = s.kept

    async def _attempt(self, s: Sample) -> Attempt:
        """One attempt: its request (``call``), raced against the hedges the tail guard sends (``HedgeRace.outcome``)."""
        if not s.lease.slot:
            await s.lease.retake()
        s.attempts += 1
        self.stats.requests += 1
        req = s.req
        req.provider_ignore = self.ignore_for(s.avoid)
        fl = s.current = Flight(s.key, s.part.name, time.monotonic())
        req.meter = fl.meter
        s.flight[s.key] = fl  # on the wire: one insert now, one pop when the attempt ends
        try:
            out = await self.call(s, req, fl)
        finally:
            s.flight.pop(s.key, None)
        if fl.hedges or isinstance(out, Lost):
            return await self.race.outcome(s, fl, out)
        return out

    async def call(self, s: Sample, req: CompletionRequest, fl: Flight) -> Attempt | Lost:
        """One request on the wire, inside ``fl``'s scope (the tail guard cancels it there), and the checks
        on its response; a failed one's ``AttemptRecord`` is written here, a usable one's with its record."""
        started = time.time()
        comp: Completion | None = None
        try:
            async with fl.scope():
                comp = await self.backend.complete(req)
        except TimeoutError:
            if fl.reason is None:
                raise
            return self.race.cancelled(s, fl, started)
        except APIError as exc:
            prov = provider_of(exc)
            billing = billing_of(exc)
            charged = self._charge(s, billing) if billing is not None else 0.0
            self.record(s, started, exc.kind, prov, cost=charged, hedge=fl.hedge)
            self.judge(prov, exc)
            return Rejected(exc)
        except asyncio.CancelledError:  # abandoned on the wire (an interrupt): it may be billed in full
            self._abandon(s, started, fl)
            raise
        finally:
            fl.close()
            self.stats.attempt_ended(fl, comp.usage.completion_tokens if comp is not None and comp.usage else None)
        latency = time.monotonic() - fl.started
        ended = time.time()
        try:
            check_response(comp, req.max_tokens, self.options.intake,
                           guard=self.health.guard if self.health is not None else None, sent_ignore=req.provider_ignore)
        except RetryableAPIError as exc:  # more tokens than asked for, or unusable
            attribute(exc, comp.provider)
            charged = self._charge(s, Billing(usage=comp.usage, cost_known=not comp.cost_missing,
                                              text_bytes=comp.text_bytes))
            self.record(s, started, exc.kind, comp.provider, comp, charged, ended=ended, hedge=fl.hedge)
            self.judge(comp.provider, exc)
            if isinstance(exc, UnusableResponse):
                return Unusable(exc, Response(comp, latency, started, ended, charged, exc.kind, fl.hedge))
            return Rejected(exc)
        return Usable(Response(comp, latency, started, ended, hedge=fl.hedge))


    async def _finish(self, s: Sample, r: Response) -> Built:
        """Free the slot (so reconstruction never keeps a slot from the wire), build the record, write it."""
        s.lease.response_in(success=r.unusable is None)
        self.connect_failures = 0
        self.successes += 1
        self.last_success = time.monotonic()
        rec = await self._build(s, r)
        if rec is None:
            return Finished()
        try:
            check_record_tokens(rec, s.part.max_tokens)
        except RetryableAPIError as exc:  # the text rebuilt to more ids than were asked for
            attribute(exc, r.comp.provider)
            if r.unusable is None:
                charged = self._charge(s, Billing(usage=r.comp.usage, cost_known=not r.comp.cost_missing,
                                                  text_bytes=r.comp.text_bytes))
                self.record(s, r.started, exc.kind, r.comp.provider, r.comp, charged, ended=r.ended)
                self.judge(r.comp.provider, exc)
            s.kept = None  # a kept response that rebuilds too long is no record either
            return Rejected(exc)
        self._write(s, r, rec)
        return Finished()

    async def _build(self, s: Sample, r: Response) -> ResponseRecord | None:
        """The record, built in the CPU pool; None when it cannot be (the failure is recorded)."""
        comp = r.comp
        quant = self.health.guard.quantization(comp.provider) if self.health is not None else None
        try:
            return await asyncio.get_running_loop().run_in_executor(self.cpu, partial(
                self.assembler.build, s.prompt, comp, partition=s.part.name, max_tokens=s.part.max_tokens,
                attempts=s.attempts, latency_s=r.latency, prompt_ids=s.req.prompt_ids, quantization=quant,
                extra_flags=record_flags(comp, s.req.tools) + ([f"unusable:{r.unusable}"] if r.unusable else []),
            ))
        except DraftgenError as exc:  # a tokenizer/profile problem with this one output
            if r.unusable is None:
                self.record(s, r.started, "reconstruction", comp.provider, comp, ended=r.ended)
            self._fail(s, "reconstruction", str(exc), permanent=True, provider=comp.provider)
            return None

    def _write(self, s: Sample, r: Response, rec: ResponseRecord) -> None:
        """Price it where the response had no cost, settle the reservation, queue the record (unless a record of
        this sample is queued already: then it is discarded, its cost booked)."""
        comp = r.comp
        if not self.sinks.claim(s.dataset, rec.sample_id):
            self.log.write(f"discarded a second response of {s.dataset}/{rec.sample_id}: its record is written")
            self.race.discard(s, r)
            return
        if comp.usage is None or comp.cost_missing:
            rec.usage = self.governor.priced_usage(rec.usage, prompt_tokens=len(rec.prompt_ids or ()),
                                                   completion_tokens=len(rec.output_ids or ()))
        if r.unusable is None:
            billing = None
            u = rec.usage
            if self.health is not None and u is not None and rec.output_ids is not None \
                    and self.health.policy.billing_off(len(rec.output_ids), u.completion_tokens):
                billing = "billing_off"
            self.record(s, r.started, "ok", comp.provider, comp, usage_cost(u), ended=r.ended, hedge=r.hedge)
            self.judge(comp.provider, billing)
        else:
            self.stats.kept_unusable[r.unusable] += 1
        s.lease.settled = True
        self._book(s.dataset, comp, rec, s.lease.res, r.latency, charged=r.charged)
        self.sinks.responses(s.dataset).put(rec)

    # -- the decision after a failed outcome --------------------------------------------------------------

    async def _decide(self, s: Sample, exc: APIError) -> _Next:
        """What follows a failed outcome: ``attempt`` (after the backoff), ``stop`` (given up: a failure is
        recorded, or the run is stopping), or ``keep`` (retries exhausted: the sample's last unusable
        response is written as its record, flagged, under ``keep_unusable``)."""
        if isinstance(exc, AuthError):
            self.host.request_stop(f"{exc}", exit_code=exc.exit_code, hard=True)
            return "stop"
        if isinstance(exc, PaymentRequired):
            self._fail(s, exc.kind, str(exc), permanent=False, status=exc.status)
            self.host.request_stop(f"out of credits or over the key's limit ({exc.kind}); add credits and rerun "
                                   "to resume", exit_code=exc.exit_code)
            return "stop"
        self._note_error(s.part, s.lease.limiter, exc)
        where = f"{s.dataset}/{s.prompt.sample_id}"
        if self.host.stopping:
            self.log.write(f"abandon {where} attempt {s.attempts}: {exc} (stopping)")
            return "stop"
        decision = self.policy.decide(exc, s.attempts, keepable=s.kept is not None and self.options.keep_unusable,
                                      rate_limits=s.rate_limits, rate_waited=s.rate_waited)
        if isinstance(decision, Retry):
            self.stats.retries[exc.kind] += 1
            self.stats.partition(s.part.name).retries += 1
            if decision.rate_limited:
                s.rate_limits += 1
                s.rate_waited += decision.delay
            self.log.write(f"retry {where} attempt {s.attempts - s.rate_limits + decision.rate_limited}/"
                           f"{self.policy.max_attempts} in {decision.delay:.2f}s: {exc}"
                           + (" (a rate limit: waited out, no attempt used)" if decision.rate_limited else ""))
            await self._backoff(decision.delay)
            if self.host.stopping:
                return "stop"
            return "attempt" if await self._rebook(s) else "stop"
        if isinstance(decision, Keep):
            self.log.write(f"kept {where} after {s.attempts} attempt(s): its last unusable response is its "
                           f"record, flagged unusable (quality.keep_unusable); last error: {exc}")
            return "keep"
        self._fail(s, decision.kind, str(exc), permanent=decision.permanent, status=exc.status,
                   provider=provider_of(exc))
        return "stop"

    def _note_error(self, part: PartitionPlan, limiter: AdaptiveLimiter, exc: APIError) -> None:
        """A retryable failure's effect on the run: the adaptive limit, and a server that cannot be reached."""
        if isinstance(exc, RateLimited):
            if limiter.on_rate_limited():
                self.stats.limit[part.name] = limiter.current
                self.log.write(f"adaptive concurrency: 429 storm, {part.name} limit lowered to {limiter.current}")
        else:
            limiter.on_other_error()
        if exc.kind in _CONNECT_KINDS:
            # A server that cannot be reached at all, or no longer: not one burst of slow connects.
            self.connect_failures += 1
            quiet = time.monotonic() - self.last_success
            if (self.connect_failures >= self.options.connect_failure_limit and not self.host.stopping
                    and (self.successes == 0 or quiet >= 60.0)):
                self.host.request_stop(f"cannot reach the server ({exc}); check endpoint.base_url", exit_code=1)

    async def _backoff(self, delay: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.backoff.add(task)  # a stop cancels the wait: the sample is abandoned, the next run picks it up
        try:
            await asyncio.sleep(delay)
        finally:
            self.backoff.discard(task)

    # -- quality and health --------------------------------------------------------------------------------

    def ignore_for(self, avoid: list[str]) -> list[str] | None:
        """What this attempt adds to ``provider.ignore``: the providers in the run's cool-down and the ones
        this sample must avoid, never all the routing allows (the sample's oldest are dropped first)."""
        run = self.health.ignore() if self.health is not None else []
        if not avoid:
            return run or None
        guard = self.health.guard if self.health is not None else None
        own = list(avoid)
        while own and guard is not None and guard.leaves_none([*run, *own]):
            own.pop(0)
        out = list(run)
        for slug in own:
            if slug not in out:
                out.append(slug)
        return out or None

    def avoid(self, avoid: list[str], provider: str | None) -> None:
        if provider and self.health is not None:
            slug = self.health.guard.slug(provider)
            if slug not in avoid:
                avoid.append(slug)

    def judge(self, provider: str | None, outcome: APIError | str | None) -> None:
        """One outcome for the provider's health: a retryable error or a quality kind is bad; a permanent
        error (about the request, not the provider) is not counted."""
        if self.health is None or not provider:
            return
        if isinstance(outcome, APIError):
            if not isinstance(outcome, RetryableAPIError):
                return
            outcome = outcome.kind
        self.health.outcome(provider, outcome)

    # -- records and books ---------------------------------------------------------------------------------

    def record(self, s: Sample, started: float, outcome: str, provider: str | None, comp: Completion | None = None,
                cost: float = 0.0, ended: float | None = None, *, hedge: bool = False,
                generation_id: str | None = None, streamed_tokens: int = 0) -> None:
        """One ``AttemptRecord`` (wall-clock times; ``ended``: when the response was in, default now; ``hedge``:
        the request was a hedge; ``generation_id``: the server's, default the response's; ``streamed_tokens``:
        what arrived of a request that left no response)."""
        sink = self.sinks.attempts
        if sink is None:
            return
        u = comp.usage if comp is not None else None
        sink.put(AttemptRecord(
            sample_id=s.prompt.sample_id, dataset=s.dataset, attempt=s.attempts, started_at=round(started, 4),
            ended_at=round(time.time() if ended is None else ended, 4), outcome=outcome, provider=provider,
            quantization=self.health.guard.quantization(provider) if self.health is not None else None,
            ttft_s=comp.ttft_s if comp is not None else None,
            completion_tokens=u.completion_tokens if u is not None else 0, cost=cost, hedge=hedge,
            generation_id=generation_id or (comp.generation_id if comp is not None else None),
            streamed_tokens=streamed_tokens,
        ))

    def _charge(self, s: Sample, billing: Billing) -> float:
        """Book what a response that produced no record was billed (``BudgetGovernor.billed_cost``); the
        sample reserves again before its next attempt. Returns it."""
        cost = self.governor.billed_cost(billing, s.lease.res.worst_usd, estimate_prompt_tokens(s.prompt))
        if cost > 0:
            self.governor.charge(cost)
            s.billed = True
            self.stats.spend_session = self.governor.session
            self.stats.remaining = self.governor.remaining
        return cost

    def _abandon(self, s: Sample, started: float, fl: Flight) -> None:
        """A request cancelled on the wire: held at its worst case (the provider may finish and bill it), as an
        ``abandoned`` attempt the next run's budget reads, with its generation id when the server sent one (a
        lookup of it settles the hold: ``engine.settle``)."""
        gid = fl.meter.generation_id
        self.governor.hold_abandoned(Abandoned(s.prompt.sample_id, s.dataset, s.lease.res.worst_usd, gid))
        self.stats.spend_session = self.governor.session
        self.record(s, started, "abandoned", fl.meter.provider, cost=s.lease.res.worst_usd, hedge=fl.hedge,
                    generation_id=gid, streamed_tokens=round(fl.meter.tokens(self.stats.chars_per_token)))

    async def _rebook(self, s: Sample) -> bool:
        """Reserve again before an attempt that follows a billed one; False (the run stops, the sample is
        left for the next run) when no reservation will fit."""
        if not s.billed:
            return True
        s.billed = False
        new = await self.governor.rebook(s.lease.res, estimate_prompt_tokens(s.prompt))
        self.stats.reserved = self.governor.reserved
        if new is None:
            self.host.request_stop(self.governor.stop_message(s.lease.res.usd, s.lease.res.worst_usd), exit_code=1)
            return False
        s.lease.res = new
        return True

    def _book(self, dataset: str, comp: Completion, rec: ResponseRecord, res: Reservation, latency: float,
              charged: float = 0.0) -> None:
        u = rec.usage  # the completion's, with a computed cost where it had none
        tokens = u.completion_tokens if u is not None and u.completion_tokens else len(rec.output_ids or ())
        cost = self.governor.settle_res(res, u, completion_tokens=tokens, charged=charged)
        st = self.stats
        counts = st.dataset(dataset)
        counts.completion_tokens += tokens
        counts.prompt_tokens += u.prompt_tokens if u is not None and u.prompt_tokens else len(rec.prompt_ids or ())
        counts.cost += cost
        pc = st.partition(rec.partition)
        pc.completion_tokens += tokens
        pc.cost += cost
        st.spend_session = self.governor.session
        st.reserved = self.governor.reserved
        st.remaining = self.governor.remaining
        st.latency_sum += latency
        st.response_in(rec.partition, tokens, len(comp.reasoning or "") + len(comp.content or ""),
                       comp.ttft_s if comp.ttft_s is not None else latency)
        st.providers[comp.provider or comp.backend] += 1
        st.ids_source[rec.ids_source] += 1

    def _fail(self, s: Sample, kind: str, reason: str, *, permanent: bool, status: int | None = None,
              provider: str | None = None) -> None:
        dataset, partition, attempts = s.dataset, s.part.name, s.attempts
        rec = FailureRecord(
            sample_id=s.prompt.sample_id, dataset=dataset, kind=kind, reason=reason, partition=partition,
            status=status, permanent=permanent, attempts=attempts, provider=provider, created_at=round(time.time(), 3),
        )
        self.stats.failures[kind] += 1
        self.stats.dataset(dataset).failed += 1
        self.stats.partition(partition).failed += 1
        self.log.write(f"failed {dataset}/{s.prompt.sample_id} after {attempts} attempt(s): {kind}: {reason}")
        self.sinks.failures(dataset).put(rec)
