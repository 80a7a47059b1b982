"""The generation engine: per-partition producers → bounded sample tasks → one writer per file.

Flow, per partition (``short``, ``long``), each with its own ``AdaptiveLimiter`` (concurrency) and
``max_tokens``, so a slow long request never holds a short slot:

    producer: take a slot → pick the next admissible prompt (file order, dataset order; a dataset
              blocked by its token budget lets the next one go) → reserve tokens and dollars → spawn
    task:     [prompt ids for SGLang] → attempts with backoff → release the slot → build the record in
              the CPU pool → settle the budget → queue the record on the dataset's raw sink

Invariants:
- Requests on the wire ≤ slots ≤ concurrency; a slot is freed as soon as its response is in, before
  the record is built, so reconstruction never keeps a slot from the wire. Tasks alive ≤ 2 × concurrency
  (the producer waits when responses pile up before the CPU pool): prompts are streamed from disk, never
  one task per prompt.
- A sample is done iff its ResponseRecord is in ``raw_responses.jsonl``; each id is scheduled at most once
  per run and never if already done, so no id is appended twice.
- Every reservation is released exactly once (settled on success, released on failure or cancel). What
  it holds follows ``budget.token_policy`` (``budget.BudgetGovernor.reservation``): max_tokens and the
  worst case under ``strict``; the dataset and partition's p90 length (dollars: its mean, the worst case
  near the cap) under ``expected``; each settled length feeds that estimate.
- A response with more tokens than it was allowed (``assemble.check_tokens``/``check_record_tokens``) is
  retried like a retryable error, never written; what it was billed is booked all the same. A response
  without ``usage.cost`` is priced from the routed prices before it is booked and written.
- Stop: scheduling stops at once; in-flight requests finish (within ``grace_s`` for an interrupt); tasks
  waiting in backoff are abandoned (not done; the next run picks them up). A hard stop cancels all
  in-flight requests. Records already handed to a sink are always written before ``run`` returns.
- A record is usable: a response with dropped reasoning (``assemble.check_reasoning``) or from a provider
  the request's routing excluded (``health.RoutingGuard.excluded``) is an ``UnusableResponse``, retried
  with that provider added to the sample's own ``provider.ignore``, and booked as spend. When the retries
  run out the sample is a failure of that kind, or (``keep_unusable``) the last unusable response becomes
  its record, flagged ``unusable:<kind>``.
- Every attempt is one ``AttemptRecord`` in ``logs/attempts.jsonl`` (its own writer task). Each outcome
  attributed to a provider feeds ``health.ProviderHealth``; the providers it cools down go into every
  request's ``provider.ignore`` until restored (``HealthEvent`` in ``logs/health.jsonl``, a line in the
  log and on the display). A sample's own ignores never exclude every provider the routing allows: the
  oldest is dropped first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from draftgen.backends.base import Backend, Completion, CompletionRequest
from draftgen.backends.errors import attribute, provider_of
from draftgen.engine.assemble import (
    Assembler,
    UnusableResponse,
    check_reasoning,
    check_record_tokens,
    check_tokens,
)
from draftgen.engine.budget import Admission, BudgetGovernor, Reservation, usage_cost
from draftgen.engine.health import ProviderHealth
from draftgen.engine.limiter import AdaptiveLimiter
from draftgen.engine.progress import Display, RunLog
from draftgen.engine.prompts import PromptCursor, estimate_prompt_tokens
from draftgen.engine.retry import RetryPolicy
from draftgen.engine.stats import RunStats
from draftgen.engine.writer import RecordSink
from draftgen.errors import (
    APIError,
    AuthError,
    DraftgenError,
    PaymentRequired,
    RateLimited,
    RetryableAPIError,
)
from draftgen.records import AttemptRecord, FailureRecord, HealthEvent, PromptRecord, ResponseRecord

__all__ = ["DatasetPlan", "Engine", "EngineResult", "PartitionPlan"]

_CONNECT_KINDS = {"connect_error", "connect_timeout"}


@dataclass
class PartitionPlan:
    name: str
    concurrency: int
    max_tokens: int


@dataclass
class DatasetPlan:
    """One dataset's work: where its prompts are read and its records and failures written (the caller
    spells the paths, ``rundir.RunDir``; the engine sees plans, not the run directory)."""

    name: str
    prompts_path: Path
    raw_path: Path
    failures_path: Path
    done: set[str] = field(default_factory=set)
    pending: dict[str, int] = field(default_factory=dict)  # partition → prompts left


@dataclass
class EngineResult:
    exit_code: int = 0
    stop_reason: str | None = None


@dataclass
class _Kept:
    """The last unusable response of a sample (written as its record under ``keep_unusable``)."""

    comp: Completion
    kind: str
    latency: float
    charged: float


_Step = Literal["retry", "stop", "keep"]


class Engine:
    def __init__(
        self,
        *,
        backend: Backend,
        assembler: Assembler,
        datasets: Sequence[DatasetPlan],
        partitions: Sequence[PartitionPlan],
        governor: BudgetGovernor,
        policy: RetryPolicy,
        stats: RunStats,
        log: RunLog,
        display: Display,
        adaptive: bool = True,
        grace_s: float = 30.0,
        needs_prompt_ids: bool = False,
        cpu_workers: int = 2,
        fsync: bool = True,
        connect_failure_limit: int = 50,
        ramp_s: float = 1.0,
        attempts_path: Path | None = None,
        health_path: Path | None = None,
        health: ProviderHealth | None = None,
        keep_unusable: bool = False,
        require_reasoning: bool = True,
    ) -> None:
        self.backend = backend
        self.assembler = assembler
        self.datasets = list(datasets)
        self.partitions = list(partitions)
        self.governor = governor
        self.policy = policy
        self.stats = stats
        self.log = log
        self.display = display
        self.adaptive = adaptive
        self.grace_s = grace_s
        self.needs_prompt_ids = needs_prompt_ids
        self.cpu_workers = cpu_workers
        self.fsync = fsync
        self.connect_failure_limit = connect_failure_limit
        self.limiters: dict[str, AdaptiveLimiter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._backoff: set[asyncio.Task[None]] = set()
        self._producers: list[asyncio.Task[None]] = []
        self._sinks: dict[str, RecordSink[ResponseRecord]] = {}
        self._fail_sinks: dict[str, RecordSink[FailureRecord]] = {}
        self._taken: dict[str, set[str]] = {d.name: set() for d in self.datasets}
        self._stop_reason: str | None = None
        self._exit_code = 0
        self._stopping = False
        self._hard = False
        self._deadline: float | None = None
        self._fatal: BaseException | None = None
        self._connect_failures = 0
        self._successes = 0
        self._last_success = time.monotonic()
        self.ramp_s = ramp_s
        self._cpu: ThreadPoolExecutor | None = None
        self._io: ThreadPoolExecutor | None = None
        self.attempts_path = attempts_path
        self.health_path = health_path
        self.health = health
        self.keep_unusable = keep_unusable
        self.require_reasoning = require_reasoning
        self._attempt_sink: RecordSink[AttemptRecord] | None = None
        self._health_sink: RecordSink[HealthEvent] | None = None
        if health is not None:
            health.on_event = self._health_event
            health.on_note = self.display.print

    # -- control -------------------------------------------------------------------------------------------

    def request_stop(self, reason: str, *, exit_code: int = 1, hard: bool = False, grace: bool = False) -> None:
        """Stop scheduling (first reason wins). ``grace``: cancel what is still in flight after ``grace_s``;
        ``hard``: cancel it now."""
        if self._stop_reason is None:
            self._stop_reason = reason
            self._exit_code = exit_code
            self.stats.stopping = reason
        self._stopping = True
        if grace and self._deadline is None:
            self._deadline = time.monotonic() + self.grace_s
            self.stats.grace_until = self._deadline  # the display counts the grace period down
        if hard:
            self._hard = True
            self.stats.aborting = True
        for p in self._producers:
            p.cancel()
        for t in list(self._backoff):
            t.cancel()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    # -- main ----------------------------------------------------------------------------------------------

    async def run(self) -> EngineResult:
        loop = asyncio.get_running_loop()
        self._cpu = ThreadPoolExecutor(self.cpu_workers, thread_name_prefix="draftgen-cpu")
        self._io = ThreadPoolExecutor(2, thread_name_prefix="draftgen-io")
        try:
            for ds in self.datasets:
                if sum(ds.pending.values()):
                    self._sink(ds.name)
            if self.attempts_path is not None:
                self._attempt_sink = RecordSink(self.attempts_path, executor=self._io, fsync=False)
                self._attempt_sink.start()
            if not self.governor.slots_worst:  # near the dollar cap: see budget.BudgetGovernor.near_cap
                self.governor.slots_worst = sum(p.concurrency * self.governor.prices.worst_case(0, p.max_tokens)
                                                for p in self.partitions)
            for ds in self.datasets:
                for pname, n in ds.pending.items():
                    if any(p.name == pname for p in self.partitions):
                        self.stats.partition(pname).planned += n
            for part in self.partitions:
                self.stats.partition(part.name)
                lim = AdaptiveLimiter(part.concurrency, adaptive=self.adaptive)
                self.limiters[part.name] = lim
                self.stats.limit[part.name] = lim.current
                self.stats.in_flight[part.name] = 0
                self._producers.append(loop.create_task(self._produce(part, lim), name=f"producer:{part.name}"))
            while True:
                if self._hard:
                    break
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    self.log.write(f"grace period over: cancelling {len(self._tasks)} requests in flight")
                    break
                if all(p.done() for p in self._producers) and not self._tasks:
                    break
                for part_name, lim in self.limiters.items():
                    lim.tick()
                    self.stats.limit[part_name] = lim.current
                if self.health is not None:
                    self.health.tick()
                await asyncio.sleep(0.05)
        finally:
            await self._shutdown()
        for p in self._producers:
            if not p.cancelled() and p.exception() is not None and self._fatal is None:
                self._fatal = p.exception()
        if self._fatal is not None:
            raise self._fatal
        return EngineResult(exit_code=self._exit_code, stop_reason=self._stop_reason)

    async def _shutdown(self) -> None:
        for p in self._producers:
            p.cancel()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*self._producers, *tasks, return_exceptions=True)
        errors: list[BaseException] = []
        sinks: list[RecordSink[Any]] = [*self._sinks.values(), *self._fail_sinks.values()]
        sinks += [x for x in (self._attempt_sink, self._health_sink) if x is not None]
        for sink in sinks:
            try:
                await sink.close()
            except Exception as exc:  # StorageError: keep closing the others, re-raise below
                errors.append(exc)
        if self._cpu is not None:
            self._cpu.shutdown(wait=True, cancel_futures=True)
        if self._io is not None:
            self._io.shutdown(wait=True)
        if errors and self._fatal is None:
            self._fatal = errors[0]

    # -- sinks ---------------------------------------------------------------------------------------------

    def _sink(self, dataset: str) -> RecordSink[ResponseRecord]:
        sink = self._sinks.get(dataset)
        if sink is None:
            plan = next(d for d in self.datasets if d.name == dataset)
            counts = self.stats.dataset(dataset)

            parts = self.stats.partitions

            def written(batch: Sequence[ResponseRecord]) -> None:
                counts.done += len(batch)
                for rec in batch:
                    pc = parts.get(rec.partition)
                    if pc is not None:
                        pc.done += 1

            sink = RecordSink(plan.raw_path, executor=self._io, on_written=written, fsync=self.fsync)
            sink.start()
            self._sinks[dataset] = sink
        return sink

    def _fail_sink(self, dataset: str) -> RecordSink[FailureRecord]:
        sink = self._fail_sinks.get(dataset)
        if sink is None:
            plan = next(d for d in self.datasets if d.name == dataset)
            sink = RecordSink(plan.failures_path, executor=self._io, fsync=self.fsync)
            sink.start()
            self._fail_sinks[dataset] = sink
        return sink

    def _health_event(self, ev: HealthEvent, line: str) -> None:
        if self.health_path is not None:
            if self._health_sink is None:
                self._health_sink = RecordSink(self.health_path, executor=self._io, fsync=self.fsync)
                self._health_sink.start()
            self._health_sink.put(ev)
        if self.health is not None:
            self.stats.cooling = sorted(self.health.cooling)
        if ev.event == "cooldown":
            self.stats.cooldowns[ev.provider] += 1
        self.display.print(line)

    # -- producer ------------------------------------------------------------------------------------------

    async def _produce(self, part: PartitionPlan, limiter: AdaptiveLimiter) -> None:
        cursors = [
            PromptCursor(d.name, d.prompts_path, part.name, d.done, self._taken[d.name])
            for d in self.datasets
            if d.pending.get(part.name)
        ]
        loop = asyncio.get_running_loop()
        # First fill: spread the first ``concurrency`` requests over ``ramp_s`` so thousands of
        # connections are not opened in the same millisecond (accept queues, TLS handshakes).
        start = time.monotonic()
        spawned = 0
        # Tasks alive ≤ 2 × concurrency: a slot is freed when its response is in, and up to
        # ``concurrency`` more responses may wait for the CPU pool before the producer waits too.
        alive = asyncio.Semaphore(2 * part.concurrency)
        while not self._stopping:
            if spawned < part.concurrency and self.ramp_s > 0:
                due = start + self.ramp_s * spawned / part.concurrency
                delay = due - time.monotonic()
                if delay > 0.002:
                    await asyncio.sleep(delay)
            await alive.acquire()
            try:
                await limiter.acquire()
            except BaseException:
                alive.release()
                raise
            try:
                picked = await self._pick(part, cursors)
            except BaseException:
                limiter.release()
                alive.release()
                raise
            if picked is None:
                limiter.release()
                alive.release()
                return
            dataset, prompt, res = picked
            self.stats.in_flight[part.name] = limiter.in_use
            spawned += 1
            task = loop.create_task(self._sample(part, limiter, alive, dataset, prompt, res))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

    async def _pick(self, part: PartitionPlan,
                    cursors: list[PromptCursor]) -> tuple[str, PromptRecord, Reservation] | None:
        gov = self.governor
        mt = part.max_tokens
        while not self._stopping:
            waiting = False
            for cur in cursors:
                if cur.exhausted:
                    continue
                tb = gov.token_budget(cur.dataset)
                adm = tb.check(gov.estimate(cur.dataset, part.name, mt))  # max_tokens under strict
                if adm is Admission.NEVER:
                    self._budget_reached(cur)
                    continue
                if adm is Admission.WAIT:
                    waiting = True
                    continue
                prompt = cur.peek()
                if prompt is None:
                    continue
                res = gov.reservation(cur.dataset, part.name, mt, estimate_prompt_tokens(prompt))
                dadm = gov.check_dollars(res.usd, res.worst_usd)
                if dadm is Admission.OK:
                    cur.take()
                    gov.hold(res)
                    self.stats.reserved = gov.reserved
                    return cur.dataset, prompt, res
                if dadm is Admission.WAIT:
                    waiting = True
                    break
                rem = gov.remaining or 0.0
                self.request_stop(
                    f"dollar budget: ${max(rem, 0.0):.4f} left cannot cover the next request (${res.usd:.4f}); "
                    "raise --max-spend to continue",
                    exit_code=1,
                )
                return None
            if not waiting:
                return None
            await gov.changed()
        return None

    def _budget_reached(self, cur: PromptCursor) -> None:
        tb = self.governor.token_budget(cur.dataset)
        reason = f"token budget reached ({tb.done} of {tb.budget} completion tokens)"
        cur.finish(reason)
        counts = self.stats.dataset(cur.dataset)
        if counts.skipped is None:
            counts.skipped = reason
            self.display.print(f"{cur.dataset}: {reason}; its remaining prompts are skipped")

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._fatal is None:
            self._fatal = exc
            self.request_stop(f"internal error: {type(exc).__name__}", exit_code=1, hard=True)

    # -- one sample ----------------------------------------------------------------------------------------

    async def _sample(self, part: PartitionPlan, limiter: AdaptiveLimiter, alive: asyncio.Semaphore, dataset: str,
                      prompt: PromptRecord, res: Reservation) -> None:
        loop = asyncio.get_running_loop()
        mt = part.max_tokens
        worst = res.worst_usd
        settled = False
        slot = True
        flight = self.stats.partition(part.name).flight
        key = (dataset, prompt.sample_id)
        try:
            prompt_ids = None
            if self.needs_prompt_ids:
                prompt_ids = await loop.run_in_executor(self._cpu, self.assembler.prompt_ids, prompt)
            req = CompletionRequest(sample_id=prompt.sample_id, messages=prompt.messages, max_tokens=mt,
                                    tools=prompt.tools, prompt_ids=prompt_ids)
            attempts = 0
            avoid: list[str] = []  # providers this sample must not go back to (they returned it unusable)
            kept: _Kept | None = None
            while True:
                attempts += 1
                self.stats.requests += 1
                req.provider_ignore = self._ignore_for(avoid)
                started = time.time()
                t0 = time.monotonic()
                charged = 0.0
                unusable: str | None = None
                step: _Step
                flight[key] = t0  # on the wire: one insert now, one pop when the attempt ends
                try:
                    comp = await self.backend.complete(req)
                except APIError as exc:
                    flight.pop(key, None)
                    prov = provider_of(exc)
                    self._attempt(prompt, dataset, attempts, started, exc.kind, prov)
                    self._judge(prov, exc)
                    step = await self._after_error(exc, attempts, part, limiter, dataset, prompt, keep=kept is not None)
                    if step == "retry":
                        continue
                    if step == "stop" or kept is None:
                        return
                    comp, latency, charged, unusable = kept.comp, kept.latency, kept.charged, kept.kind
                else:
                    flight.pop(key, None)
                    latency = time.monotonic() - t0
                    ended = time.time()
                    try:
                        check_tokens(comp, mt)
                        self._check_usable(comp, req.provider_ignore)
                    except RetryableAPIError as exc:  # more tokens than asked for, or unusable
                        attribute(exc, comp.provider)
                        charged = self._charge_rejected(comp, worst)
                        self._attempt(prompt, dataset, attempts, started, exc.kind, comp.provider, comp, charged,
                                      ended=ended)
                        self._judge(comp.provider, exc)
                        if isinstance(exc, UnusableResponse):
                            kept = _Kept(comp, exc.kind, latency, charged)
                            self._avoid(avoid, comp.provider)
                        step = await self._after_error(exc, attempts, part, limiter, dataset, prompt,
                                                       keep=kept is not None)
                        if step == "retry":
                            continue
                        if step == "stop" or kept is None:
                            return
                        comp, latency, charged, unusable = kept.comp, kept.latency, kept.charged, kept.kind
                # The response is in: free the slot now, so reconstruction never keeps a slot from the wire.
                slot = False
                if unusable is None:
                    limiter.on_success()
                limiter.release()
                st = self.stats
                st.in_flight[part.name] = limiter.in_use
                st.limit[part.name] = limiter.current
                self._connect_failures = 0
                self._successes += 1
                self._last_success = time.monotonic()
                quant = self.health.guard.quantization(comp.provider) if self.health is not None else None
                try:
                    rec = await loop.run_in_executor(self._cpu, partial(
                        self.assembler.build, prompt, comp, partition=part.name, max_tokens=mt, attempts=attempts,
                        latency_s=latency, prompt_ids=prompt_ids, quantization=quant,
                        extra_flags=[f"unusable:{unusable}"] if unusable else None,
                    ))
                except DraftgenError as exc:  # a tokenizer/profile problem with this one output
                    if unusable is None:
                        self._attempt(prompt, dataset, attempts, started, "reconstruction", comp.provider, comp,
                                      ended=ended)
                    self._fail(dataset, prompt, part.name, "reconstruction", str(exc), attempts, permanent=True,
                               provider=comp.provider)
                    return
                try:
                    check_record_tokens(rec, mt)
                except RetryableAPIError as exc:  # the text rebuilt to more ids than were asked for
                    attribute(exc, comp.provider)
                    if unusable is None:
                        charged = self._charge_rejected(comp, worst)
                        self._attempt(prompt, dataset, attempts, started, exc.kind, comp.provider, comp, charged,
                                      ended=ended)
                        self._judge(comp.provider, exc)
                    kept = None  # a kept response that rebuilds too long is no record either
                    step = await self._after_error(exc, attempts, part, limiter, dataset, prompt)
                    if step != "retry":
                        return
                    await limiter.acquire()  # a slot again for the next attempt
                    slot = True
                    self.stats.in_flight[part.name] = limiter.in_use
                    continue
                break
            if comp.usage is None or comp.cost_missing:
                rec.usage = self.governor.priced_usage(rec.usage, prompt_tokens=len(rec.prompt_ids or ()),
                                                       completion_tokens=len(rec.output_ids or ()))
            if unusable is None:
                billing = None
                u = rec.usage
                if self.health is not None and u is not None and rec.output_ids is not None \
                        and self.health.policy.billing_off(len(rec.output_ids), u.completion_tokens):
                    billing = "billing_off"
                self._attempt(prompt, dataset, attempts, started, "ok", comp.provider, comp, usage_cost(u), ended=ended)
                self._judge(comp.provider, billing)
            else:
                self.stats.kept_unusable[unusable] += 1
            settled = True
            self._book(dataset, comp, rec, res, latency, charged=charged)
            self._sink(dataset).put(rec)
        finally:
            flight.pop(key, None)  # cancelled or failed on the wire: no longer in flight
            if not settled:
                self.governor.release_res(res)
                self.stats.reserved = self.governor.reserved
            if slot:
                limiter.release()
                self.stats.in_flight[part.name] = limiter.in_use
            alive.release()

    # -- quality and health --------------------------------------------------------------------------------

    def _check_usable(self, comp: Completion, sent_ignore: list[str] | None) -> None:
        """Raise ``UnusableResponse`` for a response from a provider the request's routing excluded, or one
        whose reasoning text was dropped."""
        if self.health is not None:
            why = self.health.guard.excluded(comp.provider, sent_ignore)
            if why is not None:
                raise UnusableResponse(f"provider_excluded ({comp.provider}: {why}; it was served all the same)",
                                       kind="provider_excluded")
        if self.require_reasoning:
            check_reasoning(comp)

    def _ignore_for(self, avoid: list[str]) -> list[str] | None:
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

    def _avoid(self, avoid: list[str], provider: str | None) -> None:
        if provider and self.health is not None:
            slug = self.health.guard.slug(provider)
            if slug not in avoid:
                avoid.append(slug)

    def _judge(self, provider: str | None, outcome: APIError | str | None) -> None:
        """One outcome for the provider's health: a retryable error or a quality kind is bad; a permanent
        error (about the request, not the provider) is not counted."""
        if self.health is None or not provider:
            return
        if isinstance(outcome, APIError):
            if not isinstance(outcome, RetryableAPIError):
                return
            outcome = outcome.kind
        self.health.outcome(provider, outcome)

    def _attempt(self, prompt: PromptRecord, dataset: str, attempt: int, started: float, outcome: str,
                 provider: str | None, comp: Completion | None = None, cost: float = 0.0,
                 ended: float | None = None) -> None:
        """One ``AttemptRecord`` (wall-clock times; ``ended``: when the response was in, default now)."""
        sink = self._attempt_sink
        if sink is None:
            return
        u = comp.usage if comp is not None else None
        sink.put(AttemptRecord(
            sample_id=prompt.sample_id, dataset=dataset, attempt=attempt, started_at=round(started, 4),
            ended_at=round(time.time() if ended is None else ended, 4), outcome=outcome, provider=provider,
            quantization=self.health.guard.quantization(provider) if self.health is not None else None,
            ttft_s=comp.ttft_s if comp is not None else None,
            completion_tokens=u.completion_tokens if u is not None else 0, cost=cost,
        ))

    def _charge_rejected(self, comp: Completion, worst: float) -> float:
        """Book what a response rejected as invalid was billed (no record will carry it): its reported
        cost, or the cost computed from its usage, at most the request's worst case. Returns it."""
        u = comp.usage
        if u is None:
            return 0.0
        if comp.cost_missing:
            priced = self.governor.priced_usage(u, prompt_tokens=0, completion_tokens=0)
            cost = min(usage_cost(priced), worst) if priced is not u else 0.0
        else:
            cost = usage_cost(u)
        if cost > 0:
            self.governor.charge(cost)
            self.stats.spend_session = self.governor.session
            self.stats.remaining = self.governor.remaining
        return max(cost, 0.0)

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
        st.providers[comp.provider or comp.backend] += 1
        st.ids_source[rec.ids_source] += 1

    async def _after_error(self, exc: APIError, attempts: int, part: PartitionPlan, limiter: AdaptiveLimiter,
                           dataset: str, prompt: PromptRecord, *, keep: bool = False) -> _Step:
        """Decide what follows a failed attempt: ``retry`` (after the backoff), ``stop`` (given up: a failure
        is recorded, or the run is stopping), or ``keep`` (retries exhausted and ``keep``: the caller writes
        the sample's last unusable response as its record, flagged, under ``keep_unusable``)."""
        sid = prompt.sample_id
        if isinstance(exc, AuthError):
            self.request_stop(f"{exc}", exit_code=exc.exit_code, hard=True)
            return "stop"
        if isinstance(exc, PaymentRequired):
            self._fail(dataset, prompt, part.name, exc.kind, str(exc), attempts, permanent=False, status=exc.status)
            self.request_stop(f"out of credits or over the key's limit ({exc.kind}); add credits and rerun to resume",
                              exit_code=exc.exit_code)
            return "stop"
        if isinstance(exc, RateLimited):
            if limiter.on_rate_limited():
                self.stats.limit[part.name] = limiter.current
                self.log.write(f"adaptive concurrency: 429 storm, {part.name} limit lowered to {limiter.current}")
        else:
            limiter.on_other_error()
        if exc.kind in _CONNECT_KINDS:
            # A server that cannot be reached at all, or no longer: not one burst of slow connects.
            self._connect_failures += 1
            quiet = time.monotonic() - self._last_success
            if (self._connect_failures >= self.connect_failure_limit and not self._stopping
                    and (self._successes == 0 or quiet >= 60.0)):
                self.request_stop(f"cannot reach the server ({exc}); check endpoint.base_url", exit_code=1)
        if self._stopping:
            self.log.write(f"abandon {dataset}/{sid} attempt {attempts}: {exc} (stopping)")
            return "stop"
        if self.policy.should_retry(exc, attempts):
            delay = self.policy.delay(attempts, exc.retry_after)
            self.stats.retries[exc.kind] += 1
            self.stats.partition(part.name).retries += 1
            self.log.write(f"retry {dataset}/{sid} attempt {attempts}/{self.policy.max_attempts} in {delay:.2f}s: {exc}")
            task = asyncio.current_task()
            assert task is not None
            self._backoff.add(task)  # type: ignore[arg-type]
            try:
                await asyncio.sleep(delay)
            finally:
                self._backoff.discard(task)  # type: ignore[arg-type]
            return "stop" if self._stopping else "retry"
        retryable = isinstance(exc, RetryableAPIError)
        if retryable and keep and self.keep_unusable:
            self.log.write(f"kept {dataset}/{sid} after {attempts} attempt(s): its last unusable response is its "
                           f"record, flagged unusable (quality.keep_unusable); last error: {exc}")
            return "keep"
        # An unusable response is no transient error: the failure says what was wrong with it.
        kind = exc.kind if isinstance(exc, UnusableResponse) else f"retries_exhausted:{exc.kind}" if retryable else exc.kind
        self._fail(dataset, prompt, part.name, kind, str(exc), attempts, permanent=not retryable, status=exc.status,
                   provider=provider_of(exc))
        return "stop"

    def _fail(self, dataset: str, prompt: PromptRecord, partition: str, kind: str, reason: str, attempts: int, *,
              permanent: bool, status: int | None = None, provider: str | None = None) -> None:
        rec = FailureRecord(
            sample_id=prompt.sample_id, dataset=dataset, kind=kind, reason=reason, partition=partition,
            status=status, permanent=permanent, attempts=attempts, provider=provider, created_at=round(time.time(), 3),
        )
        self.stats.failures[kind] += 1
        self.stats.dataset(dataset).failed += 1
        self.stats.partition(partition).failed += 1
        self.log.write(f"failed {dataset}/{prompt.sample_id} after {attempts} attempt(s): {kind}: {reason}")
        self._fail_sink(dataset).put(rec)
