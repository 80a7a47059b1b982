"""``draftgen generate``: prepared prompts → raw responses with exact token ids, resumable, within budget.

Reads ``run_dir/prepared/<dataset>/prompts.jsonl`` and the existing
``run_dir/raw/<dataset>/raw_responses.jsonl`` (resume: done ids, tokens, spend). Writes, per dataset,
``raw/<dataset>/raw_responses.jsonl`` (``ResponseRecord``, one per finished sample) and
``raw/<dataset>/failures.jsonl`` (``FailureRecord``); ``run.json`` (``RunManifest``: config, argv with
secrets removed, versions, git SHA, config hash); ``logs/generate.log``; ``logs/attempts.jsonl`` (one
``AttemptRecord`` per request attempt) and ``logs/health.jsonl`` (``HealthEvent``: providers cooled down
and restored). With ``endpoint: emulator`` and no base URL it starts the embedded emulator (ground truth
in ``emulator/ground_truth.jsonl``). With ``endpoint.mode: batch`` the prompts go through OpenRouter's Batch
API first (``generate.batch``, ``openrouter-batches/journal.jsonl``), then what it leaves is sent
synchronously.

Quality (``quality.*``): unusable responses (dropped reasoning, a provider the routing excluded) are
retried elsewhere and never written, unless ``keep_unusable``; failing providers are cooled down
(``engine.health``). At the end a per-provider table (responses, $/M output, latency and TTFT
percentiles, retries, dropped reasoning, quantization, cool-downs, service tier), computed from the files by
``runview.providers.provider_metrics``, is printed and logged.

A run directory written for another target (``model.*``, unless ``--force``) or with another source under a
dataset's name is refused with a RunDirError. Other generation settings are the records' own: a rerun says
what differs and what it keeps, and ``redo`` (``--redo changed|truncated``) generates those samples again
(``generate.rerun``). The engine itself lives in ``draftgen.engine``.

A selected dataset not prepared yet is prepared first by the ``prepare`` a command hands in (``draftgen
generate`` hands in ``phases.prepare.run.run_prepare``; a phase imports no other phase); without one it is an
InputError naming the fix (``draftgen run`` has prepared every dataset before generate runs).

Spend: the run directory's spend before this run (``prior``) is what its raw logs' records cost plus what
``logs/attempts.jsonl`` booked for attempts that left no record (responses rejected or unusable, requests
abandoned on an interrupt, held at their worst case: ``store.scan_attempt_spend``), so a resumed run's budget
sees every billed response. An abandoned request's hold is settled by its bill (``engine.settle``: ``GET
/generation``) at the end of the run that abandoned it, and again at the start of the next while one is held. The API key's limit is read again during the run (``engine.keywatch``). Samples whose last
record the audit excluded are generated again (``generate.excluded``), elsewhere when the provider was at
fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from draftgen import rundir
from draftgen.backends import (
    Backend,
    Capabilities,
    EndpointInfo,
    api_key_for,
    capabilities,
    management_key_for,
    open_backend,
)
from draftgen.backends.account import AccountSnapshot, read_account
from draftgen.backends.pricing import routable_endpoints
from draftgen.config import RunConfig
from draftgen.engine import (
    Assembler,
    BudgetGovernor,
    DatasetPlan,
    Engine,
    EngineOptions,
    HealthPolicy,
    PartitionPlan,
    ProviderHealth,
    RetryPolicy,
    RoutingGuard,
    RunLog,
    RunStats,
    TailPolicy,
    TokenBudget,
    count_pending,
    key_limit_label,
    make_display,
    summary_lines,
    watch_key,
)
from draftgen.engine.intake import IntakeRules
from draftgen.engine.settle import SETTLE_WAIT_S, open_abandoned, settle
from draftgen.engine.signals import install_signal_handlers
from draftgen.errors import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    APIError,
    ConfigError,
    InputError,
)
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.phases.generate.batch import check_mode, leftover_plans, run_batch_phase, wants_batches
from draftgen.phases.generate.excluded import excluded_samples, plan_regeneration
from draftgen.phases.generate.rerun import (
    REDO_KINDS,
    generation_settings,
    redo,
    replaced_spend,
    rerun_lines,
    settings_report,
)
from draftgen.phases.generate.rounds import start_round
from draftgen.phases.generate.summary import budget_lines, failure_lines, overshoot_lines, provider_table
from draftgen.provenance import check_provenance, expected_provenance
from draftgen.records import Provenance
from draftgen.rundir.claim import writer
from draftgen.runview.rounds import read_rounds
from draftgen.secrets import scrub_argv
from draftgen.store import scan_attempt_spend, scan_responses
from draftgen.tokens import Profile, profile_from_config

__all__ = [
    "DatasetSummary",
    "GenerateReport",
    "Prepare",
    "phase_run",
    "run_generate",
]


class Prepare(Protocol):
    """The prepare phase's entry point (``phases.prepare.run.run_prepare``), as a command hands it in."""

    def __call__(self, cfg: RunConfig, *, echo: Echo, profile: Profile | None, force: bool) -> object: ...


@dataclass
class GenerateOptions:
    """``run_generate``'s own inputs, as the run reads them."""

    datasets: list[str] = field(default_factory=list)  # empty: every dataset of the config
    partition: str = "all"  # short | long | all
    argv: list[str] = field(default_factory=list)
    base_url_flag: str | None = None
    force: bool = False  # accept records whose provenance differs from the config
    redo: list[str] = field(default_factory=list)  # generate.rerun.REDO_KINDS: records to generate again
    prepare: Prepare | None = None  # prepares the selected datasets not prepared yet (None: refuse them)
    round: int | None = None  # a proposed round to start first (generate.rounds)


class DatasetSummary(msgspec.Struct, kw_only=True):
    name: str
    done_before: int = 0
    done: int = 0
    failed: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    skipped: str | None = None
    token_budget: int | None = None
    #: completion tokens done beyond ``token_budget`` (``budget.token_policy: expected`` only; at most what
    #: was in flight when admission stopped)
    tokens_over_budget: int = 0


class GenerateReport(msgspec.Struct, kw_only=True):
    run_dir: str
    exit_code: int = 0
    message: str | None = None
    datasets: list[DatasetSummary] = msgspec.field(default_factory=list)
    done: int = 0
    failed: int = 0
    completion_tokens: int = 0
    spend_session: float = 0.0
    spend_total: float = 0.0
    elapsed_s: float = 0.0
    requests: int = 0
    #: dollars spent beyond ``budget.max_spend_usd`` (at most the worst case of what was in flight)
    spend_over_budget: float = 0.0
    #: the tail (``tail.*``): hedges sent, hedges whose response became the record, what the losing requests
    #: of hedged samples cost (in ``spend_session`` too), streams cancelled under the rate floor
    hedges: int = 0
    hedges_won: int = 0
    hedge_extra_usd: float = 0.0
    slow_streams: int = 0


# -- set-up ----------------------------------------------------------------------------------------------

def _raise_fd_limit(needed: int) -> None:
    """Thousands of sockets need thousands of descriptors; raise the soft limit toward the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _api_keys(cfg: RunConfig) -> tuple[str | None, str | None]:
    return api_key_for(cfg), management_key_for(cfg)


def _prepared(cfg: RunConfig, rd: rundir.RunDir, names: list[str], echo: Echo,
              profile: Profile | None, force: bool, prepare: Prepare | None) -> Profile | None:
    """Prepare the selected datasets not prepared yet with ``prepare`` (``force`` reaches prepare too; no
    ``prepare``: an InputError naming the fix); returns the profile, loaded here when prepare ran."""
    missing = [n for n in names if not rd.prepared(n).is_file()]
    if prepare is not None and any(r.started_at is not None for r in read_rounds(rd.root)):
        missing = list(names)  # a started round may draw more prompts: prepare redoes only what changed
    if not missing:
        return profile
    if prepare is None:
        raise InputError(f"{rd.prepared(missing[0])}: not found ({', '.join(missing)} not prepared yet); "
                         "run `draftgen prepare CONFIG` first")
    if not all(rd.prepared(n).is_file() for n in missing):
        echo(f"preparing prompts first ({', '.join(n for n in missing if not rd.prepared(n).is_file())} "
             "not prepared yet)")
    profile = profile if profile is not None else profile_from_config(cfg)
    prepare(cfg, echo=echo, profile=profile, force=force)
    still = [n for n in missing if not rd.prepared(n).is_file()]
    if still:
        raise InputError(f"{rd.prepared(still[0])}: not found after prepare; "
                         "run `draftgen prepare CONFIG` and check its messages")
    return profile


# -- the run ---------------------------------------------------------------------------------------------


def run_generate(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
                 datasets: Sequence[str] = (), partition: str = "all", argv: Sequence[str] = (),
                 base_url_flag: str | None = None, redo: Sequence[str] = (),
                 prepare: Prepare | None = None, round: int | None = None) -> GenerateReport:
    """Generate every pending sample of the selected datasets and partitions (see module docstring).
    ``profile``: the already loaded profile of ``cfg.model`` (default: loaded here, once, and shared with
    prepare and the embedded emulator). ``force``: accept records whose provenance differs from the config.
    ``datasets``: the ones to generate (default: every dataset of the config); ``partition``: short, long
    or all; ``argv``: the command line recorded in run.json and the log; ``base_url_flag``: ``--base-url``;
    ``redo``: records to generate again, ``changed`` and/or ``truncated`` (``generate.rerun``); ``prepare``:
    prepares the selected datasets not prepared yet (``phases.prepare.run.run_prepare``; None: they are an
    InputError); ``round``: start that proposed round first (``generate.rounds``: prepare then draws its
    prompts)."""
    opts = GenerateOptions(datasets=list(datasets), partition=partition, argv=list(argv),
                           base_url_flag=base_url_flag, force=force, redo=list(redo), prepare=prepare, round=round)
    bad = [k for k in opts.redo if k not in REDO_KINDS]
    if bad:
        raise ConfigError(f"--redo {bad[0]!r}: use {' or '.join(REDO_KINDS)}")
    names = opts.datasets or [d.name for d in cfg.datasets]
    for n in names:
        cfg.dataset(n)  # ConfigError naming the known datasets
    if opts.partition not in ("short", "long", "all"):
        raise ConfigError(f"--partition {opts.partition!r}: use short, long or all")
    with writer(cfg, "generate", argv=opts.argv, force=opts.force, same_config=True) as rd:
        return _run_generate(cfg, opts, rd, names, echo, profile)


def _run_generate(cfg: RunConfig, opts: GenerateOptions, rd: rundir.RunDir, names: list[str],
                  out: Echo, loaded: Profile | None) -> GenerateReport:
    """Inside the writer lock: the profile and provenance, what is left to do (``_resume``), the run (on the
    embedded emulator when configured), and the lines it prints and logs at the end (``generate.summary``)."""
    check_mode(cfg)  # endpoint.mode / service_tier the backend cannot honour: refused before anything is sent
    if opts.round is not None:
        start_round(rd, opts.round, out)
    loaded = _prepared(cfg, rd, names, out, loaded, opts.force, opts.prepare)
    api_key, mgmt = _api_keys(cfg)
    profile = loaded if loaded is not None else profile_from_config(cfg)
    provenance = expected_provenance(cfg, profile.tokenizer_sha256)
    forced: set[str] = set()

    def check(got: Provenance | None, where: str) -> None:
        check_provenance(got, provenance, where, force=opts.force, forced=forced)
    parts = [p for p in ("short", "long") if opts.partition in (p, "all")]
    partitions = [PartitionPlan(p, getattr(cfg.partitions, p).concurrency, getattr(cfg.partitions, p).max_tokens)
                  for p in parts]
    _raise_fd_limit(2 * sum(p.concurrency for p in partitions) + 256)

    log = RunLog(rd.log("generate"))
    governor = BudgetGovernor(max_spend=cfg.budget.max_spend_usd, token_policy=cfg.budget.token_policy)
    stats = RunStats(governor=governor)
    plans: list[DatasetPlan] = []
    table: list[str] = []
    failed_lines: list[str] = []
    since = time.time()  # this session's failures are those recorded from now on
    try:
        log.write(f"generate: {' '.join(scrub_argv(list(opts.argv)))}")
        _rerun(cfg, rd, names, opts.redo, check, out, log)
        plans, avoid = _resume(cfg, rd, names, parts, check, stats, governor, out, log)
        for f in sorted(forced):
            log.write(f"--force: accepted records whose {f}")
        from draftgen.emulator.embedded import (
            embedded_emulator,  # here, so `import draftgen.phases.generate.run` stays light
        )

        with embedded_emulator(cfg, api_key=api_key, management_key=mgmt, profile=profile) as emu_url:
            base_urls = [emu_url] if emu_url else None
            result_code, message = asyncio.run(_main(cfg, api_key, mgmt, base_urls, profile, provenance, plans,
                                                     partitions, governor, stats, log, rd, avoid))
        if stats.failed:
            failed_lines, failed_message = failure_lines(rd, [c.name for c in stats.datasets.values() if c.failed],
                                                         since)
            if result_code == 0:
                result_code, message = EXIT_FAILURES, failed_message
        table = provider_table(rd.root, names) if plans else []
    finally:
        summary = summary_lines(stats) + failed_lines + table + overshoot_lines(governor) + budget_lines(governor)
        for line in summary:
            log.write(line)
        log.close()
    for line in summary:
        out(line)
    if message:
        out(f"stopped: {message}")
    return _report(cfg, rd.root, stats, governor, result_code, message)


def _resume(cfg: RunConfig, rd: rundir.RunDir, names: list[str], parts: list[str],
            check: Callable[[Provenance | None, str], None], stats: RunStats, governor: BudgetGovernor, out: Echo,
            log: RunLog) -> tuple[list[DatasetPlan], dict[tuple[str, str], list[str]]]:
    """What this run has to do, from the run directory: the spend before it (``governor.prior``: every
    dataset's records, the replaced ones and the attempts that left none), and per selected dataset its
    done samples, its token budget, and the samples the audit excluded (generated again, avoiding the
    providers at fault). Returns the datasets' plans and those providers, by (dataset, sample id)."""
    plans: list[DatasetPlan] = []
    avoid: dict[tuple[str, str], list[str]] = {}
    if rd.attempts.is_file():
        spend = scan_attempt_spend(rd.attempts, rd.settlements)
        governor.prior += spend.billed + spend.held
        governor.held, governor.abandoned = spend.held, spend.abandoned
    excluded = excluded_samples(rd)
    for d in cfg.datasets:
        excl = excluded.get(d.name, {}) if d.name in names else {}
        idx = scan_responses(rd.raw(d.name), check=check, track=excl.keys())
        governor.prior += idx.spend_usd + replaced_spend(rd, d.name)
        if d.name not in names:
            continue
        regen = plan_regeneration(rd, d.name, excl, idx.tracked, now=time.time())
        if regen.samples:
            idx.done -= regen.samples.keys()
            avoid.update(((d.name, sid), provs) for sid, provs in regen.avoid.items())
            line = (f"{d.name}: {len(regen.samples):,} samples whose record the audit excluded are generated "
                    "again (" + ", ".join(f"{k} {v}" for k, v in regen.reasons.most_common()) + ")")
            out(line)
            log.write(line)
        counts = stats.dataset(d.name)
        counts.done_before = len(idx.done)
        counts.tokens_before = idx.completion_tokens
        budget = d.token_budget if d.token_budget is not None else cfg.budget.token_budget
        counts.token_budget = budget
        governor.tokens[d.name] = TokenBudget(budget=budget, done=idx.completion_tokens)
        done_by_part: dict[str, int] = {}
        pending = count_pending(rd.prepared(d.name), idx.done, done_by_part)
        pending = {p: n for p, n in pending.items() if p in parts}
        for p in parts:  # the display's progress is over the whole prepared set, not only this run's work
            stats.partition(p).done_before += done_by_part.get(p, 0)
        if budget is not None and idx.completion_tokens >= budget:
            counts.skipped = f"over its token budget ({idx.completion_tokens} of {budget} completion tokens done)"
            out(f"{d.name}: skipped, {counts.skipped}")
            log.write(f"{d.name}: skipped, {counts.skipped}")
            continue
        counts.to_do = sum(pending.values())
        plans.append(DatasetPlan(d.name, rd.prepared(d.name), rd.raw(d.name), rd.failures(d.name),
                                 done=idx.done, pending=pending))
    stats.spend_prior = governor.prior
    return plans, avoid


def _report(cfg: RunConfig, run_dir: Path, stats: RunStats, governor: BudgetGovernor, exit_code: int,
            message: str | None) -> GenerateReport:
    """The run's ``GenerateReport``, from its stats and its governor."""
    return GenerateReport(
        run_dir=str(run_dir), exit_code=exit_code, message=message,
        datasets=[DatasetSummary(name=c.name, done_before=c.done_before, done=c.done, failed=c.failed,
                                 completion_tokens=c.completion_tokens, cost=c.cost, skipped=c.skipped,
                                 token_budget=c.token_budget, tokens_over_budget=governor.token_budget(c.name).overshoot)
                  for c in stats.datasets.values()],
        done=stats.done, failed=stats.failed, completion_tokens=stats.completion_tokens,
        spend_session=stats.spend_session, spend_total=stats.spend_prior + stats.spend_session,
        elapsed_s=round(stats.elapsed, 3), requests=stats.requests,
        spend_over_budget=round(max(0.0, governor.spent - cfg.budget.max_spend_usd), 6)
        if cfg.budget.max_spend_usd is not None else 0.0,
        hedges=stats.hedges, hedges_won=stats.hedges_won, hedge_extra_usd=round(stats.hedge_extra_usd, 6),
        slow_streams=stats.slow_streams,
    )


def _rerun(cfg: RunConfig, rd: rundir.RunDir, names: list[str], kinds: list[str],
           check: Callable[[Provenance | None, str], None], out: Echo, log: RunLog) -> None:
    """Say what this rerun keeps of the records made with other settings (``generate.rerun``) and, with
    ``--redo``, move those records aside so their samples are generated again. A record refused by the
    provenance check stops the run before anything moves."""
    report = settings_report(cfg, rd, names)
    lines = rerun_lines(report, kinds)
    if kinds:
        for name in names:
            scan_responses(rd.raw(name), check=check)
        for name, n in redo(rd, report, kinds).items():
            lines.append(f"{name}: --redo {'/'.join(kinds)}: {n:,} records moved to "
                         f"{rd.replaced(name).relative_to(rd.root)}; their samples are generated again")
    for line in lines:
        out(line)
        log.write(line)


def _apply_prices(snap: AccountSnapshot, backend: Backend, cfg: RunConfig, governor: BudgetGovernor,
                  log: RunLog) -> None:
    """The routed prices into ``governor``. Without them a dollar budget is refused (ConfigError naming
    ``budget.max_spend_usd`` and ``budget.allow_unpriced``) unless ``budget.allow_unpriced`` is true; then a
    warning on stderr says what cannot be enforced."""
    if snap.prices is not None:
        prices = snap.prices
        governor.prices, governor.priced = prices, True
        log.write(f"prices (worst case over {', '.join(snap.priced_over)}): ${prices.prompt * 1e6:.4f}/M prompt, "
                  f"${prices.completion * 1e6:.4f}/M completion, ${prices.request:.6f}/request")
        return
    why = snap.prices_missing(cfg.model.id)
    reports_cost = bool(getattr(backend, "reports_cost", False))
    budget = cfg.budget.max_spend_usd
    if budget is None:
        log.write(f"prices: not available ({why}); "
                  + ("spend is tracked from usage.cost only" if reports_cost else "spend is not tracked"))
        return
    if reports_cost:
        problem = (f"budget.max_spend_usd is set but the prices of {cfg.model.id} are unknown ({why}), so "
                   "requests cannot be reserved against it")
        fix = ("retry later, or set budget.allow_unpriced: true to track spend from usage.cost only "
               "(it may then pass the budget by what is in flight)")
    else:
        problem = (f"budget.max_spend_usd is set but neither the cost nor the prices of {cfg.model.id} can be "
                   f"known ({why}, and {backend.name} responses carry no usage.cost)")
        fix = ("remove budget.max_spend_usd, or set budget.allow_unpriced: true to run anyway "
               "(the dollar budget is then not enforced)")
    if not cfg.budget.allow_unpriced:
        raise ConfigError(f"{problem}; {fix}")
    _warn(log, f"warning: {problem}; budget.allow_unpriced is true, so the dollar budget of ${budget:g} "
          + ("is enforced from usage.cost only, after the fact" if reports_cost else "cannot be enforced"))


def _warn(log: RunLog, warning: str) -> None:
    """One warning into the run log and onto stderr (the only output of generate that goes there)."""
    log.write(warning)
    print(warning, file=sys.stderr, flush=True)


async def _account(backend: Backend, cfg: RunConfig, governor: BudgetGovernor,
                   log: RunLog) -> tuple[float | None, float | None, list[EndpointInfo] | None, float | None]:
    """Prices and account caps before the run (``account.read_account``); returns (key usage, credits
    usage) for reconciliation, the model's endpoints when the backend lists them, and the credits left
    (the cap a reread key limit never passes).

    A dollar budget needs the cost of every response: ``usage.cost`` where the backend reports it, else
    usage × the routed prices (``governor.priced``). Prices also size each request's reservation
    (``_apply_prices``).
    """
    snap = await read_account(backend, cfg)
    _apply_prices(snap, backend, cfg, governor, log)
    if snap.key_error is not None:
        _warn(log, f"warning: the API key's limit could not be read ({snap.key_error}); this run is held to "
              + (f"budget.max_spend_usd (${cfg.budget.max_spend_usd:g})" if cfg.budget.max_spend_usd is not None
                 else "no dollar cap of its own") + " and the server's own refusals")
    key = snap.key
    if key is not None:
        log.write(f"key: usage ${key.usage:.4f}, limit remaining "
                  f"{'none' if key.limit_remaining is None else f'${key.limit_remaining:.4f}'}")
    if snap.credits_error is not None:
        log.write(f"GET /credits failed: {snap.credits_error}")
    cr = snap.credits
    if cr is not None:
        log.write(f"credits: ${cr.total_credits:.4f} total, ${cr.total_usage:.4f} used")
    if snap.remaining is not None:
        governor.session_cap = snap.remaining
        key_cap = key.limit_remaining if key is not None else None
        governor.session_cap_source = (key_limit_label(key) if key is not None and key_cap is not None
                                       and (cr is None or key_cap <= cr.remaining) else "the account's credits")
    return ((key.usage if key is not None else None), (cr.total_usage if cr is not None else None), snap.endpoints,
            cr.remaining if cr is not None else None)


async def _reconcile(backend: Backend, mgmt: str | None, key_usage: float | None, credits_usage: float | None,
                     stats: RunStats, log: RunLog) -> None:
    ours = stats.spend_session
    try:
        if key_usage is not None:
            key = await backend.get_key_info()
            if key is not None:
                log.write(f"reconcile: this run's usage.cost total ${ours:.4f}; key usage grew ${key.usage - key_usage:.4f}")
        if credits_usage is not None and mgmt:
            cr = await backend.get_credits(mgmt)
            if cr is not None:
                log.write(f"reconcile: credits usage grew ${cr.total_usage - credits_usage:.4f}")
    except APIError as exc:
        log.write(f"reconcile skipped: {exc}")


def _health(cfg: RunConfig, endpoints: list[EndpointInfo] | None) -> ProviderHealth:
    """Provider health over the model's endpoints (when listed) and the configured routing."""
    r, q = cfg.routing, cfg.quality
    guard = RoutingGuard(endpoints, allowed=routable_endpoints(cfg, endpoints) if endpoints else None,
                         ignore=r.ignore, only=r.only, quantizations=r.quantizations)
    policy = HealthPolicy(window=q.provider_window, min_outcomes=q.provider_min_outcomes,
                          max_failure_rate=q.provider_max_failure_rate, cooldown_s=q.provider_cooldown_s,
                          billing_tolerance=q.billing_tolerance)
    return ProviderHealth(policy, guard)


#: a second SIGINT/SIGTERM this soon after the first is the same keypress delivered twice, not a second one
SIGNAL_DEBOUNCE_S = 0.2


def _install_signals(engine: Engine, display: Any) -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    count = 0
    last = 0.0

    def on_signal(signame: str) -> None:
        nonlocal count, last
        now = time.monotonic()
        if (count and now - last < SIGNAL_DEBOUNCE_S) or count >= 2:
            return  # one keypress delivered twice (terminal and shell), or the abort is already under way
        count, last = count + 1, now
        if count == 1:
            engine.stats.interrupt = signame  # the display shows the grace period counting down
            display.print(f"{signame}: stopping; grace period: finishing {engine.in_flight} requests in flight "
                          f"(up to {engine.options.grace_s:g}s); press Ctrl-C again to abort now")
            engine.request_stop(f"interrupted ({signame}); the next run resumes", exit_code=130, grace=True)
        else:
            display.print(f"{signame} again: aborting, exiting now; finished records are on disk")
            engine.request_stop(f"interrupted ({signame}); the next run resumes", exit_code=130, hard=True)

    return install_signal_handlers(on_signal)


def _engine_options(cfg: RunConfig, caps: Capabilities, rd: rundir.RunDir,
                    avoid: dict[tuple[str, str], list[str]]) -> EngineOptions:
    """The engine's settings from the config, the backend's capabilities and the run directory."""
    q = cfg.quality
    return EngineOptions(
        adaptive=cfg.retry.adaptive_concurrency, grace_s=cfg.retry.shutdown_grace_s,
        needs_prompt_ids=caps.needs_prompt_ids, cpu_workers=max(1, min(4, (os.cpu_count() or 2))),
        attempts_path=rd.attempts, health_path=rd.health,
        keep_unusable=q.keep_unusable, intake=IntakeRules.from_config(cfg), avoid=avoid,
        tail=TailPolicy(min_tokens_per_s=cfg.tail.min_tokens_per_s, slow_window_s=cfg.tail.slow_window_s,
                        stall_s=cfg.tail.stall_s, hedge_max_extra_spend=cfg.tail.hedge_max_extra_spend,
                        streamed=cfg.endpoint.stream),
    )


async def _main(cfg: RunConfig, api_key: str | None, mgmt: str | None, base_urls: list[str] | None, profile: Any,
                provenance: Provenance, plans: list[DatasetPlan], partitions: list[PartitionPlan], governor: BudgetGovernor, stats: RunStats,
                log: RunLog, rd: rundir.RunDir,
                avoid: dict[tuple[str, str], list[str]]) -> tuple[int, str | None]:
    display = make_display(cfg.progress, stats, log, record=rd.progress)  # status reads logs/progress.json
    conns = sum(p.concurrency for p in partitions) + 16
    caps = capabilities(cfg.endpoint.kind)
    async with open_backend(cfg, api_key, base_urls=base_urls, connections=conns) as backend:
        key_usage, credits_usage, eps, credits_cap = await _account(backend, cfg, governor, log)
        if governor.abandoned:  # earlier runs' abandoned requests: their bills may be known by now
            await settle(backend, governor, open_abandoned(rd.attempts, rd.settlements), rd.settlements, wait_s=0.0,
                         log=log)
        stats.remaining = governor.remaining
        if governor.remaining is not None and governor.remaining <= 0:
            return 1, governor.stop_message()
        assembler = Assembler(profile, provenance=provenance, parse_ids=caps.output_is_raw_ids,
                              settings=generation_settings(cfg))
        if wants_batches(cfg, rd):  # endpoint.mode batch, or open batches of an earlier run (generate.batch)
            display.start()
            try:
                phase = await run_batch_phase(cfg, backend, rd=rd, plans=plans, partitions=partitions,
                                              governor=governor, stats=stats, log=log, display=display,
                                              assembler=assembler)
            finally:
                await display.stop()
            if phase.exit_code or not phase.sync_after:
                await _reconcile(backend, mgmt, key_usage, credits_usage, stats, log)
                return phase.exit_code, phase.stop_reason
            plans = leftover_plans(plans, phase, stats, planned=cfg.endpoint.mode == "batch")
            for key, slugs in phase.avoid.items():  # providers that gave these samples unusable batch results
                mine = avoid.setdefault(key, [])
                mine += [x for x in slugs if x not in mine]
        options = _engine_options(cfg, caps, rd, avoid)
        engine = Engine(
            backend=backend, assembler=assembler,
            datasets=plans, partitions=partitions, governor=governor, policy=RetryPolicy(cfg.retry), stats=stats,
            log=log, display=display, health=_health(cfg, eps), options=options,
        )
        uninstall = _install_signals(engine, display)
        watch = None
        if caps.account and cfg.budget.key_recheck_s > 0:
            watch = asyncio.create_task(watch_key(
                backend, governor, interval_s=cfg.budget.key_recheck_s, credits_cap=credits_cap, log=log,
                stop=lambda why: engine.request_stop(why, exit_code=1)))
        display.start()
        try:
            result = await engine.run()
        finally:
            if watch is not None:
                watch.cancel()
            uninstall()
            await display.stop()
        if governor.open_abandoned:
            await settle(backend, governor, list(governor.open_abandoned), rd.settlements,
                         wait_s=0.0 if stats.aborting else SETTLE_WAIT_S, log=log)
        await _reconcile(backend, mgmt, key_usage, credits_usage, stats, log)
    return result.exit_code, result.stop_reason


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``generate`` row of ``phases.PHASES``: an early stop (budget, auth) skips to the report, Ctrl-C
    stops the run, and a run with no usable record skips audit and merge too."""
    o = ctx.options
    gen = run_generate(ctx.cfg, echo=ctx.echo, profile=ctx.profile, force=o.force, datasets=o.datasets,
                       partition=o.partition, argv=o.argv, base_url_flag=o.base_url_flag)
    usable = sum(d.done_before + d.done for d in gen.datasets)
    if gen.exit_code == EXIT_INTERRUPTED:
        return PhaseOutcome(EXIT_INTERRUPTED, gen.message, then="stop")
    if gen.exit_code not in (EXIT_OK, EXIT_FAILURES) or not usable:
        message = gen.message or "generate produced no usable record"
        ctx.echo(f"generate {'stopped early' if gen.exit_code != EXIT_FAILURES else 'finished'} ({message})"
                 + ("" if usable else "; nothing usable to merge") + "; skipping audit and merge, writing the report")
        return PhaseOutcome(gen.exit_code or EXIT_FAILURES, message, then="report")
    # Some samples failing (exit 4) is no early stop: the phases after run over what is done.
    return PhaseOutcome(gen.exit_code, gen.message if gen.exit_code else None)
