"""``draftgen plan CONFIG``: tokens, dollars, time and hidden-state disk per dataset, before spending.

Per dataset it reports the prompts (``prepared/<dataset>/stats.json``; ``prepare`` runs first when a
dataset is not prepared), the expected output tokens (within the dataset's token budget, shown in the basis
column), the cost, its share of the run's time (waves of work per partition, ``plan.timing``), and whether
``budget.max_spend_usd`` suffices (and, if not, how far to cap each dataset), with how far spend may pass it
(what can be in flight: per partition the smaller of its concurrency and its requests left) and, when that
is a large share of the budget, what would shrink it; then the same work bought synchronously, at
``service_tier: flex`` and through the Batch API, side by side (``plan.modes``: cost, expected time, whether
the model has a flex endpoint and a batch variant). A model id that does not look like the profile's family
is a note (``tokens.profile_fit``). With
``hidden_states.hidden_size`` set it also gives the hidden-state disk size for ``merge.max_seq_len`` and
the extraction time, at ``hidden_states.extraction_tokens_per_s`` or, when unset, at the throughput the last
``draftgen extract`` (or ``extract --pilot N``) measured and recorded in its local manifest.json (the line
says which).

Where the numbers come from, best first:

- output tokens, latency and cost per sample: responses already in ``raw/<dataset>/raw_responses.jsonl``,
  including the pilot's; after an interrupt, with the samples cut off mid-stream counted as censored
  lengths (``plan.lengths``: the finished ones are the short ones), the cost and latency scaled to the
  longer samples left; else ``plan.avg_output_tokens`` / ``plan.avg_latency_s`` and the routed prices;
  else the partition's ``max_tokens`` (an upper bound);
- a stream's rate and first-token time: those responses; else what ``draftgen probe`` measured
  (``logs/probe.json``, the same model); else ``timing.ASSUMED_TOKENS_PER_S``;
- prices: the model's endpoints (``GET /models/{model}/endpoints``) filtered by ``routing``
  (``draftgen.backends.pricing``).

The pilot (``plan.pilot`` = N, ``plan.pilot``'s module) sends the first N pending prompts of each dataset
through the normal generate path into a side run directory (``<run_dir>/plan/pilot``), with generate's plain
status line on stderr every 10 s (unless ``progress: off``), then appends its records to the run's raw logs
(and its emulator ground truth to the run's), so ``draftgen run`` does not send them again.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import msgspec

from draftgen.backends import EndpointInfo, capabilities
from draftgen.backends.account import read_account_at
from draftgen.backends.pricing import PriceEstimate, eligible_endpoints, estimate_price, tier_pool
from draftgen.config import RunConfig
from draftgen.fmt import fmt_duration, fmt_int, fmt_usd, render_text
from draftgen.hidden.estimate import DatasetTokens, format_bytes, format_hidden_report, hidden_states_report
from draftgen.phases import Echo
from draftgen.phases.plan.lengths import describe, lengths_left
from draftgen.phases.plan.modes import ModeLine, mode_lines, mode_table, read_batch_endpoints
from draftgen.phases.plan.pilot import send_pilot
from draftgen.phases.plan.timing import (
    ASSUMED_TOKENS_PER_S,
    ASSUMED_TTFT_S,
    PartitionTime,
    PartitionWork,
    StreamRates,
    dataset_shares,
    partition_times,
    stream_rates,
)
from draftgen.records import (
    DatasetStats,
    HiddenStatesReport,
    ProbeMeasurement,
    ResponseScanView,
)
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.runview.datasets import DatasetMetrics
from draftgen.runview.metrics import compute_metrics
from draftgen.store import (
    iter_jsonl,
    read_json,
)
from draftgen.tokens import Profile, profile_fit, profile_from_config

__all__ = ["ASSUMED_TOKENS_PER_S", "DatasetPlanLine", "PlanReport", "estimate_plan", "run_plan", "send_pilot"]

#: The in-flight worst case above this share of the dollar budget: plan says what would shrink it.
LARGE_BOUND_SHARE = 0.2


class DatasetPlanLine(msgspec.Struct, kw_only=True):
    dataset: str
    prompts: int
    short: int = 0
    long: int = 0
    done: int = 0
    remaining: int = 0
    avg_prompt_tokens: float = 0.0
    avg_output_tokens: float = 0.0
    output_basis: str = ""
    expected_output_tokens: int = 0
    """Completion tokens still to generate (limited by the dataset's token budget)."""
    cost_usd: float | None = None
    """Expected cost of what remains."""
    cost_basis: str = ""
    latency_s: float = 0.0
    """Mean latency of one of its requests."""
    requests: float = 0.0
    """Requests still to send (fewer than ``remaining`` when its token budget binds first)."""
    long_requests: float = 0.0
    """Of ``requests``, those of the long partition."""
    token_budget: int | None = None
    """Its completion-token budget (``datasets[].token_budget``, else ``budget.token_budget``)."""
    tokens_done: int = 0
    """Completion tokens already generated (what counts against ``token_budget``)."""
    time_s: float = 0.0
    """Its share of the run's time (``plan.timing``: the rows add up to ``PlanReport.time_s``)."""
    cap_samples: int | None = None
    """Suggested total samples (done + new) to fit the dollar budget; None: no cap needed."""
    cap_tokens: int | None = None
    """The same cap as a completion-token budget (``datasets[].token_budget``)."""


class PlanReport(msgspec.Struct, kw_only=True):
    datasets: list[DatasetPlanLine]
    prices: PriceEstimate | None = None
    eligible_endpoints: list[str] = msgspec.field(default_factory=list)
    spent_usd: float = 0.0
    expected_cost_usd: float | None = None
    budget_usd: float | None = None
    budget_ok: bool | None = None
    account_remaining_usd: float | None = None
    """What the key may still spend (its limit remaining, or the account's credits), when known."""
    account_ok: bool | None = None
    time_s: float = 0.0
    """The run's time: the longest partition's (``plan.timing``)."""
    partitions: list[PartitionTime] = msgspec.field(default_factory=list)
    pilot_responses: int = 0
    hidden: HiddenStatesReport | None = None
    extraction_s: float | None = None
    extraction_tokens_per_s: float | None = None
    extraction_rate_source: str | None = None  # the config key, or the manifest whose measured rate was used
    # which drafters the configured capture feeds, and the disk of each layer choice (hidden.algorithms)
    algorithms: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    modes: list[ModeLine] = msgspec.field(default_factory=list)
    """Sync, flex and batch side by side (``plan.modes``)."""


# -- estimate --------------------------------------------------------------------------------------------


def _lengths(cfg: RunConfig, name: str) -> list[int]:
    out: list[int] = []
    seen: set[str] = set()
    for _, row in iter_jsonl(RunDir(cfg.run_path).raw(name), ResponseScanView):
        if row.sample_id in seen or row.usage is None:
            continue
        seen.add(row.sample_id)
        out.append(row.usage.prompt_tokens + row.usage.completion_tokens)
    return out


def _line(cfg: RunConfig, name: str, obs: DatasetMetrics, prices: PriceEstimate | None, notes: list[str]) -> DatasetPlanLine:
    ds = cfg.dataset(name)
    stats = read_json(RunDir(cfg.run_path).prepared_stats(name), DatasetStats)
    line = DatasetPlanLine(dataset=name, prompts=stats.samples, short=stats.short, long=stats.long, done=obs.done)
    line.remaining = max(0, stats.samples - obs.done)
    line.avg_prompt_tokens = stats.prompt_tokens / stats.samples if stats.samples else 0.0
    parts = cfg.partitions
    cut = lengths_left(cfg, name) if obs.done else None
    if cut is not None and cut.left:
        line.avg_output_tokens = cut.mean_left
        line.output_basis = f"observed ({obs.done}) + {cut.cut} cut off, censored fit"
        notes.append(describe(cut, name))
    elif obs.done and obs.mean_completion_tokens is not None:
        line.avg_output_tokens = obs.mean_completion_tokens
        line.output_basis = f"observed ({obs.done})"
    elif cfg.plan.avg_output_tokens is not None:
        line.avg_output_tokens = float(cfg.plan.avg_output_tokens)
        line.output_basis = "plan.avg_output_tokens"
    else:
        share_long = stats.long / stats.samples if stats.samples else 0.0
        line.avg_output_tokens = (1 - share_long) * parts.short.max_tokens + share_long * parts.long.max_tokens
        line.output_basis = "max_tokens"
    expected = line.remaining * line.avg_output_tokens
    budget = ds.token_budget if ds.token_budget is not None else cfg.budget.token_budget
    line.token_budget, line.tokens_done = budget, obs.completion_tokens
    if budget is not None:
        expected = min(expected, max(0, budget - obs.completion_tokens))
    line.expected_output_tokens = round(expected)
    new_samples = expected / line.avg_output_tokens if line.avg_output_tokens else float(line.remaining)
    # The observed per-sample figures are the finished samples'; with a censored fit the samples left are
    # longer: cost and latency scale with their expected length.
    longer = line.avg_output_tokens / obs.mean_completion_tokens if cut is not None and obs.mean_completion_tokens else 1.0
    if obs.done and obs.cost_usd > 0:
        line.cost_usd = obs.cost_usd / obs.done * new_samples * longer
        line.cost_basis = "observed"
    elif prices is not None:
        per = line.avg_prompt_tokens * prices.prompt + line.avg_output_tokens * prices.completion + prices.request
        line.cost_usd = per * new_samples
        line.cost_basis = "prices"
    elif capabilities(cfg.endpoint.kind).self_hosted:
        line.cost_usd = 0.0
        line.cost_basis = "local server"
    if obs.done and obs.mean_latency_s is not None:
        line.latency_s = obs.mean_latency_s * longer
    elif cfg.plan.avg_latency_s is not None:
        line.latency_s = cfg.plan.avg_latency_s
    else:
        probe = probed(cfg)
        ttft, rate = (probe.ttft_s or ASSUMED_TTFT_S, probe.tokens_per_s) if probe else (ASSUMED_TTFT_S, ASSUMED_TOKENS_PER_S)
        line.latency_s = ttft + line.avg_output_tokens / rate
    line.requests = min(float(line.remaining), new_samples)
    long_left = min(stats.long, line.remaining)
    line.long_requests = line.requests * long_left / line.remaining if line.remaining else 0.0
    return line


def probed(cfg: RunConfig) -> ProbeMeasurement | None:
    """What ``draftgen probe`` measured of a stream of this model (``logs/probe.json``), if it did."""
    path = RunDir(cfg.run_path).probe
    if not path.is_file():
        return None
    m = read_json(path, ProbeMeasurement)
    return m if m.model == cfg.model.id and m.tokens_per_s > 0 else None


def _basis(ln: DatasetPlanLine) -> str:
    """The basis column of a dataset's row: where its output and cost come from, and its token budget."""
    parts = [ln.output_basis, ln.cost_basis or "no prices"]
    if ln.token_budget is not None:
        parts.append(f"token budget {fmt_int(ln.tokens_done)}/{fmt_int(ln.token_budget)}")
    return " · ".join(parts)


def _time(cfg: RunConfig, rep: PlanReport) -> None:
    """The run's time and each dataset's share of it (``plan.timing``)."""
    work = [w for ln in rep.datasets for w in (
        PartitionWork(dataset=ln.dataset, partition="short", requests=ln.requests - ln.long_requests,
                      latency_s=ln.latency_s),
        PartitionWork(dataset=ln.dataset, partition="long", requests=ln.long_requests, latency_s=ln.latency_s))]
    rates = stream_rates(RunDir(cfg.run_path).raw(ln.dataset) for ln in rep.datasets)
    probe = probed(cfg) if not rates.responses else None
    basis = rates.basis
    if probe is not None:  # no response yet: the stream the probe measured, not an assumed rate
        rates = StreamRates(ttft_s=probe.ttft_s or ASSUMED_TTFT_S, slowest_tokens_per_s=probe.tokens_per_s)
        basis = f"measured by draftgen probe, {RunDir(cfg.run_path).probe}"
    rep.partitions = partition_times(cfg, work, rates)
    rep.time_s = max((p.time_s for p in rep.partitions), default=0.0)
    shares = dataset_shares(work, rep.time_s)
    for ln in rep.datasets:
        ln.time_s = shares.get(ln.dataset, 0.0)
    if rep.partitions:
        rep.notes.append("time: partitions run side by side, each in waves of its concurrency; "
                         + "; ".join(p.describe() for p in rep.partitions)
                         + f"; slowest stream {rates.slowest_tokens_per_s:,.0f} tokens/s ({basis}); "
                         "no rate limiting assumed")


def _as_batch(rep: PlanReport) -> None:
    """``endpoint.mode: batch``: the headline, the rows and the budget line at the Batch API's cost and time
    (``plan.modes``' batch line), not the synchronous ones; a note when it is not known."""
    batch = next((m for m in rep.modes if m.mode == "batch"), None)
    if batch is None or not batch.available or batch.cost_usd is None or batch.vs_sync is None or batch.time_s is None:
        why = batch.note if batch is not None else "no batch line"
        rep.notes.append(f"endpoint.mode is batch but the Batch API's cost is not known ({why}); "
                         "cost and time above are the synchronous ones")
        return
    for ln in rep.datasets:
        if ln.cost_usd is not None:
            ln.cost_usd *= batch.vs_sync
        ln.time_s = ln.time_s * batch.time_s / rep.time_s if rep.time_s else 0.0
    rep.expected_cost_usd, rep.time_s = batch.cost_usd, batch.time_s
    rep.notes.append(f"endpoint.mode is batch: cost and time are the Batch API's ({batch.vs_sync:.2f} × the "
                     f"synchronous cost; {batch.time_text}); the sync and flex lines are for comparison")


def _fit_budget(rep: PlanReport, lines: list[DatasetPlanLine], done_tokens: dict[str, int]) -> None:
    if rep.budget_usd is None or rep.expected_cost_usd is None:
        return
    rep.budget_ok = rep.spent_usd + rep.expected_cost_usd <= rep.budget_usd + 1e-12
    if rep.budget_ok or rep.expected_cost_usd <= 0:
        return
    f = max(0.0, rep.budget_usd - rep.spent_usd) / rep.expected_cost_usd
    for ln in lines:
        if ln.remaining and ln.cost_usd:
            ln.cap_samples = ln.done + math.floor(ln.remaining * f)
            ln.cap_tokens = done_tokens.get(ln.dataset, 0) + math.floor(ln.expected_output_tokens * f)


def _hidden(cfg: RunConfig, lines: list[DatasetPlanLine], rep: PlanReport) -> None:
    hs = cfg.hidden_states
    if hs.hidden_size is None:
        rep.notes.append("set hidden_states.hidden_size (e.g. 4096 for Qwen3-8B, 7168 for Kimi-K2.5) "
                         "for the hidden-state disk estimate")
        return
    cap = cfg.merge.max_seq_len
    items: list[DatasetTokens] = []
    for ln in lines:
        ds = cfg.dataset(ln.dataset)
        samples = ln.done + (ln.cap_samples - ln.done if ln.cap_samples is not None else ln.remaining)
        samples = round(samples * ds.weight)
        if ds.cap is not None:
            samples = min(samples, ds.cap)
        lens = _lengths(cfg, ln.dataset)
        if lens:
            per_capped = sum(min(n, cap) for n in lens) / len(lens)
            per = sum(lens) / len(lens)
        else:
            per = ln.avg_prompt_tokens + ln.avg_output_tokens
            per_capped = min(per, cap)
        items.append(DatasetTokens(dataset=ln.dataset, tokens=round(samples * per_capped),
                                   tokens_uncapped=round(samples * per), samples=samples))
    rep.hidden = hidden_states_report(items, hidden_size=hs.hidden_size, slots=hs.slots, dtype=hs.dtype,
                                      max_seq_len=cap)
    rate: float | None = hs.extraction_tokens_per_s
    source: str | None = "hidden_states.extraction_tokens_per_s"
    if not rate:
        rate, source = _measured_extraction(cfg)
    if rate:
        rep.extraction_s = rep.hidden.tokens / rate
        rep.extraction_tokens_per_s, rep.extraction_rate_source = rate, source
    else:
        rep.notes.append("set hidden_states.extraction_tokens_per_s for the extraction time, or measure it: "
                         "draftgen extract --pilot N (after merge)")
    rep.algorithms = _algorithms(cfg, rep.hidden.tokens)


def _algorithms(cfg: RunConfig, tokens: int) -> list[str]:
    """Which drafters the configured capture feeds and the disk each layer choice costs (``hidden.algorithms``);
    needs the target's layer count, read from ``hidden_states.model``'s config.json when it is a local folder."""
    from draftgen.errors import ConfigError
    from draftgen.hidden.algorithms import bytes_per_token, default_aux, feeds_lines
    from draftgen.store import read_json_object

    hs = cfg.hidden_states
    folder = cfg.path(hs.model) if hs.model else None
    if folder is None or not (folder / "config.json").is_file() or hs.hidden_size is None:
        return []
    raw = read_json_object(folder / "config.json")
    text_cfg = raw.get("text_config") or raw
    layers = int(text_cfg.get("num_hidden_layers") or 0)
    try:
        stored = sorted(hs.layer_ids) if hs.layer_ids else default_aux("eagle3", layers)
        lines = feeds_lines(stored, layers, hs.hidden_size, hs.dtype, tokens)
    except ConfigError:
        return []
    if cfg.train.online:
        model_dtype = str(text_cfg.get("torch_dtype") or text_cfg.get("dtype") or "bfloat16")
        server_dtype = {"float32": "fp32", "float16": "fp16"}.get(model_dtype, "bf16")  # vLLM writes this dtype
        lines.append(_online_window(cfg, bytes_per_token(len(stored), hs.hidden_size, server_dtype)))
    return lines


def _online_window(cfg: RunConfig, per_token: int) -> str:
    """``train --online``'s disk: the window (``train.online_window_mb``) against what full speed wants, two
    batches of the servers' files (``per_token``: their bytes a token, in the model's dtype)."""
    from draftgen.hidden.estimate import format_bytes

    batch = cfg.train.total_seq_len * per_token
    window = cfg.train.online_window_mb * 1e6
    text = (f"train --online: no set stored; the servers' files take at most {format_bytes(window)} at once "
            f"(train.online_window_mb); full speed wants about {format_bytes(2 * batch)}, two "
            f"{cfg.train.total_seq_len:,}-token batches at {per_token:,} bytes a token")
    if window < batch:
        text += "; the window is under one batch: the trainer will wait for the servers"
    return text


def _measured_extraction(cfg: RunConfig) -> tuple[float | None, str | None]:
    """The throughput the last ``draftgen extract`` (or ``--pilot``) recorded in a local hidden-state
    manifest (the configured destination, ``hidden.stream.hidden_url``, when it is a folder, else
    ``<run>/hidden``)."""
    from draftgen.hidden.stream import hidden_url
    from draftgen.records import HiddenManifest
    from draftgen.rundir import HiddenLayout, RunDir
    from draftgen.store import read_json

    url = hidden_url(cfg)
    root = Path(url) if "://" not in url else RunDir(cfg.run_path).hidden
    path = root / HiddenLayout.manifest
    if not path.is_file():
        return None, None
    rate = read_json(path, HiddenManifest).throughput_tokens_per_s
    return (rate, f"measured by draftgen extract ({path})") if rate else (None, None)


def _print(rep: PlanReport, cfg: RunConfig, echo: Echo) -> None:
    from rich.table import Table

    if rep.prices is not None:
        p = rep.prices
        echo(f"prices: ${p.prompt * 1e6:.4f}/M prompt, ${p.completion * 1e6:.4f}/M completion ({p.basis}; "
             f"completion ${p.min_completion * 1e6:.2f}–${p.max_completion * 1e6:.2f}/M over "
             f"{len(rep.eligible_endpoints)} allowed endpoints: {', '.join(rep.eligible_endpoints)})")
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for col in ("dataset", "prompts", "done", "avg out", "expected out", "cost", "time", "basis"):
        table.add_column(col, justify="left" if col in ("dataset", "basis") else "right")
    for ln in rep.datasets:
        table.add_row(ln.dataset, fmt_int(ln.prompts), fmt_int(ln.done), f"{ln.avg_output_tokens:,.0f}",
                      fmt_int(ln.expected_output_tokens), fmt_usd(ln.cost_usd), fmt_duration(ln.time_s), _basis(ln))
    table.add_section()
    table.add_row("all", fmt_int(sum(x.prompts for x in rep.datasets)), fmt_int(sum(x.done for x in rep.datasets)), "",
                  fmt_int(sum(x.expected_output_tokens for x in rep.datasets)), fmt_usd(rep.expected_cost_usd),
                  fmt_duration(rep.time_s), "", style="bold")
    echo(render_text(table))
    echo("basis: output tokens from observed responses (count), plan.avg_output_tokens, or max_tokens (upper "
         "bound) · cost from observed $/sample or endpoint prices · token budget: completion tokens done/budget; "
         "time: each dataset's share of the run's (the rows add up to it); total time: partitions run in parallel")
    if rep.modes:
        echo("what remains, bought three ways:")
        for text in mode_table(rep.modes):
            echo(f"  {text}")
    if rep.budget_usd is None:
        echo(f"budget: none set; spent so far {fmt_usd(rep.spent_usd)}")
    elif rep.budget_ok:
        echo(f"budget: {fmt_usd(rep.budget_usd)} suffices (spent {fmt_usd(rep.spent_usd)} + expected "
             f"{fmt_usd(rep.expected_cost_usd)})")
    elif rep.budget_ok is False:
        echo(f"budget: {fmt_usd(rep.budget_usd)} does NOT suffice (spent {fmt_usd(rep.spent_usd)} + expected "
             f"{fmt_usd(rep.expected_cost_usd)}); to fit, cap:")
        for ln in rep.datasets:
            if ln.cap_samples is not None:
                echo(f"  {ln.dataset}: about {ln.cap_samples:,} of {ln.prompts:,} samples "
                     f"→ datasets[{[d.name for d in cfg.datasets].index(ln.dataset)}].token_budget: {ln.cap_tokens}")
    if rep.budget_usd is not None:
        echo(_budget_bound(cfg, rep))
    if rep.hidden is not None:
        for text in format_hidden_report(rep.hidden):
            echo(text)
        if rep.extraction_s is not None:
            echo(f"  extraction: {fmt_duration(rep.extraction_s)} at {rep.extraction_tokens_per_s or 0:,.0f} tokens/s, "
                 f"{rep.extraction_rate_source} ({format_bytes(rep.hidden.bytes)} written)")
        for text in rep.algorithms:
            echo(f"  {text}")
    if rep.account_ok is False:
        echo(f"account: the key can spend {fmt_usd(rep.account_remaining_usd)} more, less than the expected "
             f"{fmt_usd(rep.expected_cost_usd)}; add credits or raise the key's limit")
    elif rep.account_ok:
        echo(f"account: {fmt_usd(rep.account_remaining_usd)} available to the key")
    for note in rep.notes:
        echo(f"note: {note}")


def _budget_bound(cfg: RunConfig, rep: PlanReport) -> str:
    """How far spend may pass ``budget.max_spend_usd`` (``engine.budget``): never under ``strict``; under
    ``expected`` at most the worst case of the requests that can be in flight: per partition the smaller of
    its concurrency and its requests left, at max_tokens. When that is a large share of the budget, what
    would shrink it."""
    budget = fmt_usd(rep.budget_usd)
    if cfg.budget.token_policy == "strict":
        return f"budget bound: spend never passes {budget} (token_policy strict: every request reserves its worst case)"
    left = {p.partition: p.requests for p in rep.partitions}
    parts = [(n, min(getattr(cfg.partitions, n).concurrency, math.ceil(left.get(n, 0.0))),
              getattr(cfg.partitions, n).max_tokens) for n in ("short", "long")]
    parts = [p for p in parts if p[1] > 0]
    if not parts:
        return f"budget bound: nothing is left to send; spend stays at what is spent (budget {budget})"
    slots = " + ".join(f"{c:,} × {m:,}" for _, c, m in parts)
    price = (rep.prices.max_completion or rep.prices.completion) if rep.prices is not None else None
    worst_usd = sum(c * m for _, c, m in parts) * price if price else None
    worst = f" = {fmt_usd(worst_usd)} at the dearest routable price" if worst_usd is not None else ""
    line = (f"budget bound: spend stays under {budget} plus at most the worst case of the requests in flight "
            f"({slots} completion tokens{worst}, plus their prompts; in flight: the smaller of each partition's "
            "concurrency and its requests left); token_policy expected reserves the p90 output length and "
            "switches to worst cases near the cap")
    if worst_usd is not None and rep.budget_usd and worst_usd > LARGE_BOUND_SHARE * rep.budget_usd:
        big = max(parts, key=lambda p: p[1] * p[2])[0]
        line += (f". That is {worst_usd / rep.budget_usd:.0%} of the budget; to shrink it lower "
                 f"partitions.{big}.concurrency or partitions.{big}.max_tokens, or set budget.token_policy: "
                 "strict (spend then never passes the budget)")
    return line


def run_plan(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None,
             force: bool = False) -> PlanReport:
    """Estimate what the run will cost and take (see the module docstring). Holds the run directory's
    writer lock: prepare and the pilot write into it. ``profile``: the already loaded profile of
    ``cfg.model`` (default: loaded here, once, for prepare, the pilot and the emulator). ``force``: hold a
    run directory made with another target (``rundir.claim.writer``)."""
    with writer(cfg, "plan", force=force):
        return _plan(cfg, echo, profile if profile is not None else profile_from_config(cfg), force)


def _plan(cfg: RunConfig, echo: Echo, profile: Profile, force: bool) -> PlanReport:
    names = [d.name for d in cfg.datasets]
    rd = RunDir(cfg.run_path)
    if any(not rd.prepared_stats(n).is_file() for n in names):
        from draftgen.phases.prepare.run import run_prepare

        run_prepare(cfg, echo=echo, profile=profile, force=force)
    notes: list[str] = []
    pilot_added, stopped = (send_pilot(cfg, cfg.plan.pilot, echo=echo, profile=profile, force=force)
                            if cfg.plan.pilot > 0 else (0, None))
    if stopped:
        notes.append(f"the pilot stopped early (its reason is above); the estimates use the {pilot_added} "
                     "responses it added")
    return estimate_plan(cfg, echo=echo, profile=profile, notes=notes, pilot_responses=pilot_added)


def estimate_plan(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None,
                  datasets: list[str] | None = None, notes: list[str] | None = None,
                  pilot_responses: int = 0) -> PlanReport:
    """The estimate of what remains, from what is on disk, printed through ``echo``: no pilot, no prepare,
    and nothing written (the datasets must be prepared). ``datasets``: only these (default: every one);
    the spend so far counts every dataset. ``draftgen run`` shows it before generating (``pipeline``)."""
    all_names = [d.name for d in cfg.datasets]
    names = [n for n in all_names if not datasets or n in datasets]
    notes = list(notes or [])
    from draftgen.emulator.embedded import embedded_endpoint  # here: importing plan loads no emulator module

    # The account and price list (``account.read_account``): a rejected key raises AuthError, planning a
    # run the key cannot make is pointless; other failures are notes.
    with embedded_endpoint(cfg, profile=profile) as urls:
        snap = asyncio.run(read_account_at(cfg, urls))
        batch_eps, batch_error = read_batch_endpoints(cfg, urls)
    eps: list[EndpointInfo] | None = snap.endpoints
    account: float | None = snap.remaining
    for what, why in (("GET /key", snap.key_error), ("GET /credits", snap.credits_error)):
        if why is not None:
            notes.append(f"{what} failed ({why}); the money left on the account is not known from it")
    if snap.endpoints_error is not None:
        notes.append(f"prices not available ({snap.endpoints_error}); costs use observed responses only")
    prices: PriceEstimate | None = None
    eligible: list[EndpointInfo] = []
    if eps is not None:
        r = cfg.routing  # the service tier's endpoints only (a tier endpoint serves only those who ask)
        eligible = eligible_endpoints(tier_pool(eps, cfg.endpoint.service_tier, [*(r.only or []), *(r.order or [])]), r)
        prices = estimate_price(eligible, cfg.routing)
        if prices is None:
            notes.append("the routing config (ignore/only/quantizations/max_price) excludes every endpoint")
    m = compute_metrics(cfg.run_path, all_names)
    by = {d.name: d for d in m.datasets}
    lines = [_line(cfg, n, by[n], prices, notes) for n in names]
    costs = [ln.cost_usd for ln in lines]
    rep = PlanReport(
        datasets=lines, prices=prices, eligible_endpoints=[e.tag or e.provider_name for e in eligible],
        spent_usd=m.total.spent_usd, expected_cost_usd=None if any(c is None for c in costs) else sum(c or 0.0 for c in costs),
        budget_usd=cfg.budget.max_spend_usd, pilot_responses=pilot_responses, notes=notes,
        account_remaining_usd=account,
    )
    if account is not None and rep.expected_cost_usd is not None:
        rep.account_ok = rep.expected_cost_usd <= account
    _time(cfg, rep)
    if any(ln.output_basis == "max_tokens" for ln in lines):
        notes.append("output tokens are upper bounds (max_tokens); set plan.pilot (or `draftgen plan --pilot N`) for real figures")
    fit = profile_fit(cfg.model.id, cfg.model.profile)
    if fit is not None:
        notes.append(fit)
    rep.modes = mode_lines(cfg, lines=list(lines), sync_cost=rep.expected_cost_usd, sync_time_s=rep.time_s,
                           sync_prices=prices, endpoints=eps, batch_endpoints=batch_eps, batch_error=batch_error)
    if cfg.endpoint.mode == "batch":
        _as_batch(rep)
    _fit_budget(rep, lines, {d.name: d.completion_tokens for d in m.datasets})
    _hidden(cfg, lines, rep)
    _print(rep, cfg, echo)
    return rep
