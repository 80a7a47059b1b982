"""``endpoint.mode: batch``: prompts cut into OpenRouter batches, submitted, polled, and their results
recorded as synchronous responses are, crash-safe by construction.

Reads each dataset's ``prompts.jsonl`` (``DatasetPlan``) and the batch journal (``BatchJournal``, path from
``rundir.RunDir.batch_journal``); writes the journal, and through ``Sinks`` the raw logs, failures and
attempts (``engine.batch_ingest``). The Batch API is ``BatchSetup.client``
(``backends.openrouter_batch.BatchClient``).

A batch's steps, each journalled (fsynced) before the next starts:

    cut       pending prompts (a ``retry: batch`` queue first, then file order) until a limit binds:
              ``max_requests``, ``max_bytes`` of the submission, or the budgets (below)
    prepared  items, fingerprint, model, provider filter → the journal; the worst case is reserved
    submit    POST; its id → the journal (``submitted``)
    poll      GET after ``poll_interval_s``, then waits growing by half up to ``poll_max_interval_s``; a
              changed status or count → the journal (``status``)
    ingest    a terminal status: the results → records (durable), then ``finished`` → the journal

Crash safety (kill -9 at any point, then rerun): every batch the journal holds open is resumed, never cut
again and never generated synchronously. One that is ``prepared`` without an id may or may not have
reached OpenRouter. Its key is in every custom_id it was submitted with, and the Batch API echoes nothing
else of a submission (no metadata; custom_ids only in the results, which come with a terminal status). So
the account's batches with its model and request count, created since it was prepared (less a few
seconds of clock skew) and not known to the journal, are candidates: one whose results carry its
custom_ids is it, adopted (``submitted``, ``adopted``) and ingested; one whose results do not, or that
ended without results (nothing to record, nothing billed), is not; while a candidate still runs it is
waited for. Only when no candidate is left is the batch submitted, the same body again (its fingerprint
checked; a batch whose prompts changed is ``abandoned``). One with an id is polled again. Ingestion skips
samples already in a raw log. So each sample is paid for once and recorded once.

Budgets: a batch reserves the worst case of every item at batch prices (prompt estimate × prompt price +
max_tokens × completion price) against the dollar budget and max_tokens against its dataset's token
budget, from ``prepared`` until its results are in; a batch is cut only as large as what is left of both
(``BudgetGovernor.check_dollars``, ``TokenBudget.check``). When nothing fits while batches are open, cutting
waits for them. What a finished batch billed is booked in full (``batch_ingest``: beyond its results'
costs too), and later batches are cut against it. So spend passes ``max_spend_usd`` only by what the
batches open at once were billed beyond their reservations (``spent <= max_spend + Σ open batches (billed
- reserved)``): never while the server bills at most the listed batch prices for the prompts submitted;
a server that bills more (the sync price, a duplicate, a result for no request) passes it by that excess
of the batches in flight, and nothing is cut after it.

Stop (signal, budget, a refused submission): nothing new is cut or submitted; the open batches stay open
at OpenRouter and in the journal; the next run collects them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from draftgen.backends.errors import provider_of
from draftgen.backends.openrouter_batch import WireBatch, encode_submission, request_item, results_cap
from draftgen.engine.batch_ingest import BatchContext, Ingested, ingest, release_item
from draftgen.engine.batch_journal import BatchJournal, batch_lines, load_prompts
from draftgen.engine.budget import RAISE_BUDGET, Admission
from draftgen.engine.plans import EngineResult, PartitionPlan
from draftgen.engine.prompts import PromptCursor, estimate_prompt_tokens
from draftgen.errors import APIError, AuthError, PaymentRequired, PermanentAPIError
from draftgen.records import BatchEvent, BatchItem, BatchView, PromptRecord
from draftgen.records.batches import apply_event, custom_id

__all__ = ["BatchRunner"]

#: how far before its ``prepared`` time a batch found on the account may have been created (clock skew
#: between this machine and OpenRouter's; NTP keeps it well under this)
ADOPT_SKEW_S = 5.0
#: how often the batches' summary line is printed while they run
SUMMARY_EVERY_S = 60.0


@dataclass
class _Open:
    """A batch the journal holds open, as this run drives it."""

    view: BatchView
    prompts: dict[tuple[str, str], PromptRecord] = field(default_factory=dict)
    body: bytes | None = None
    next_poll: float = 0.0
    interval: float = 0.0
    failures: int = 0  # submissions or polls failed in a row
    foreign: set[str] = field(default_factory=set)  # account batches seen ended and found not to be this one
    undecided: int = 0  # account batches that may be this one, still running


@dataclass
class _Cut:
    key: str
    items: list[BatchItem] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    prompts: dict[tuple[str, str], PromptRecord] = field(default_factory=dict)
    usd: float = 0.0
    tokens: Counter[str] = field(default_factory=Counter)
    size: int = 0
    refused_usd: float = 0.0  # the worst case of the first prompt the dollars left could not cover


class BatchRunner:
    """Drives a run's batches (module docstring); ``run`` returns when none is open and nothing is left
    to cut, or the run stops."""

    def __init__(self, ctx: BatchContext, partitions: list[PartitionPlan], journal: BatchJournal) -> None:
        self.ctx = ctx
        self.partitions = {p.name: p for p in partitions}
        self.journal = journal
        self._open: dict[str, _Open] = {}
        self._views: dict[str, BatchView] = {}
        self._taken: dict[str, set[str]] = {d: set() for d in ctx.datasets}
        self._cursors: list[PromptCursor] | None = None
        self._stop_reason: str | None = None
        self._exit_code = 0
        self._stopping = False
        self._wake = asyncio.Event()
        self._last_summary = 0.0
        self._seq = 0

    # -- control -------------------------------------------------------------------------------------------

    def request_stop(self, reason: str, *, exit_code: int = 1, hard: bool = False, grace: bool = False) -> None:
        """Stop cutting, submitting and polling (first reason wins); open batches stay open."""
        if self._stop_reason is None:
            self._stop_reason, self._exit_code = reason, exit_code
            self.ctx.stats.stopping = reason
        self._stopping = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def open_batches(self) -> list[BatchView]:
        return [o.view for o in self._open.values()]

    # -- main ----------------------------------------------------------------------------------------------

    async def run(self) -> EngineResult:
        ctx = self.ctx
        ctx.cpu = ThreadPoolExecutor(2, thread_name_prefix="draftgen-batch-cpu")
        io = ThreadPoolExecutor(2, thread_name_prefix="draftgen-batch-io")
        ctx.sinks.open(io)
        try:
            self._restore()
            while not self._stopping:
                if ctx.options.cut:
                    await self._fill()
                await self._poll_due()
                if not self._open and (not ctx.options.cut or self._exhausted()):
                    break
                self._summary()
                await self._sleep()
        finally:
            errors = await ctx.sinks.close()
            ctx.cpu.shutdown(wait=True, cancel_futures=True)
            io.shutdown(wait=True)
            self.journal.close()
        if errors:
            raise errors[0]
        if self._open and self._stopping:
            ids = ", ".join(o.view.batch_id or o.view.key for o in list(self._open.values())[:3])
            more = "" if len(self._open) <= 3 else f" and {len(self._open) - 3} more"
            reason = (f"{self._stop_reason}; {len(self._open)} batches still open ({ids}{more}): rerun to collect "
                      "them (they are never submitted twice)")
            return EngineResult(exit_code=self._exit_code or 1, stop_reason=reason)
        return EngineResult(exit_code=self._exit_code, stop_reason=self._stop_reason)

    def _summary(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_summary >= SUMMARY_EVERY_S:
            self._last_summary = now
            for line in batch_lines(self._views.values()):
                self.ctx.display.print(line)

    async def _sleep(self) -> None:
        if self._wake.is_set():  # something changed since the last round (a batch finished, a stop)
            self._wake.clear()
            return
        due = min((o.next_poll for o in self._open.values()), default=None)
        wait = 1.0 if due is None else max(0.0, due - time.monotonic())
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=min(wait, SUMMARY_EVERY_S))
        except TimeoutError:
            pass
        self._wake.clear()

    def _exhausted(self) -> bool:
        """Nothing is left to cut (every cursor done, no retry waiting) or nothing could ever fit."""
        return not self.ctx.retry and self._cursors is not None and all(c.exhausted for c in self._cursors)

    def _append(self, ev: BatchEvent) -> None:
        """Journal ``ev`` (fsynced), then apply it to the batch's view."""
        self.journal.append(ev)
        v = self._views.get(ev.key)
        if v is None:
            v = self._views[ev.key] = BatchView(key=ev.key)
        apply_event(v, ev)

    # -- restart -------------------------------------------------------------------------------------------

    def _restore(self) -> None:
        """Resume the batches the journal holds open: their items are taken, their worst case reserved."""
        ctx = self.ctx
        self._views = self.journal.load()
        now = time.monotonic()
        for v in self._views.values():
            if not v.open:
                continue
            for it in v.items:
                self._taken.setdefault(it.dataset, set()).add(it.sample_id)
                if not ctx.done(it.dataset, it.sample_id):
                    ctx.governor.reserve(it.dataset, it.max_tokens, it.usd, worst_usd=it.usd)
            self._open[v.key] = _Open(v, next_poll=now, interval=ctx.options.poll_interval_s)
        ctx.stats.reserved = ctx.governor.reserved
        ctx.stats.remaining = ctx.governor.remaining
        if self._open:
            ctx.display.print(f"resuming {len(self._open)} open batches from the journal (never submitted twice)")
            self._summary(force=True)

    def _prompts_of(self, o: _Open) -> dict[tuple[str, str], PromptRecord]:
        """The prompts of an open batch's items: cut by this run, else read back from prompts.jsonl."""
        missing: dict[str, set[str]] = {}
        for it in o.view.items:
            if (it.dataset, it.sample_id) not in o.prompts:
                missing.setdefault(it.dataset, set()).add(it.sample_id)
        for ds, ids in missing.items():
            plan = self.ctx.datasets.get(ds)
            if plan is None:
                continue
            for sid, rec in load_prompts(plan.prompts_path, ids).items():
                o.prompts[(ds, sid)] = rec
        return o.prompts

    # -- cutting -------------------------------------------------------------------------------------------

    def _cursors_now(self) -> list[PromptCursor]:
        if self._cursors is None:
            self._cursors = [PromptCursor(d.name, d.prompts_path, p, d.done, self._taken.setdefault(d.name, set()))
                             for d in self.ctx.datasets.values() for p in self.partitions if d.pending.get(p)]
        return self._cursors

    async def _fill(self) -> None:
        while not self._stopping and len(self._open) < self.ctx.options.max_open:
            cut = self._cut()
            if cut is None or not cut.items:
                return
            await self._start(cut)

    def _add(self, cut: _Cut, dataset: str, prompt: PromptRecord, part: str, mt: int) -> str:
        """Add one prompt to ``cut`` if it fits: ``ok``; else ``skip`` (its dataset's token budget is
        reached), ``full`` (not its dataset's tokens in this batch), ``stop`` (the dollars) or ``bytes``."""
        ctx = self.ctx
        gov = ctx.governor
        adm = gov.token_budget(dataset).check(cut.tokens[dataset] + mt)
        if adm is not Admission.OK:
            return "skip" if adm is Admission.NEVER and not cut.tokens[dataset] else "full"
        usd = ctx.setup.prices.worst_case(estimate_prompt_tokens(prompt), mt)
        if gov.check_dollars(cut.usd + usd) is not Admission.OK:
            cut.refused_usd = usd
            return "stop"
        item_bytes = request_item(custom_id(dataset, prompt.sample_id, cut.key), ctx.setup.body(prompt, mt))
        if cut.size + len(item_bytes) + 1 > ctx.options.max_bytes:
            return "bytes"
        cut.items.append(BatchItem(dataset, prompt.sample_id, part, mt, usd))
        cut.bodies.append(item_bytes)
        cut.prompts[(dataset, prompt.sample_id)] = prompt
        cut.usd += usd
        cut.tokens[dataset] += mt
        cut.size += len(item_bytes) + 1
        return "ok"

    def _cut(self) -> _Cut | None:
        """The next batch's items (retries first, then the prompts in file order), as many as the limits
        and budgets allow; None when the run stops."""
        ctx, limit = self.ctx, self.ctx.options.max_requests
        self._seq += 1
        cut = _Cut(key=f"b{time.time_ns():x}-{secrets.token_hex(3)}-{self._seq}")
        provider, _ = ctx.setup.provider_for(ctx.avoid)
        cut.size = len(encode_submission(ctx.setup.model, provider, [])[0])
        retries, ctx.retry = ctx.retry, []
        for dataset, prompt, part, mt in retries:
            verdict = self._add(cut, dataset, prompt, part, mt) if len(cut.items) < limit else "full"
            if verdict == "skip":
                ctx.log.write(f"{dataset}/{prompt.sample_id}: not retried, its dataset's token budget is reached")
            elif verdict != "ok":
                ctx.retry.append((dataset, prompt, part, mt))  # waits for a later batch
        complete = False
        for cur in self._cursors_now():
            mt = self.partitions[cur.partition].max_tokens
            while not complete and len(cut.items) < limit and (nxt := cur.peek()) is not None:
                verdict = self._add(cut, cur.dataset, nxt, cur.partition, mt)
                if verdict == "ok":
                    cur.take()
                    continue
                if verdict == "skip":
                    self._budget_reached(cur)
                complete = verdict in ("stop", "bytes")
                break
            if complete or len(cut.items) >= limit:
                break
        if not cut.items and cut.refused_usd and not self._open:
            rem = ctx.governor.remaining or 0.0
            self.request_stop(f"dollar budget: ${max(rem, 0.0):.4f} left cannot cover one more request in a batch "
                              f"(${cut.refused_usd:.4f} at its worst); {RAISE_BUDGET}")
        return None if self._stopping else cut

    def _budget_reached(self, cur: PromptCursor) -> None:
        tb = self.ctx.governor.token_budget(cur.dataset)
        reason = f"token budget reached ({tb.done} of {tb.budget} completion tokens)"
        cur.finish(reason)
        counts = self.ctx.stats.dataset(cur.dataset)
        if counts.skipped is None:
            counts.skipped = reason
            self.ctx.display.print(f"{cur.dataset}: {reason}; its remaining prompts are skipped")

    # -- submission ----------------------------------------------------------------------------------------

    async def _start(self, cut: _Cut) -> None:
        """Journal the cut (``prepared``), reserve its worst case, submit it."""
        ctx = self.ctx
        provider, _ = ctx.setup.provider_for(ctx.avoid)
        body, fingerprint = encode_submission(ctx.setup.model, provider, cut.bodies)
        key = cut.key
        self._append(BatchEvent(key=key, event="prepared", at=time.time(), items=cut.items, keyed=True,
                                fingerprint=fingerprint,
                                model=ctx.setup.model, provider_only=(provider or {}).get("only"),
                                size_bytes=len(body)))
        for it in cut.items:
            ctx.governor.reserve(it.dataset, it.max_tokens, it.usd, worst_usd=it.usd)
        ctx.stats.reserved, ctx.stats.remaining = ctx.governor.reserved, ctx.governor.remaining
        o = self._open[key] = _Open(self._views[key], cut.prompts, body, interval=ctx.options.poll_interval_s)
        await self._submit(o)

    async def _submit(self, o: _Open) -> None:
        ctx, v = self.ctx, o.view
        if o.body is None:
            return
        try:
            wb = await ctx.setup.client.submit(o.body)
        except (AuthError, PaymentRequired, PermanentAPIError) as exc:
            self._abandon(o, f"refused at submission: {exc}")
            self.request_stop(f"batch submission refused: {exc}", exit_code=exc.exit_code)
            return
        except APIError as exc:  # it may have reached OpenRouter all the same: looked up before a resubmission
            o.failures += 1
            o.next_poll = time.monotonic() + ctx.policy.delay(o.failures, exc.retry_after)
            ctx.log.write(f"batch {v.key}: submission failed ({exc}); looked up, then retried")
            return
        self._append(BatchEvent(key=v.key, event="submitted", at=time.time(), batch_id=wb.id))
        o.body, o.failures = None, 0
        o.next_poll = time.monotonic() + o.interval
        ctx.display.print(f"batch {wb.id}: submitted, {len(v.items):,} requests, {v.size_bytes / 1e6:.1f} MB, "
                          f"${v.reserved_usd:.4f} reserved at worst")

    def _abandon(self, o: _Open, reason: str) -> None:
        for it in o.view.items:
            if not self.ctx.done(it.dataset, it.sample_id):
                release_item(self.ctx, it)
                self._taken.get(it.dataset, set()).discard(it.sample_id)
        self._append(BatchEvent(key=o.view.key, event="abandoned", at=time.time(), reason=reason))
        self._open.pop(o.view.key, None)
        self.ctx.log.write(f"batch {o.view.key}: abandoned ({reason})")

    async def _reconcile(self, o: _Open) -> None:
        """A batch prepared without a known id: adopted if OpenRouter has it, else submitted (again)."""
        ctx, v = self.ctx, o.view
        try:
            found = await self._find(o)
        except APIError as exc:
            o.failures += 1
            o.next_poll = time.monotonic() + ctx.policy.delay(o.failures, exc.retry_after)
            ctx.log.write(f"batch {v.key}: looking for it among the account's batches failed ({exc}); tried again "
                          "later")
            return
        if found is not None:
            self._append(BatchEvent(key=v.key, event="submitted", at=time.time(), batch_id=found.id, adopted=True))
            o.body = None
            ctx.display.print(f"batch {found.id}: found at OpenRouter for {v.key} (submitted before the last stop, "
                              "its results carry its custom_ids); not submitted again")
            await self._finish(o, found)
            return
        if o.undecided:  # one of them may be it: known only once its results are in
            o.next_poll = time.monotonic() + o.interval
            o.interval = min(ctx.options.poll_max_interval_s, o.interval * 1.5)
            return
        if o.body is None:
            o.body = self._rebuild(o)
            if o.body is None:
                return
        await self._submit(o)

    async def _find(self, o: _Open) -> WireBatch | None:
        """The account's batch that is ``o``'s, ended, with its results; None when it is not there or not
        yet known to be (``o.undecided``: candidates still running). An ended candidate is read with its
        results and is ``o``'s exactly when they carry its custom_ids (which hold its key)."""
        v = o.view
        known = {x.batch_id for x in self._views.values() if x.batch_id} | o.foreign
        mine = {v.custom_id(it) for it in v.items}
        running: list[str] = []
        async for b in self._candidates(v, known):
            if not b.terminal:
                running.append(b.id)
                continue
            full = await self.ctx.setup.client.retrieve(b.id, cap=results_cap([it.max_tokens for it in v.items]))
            if any(isinstance(r.custom_id, str) and r.custom_id in mine for r in full.results or []):
                return full
            o.foreign.add(b.id)  # another's, or ended without results (then nothing to record, nothing billed)
        if running and len(running) != o.undecided:
            self.ctx.log.write(f"batch {v.key}: {len(running)} batches at OpenRouter may be it ({', '.join(running)}: "
                               "its model and size, created since it was prepared); waiting for their results "
                               "before submitting it")
        o.undecided = len(running)
        return None

    async def _candidates(self, v: BatchView, known: set[str]) -> AsyncIterator[WireBatch]:
        """The account's batches (listed newest first, without results) that may be ``v``: its model and
        request count, not in ``known``, created no earlier than ``ADOPT_SKEW_S`` (and the second
        ``created_at`` is rounded to) before ``v`` was prepared."""
        since = v.prepared_at - 1.0 - ADOPT_SKEW_S
        after: str | None = None
        while True:
            page = await self.ctx.setup.client.list_page(after=after)
            for b in page.data:
                if b.created_at is not None and b.created_at < since:
                    return
                if b.id not in known and b.model == v.model and b.counts.total == len(v.items):
                    yield b
            if not page.has_more or not page.data:
                return
            after = page.last_id or page.data[-1].id

    def _rebuild(self, o: _Open) -> bytes | None:
        """The body of a prepared batch again, from its prompts; None (abandoned) when it is not the same."""
        ctx, v = self.ctx, o.view
        prompts = self._prompts_of(o)
        bodies = []
        for it in v.items:
            p = prompts.get((it.dataset, it.sample_id))
            if p is None:
                self._abandon(o, f"the prompt of {v.custom_id(it)} is no longer prepared")
                return None
            bodies.append(request_item(v.custom_id(it), ctx.setup.body(p, it.max_tokens)))
        provider = {"only": v.provider_only} if v.provider_only else None
        body, fingerprint = encode_submission(v.model or ctx.setup.model, provider, bodies)
        if fingerprint != v.fingerprint:
            self._abandon(o, "its requests would differ from the ones prepared (prompts or settings changed)")
            return None
        return body

    # -- polling -------------------------------------------------------------------------------------------

    async def _poll_due(self) -> None:
        now = time.monotonic()
        for o in list(self._open.values()):
            if self._stopping:
                return
            if o.next_poll > now:
                continue
            if o.view.batch_id is None:
                await self._reconcile(o)
            else:
                await self._poll(o)

    async def _poll(self, o: _Open) -> None:
        ctx, v = self.ctx, o.view
        assert v.batch_id is not None
        try:
            wb = await ctx.setup.client.retrieve(v.batch_id, cap=results_cap([it.max_tokens for it in v.items]))
        except AuthError as exc:
            self.request_stop(f"{exc}", exit_code=exc.exit_code)
            return
        except APIError as exc:
            if exc.status == 404:
                wb = WireBatch(id=v.batch_id, status="failed")
                ctx.log.write(f"batch {v.batch_id}: not found at OpenRouter ({exc}); its items are retried")
            else:
                o.failures += 1
                o.next_poll = time.monotonic() + max(o.interval, ctx.policy.delay(o.failures, exc.retry_after))
                ctx.log.write(f"batch {v.batch_id}: poll failed ({exc}, provider {provider_of(exc)})")
                return
        o.failures = 0
        c = wb.counts
        if not wb.terminal:
            if (wb.status, c.completed, c.failed) != (v.status, v.completed, v.failed):
                self._append(BatchEvent(key=v.key, event="status", at=time.time(), status=wb.status, total=c.total,
                                        completed=c.completed, failed=c.failed, provider=wb.provider))
            o.next_poll = time.monotonic() + o.interval
            o.interval = min(ctx.options.poll_max_interval_s, o.interval * 1.5)
            return
        await self._finish(o, wb)

    async def _finish(self, o: _Open, wb: WireBatch) -> None:
        ctx, v = self.ctx, o.view
        got = await ingest(ctx, wb, v, self._prompts_of(o), started=_wall(v))
        c = wb.counts
        why = str(wb.error.message) if wb.error is not None and wb.error.message else None
        self._append(BatchEvent(key=v.key, event="finished", at=time.time(), status=wb.status, total=c.total,
                                completed=c.completed, failed=c.failed, cost=got.billed, provider=wb.provider,
                                reason=why))
        self._open.pop(v.key, None)
        ctx.display.print(f"batch {wb.id}: {wb.status}{_money(got)}; {got.written:,} records, {c.failed:,} failed "
                          "requests" + (f" ({why})" if why else "") + _extras(got))
        self._summary(force=True)
        self._wake.set()


def _wall(v: BatchView) -> float:
    return v.submitted_at or v.prepared_at


def _money(got: Ingested) -> str:
    """What a batch billed, and the part of it no result accounts for (booked as spend all the same)."""
    if got.billed is None:
        return f", ${got.results_cost:.4f} booked for its results (it said no cost)" if got.results_cost else ""
    beyond = f" (${got.unattributed:.4f} of it beyond its results' costs, booked as spend)" if got.unattributed else ""
    return f", ${got.billed:.4f} billed{beyond}"


def _extras(got: Ingested) -> str:
    parts = [f"{got.duplicates:,} duplicate results"] if got.duplicates else []
    parts += [f"{got.strays:,} results it was not submitted with"] if got.strays else []
    return f"; {' and '.join(parts)}: no record, their cost booked as spend" if parts else ""
