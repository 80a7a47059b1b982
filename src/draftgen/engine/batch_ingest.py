"""A finished batch's results → the same records synchronous responses make, and what becomes of the rest.

Reads a terminal batch (``backends.openrouter_batch.WireBatch``) and the prompts its items were cut
from; writes, through the run's ``Sinks``, a ``ResponseRecord`` per usable result (built by the same
``Assembler``, so reconstruction, the audit's billing check, the dropped-reasoning gate and provenance
see nothing new; ``batch_id`` and ``service_tier`` say where it came from), an ``AttemptRecord`` per result
(and per dollar billed beyond them), and a ``FailureRecord`` for an item given up.

Invariants:

- Every result goes through the one intake of every response (``intake.check_response``: tokens, model,
  providers, completeness, reasoning, as for sync): a result of another model, without a finish reason or
  cut short is unusable, never a record, never done; its sample is retried like a failed item (below).
- One record per sample: of the results carrying an item's custom_id, the first usable one is its record;
  every other one is booked as spend with no record (a usable one as ``batch_duplicate``). A result with a
  custom_id the batch was not submitted with (``batch_stray``) is booked the same way.
- An item whose sample is already done (written before a kill, or by another path) is skipped: each
  sample is recorded once. Its reservation is released, never settled (its spend is in the raw log).
- Every other item's reservation is settled (a record: its cost booked) or released (no record).
- Records are handed to the sinks in chunks; after each chunk the sinks are flushed (durable on disk)
  before the next, so a kill -9 loses at most what was not yet durable, and the next run writes it.
- Costs: a result's own ``usage.cost`` when it carries one (a negative or unreadable one is none);
  otherwise its share of the batch's ``usage.cost`` (what OpenRouter charges for the batch, read by
  ``WireBatch.cost``), split by each result's tokens at the batch prices (``cost_computed``), the same split
  whichever run ingests it; a result whose body could not be read, what its usage says (at the batch
  prices). A result with no record has its cost booked as spend (``BudgetGovernor.charge``); an unusable
  one's provider is avoided by later batches and by the sample's synchronous retry (``avoid_for``).
- Booked equals billed: what the batch billed beyond the costs of all its results (``intake.unattributed``)
  is booked as spend with no record, logged, and shown on the batch's line (``engine.batch``), so the
  dollars left are computed from what the server billed.
- A failed item (an ``error`` result, a non-2xx response, an unusable result, no result, or a
  failed/expired/cancelled batch) goes through ``RetryPolicy.decide`` once: retried (synchronously after
  the batches, or in a later batch, by ``endpoint.batch.retry``) or given up (a ``FailureRecord``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from draftgen.backends.base import Completion, EndpointInfo
from draftgen.backends.errors import attribute, billing_of, provider_of
from draftgen.backends.openrouter_batch import WireBatch, WireBatchList, result_completion
from draftgen.backends.pricing import Prices
from draftgen.engine.assemble import Assembler, UnusableResponse, check_record_tokens
from draftgen.engine.budget import BudgetGovernor, usage_cost
from draftgen.engine.health import RoutingGuard
from draftgen.engine.intake import IntakeRules, check_response, unattributed
from draftgen.engine.plans import DatasetPlan
from draftgen.engine.progress import Display, RunLog
from draftgen.engine.prompts import estimate_prompt_tokens
from draftgen.engine.retry import GiveUp, RetryPolicy
from draftgen.engine.sinks import Sinks
from draftgen.engine.stats import RunStats
from draftgen.engine.usable import record_flags
from draftgen.errors import APIError, PermanentAPIError, RetryableAPIError
from draftgen.records import (
    AttemptRecord,
    BatchItem,
    BatchView,
    FailureRecord,
    PromptRecord,
    ResponseRecord,
    Usage,
)

__all__ = ["BatchAPI", "BatchContext", "BatchOptions", "BatchSetup", "Ingested", "ingest", "release_item"]

#: records handed to the sinks between two flushes
CHUNK = 256


class BatchAPI(Protocol):
    """The Batch API calls the engine makes (``backends.openrouter_batch.BatchClient``)."""

    async def submit(self, body: bytes) -> WireBatch: ...

    async def retrieve(self, batch_id: str, *, cap: int = ...) -> WireBatch: ...

    async def list_page(self, *, after: str | None = None, limit: int = 100) -> WireBatchList: ...


@dataclass(frozen=True)
class BatchOptions:
    """``endpoint.batch.*`` and ``retry.max_attempts`` as the engine uses them. ``cut``: cut new batches
    (false: only finish the batches the journal holds open, ``endpoint.mode: sync`` after batch runs)."""

    max_requests: int = 5000
    max_bytes: int = 200_000_000
    max_open: int = 20
    retry: Literal["sync", "batch"] = "sync"
    poll_interval_s: float = 30.0
    poll_max_interval_s: float = 600.0
    cut: bool = True
    fsync: bool = True


@dataclass
class BatchSetup:
    """What the run's batches are made of: the client, the batch-level model, each request's body, the
    batch prices (worst case over the batch endpoints routing allows), the ``provider`` object for the
    providers still to be avoided (``backends.openrouter_batch.batch_provider``), and what every result is
    held to (``intake``: the run's ``IntakeRules``, the same as its synchronous responses')."""

    client: BatchAPI
    model: str
    body: Callable[[PromptRecord, int], bytes]
    prices: Prices
    provider_for: Callable[[Sequence[str]], tuple[dict[str, Any] | None, list[EndpointInfo]]]
    intake: IntakeRules
    guard: RoutingGuard | None = None
    backend: str = "openrouter"


@dataclass
class BatchContext:
    """The run's books, shared by the scheduler (``engine.batch``) and ingestion."""

    setup: BatchSetup
    assembler: Assembler
    governor: BudgetGovernor
    policy: RetryPolicy
    stats: RunStats
    log: RunLog
    display: Display
    sinks: Sinks
    options: BatchOptions
    datasets: dict[str, DatasetPlan]
    cpu: Executor | None = None
    written: set[tuple[str, str]] = field(default_factory=set)
    attempts: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: ``retry: batch``: failed items waiting for a later batch (dataset, prompt, partition, max_tokens)
    retry: list[tuple[str, PromptRecord, str, int]] = field(default_factory=list)
    #: ``retry: sync``: items left for the synchronous requests after the batches
    to_sync: int = 0
    #: providers (slugs) whose results were unusable: later batches leave them out of ``provider.only``
    avoid: list[str] = field(default_factory=list)
    #: (dataset, sample id) → providers (slugs) that gave it an unusable result: its synchronous retry avoids them
    avoid_for: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def done(self, dataset: str, sample_id: str) -> bool:
        plan = self.datasets.get(dataset)
        return (dataset, sample_id) in self.written or (plan is not None and sample_id in plan.done)


def release_item(ctx: BatchContext, item: BatchItem, cost: float = 0.0) -> None:
    """Release an item's reservation (no record), booking ``cost`` if it was billed all the same."""
    ctx.governor.release(item.dataset, item.max_tokens, item.usd, cost, worst_usd=item.usd)
    ctx.stats.reserved = ctx.governor.reserved
    ctx.stats.spend_session = ctx.governor.session
    ctx.stats.remaining = ctx.governor.remaining


# -- costs ---------------------------------------------------------------------------------------------


def _own_cost(ctx: BatchContext, out: Completion | APIError, worst_usd: float,
              prompt_tokens: int) -> tuple[float | None, float]:
    """A result's own cost (None when it reported none that can be read) and its weight in the batch's
    cost: its tokens (or, for a body that could not be read, its text) at the batch prices. An error that
    says nothing of a bill costs nothing."""
    prices = ctx.setup.prices
    if isinstance(out, Completion):
        u = out.usage
        weight = prices.cost(u.prompt_tokens, u.completion_tokens) if u is not None else prices.request
        return (None if u is None or out.cost_missing else usage_cost(u)), weight
    b = billing_of(out)
    if b is None:
        return 0.0, 0.0
    if b.usage is not None and b.cost_known:
        return usage_cost(b.usage), 0.0
    return None, ctx.governor.billed_cost(b, worst_usd, prompt_tokens, prices=prices)


def _shares(billed: float | None, known: dict[int, float], weights: dict[int, float]) -> dict[int, float]:
    """Each result without a cost of its own (``weights``) → its share of what the batch was charged
    beyond the costs the others reported (``known``), by weight; its weight itself (the batch prices)
    when the batch said no cost either."""
    if billed is None:
        return dict(weights)
    pool = max(0.0, billed - sum(known.values()))
    total = sum(weights.values())
    if total <= 0:
        return {i: pool / len(weights) for i in weights}
    return {i: pool * w / total for i, w in weights.items()}


def _priced(comp: Completion, share: float | None) -> Completion:
    if share is None:
        return comp
    u = comp.usage if comp.usage is not None else Usage()
    return msgspec.structs.replace(comp, usage=msgspec.structs.replace(u, cost=share, cost_computed=True),
                                   cost_missing=False)


# -- one batch -----------------------------------------------------------------------------------------


@dataclass
class _Arrival:
    """One result as it came: its custom_id (of any type), what it is, and what it cost."""

    cid: Any
    out: Completion | APIError
    cost: float = 0.0


@dataclass
class _Item:
    item: BatchItem
    cid: str  # its custom_id
    prompt: PromptRecord | None
    arrivals: list[_Arrival]  # every result carrying its custom_id, in order; a missing one's error if none


@dataclass
class Ingested:
    """What ingesting one batch did: records written, what the server billed (``WireBatch.cost``), the
    costs of its results, and the remainder booked as spend with no record (``intake.unattributed``);
    ``duplicates``: results beyond one per request; ``strays``: results it was not submitted with."""

    written: int = 0
    billed: float | None = None
    results_cost: float = 0.0
    unattributed: float = 0.0
    duplicates: int = 0
    strays: int = 0


def _arrivals(ctx: BatchContext, wb: WireBatch, view: BatchView,
              prompts: dict[tuple[str, str], PromptRecord]) -> list[_Arrival]:
    """Every result of ``wb``, decoded and priced: its own cost, else its share of the batch's."""
    where = f"batch {wb.id}"
    items = {view.custom_id(it): it for it in view.items}
    out: list[_Arrival] = []
    known: dict[int, float] = {}
    weights: dict[int, float] = {}
    for i, r in enumerate(wb.results or []):
        got = result_completion(r, backend=ctx.setup.backend, where=f"{where}, {r.custom_id}")
        it = items.get(r.custom_id) if isinstance(r.custom_id, str) else None
        p = prompts.get((it.dataset, it.sample_id)) if it is not None else None
        cost, weight = _own_cost(ctx, got, it.usd if it is not None else math.inf,
                                 estimate_prompt_tokens(p) if p is not None else 0)
        if cost is None:
            weights[i] = weight
        else:
            known[i] = cost
        out.append(_Arrival(r.custom_id, got, cost or 0.0))
    for i, share in _shares(wb.cost, known, weights).items():
        a = out[i]
        a.cost = share
        if isinstance(a.out, Completion):
            a.out = _priced(a.out, share)
    return out


async def ingest(ctx: BatchContext, wb: WireBatch, view: BatchView, prompts: dict[tuple[str, str], PromptRecord],
                 *, started: float) -> Ingested:
    """Records for the usable results of terminal batch ``wb`` (the journal's ``view`` of it), everything
    else retried or given up, and every dollar it was billed booked (module docstring)."""
    arrivals = _arrivals(ctx, wb, view, prompts)
    mine: dict[str, list[_Arrival]] = {view.custom_id(it): [] for it in view.items}
    strays: list[_Arrival] = []
    for a in arrivals:
        (mine[a.cid] if isinstance(a.cid, str) and a.cid in mine else strays).append(a)
    rep = Ingested(billed=wb.cost, results_cost=sum(a.cost for a in arrivals), strays=len(strays),
                   duplicates=sum(max(0, len(v) - 1) for v in mine.values()))
    where = f"batch {wb.id}"
    todo: list[_Item] = []
    for it in view.items:
        if ctx.done(it.dataset, it.sample_id):
            release_item(ctx, it)  # recorded before (a run killed while ingesting): never twice
            continue
        cid = view.custom_id(it)
        got = mine[cid]
        if not got:
            kind = "batch_missing_result" if wb.status == "completed" else f"batch_{wb.status}"
            why = wb.error.message if wb.error is not None and wb.error.message else f"the batch ended {wb.status}"
            got = [_Arrival(cid, RetryableAPIError(f"{kind} ({why}; {where})", kind=kind))]
        todo.append(_Item(it, cid, prompts.get((it.dataset, it.sample_id)), got))
    ended = time.time()
    for n in range(0, len(todo), CHUNK):
        rep.written += await _chunk(ctx, wb, todo[n:n + CHUNK], started, ended)
        await ctx.sinks.flush()
    _book_beyond(ctx, wb, rep, strays, started, ended)
    return rep


def _book_beyond(ctx: BatchContext, wb: WireBatch, rep: Ingested, strays: list[_Arrival], started: float,
                 ended: float) -> None:
    """Book what no request of the batch accounts for: its strays' costs, then what it billed beyond all
    its results' costs (``intake.unattributed``); each an ``AttemptRecord`` the next run's budget reads."""
    for a in strays:
        _spend(ctx, "", str(a.cid), started, ended, "batch_stray", wb.provider, a.cost, 1)
    if strays:
        ctx.log.write(f"batch {wb.id}: {len(strays)} results with custom_ids it was not submitted with "
                      f"(first: {strays[0].cid!r}): no record; ${sum(a.cost for a in strays):.6f} booked as spend")
    rep.unattributed = unattributed(rep.billed, rep.results_cost)
    if rep.unattributed > 0:
        _spend(ctx, "", wb.id, started, ended, "batch_unattributed", wb.provider, rep.unattributed, 1)
        ctx.log.write(f"batch {wb.id}: billed ${rep.billed or 0.0:.6f}, its results' costs ${rep.results_cost:.6f}; "
                      f"the ${rep.unattributed:.6f} beyond them is booked as spend with no record")


async def _chunk(ctx: BatchContext, wb: WireBatch, chunk: list[_Item], started: float, ended: float) -> int:
    usable: list[tuple[_Item, Completion]] = []
    for t in chunk:
        it = t.item
        ctx.attempts[(it.dataset, it.sample_id)] += 1
        chosen = _choose(ctx, wb, t, started, ended)
        if chosen is not None:
            usable.append((t, chosen))
    if not usable:
        return 0
    latency = max(0.0, ended - started)
    recs = await asyncio.get_running_loop().run_in_executor(ctx.cpu, _build_all, ctx, usable, latency)
    n = 0
    for (t, comp), rec in zip(usable, recs, strict=True):
        if isinstance(rec, APIError):
            _failed(ctx, t, rec, started, ended, cost=usage_cost(comp.usage), provider=comp.provider)
            continue
        rec.batch_id = wb.id
        _write(ctx, t.item, comp, rec, started, ended)
        n += 1
    return n


def _choose(ctx: BatchContext, wb: WireBatch, t: _Item, started: float, ended: float) -> Completion | None:
    """The first of an item's results that passes the intake (``intake.check_response``), to become its
    record. Every other result is booked as spend with no record (a usable one as ``batch_duplicate``); with
    none usable, the last failure is retried or given up (``_failed``) and the others are only booked."""
    it = t.item
    chosen: Completion | None = None
    failures: list[tuple[_Arrival, APIError]] = []
    for a in t.arrivals:
        out = a.out
        bad = _check(ctx, out, it.max_tokens) if isinstance(out, Completion) else out
        if bad is None and t.prompt is None:
            bad = PermanentAPIError(f"prompt_missing ({it.sample_id} is no longer in the prepared prompts)",
                                    kind="prompt_missing")
        if bad is None and chosen is None:
            assert isinstance(out, Completion)
            chosen = out
        elif bad is None:
            assert isinstance(out, Completion)
            _extra(ctx, t, started, ended, "batch_duplicate", out.provider, a.cost)
        else:
            failures.append((a, bad))
    last = None if chosen is not None or not failures else failures.pop()
    for a, bad in failures:
        _extra(ctx, t, started, ended, bad.kind, _provider(a.out, wb), a.cost, bad)
    if last is not None:
        a, bad = last
        _failed(ctx, t, bad, started, ended, cost=a.cost, provider=_provider(a.out, wb))
    if len(t.arrivals) > 1:
        ctx.log.write(f"batch {wb.id}: {len(t.arrivals)} results for {t.cid}: "
                      + ("the first usable one is its record, " if chosen is not None else "")
                      + "the others are booked as spend with no record")
    return chosen


def _provider(out: Completion | APIError, wb: WireBatch) -> str | None:
    return out.provider if isinstance(out, Completion) else provider_of(out) or wb.provider


def _check(ctx: BatchContext, comp: Completion, max_tokens: int) -> APIError | None:
    """Why a result cannot be a record (``intake.check_response``, as every response); None when it can."""
    try:
        check_response(comp, max_tokens, ctx.setup.intake, guard=ctx.setup.guard)
    except RetryableAPIError as exc:
        return attribute(exc, comp.provider)
    return None


def _build_all(ctx: BatchContext, usable: list[tuple[_Item, Completion]], latency: float) -> list[ResponseRecord | APIError]:
    """The records of a chunk (in the CPU pool): built by the run's ``Assembler``, then size-checked."""
    out: list[ResponseRecord | APIError] = []
    guard = ctx.setup.guard
    for t, comp in usable:
        assert t.prompt is not None
        it = t.item
        try:
            rec = ctx.assembler.build(t.prompt, comp, partition=it.partition, max_tokens=it.max_tokens,
                                      attempts=ctx.attempts[(it.dataset, it.sample_id)], latency_s=latency,
                                      quantization=guard.quantization(comp.provider) if guard is not None else None,
                                      extra_flags=record_flags(comp, t.prompt.tools))
            check_record_tokens(rec, it.max_tokens)
        except APIError as exc:
            out.append(exc)
            continue
        except Exception as exc:  # a tokenizer/profile problem with this one output: a failure, not a crash
            out.append(PermanentAPIError(f"reconstruction ({type(exc).__name__}: {exc})", kind="reconstruction"))
            continue
        out.append(rec)
    return out


def _write(ctx: BatchContext, item: BatchItem, comp: Completion, rec: ResponseRecord, started: float,
           ended: float) -> None:
    """Settle the item's reservation at the record's cost, book it, queue the record and its attempt."""
    u = rec.usage
    tokens = u.completion_tokens if u is not None and u.completion_tokens else len(rec.output_ids or ())
    gov, st = ctx.governor, ctx.stats
    cost = gov.settle(item.dataset, item.max_tokens, item.usd, u, completion_tokens=tokens, worst_usd=item.usd)
    counts, part = st.dataset(item.dataset), st.partition(item.partition)
    counts.completion_tokens += tokens
    counts.prompt_tokens += u.prompt_tokens if u is not None else 0
    counts.cost += cost
    part.completion_tokens += tokens
    part.cost += cost
    st.spend_session, st.reserved, st.remaining = gov.session, gov.reserved, gov.remaining
    st.providers[comp.provider or comp.backend] += 1
    st.ids_source[rec.ids_source] += 1
    ctx.written.add((item.dataset, item.sample_id))
    _attempt(ctx, item, started, ended, "ok", comp.provider, comp, cost)
    ctx.sinks.responses(item.dataset).put(rec)


def _attempt(ctx: BatchContext, item: BatchItem, started: float, ended: float, outcome: str, provider: str | None,
             comp: Completion | None = None, cost: float = 0.0) -> None:
    u = comp.usage if comp is not None else None
    _attempt_row(ctx, item.dataset, item.sample_id, started, ended, outcome, provider, cost,
                 ctx.attempts[(item.dataset, item.sample_id)], u.completion_tokens if u is not None else 0)


def _attempt_row(ctx: BatchContext, dataset: str, sample_id: str, started: float, ended: float, outcome: str,
                 provider: str | None, cost: float, attempt: int, completion_tokens: int = 0) -> None:
    sink = ctx.sinks.attempts
    if sink is None:
        return
    guard = ctx.setup.guard
    sink.put(AttemptRecord(
        sample_id=sample_id, dataset=dataset, attempt=attempt, started_at=round(started, 4),
        ended_at=round(ended, 4), outcome=outcome, provider=provider,
        quantization=guard.quantization(provider) if guard is not None and provider else None,
        completion_tokens=completion_tokens, cost=cost,
    ))


def _spend(ctx: BatchContext, dataset: str, sample_id: str, started: float, ended: float, outcome: str,
           provider: str | None, cost: float, attempt: int) -> None:
    """Book ``cost``, billed with no record and no reservation of its own (``BudgetGovernor.charge``), as an
    ``AttemptRecord`` with that cost (the next run's budget reads it: ``store.scan_attempt_spend``)."""
    gov, st = ctx.governor, ctx.stats
    gov.charge(cost)
    st.spend_session, st.remaining = gov.session, gov.remaining
    _attempt_row(ctx, dataset, sample_id, started, ended, outcome, provider, cost, attempt)


def _extra(ctx: BatchContext, t: _Item, started: float, ended: float, outcome: str, provider: str | None,
           cost: float, exc: APIError | None = None) -> None:
    """A result of an item beyond the one that decides it (a duplicate custom_id): booked, never a record;
    an unusable one's provider is avoided all the same."""
    it = t.item
    _spend(ctx, it.dataset, it.sample_id, started, ended, outcome, provider, cost,
           ctx.attempts[(it.dataset, it.sample_id)])
    if exc is not None:
        _avoid(ctx, t, exc, provider)


def _avoid(ctx: BatchContext, t: _Item, exc: APIError, provider: str | None) -> None:
    """An unusable result's provider: avoided by later batches (their ``provider.only``) and by the
    sample's synchronous retry (``avoid_for``)."""
    if not isinstance(exc, UnusableResponse) or not provider or ctx.setup.guard is None:
        return
    slug = ctx.setup.guard.slug(provider)
    mine = ctx.avoid_for.setdefault((t.item.dataset, t.item.sample_id), [])
    if slug not in mine:
        mine.append(slug)
    if slug not in ctx.avoid:
        ctx.avoid.append(slug)
        ctx.display.print(f"batch results from {provider} are unusable ({exc.kind}); later batches avoid it")


def _failed(ctx: BatchContext, t: _Item, exc: APIError, started: float, ended: float, *, cost: float = 0.0,
            provider: str | None = None) -> None:
    """An item with no record: its reservation released (``cost`` booked if billed), then retried or
    given up once (``RetryPolicy.decide``)."""
    it = t.item
    release_item(ctx, it, cost)
    _attempt(ctx, it, started, ended, exc.kind, provider, cost=cost)
    _avoid(ctx, t, exc, provider)
    tries = ctx.attempts[(it.dataset, it.sample_id)]
    decision = ctx.policy.decide(exc, tries)
    if not isinstance(decision, GiveUp) and t.prompt is not None:
        if ctx.options.retry == "batch":
            ctx.retry.append((it.dataset, t.prompt, it.partition, it.max_tokens))
        else:
            ctx.to_sync += 1
        ctx.stats.retries[exc.kind] += 1
        ctx.stats.partition(it.partition).retries += 1
        return
    kind = decision.kind if isinstance(decision, GiveUp) else exc.kind
    permanent = decision.permanent if isinstance(decision, GiveUp) else True
    ctx.stats.failures[kind] += 1
    ctx.stats.dataset(it.dataset).failed += 1
    ctx.stats.partition(it.partition).failed += 1
    ctx.log.write(f"failed {it.dataset}/{it.sample_id} after {tries} attempt(s): {kind}: {exc}")
    ctx.sinks.failures(it.dataset).put(FailureRecord(
        sample_id=it.sample_id, dataset=it.dataset, kind=kind, reason=str(exc), partition=it.partition,
        status=exc.status, permanent=permanent, attempts=tries, provider=provider, created_at=round(time.time(), 3)))
