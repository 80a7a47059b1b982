"""``draftgen status [CONFIG | RUN_DIR]``: a terminal summary of a run directory, during a run or after it.

Reads only the run directory (through ``runview.metrics.compute_metrics``), so it is safe to run while
``generate`` is writing: an unterminated last line of a raw log is skipped. Writes nothing and never
takes the writer lock. Rendering uses rich tables; colour is used only when stdout is a terminal.

Each row is one phase of the phase table (``phases.PHASES``: the same names, in run order), in one state
(``phase_states``), and shown done only when its output is complete and current:

    prepare   done: every selected dataset has prepared/<dataset>; incomplete: some have
    generate  done: every prepared sample of the selected datasets has a response (done == planned);
              incomplete: some have (failed, budget-skipped or stopped samples count as not done)
    any other phase, by its ``Phase.output`` (a phase without one has no row):
              done: the output exists and is not older than its input: the raw logs for the phases up to
              merge (audit/audit.json, merged/manifest.json), merged/manifest.json for those after it
              (hidden/manifest.json, train/train.json, accept/acceptance.json, report.html; a final phase's
              output without a merged manifest is "written before merge"); incomplete: it is older, or
              its ``Phase.refused`` says why it is not done (train: a drafter refused, not published).
              A phase the config may leave out (an ``enabled`` predicate: extract, train, accept) is listed
              only once its output's folder exists; with no output yet it is incomplete ("started, not
              finished")
    any       running: a live process holds ``.draftgen.lock`` for this phase (``draftgen <phase>``, or
              ``draftgen run``, whose running phase is the first one not done); pending: nothing yet

While ``generate`` runs, its ETA and pace as the run records them (``logs/progress.json``, written by the
live display with each status line: ``engine.timemodel``'s ETA, counted down from when it was written, and
this run's elapsed time and mean tok/s under the display's one definition and labels); once the run is over,
its last figures. The span from the first response to the last (over every run) is labelled as such.

After the table: provider fidelity when extract or online training measured it (``runview.chain.read_fidelity``
and ``fidelity_lines``: one line per provider, a warning line in red per flagged one; whole in ``--json``'s
``fidelity``); the rounds of generation when there are several (``runview.rounds``); OpenRouter batches (``endpoint.mode: batch``, the
batch journal): how many wait to be submitted, are submitted, in progress and done, each open one's age and the
dollars it reserves.

The selected datasets are the config's (``status CONFIG``), else those of run.json's config snapshot,
else every dataset folder found; their completion-token budgets (``token_budget``) are read the same way.
``--json`` prints one ``StatusSummary``; ``--watch`` redraws every N seconds until Ctrl-C (which ends it
with exit 0). At 80 columns nothing is cut: the table's headers take two lines, and long lines break
between their `` · `` segments.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from draftgen.engine.batch_journal import batch_lines, load_batches
from draftgen.engine.progress import eta_text, pace_text, pack
from draftgen.errors import InputError, RunDirError
from draftgen.fmt import fmt_duration, fmt_held, fmt_int, fmt_pct, fmt_time, fmt_usd, render_text
from draftgen.phases import PHASES, Echo, Phase, PhaseTable
from draftgen.records import HiddenFidelity, LockHolder, ProgressRecord, RunManifest
from draftgen.rundir import RunDir
from draftgen.rundir.claim import live_holder
from draftgen.runview.chain import accept_status, fidelity_lines, read_fidelity
from draftgen.runview.datasets import DatasetMetrics
from draftgen.runview.metrics import RunMetrics, compute_metrics
from draftgen.runview.providers import ProviderMetrics
from draftgen.runview.rounds import RoundCount, round_counts
from draftgen.secrets import redact
from draftgen.store import read_json

__all__ = [
    "DatasetStatus",
    "PhaseStatus",
    "StatusReport",
    "StatusSummary",
    "TokenTotals",
    "phase_states",
    "render_status",
    "resolve_target",
    "run_status",
    "status_command",
    "summarize",
    "watch_status",
]

#: the phases whose done-ness is counted (datasets, samples), not read from a ``Phase.output``
COUNTED = ("prepare", "generate")
PhaseState = Literal["done", "running", "incomplete", "pending"]
PHASE_MARK: dict[str, tuple[str, str]] = {
    "done": ("✓", "green"), "running": ("▶", "bold cyan"), "incomplete": ("◐", "yellow"), "pending": ("·", "dim"),
}
VERDICT_STYLE = {"green": ("GOOD", "bold green"), "amber": ("CHECK", "bold yellow"), "red": ("NOT USABLE", "bold red")}
MAX_PROVIDERS = 6
MAX_FINDINGS = 4


class PhaseStatus(msgspec.Struct, kw_only=True):
    name: str
    """A phase of the table (``phases.PHASES``)."""
    state: PhaseState
    done: int | None = None
    """Progress in samples (prepare: datasets) where the phase has one."""
    planned: int | None = None
    percent: float | None = None
    """100 * done / planned, rounded to 0.1 (None when nothing is planned)."""
    detail: str | None = None
    """Why a phase is not done although its output exists (e.g. older than the raw logs)."""


class DatasetStatus(msgspec.Struct, kw_only=True):
    name: str
    selected: bool
    """In the config (or run.json's config); a folder found only on disk is listed but not planned."""
    done: int
    planned: int | None
    """Prepared samples (None: not prepared yet)."""
    failed: int
    percent: float | None
    completion_tokens: int
    cost_usd: float
    token_budget: int | None = None
    """Its completion-token budget (``token_budget``), of which ``completion_tokens`` are used; None: none."""


class TokenTotals(msgspec.Struct, kw_only=True):
    prompt: int
    completion: int
    reasoning: int


class StatusSummary(msgspec.Struct, kw_only=True):
    """``draftgen status --json``: one object per refresh."""

    run_dir: str
    model: str | None
    endpoint: str | None
    phases: list[PhaseStatus]
    datasets: list[DatasetStatus]
    tokens: TokenTotals
    spend_usd: float
    """Everything booked, as generate's budget books it (``RunMetrics.spend``): ``billed_usd`` (the records, done,
    orphaned or set aside by ``--redo``, and the attempts that left none) plus ``held_usd``."""
    billed_usd: float = 0.0
    held_usd: float = 0.0
    """The worst cases of the ``abandoned`` requests (cancelled on the wire) whose bill is not known yet."""
    abandoned: int = 0
    lock: LockHolder | None
    """The live holder of the writer lock, or None."""
    latest_activity: float | None
    verdict: str
    hedges: int = 0
    """Second requests sent for samples already on the wire (``tail``), and those whose response won."""
    hedges_won: int = 0
    hedge_extra_usd: float = 0.0
    """What the losing requests of hedged samples cost (part of ``spend_usd``)."""
    slow_streams: int = 0
    """Streams cancelled under ``tail.min_tokens_per_s`` and retried on another provider."""
    progress: ProgressRecord | None = None
    """generate's latest figures (``logs/progress.json``): its ETA and pace; ``finished`` once it ended."""
    live: bool = False
    """``progress`` was written by the process that holds the writer lock now (a run in progress)."""
    fidelity: HiddenFidelity | None = None
    """Extract's provider fidelity (``hidden/manifest.json``): each provider's agreement with the target, and
    which are flagged."""
    rounds: list[RoundCount] = msgspec.field(default_factory=list)
    """Per round of generation (``plan --next-round``), its prompts and those done; empty with one round."""


class StatusReport(msgspec.Struct, kw_only=True):
    run_dir: str
    metrics: RunMetrics
    summary: StatusSummary


def resolve_target(target: str) -> tuple[Path, list[str] | None]:
    """A run directory, or a config file whose ``run_dir`` is read. Returns (run dir, dataset names)."""
    p = Path(target)
    if p.is_dir():
        return p, None
    if p.is_file():
        from draftgen.config import load_config

        cfg = load_config(p)
        return cfg.run_path, [d.name for d in cfg.datasets]
    raise RunDirError(f"{target}: no such run directory or config file; give a run directory or a YAML config")


def _pct(done: int, planned: int | None) -> float | None:
    return round(100.0 * done / planned, 1) if planned else None


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def token_budgets(run_dir: Path, target: str) -> dict[str, int]:
    """Each dataset's completion-token budget: from the config ``target`` names, else run.json's config
    snapshot (datasets without one are left out)."""
    p = Path(target)
    if p.is_file():
        from draftgen.config import load_config

        cfg = load_config(p)
        out = {d.name: d.token_budget if d.token_budget is not None else cfg.budget.token_budget
               for d in cfg.datasets}
        return {k: v for k, v in out.items() if v is not None}
    marker = RunDir(run_dir).marker
    if not marker.is_file():
        return {}
    config = read_json(marker, RunManifest).config
    budget = config.get("budget")
    default = budget.get("token_budget") if isinstance(budget, dict) else None
    found: dict[str, int] = {}
    for d in config.get("datasets") or []:
        if isinstance(d, dict) and isinstance(d.get("name"), str):
            b = d.get("token_budget", default)
            if isinstance(b, int):
                found[d["name"]] = b
    return found


def _selected(run_dir: Path, configured: list[str] | None) -> list[str] | None:
    """The config's datasets, else run.json's config snapshot's, else None (every folder found)."""
    if configured is not None:
        return configured
    marker = RunDir(run_dir).marker
    if not marker.is_file():
        return None
    datasets = read_json(marker, RunManifest).config.get("datasets")
    if not isinstance(datasets, list):
        return None
    names = [d.get("name") for d in datasets if isinstance(d, dict)]
    return [n for n in names if isinstance(n, str)] or None


def _output_state(phase: Phase, out: Path, rd: RunDir, newer_than: int | None, *, before_merge: bool,
                  manifest_t: int | None) -> PhaseStatus | None:
    """The row of a phase judged by its output ``out`` (module docstring), or None: an optional phase not
    started."""
    if phase.enabled is not None and not out.parent.exists():
        return None  # one the config may leave out, and nothing of it here
    t = _mtime(out)
    if t is None:
        if phase.enabled is not None:
            return PhaseStatus(name=phase.name, state="incomplete", detail="started, not finished")
        return PhaseStatus(name=phase.name, state="pending")
    if before_merge:
        if newer_than is not None and t < newer_than:
            return PhaseStatus(name=phase.name, state="incomplete", detail="older than the raw logs")
    elif manifest_t is None:
        if phase.final:
            return PhaseStatus(name=phase.name, state="incomplete", detail="written before merge")
    elif t < manifest_t:
        return PhaseStatus(name=phase.name, state="incomplete", detail="older than merged/manifest.json")
    why = phase.refused(rd) if phase.refused is not None else None
    if why is not None:
        return PhaseStatus(name=phase.name, state="incomplete", detail=why)
    return PhaseStatus(name=phase.name, state="done", detail=accept_status(rd.root) if phase.name == "accept" else None)


def _counted(m: RunMetrics, selected: list[str] | None) -> tuple[PhaseStatus, PhaseStatus]:
    """prepare and generate, from the datasets' counts."""
    names = selected if selected is not None else [d.name for d in m.datasets]
    by = {d.name: d for d in m.datasets}
    sel = [by[n] for n in names if n in by]
    n_prepared = sum(1 for d in sel if d.prepared is not None)
    prep_state: PhaseState = "done" if sel and n_prepared == len(sel) else ("incomplete" if n_prepared else "pending")
    prepare = PhaseStatus(name="prepare", state=prep_state, done=n_prepared, planned=len(sel),
                          percent=_pct(n_prepared, len(sel)))
    planned = sum(d.prepared or 0 for d in sel)
    done = sum(min(d.done, d.prepared) if d.prepared is not None else 0 for d in sel)
    failed = sum(d.failed for d in sel)
    gen_state: PhaseState = ("done" if prep_state == "done" and done >= planned
                             else "incomplete" if done or failed else "pending")
    generate = PhaseStatus(name="generate", state=gen_state, done=done, planned=planned, percent=_pct(done, planned),
                           detail=f"{failed:,} failed" if failed and gen_state != "done" else None)
    return prepare, generate


def phase_states(m: RunMetrics, run_dir: Path, selected: list[str] | None,
                 holder: LockHolder | None, *, table: PhaseTable | None = None) -> list[PhaseStatus]:
    """The state of every phase of ``table`` (default ``phases.PHASES``), in its order, by the rules of the
    module docstring (files only; no clock)."""
    rd = RunDir(run_dir)
    table = PHASES if table is None else table
    counted = dict(zip(COUNTED, _counted(m, selected), strict=True))
    # a raw log appended after an output was written makes that output out of date
    raw_times = [t for d in m.datasets if (t := _mtime(rd.raw(d.name))) is not None]
    raw_newest = max(raw_times) if raw_times else None
    manifest_t = _mtime(rd.merged_manifest)
    names = table.names()
    merge_at = names.index("merge") if "merge" in names else len(names)
    phases: list[PhaseStatus] = []
    for i, phase in enumerate(table):
        row = counted.get(phase.name)
        if row is None and phase.output is not None:
            row = _output_state(phase, phase.output(rd), rd, raw_newest, before_merge=i <= merge_at, manifest_t=manifest_t)
        if row is not None:
            phases.append(row)
    if holder is not None:
        command = holder.command.split(" ")[0]
        # `draftgen run` runs the phases in order: the first one not done is the one running
        running: str | None = None
        if command in names:
            running = command
        elif command == "run":
            running = next((p.name for p in phases if p.state != "done"), None)
        for i, p in enumerate(phases):
            if p.name == running:
                phases[i] = msgspec.structs.replace(p, state="running", detail=None)
    return phases


def summarize(m: RunMetrics, run_dir: Path, selected: list[str] | None, holder: LockHolder | None,
              budgets: dict[str, int] | None = None) -> StatusSummary:
    """The figures ``--json`` prints (and the phase line shows); ``budgets``: the datasets' token budgets."""
    chosen = set(selected if selected is not None else [d.name for d in m.datasets])
    t = m.total
    budgets = budgets or {}
    return StatusSummary(
        run_dir=str(run_dir), model=m.model, endpoint=m.endpoint,
        phases=phase_states(m, run_dir, selected, holder),
        datasets=[DatasetStatus(name=d.name, selected=d.name in chosen, done=d.done, planned=d.prepared,
                                failed=d.failed, percent=_pct(d.done, d.prepared),
                                completion_tokens=d.completion_tokens, cost_usd=round(d.cost_usd, 6),
                                token_budget=budgets.get(d.name))
                  for d in m.datasets],
        tokens=TokenTotals(prompt=t.prompt_tokens, completion=t.completion_tokens, reasoning=t.reasoning_tokens),
        spend_usd=m.spend.booked_usd, billed_usd=m.spend.billed_usd, held_usd=m.spend.held_usd,
        abandoned=m.spend.abandoned,
        lock=holder,
        latest_activity=m.latest_activity,
        verdict=m.verdict.level,
        hedges=m.tail.hedges, hedges_won=m.tail.hedges_won, hedge_extra_usd=m.tail.extra_usd,
        slow_streams=m.tail.slow_streams,
        rounds=round_counts(run_dir, [d.name for d in m.datasets]),
        fidelity=read_fidelity(run_dir),
    )


def _phase_text(p: PhaseStatus) -> str:
    text = p.name
    if p.state in ("running", "incomplete"):
        text += f" {p.state}"
        if p.name == "generate" and p.planned is not None:
            text += f" {fmt_int(p.done or 0)}/{fmt_int(p.planned)}"
            if p.percent is not None:
                text += f" ({p.percent:.1f}%)"
    if p.detail:
        text += f" ({p.detail})"
    return text


def _ago(now: float, t: float | None) -> str:
    if t is None:
        return "no activity yet"
    return f"{fmt_time(t)} ({fmt_duration(max(0.0, now - t))} ago)"


def _row(table: Table, d: DatasetMetrics, *, style: str | None = None) -> None:
    prepared = "?" if d.prepared is None else fmt_int(d.prepared)
    table.add_row(
        d.name,
        f"{fmt_int(d.done)}/{prepared}",
        fmt_pct(d.progress),
        fmt_int(d.completion_tokens),
        fmt_pct(d.reasoning_share),
        fmt_usd(d.cost_usd),
        fmt_int(d.failed) if d.failed else "0",
        fmt_int(d.truncated),
        style=style,
    )


def _secs(x: float | None) -> str:
    return "–" if x is None else (f"{x * 1000:.0f}ms" if x < 1 else f"{x:.1f}s")


class Packed:
    """`` · ``-separated segments packed into lines of the console's width (``engine.progress.pack``): a line
    breaks between segments, never inside one that fits; the first line starts with ``indent``, the others
    with two spaces more."""

    def __init__(self, segments: list[str], *, indent: str = "", style: str = "") -> None:
        self.segments, self.indent, self.style = segments, indent, style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        more = self.indent + "  "
        for i, line in enumerate(pack(self.segments, options.max_width - len(self.indent), indent=more)):
            yield Text(self.indent + line if i == 0 else line, style=self.style)


def _provider_segments(p: ProviderMetrics) -> list[str]:
    """One provider: share, quantization, latency, TTFT, and what went wrong."""
    parts = [f"{p.provider} {fmt_int(p.responses)} ({fmt_pct(p.share, 0)})"]
    if p.quantization:
        parts.append(p.quantization)
    if p.service_tiers:
        parts.append(f"tier {p.service_tiers}")
    if p.latency_p50_s is not None:
        parts.append(f"latency p50 {_secs(p.latency_p50_s)} p95 {_secs(p.latency_p95_s)}")
    if p.ttft_p50_s is not None:
        parts.append(f"ttft p50 {_secs(p.ttft_p50_s)}")
    if p.retries:
        parts.append(f"retries {p.retries} ({', '.join(f'{k} {v}' for k, v in list(p.failures_by_kind.items())[:3])})")
    if p.dropped_reasoning:
        parts.append(f"dropped reasoning {p.dropped_reasoning}")
    if p.cooldowns:
        parts.append(f"cool-downs {p.cooldowns}")
    return parts


def progress_segments(pr: ProgressRecord, live: bool, now: float) -> list[str]:
    """generate's own figures (``logs/progress.json``) under the display's labels: the ETA counted down from
    when it was written, while the run goes on; this run's elapsed time and mean tok/s, and the live rate."""
    ago = max(0.0, now - pr.written_at)
    if live and not pr.finished:
        eta = None if pr.eta_s is None else max(pr.eta_s - ago, 0.0)
        head = [f"generate running: {eta_text(eta, pr.eta_basis)}", f"as of {fmt_duration(ago)} ago"]
        return [*head, pace_text(pr.elapsed_s, pr.mean_tok_s), f"{pr.tok_s:,.0f} tok/s (30s)"]
    how = "finished" if pr.finished else "stopped"
    return [f"last generate {how} {fmt_duration(ago)} ago", pace_text(pr.elapsed_s, pr.mean_tok_s)]


def read_progress(run_dir: Path, holder: LockHolder | None) -> tuple[ProgressRecord | None, bool]:
    """generate's latest figures, and whether the process that wrote them holds the writer lock now."""
    path = RunDir(run_dir).progress
    if not path.is_file():
        return None, False
    pr = read_json(path, ProgressRecord)
    return pr, holder is not None and holder.pid == pr.pid


def render_status(m: RunMetrics, summary: StatusSummary, *, now: float, fidelity: list[str] | None = None) -> RenderableType:
    head = Text()
    head.append("draftgen status ", style="bold")
    head.append(m.run_dir, style="cyan")
    meta = Text()
    if m.model:
        meta.append(f"model {m.model}  ")
    if m.endpoint:
        meta.append(f"endpoint {m.endpoint}  ")
    meta.append("phases: ")
    for ph in summary.phases:
        mark, style = PHASE_MARK[ph.state]
        meta.append(f"{mark} {_phase_text(ph)}  ", style=style)
    activity = Text(f"latest activity: {_ago(now, m.latest_activity)}")
    if summary.lock is not None:
        h = summary.lock
        activity.append(f"\nwriter: `draftgen {h.command}` (pid {h.pid}, since {fmt_time(h.since)})", style="cyan")
    label, style = VERDICT_STYLE.get(m.verdict.level, ("?", "bold"))
    verdict = Text()
    verdict.append(f"verdict: {label}", style=style)
    verdict.append(f"  {m.verdict.reason}")
    findings = [*m.verdict.problems, *m.verdict.warnings][1:]
    for x in findings[:MAX_FINDINGS]:
        verdict.append(f"\n  · {x}", style="red" if x in m.verdict.problems else "dim")
    if len(findings) > MAX_FINDINGS:
        verdict.append(f"\n  · … {len(findings) - MAX_FINDINGS} more (report.html lists them)", style="dim")

    # No box and one space between columns, headers on two lines: at 80 columns nothing is cut (a long
    # dataset name folds; the figures never do).
    table = Table(show_edge=False, header_style="bold", pad_edge=False, box=None, padding=(0, 1, 0, 0))
    table.add_column("dataset", overflow="fold")
    for col in ("done /\nprepared", "progress", "completion\ntokens", "reasoning\nshare", "cost", "failed", "truncated"):
        table.add_column(col, justify="right", no_wrap=True)
    for d in m.datasets:
        _row(table, d)
    if len(m.datasets) > 1 or not m.datasets:
        _row(table, m.total, style="bold")

    t = m.total
    lines: list[RenderableType] = [head, meta, activity, verdict, Text(""), table]
    lines.append(Packed([f"prompt tokens {fmt_int(t.prompt_tokens)}", f"completion tokens {fmt_int(t.completion_tokens)}",
                         f"{fmt_usd(t.usd_per_m_output)}/M output"]
                        + ([f"first to last response {fmt_duration(m.elapsed_s)} (every run)"] if m.elapsed_s else [])))
    if summary.progress is not None:
        lines.append(Packed(progress_segments(summary.progress, summary.live, now)))
    if summary.rounds:
        lines.append(Packed([f"round {r.round}: {fmt_int(r.done)}/{fmt_int(r.prepared)} done" for r in summary.rounds]))
    sp = m.spend
    if sp.booked_usd:
        held = fmt_held(sp.billed_usd, sp.held_usd, sp.abandoned)
        lines.append(Packed([f"spend {fmt_usd(sp.booked_usd)}", *([held] if held else [])], style="yellow" if held else ""))
    budgets = [d for d in summary.datasets if d.token_budget is not None]
    if budgets:
        lines.append(Packed([f"token budget {d.name}: {fmt_int(d.completion_tokens)} / {fmt_int(d.token_budget)} "
                             f"({fmt_pct(d.completion_tokens / d.token_budget if d.token_budget else None, 0)})"
                             for d in budgets]))
    tl = m.tail
    if tl.hedges or tl.slow_streams:
        lines.append(Packed([f"tail: {fmt_int(tl.hedges)} hedged ({fmt_int(tl.hedges_won)} won)",
                             f"{fmt_usd(tl.extra_usd)} extra ({fmt_pct(tl.extra_share)} of spend)"]
                            + ([f"{fmt_int(tl.slow_streams)} slow streams retried elsewhere"] if tl.slow_streams else [])))
    if t.failures_by_kind:
        kinds = ", ".join(f"{k} {v}" for k, v in t.failures_by_kind.items())
        lines.append(Text(f"failures by kind (not done yet, retried next run): {kinds}", style="yellow"))
    if t.orphans:
        lines.append(Text(f"orphans: {fmt_int(t.orphans)} records are no longer in the prepared set "
                          f"({fmt_usd(t.orphan_cost_usd)} spent on them); they are not merged", style="yellow"))
    if t.replaced:
        lines.append(Text(f"replaced: {fmt_int(t.replaced)} records set aside by --redo ({fmt_usd(t.replaced_cost_usd)} "
                          f"spent on them; {fmt_usd(t.spent_usd)} spent in all)"))
    if m.providers_table:
        # the largest providers, and every provider that cooled down or dropped reasoning
        shown = [p for i, p in enumerate(m.providers_table) if i < MAX_PROVIDERS or p.cooldowns or p.dropped_reasoning]
        more = len(m.providers_table) - len(shown)
        lines.append(Text("providers:" + (f" ({len(shown)} of {len(m.providers_table)})" if more else "")))
        for p in shown:
            lines.append(Packed(_provider_segments(p), indent="  ", style="yellow" if p.cooldowns or p.dropped_reasoning
                                else ""))
    if m.audit is not None:
        o = m.audit.overall
        billed = o.billed_completion_tokens
        disagreement = abs(o.rebuilt_completion_tokens - billed) / billed if billed else None
        audit = Text(
            f"audit: {fmt_int(o.records)} records, structural failures {sum(o.structural_failures.values())}, "
            f"billing disagreement {fmt_pct(disagreement, 3)}"
            + (f", BPE exact {o.exact_match}/{o.reference_compared}" if o.reference_compared else "")
        )
        lines.append(audit)
        if m.audit.thresholds_broken:
            lines.append(Text("thresholds broken: " + "; ".join(m.audit.thresholds_broken), style="bold red"))
    for line in fidelity or []:
        lines.append(Text(line, style="bold red" if line.startswith("warning") else ""))
    return Group(*lines)


def _status(target: str, *, now: float | None) -> tuple[StatusReport, str, str]:
    """One look at the run directory: the report, its text and its JSON."""
    run_dir, names = resolve_target(target)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: the run directory does not exist yet; run `draftgen run CONFIG` first")
    selected = _selected(run_dir, names)
    metrics = compute_metrics(run_dir, selected)
    summary = summarize(metrics, run_dir, selected, live_holder(run_dir), token_budgets(run_dir, target))
    summary.progress, summary.live = read_progress(run_dir, summary.lock)
    at = time.time() if now is None else now
    batches = batch_lines(load_batches(RunDir(run_dir).batch_journal).values(), at)  # endpoint.mode: batch
    text = redact("\n".join([render_text(render_status(metrics, summary, now=at,
                                                      fidelity=fidelity_lines(summary.fidelity) if summary.fidelity else None)),
                              *batches]))
    return StatusReport(run_dir=str(run_dir), metrics=metrics, summary=summary), text, \
        redact(msgspec.json.encode(summary).decode())


def run_status(target: str, *, echo: Echo = print, now: float | None = None,
               as_json: bool = False) -> StatusReport:
    """Summarise the run directory ``target`` (or a config's run directory) and echo it (or its JSON).

    Not of the phase signature (``run_<phase>(cfg, *, echo, profile, force)``) on purpose: status reads a
    run directory that may have no config at hand (another machine's, a copy) and writes nothing, so it
    takes a path, loads no profile and has nothing to force."""
    report, text, js = _status(target, now=now)
    echo(js if as_json else text)
    return report


CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def watch_status(target: str, interval: float, *, echo: Echo = print, as_json: bool = False,
                 tty: bool | None = None, sleep: Callable[[float], object] = time.sleep) -> int:
    """Show the status every ``interval`` seconds until interrupted; returns the blocks shown.

    On a terminal each refresh clears the screen and redraws; otherwise (a pipe, a log) each refresh is
    one block, blocks separated by a blank line (``--json``: one line each). Ctrl-C ends it quietly.
    """
    if not interval > 0:
        raise InputError(f"--watch {interval}: the interval must be more than 0 seconds (e.g. --watch 2)")
    redraw = (sys.stdout.isatty() if tty is None else tty) and not as_json
    shown = 0
    try:
        while True:
            _, text, js = _status(target, now=None)
            out = js if as_json else text
            echo(CLEAR + out if redraw else (out if as_json or not shown else "\n" + out))
            shown += 1
            sleep(interval)
    except KeyboardInterrupt:
        return shown


def status_command(target: str, *, watch: float | None = None, as_json: bool = False,
                   echo: Echo = print) -> None:
    """``draftgen status``: one summary, or (``watch``) one every ``watch`` seconds until Ctrl-C."""
    if watch is None:
        run_status(target, echo=echo, as_json=as_json)
    else:
        watch_status(target, watch, echo=echo, as_json=as_json)
