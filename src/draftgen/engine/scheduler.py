"""The generation engine: per-partition producers → bounded sample tasks → one writer per file.

Flow, per partition (``short``, ``long``), each with its own ``AdaptiveLimiter`` (concurrency) and
``max_tokens``, so a slow long request never holds a short slot:

    producer: take a slot → pick the next admissible prompt (file order, dataset order; a dataset
              blocked by its token budget lets the next one go) → reserve tokens and dollars → spawn
    task:     [prompt ids for SGLang] → attempts with backoff → release the slot → build the record in
              the CPU pool → settle the budget → queue the record on the dataset's raw sink
              (``sample.SampleRunner``: the per-sample state machine; ``sinks.Sinks``: the writers)

Reads each dataset's ``prompts.jsonl`` (``DatasetPlan``); writes, through ``Sinks``, its
``raw_responses.jsonl`` and ``failures.jsonl`` and the run's ``logs/attempts.jsonl`` and
``logs/health.jsonl``. Its knobs are one ``EngineOptions`` (``plans``).

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
- The tail (``tail.TailGuard``, four times a second): a stream under the rate floor is cancelled and retried
  elsewhere; once a partition's producer has nothing left to start, its stalled requests may be hedged on
  idle slots (a hedge takes a slot and a reservation of its own, so requests on the wire ≤ slots still
  holds); hedges left on the wire at the end are cancelled with the samples.
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
from typing import Any

from draftgen.backends.base import Backend
from draftgen.engine.assemble import Assembler
from draftgen.engine.budget import Admission, BudgetGovernor, Reservation
from draftgen.engine.health import ProviderHealth
from draftgen.engine.limiter import AdaptiveLimiter
from draftgen.engine.plans import DatasetPlan, EngineOptions, EngineResult, PartitionPlan
from draftgen.engine.progress import Display, RunLog
from draftgen.engine.prompts import PromptCursor, estimate_prompt_tokens
from draftgen.engine.retry import RetryPolicy
from draftgen.engine.sample import SampleRunner
from draftgen.engine.sinks import Sinks
from draftgen.engine.stats import RunStats
from draftgen.engine.tail import TailGuard
from draftgen.records import HealthEvent, PromptRecord

__all__ = ["DatasetPlan", "Engine", "EngineOptions", "EngineResult", "PartitionPlan"]

#: seconds between two looks of the tail guard at the requests on the wire
TAIL_LOOK_S = 0.25


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
        health: ProviderHealth | None = None,
        options: EngineOptions | None = None,
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
        self.health = health
        self.options = opts = options if options is not None else EngineOptions()
        self.limiters: dict[str, AdaptiveLimiter] = {}
        self.sinks = Sinks(self.datasets, stats, fsync=opts.fsync, attempts_path=opts.attempts_path,
                           health_path=opts.health_path)
        self._tasks: set[asyncio.Task[None]] = set()
        self._backoff: set[asyncio.Task[Any]] = set()
        self._producers: list[asyncio.Task[None]] = []
        self._samples: SampleRunner | None = None
        self._guard: TailGuard | None = None
        self._drained: set[str] = set()  # partitions whose producer has no prompt left to start
        self._taken: dict[str, set[str]] = {d.name: set() for d in self.datasets}
        self._stop_reason: str | None = None
        self._exit_code = 0
        self._stopping = False
        self._hard = False
        self._deadline: float | None = None
        self._fatal: BaseException | None = None
        self._cpu: ThreadPoolExecutor | None = None
        self._io: ThreadPoolExecutor | None = None
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
            self._deadline = time.monotonic() + self.options.grace_s
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

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- main ----------------------------------------------------------------------------------------------

    async def run(self) -> EngineResult:
        loop = asyncio.get_running_loop()
        self._cpu = ThreadPoolExecutor(self.options.cpu_workers, thread_name_prefix="draftgen-cpu")
        self._io = ThreadPoolExecutor(2, thread_name_prefix="draftgen-io")
        self._samples = SampleRunner(
            host=self, backend=self.backend, assembler=self.assembler, governor=self.governor, policy=self.policy,
            stats=self.stats, log=self.log, health=self.health, options=self.options, sinks=self.sinks,
            cpu=self._cpu, backoff=self._backoff,
        )
        self._guard = TailGuard(self.options.tail, self.stats, hedge=self._samples.race.hedge,
                                drained=self._drained.__contains__, stalled=self._stalled)
        next_look = 0.0
        try:
            self.sinks.open(self._io)
            if not self.governor.slots_worst:  # near the dollar cap: see budget.BudgetGovernor.near_cap
                self.governor.slots_worst = sum(p.concurrency * self.governor.prices.worst_case(0, p.max_tokens)
                                                for p in self.partitions)
            for ds in self.datasets:
                for pname, n in ds.pending.items():
                    if any(p.name == pname for p in self.partitions):
                        self.stats.partition(pname).planned += n
            for part in self.partitions:
                self.stats.partition(part.name).max_tokens = part.max_tokens  # what the ETA's lengths end at
                lim = AdaptiveLimiter(part.concurrency, adaptive=self.options.adaptive)
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
                now = time.monotonic()
                if now >= next_look:  # the requests on the wire: stalls, slow streams, hedges
                    next_look = now + TAIL_LOOK_S
                    self._guard.tick(now, hedging=not self._stopping)
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
        tasks: list[asyncio.Task[Any]] = list(self._tasks)
        if self._samples is not None:
            tasks += list(self._samples.race.hedging)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*self._producers, *tasks, return_exceptions=True)
        errors = await self.sinks.close()  # StorageError: re-raised below
        if self._cpu is not None:
            self._cpu.shutdown(wait=True, cancel_futures=True)
        if self._io is not None:
            self._io.shutdown(wait=True)
        if errors and self._fatal is None:
            self._fatal = errors[0]

    def _stalled(self, partition: str, n: int) -> None:
        lim = self.limiters.get(partition)
        if lim is not None:
            lim.set_stalled(n)

    # -- health --------------------------------------------------------------------------------------------

    def _health_event(self, ev: HealthEvent, line: str) -> None:
        self.sinks.health(ev)
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
            if spawned < part.concurrency and self.options.ramp_s > 0:
                due = start + self.options.ramp_s * spawned / part.concurrency
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
                if not self._stopping:
                    self._drained.add(part.name)  # nothing left to start: its idle slots may hedge
                return
            dataset, prompt, res = picked
            self.stats.in_flight[part.name] = limiter.in_use
            spawned += 1
            assert self._samples is not None  # made by ``run`` before the producers
            task = loop.create_task(self._samples.run(part, limiter, alive, dataset, prompt, res))
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
                self.request_stop(gov.stop_message(res.usd, res.worst_usd), exit_code=1)
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
