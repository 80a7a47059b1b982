"""``generate`` with ``endpoint.mode: batch``: the batch phase before (or instead of) synchronous requests.

Reads the config, the run directory's batch journal (``rundir.RunDir.batch_journal``) and, at run time,
the model's ``:batch`` variant (``GET /models/{model}:batch/endpoints``: whether the model has one, and its
batch prices); drives ``engine.batch.BatchRunner`` over the datasets' pending prompts and writes what it
writes (the journal, raw logs, failures, attempts). Every result is held to the run's
``engine.intake.IntakeRules`` (the same as its synchronous responses). ``generate`` then sends
synchronously what is left: with ``endpoint.batch.retry: sync``, the failed items (avoiding the providers
whose result for that sample was unusable: ``BatchPhase.avoid``); in ``mode: sync``, everything pending.

A run in ``mode: sync`` whose journal still holds open batches (a batch run stopped, then switched to sync)
collects them first, cutting nothing new, so no sample is paid for twice.

Refused (``ConfigError``, before anything is sent): ``mode: batch`` with a backend kind that has no Batch
API (``Capabilities.batch_api``), with a model that has no batch variant, or with a setting the Batch API
would ignore (``backends.openrouter_batch.check_batch_config``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from draftgen import rundir
from draftgen.backends import Backend, capabilities
from draftgen.backends.openrouter_batch import (
    BatchRequests,
    batch_client,
    batch_prices,
    batch_provider,
    check_batch_config,
)
from draftgen.backends.pricing import Prices
from draftgen.config import RunConfig
from draftgen.engine import (
    Assembler,
    BudgetGovernor,
    DatasetPlan,
    PartitionPlan,
    RetryPolicy,
    RoutingGuard,
    RunLog,
    RunStats,
)
from draftgen.engine.batch import BatchRunner
from draftgen.engine.batch_ingest import BatchContext, BatchOptions, BatchSetup
from draftgen.engine.batch_journal import BatchJournal, load_batches
from draftgen.engine.intake import IntakeRules
from draftgen.engine.progress import Display
from draftgen.engine.prompts import count_pending
from draftgen.engine.signals import install_signal_handlers
from draftgen.engine.sinks import Sinks
from draftgen.errors import ConfigError

__all__ = ["BatchPhase", "check_mode", "leftover_plans", "run_batch_phase", "wants_batches"]


@dataclass
class BatchPhase:
    exit_code: int = 0
    stop_reason: str | None = None
    #: whether synchronous requests follow (``mode: sync``, or ``retry: sync``)
    sync_after: bool = True
    written: set[tuple[str, str]] = field(default_factory=set)
    #: (dataset, sample id) → providers that gave it an unusable batch result: its synchronous retry avoids them
    avoid: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def wants_batches(cfg: RunConfig, rd: rundir.RunDir) -> bool:
    """``mode: batch``, or batches the journal still holds open."""
    return cfg.endpoint.mode == "batch" or any(v.open for v in load_batches(rd.batch_journal).values())


def check_mode(cfg: RunConfig) -> None:
    """Refuse, before anything is sent, ``mode: batch`` on a backend without the Batch API or with a
    setting a batch would ignore, and ``service_tier`` on a backend without it."""
    caps = capabilities(cfg.endpoint.kind)
    if cfg.endpoint.mode == "batch":
        if not caps.batch_api:
            raise ConfigError(f"endpoint.mode: batch needs OpenRouter's Batch API (endpoint.kind openrouter or "
                              f"emulator); endpoint.kind {cfg.endpoint.kind!r} has none; use endpoint.mode: sync")
        check_batch_config(cfg)
    elif cfg.endpoint.service_tier is not None and not caps.batch_api:
        raise ConfigError(f"endpoint.service_tier is OpenRouter's; endpoint.kind {cfg.endpoint.kind!r} has no service "
                          "tiers: remove it")


async def _setup(cfg: RunConfig, backend: Backend, batch: bool) -> BatchSetup:
    check_mode(cfg)
    client = batch_client(cfg, backend)
    eps = await client.variant_endpoints(cfg.model.id)
    if not eps and batch:
        raise ConfigError(f"{cfg.model.id} has no batch variant at OpenRouter (GET /models/{cfg.model.id}:batch/endpoints "
                          "lists no endpoint); only models with a :batch variant can be batched: use endpoint.mode: sync")
    r = cfg.routing
    if eps:
        _, allowed = batch_provider(cfg, eps) if batch else (None, eps)
        prices = batch_prices(allowed)
    else:  # collecting the open batches of an earlier run only
        allowed, prices = [], Prices()
    requests = BatchRequests(cfg)
    return BatchSetup(
        client=client, model=cfg.model.id.split(":", 1)[0],
        body=lambda p, mt: requests.body(p.messages, mt, p.tools), prices=prices,
        provider_for=lambda avoid: batch_provider(cfg, eps, avoid), intake=IntakeRules.from_config(cfg),
        guard=RoutingGuard(eps, allowed=allowed, ignore=r.ignore, only=r.only, quantizations=r.quantizations)
        if eps else None, backend=getattr(backend, "name", "openrouter"))


async def run_batch_phase(cfg: RunConfig, backend: Backend, *, rd: rundir.RunDir, plans: list[DatasetPlan],
                          partitions: list[PartitionPlan], governor: BudgetGovernor, stats: RunStats, log: RunLog,
                          display: Display, assembler: Assembler) -> BatchPhase:
    """Run the batch phase (module docstring); its outcome says whether synchronous requests follow."""
    batch = cfg.endpoint.mode == "batch"
    setup = await _setup(cfg, backend, batch)
    b = cfg.endpoint.batch
    retry = b.retry if batch else "sync"
    log.write(f"batch prices (worst case): ${setup.prices.prompt * 1e6:.4f}/M prompt, "
              f"${setup.prices.completion * 1e6:.4f}/M completion; model {setup.model}")
    options = BatchOptions(max_requests=b.max_requests, max_bytes=b.max_bytes, max_open=b.max_open, retry=retry,
                           poll_interval_s=b.poll_interval_s, poll_max_interval_s=b.poll_max_interval_s, cut=batch)
    sinks = Sinks(plans, stats, fsync=True, attempts_path=rd.attempts, health_path=None)
    ctx = BatchContext(setup=setup, assembler=assembler, governor=governor, policy=RetryPolicy(cfg.retry), stats=stats,
                       log=log, display=display, sinks=sinks, options=options, datasets={d.name: d for d in plans})
    if batch:
        for ds in plans:
            for pname, n in ds.pending.items():
                stats.partition(pname).planned += n
    runner = BatchRunner(ctx, partitions, BatchJournal(rd.batch_journal))
    uninstall = _signals(runner.request_stop, display)
    try:
        result = await runner.run()
    finally:
        uninstall()
    return BatchPhase(exit_code=result.exit_code, stop_reason=result.stop_reason,
                      sync_after=not batch or retry == "sync", written=ctx.written, avoid=ctx.avoid_for)


def leftover_plans(plans: list[DatasetPlan], phase: BatchPhase, stats: RunStats, *, planned: bool) -> list[DatasetPlan]:
    """The plans of what the batch phase left for synchronous requests; ``planned``: the batch phase counted
    the pending prompts already (the engine counts what it is given again, so the leftovers are taken off)."""
    out: list[DatasetPlan] = []
    for ds in plans:
        done = ds.done | {sid for d, sid in phase.written if d == ds.name}
        pending = {p: n for p, n in count_pending(ds.prompts_path, done).items() if p in ds.pending}
        if planned:
            for pname, n in pending.items():
                stats.partition(pname).planned -= n
        out.append(DatasetPlan(ds.name, ds.prompts_path, ds.raw_path, ds.failures_path, done=done, pending=pending))
    return out


def _signals(stop: Callable[..., None], display: Display) -> Callable[[], None]:
    """SIGINT/SIGTERM stop the batch phase; the open batches stay open (the next run collects them)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    def on_signal(signame: str) -> None:
        display.print(f"{signame}: stopping; batches already submitted keep running at OpenRouter and the next run "
                      "collects them")
        stop(f"interrupted ({signame}); the next run resumes", exit_code=130)

    return install_signal_handlers(on_signal)
