"""A finished batch's results → the same records synchronous responses make, and what becomes of the rest.

Reads a terminal batch (``backends.openrouter_batch.WireBatch``) and the prompts its items were cut
from; writes, through the run's ``Sinks``, a ``ResponseRecord`` per usable result (built by the same
``Assembler``, so reconstruction, the audit's billing check, the dropped-reasoning gate and provenance
see nothing new; ``batch_id`` and ``service_tier`` say where it came from), an ``AttemptRecord`` per item,
and a ``FailureRecord`` for an item given up.

Invariants:

- An item whose sample is already done (written before a kill, or by another path) is skipped: each
  sample is recorded once. Its reservation is released, never settled (its spend is in the raw log).
- Every other item's reservation is settled (a record: its cost booked) or released (no record).
- Records are handed to the sinks in chunks; after each chunk the sinks are flushed (durable on disk)
  before the next, so a kill -9 loses at most what was not yet durable, and the next run writes it.
- Costs: a result's own ``usage.cost`` when it carries one; otherwise its share of the batch's
  ``usage.cost`` (what OpenRouter charges for the batch), split by each result's tokens at the batch
  prices (``cost_computed``), the same split whichever run ingests it. An unusable result's cost is booked
  as spend (``BudgetGovernor.charge``) and its provider avoided by later batches.
- A failed item (an ``error`` result, a non-2xx response, no result, or a failed/expired/cancelled batch)
  goes through ``RetryPolicy.decide`` once: retried (synchronously after the batches, or in a later batch,
  by ``endpoint.batch.retry``) or given up (a ``FailureRecord``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from draftgen.backends.base import Completion, EndpointInfo
from draftgen.backends.errors import provider_of
from draftgen.backends.openrouter_batch import WireBatch, WireBatchList, result_completion
from draftgen.backends.pricing import Prices
from draftgen.engine.assemble import (
    Assembler,
    UnusableResponse,
    check_reasoning,
    check_record_tokens,
    check_tokens,
)
from draftgen.engine.budget import BudgetGovernor, usage_cost
from draftgen.engine.health import RoutingGuard
from draftgen.engine.plans import DatasetPlan
from draftgen.engine.progress import Display, RunLog
from draftgen.engine.retry import GiveUp, RetryPolicy
from draftgen.engine.sinks import Sinks
from draftgen.engine.stats import RunStats
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

__all__ = ["BatchAPI", "BatchContext", "BatchOptions", "BatchSetup", "ingest", "release_item"]

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
    batch prices (worst case over the batch endpoints routing allows) and the ``provider`` object for the
    providers still to be avoided (``backends.openrouter_batch.batch_provider``)."""

    client: BatchAPI
    model: str
    body: Callable[[PromptRecord, int], bytes]
    prices: Prices
    provider_for: Callable[[Sequence[str]], tuple[dict[str, Any] | None, list[EndpointInfo]]]
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
    avoid: list[str] = field(default_factory=list)

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


def _shares(wb: WireBatch, comps: dict[str, Completion], prices: Prices) -> dict[str, float]:
    """Each result without a cost of its own → its share of what the batch was charged beyond the costs
    the others reported (by their tokens at the batch prices)."""
    missing = {cid: c for cid, c in comps.items() if c.usage is None or c.cost_missing}
    if not missing:
        return {}
    reported = sum(usage_cost(c.usage) for cid, c in comps.items() if cid not in missing)

    def weight(c: Completion) -> float:
        u = c.usage
        return prices.cost(u.prompt_tokens, u.completion_tokens) if u is not None else prices.request

    if wb.usage is not None and wb.usage.cost is not None:
        pool = max(0.0, wb.usage.cost - reported)
    else:  # no batch cost either: price them (cost_computed all the same)
        return {cid: weight(c) for cid, c in missing.items()}
    weights = {cid: weight(c) for cid, c in missing.items()}
    total = sum(weights.values())
    if total <= 0:
        return {cid: pool / len(missing) for cid in missing}
    return {cid: pool * w / total for cid, w in weights.items()}


def _priced(comp: Completion, share: float | None) -> Completion:
    if share is None:
        return comp
    u = comp.usage if comp.usage is not None else Usage()
    return msgspec.structs.replace(comp, usage=msgspec.structs.replace(u, cost=share, cost_computed=True),
                                   cost_missing=False)


# -- one batch -----------------------------------------------------------------------------------------


@dataclass
class _Item:
    item: BatchItem
    cid: str  # its custom_id
    prompt: PromptRecord | None
    outcome: Completion | APIError


async def ingest(ctx: BatchContext, wb: WireBatch, view: BatchView, prompts: dict[tuple[str, str], PromptRecord],
                 *, started: float) -> int:
    """Records for the usable results of terminal batch ``wb`` (the journal's ``view`` of it), everything
    else retried or given up. Returns the records written."""
    results = {r.custom_id: r for r in wb.results or []}
    mine = {view.custom_id(it) for it in view.items}
    stray = [cid for cid in results if cid not in mine]
    if stray:
        ctx.log.write(f"batch {wb.id}: {len(stray)} results with custom_ids it was not submitted with are ignored "
                      f"(first: {stray[0]})")
    where = f"batch {wb.id}"
    todo: list[_Item] = []
    for it in view.items:
        if ctx.done(it.dataset, it.sample_id):
            release_item(ctx, it)  # recorded before (a run killed while ingesting): never twice
            continue
        cid = view.custom_id(it)
        res = results.get(cid)
        out: Completion | APIError
        if res is not None:
            out = result_completion(res, backend=ctx.setup.backend, where=f"{where}, {cid}")
        else:
            kind = "batch_missing_result" if wb.status == "completed" else f"batch_{wb.status}"
            why = wb.error.message if wb.error is not None and wb.error.message else f"the batch ended {wb.status}"
            out = RetryableAPIError(f"{kind} ({why}; {where})", kind=kind)
        todo.append(_Item(it, cid, prompts.get((it.dataset, it.sample_id)), out))
    shares = _shares(wb, {t.cid: t.outcome for t in todo if isinstance(t.outcome, Completion)},
                      ctx.setup.prices)
    ended = time.time()
    written = 0
    for n in range(0, len(todo), CHUNK):
        chunk = todo[n:n + CHUNK]
        written += await _chunk(ctx, wb, chunk, shares, started, ended)
        await ctx.sinks.flush()
    return written


async def _chunk(ctx: BatchContext, wb: WireBatch, chunk: list[_Item], shares: dict[str, float], started: float,
                 ended: float) -> int:
    usable: list[tuple[_Item, Completion]] = []
    for t in chunk:
        it = t.item
        ctx.attempts[(it.dataset, it.sample_id)] += 1
        out = t.outcome
        if not isinstance(out, Completion):
            _failed(ctx, t, out, started, ended, provider=provider_of(out) or wb.provider)
            continue
        comp = _priced(out, shares.get(t.cid))
        bad = _check(ctx, comp, it.max_tokens)
        if bad is None and t.prompt is None:
            bad = PermanentAPIError(f"prompt_missing ({it.sample_id} is no longer in the prepared prompts)",
                                    kind="prompt_missing")
        if bad is not None:  # billed all the same: its cost is spend
            _failed(ctx, t, bad, started, ended, cost=usage_cost(comp.usage), provider=comp.provider)
            continue
        usable.append((t, comp))
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


def _check(ctx: BatchContext, comp: Completion, max_tokens: int) -> APIError | None:
    """Why a result cannot be a record: more tokens than asked for, a provider the routing excluded, or
    reasoning dropped (``engine.assemble``); None when it can."""
    try:
        check_tokens(comp, max_tokens)
        guard = ctx.setup.guard
        if guard is not None:
            why = guard.excluded(comp.provider)
            if why is not None:
                raise UnusableResponse(f"provider_excluded ({comp.provider}: {why}; it was served all the same)",
                                       kind="provider_excluded")
        check_reasoning(comp)
    except RetryableAPIError as exc:
        return exc
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
                                      quantization=guard.quantization(comp.provider) if guard is not None else None)
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
    sink = ctx.sinks.attempts
    if sink is None:
        return
    guard = ctx.setup.guard
    u = comp.usage if comp is not None else None
    sink.put(AttemptRecord(
        sample_id=item.sample_id, dataset=item.dataset, attempt=ctx.attempts[(item.dataset, item.sample_id)],
        started_at=round(started, 4), ended_at=round(ended, 4), outcome=outcome, provider=provider,
        quantization=guard.quantization(provider) if guard is not None and provider else None,
        completion_tokens=u.completion_tokens if u is not None else 0, cost=cost,
    ))


def _failed(ctx: BatchContext, t: _Item, exc: APIError, started: float, ended: float, *, cost: float = 0.0,
            provider: str | None = None) -> None:
    """An item with no record: its reservation released (``cost`` booked if billed), then retried or
    given up once (``RetryPolicy.decide``)."""
    it = t.item
    release_item(ctx, it, cost)
    _attempt(ctx, it, started, ended, exc.kind, provider, cost=cost)
    if isinstance(exc, UnusableResponse) and provider and ctx.setup.guard is not None:
        slug = ctx.setup.guard.slug(provider)
        if slug not in ctx.avoid:
            ctx.avoid.append(slug)
            ctx.display.print(f"batch results from {provider} are unusable ({exc.kind}); later batches avoid it")
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
