"""``draftgen status [CONFIG | RUN_DIR]``: a terminal summary of a run directory, during a run or after it.

Reads only the run directory (through ``metrics.compute_metrics``), so it is safe to run while
``generate`` is writing: an unterminated last line of a raw log is skipped, and missing phases
(no audit or merge yet) are shown as not done. Writes nothing. Rendering uses rich tables; colour is
used only when stdout is a terminal.
"""

from __future__ import annotations

import io
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..errors import RunDirError
from ..secrets import redact
from .datasets import DatasetMetrics
from .format import fmt_duration, fmt_int, fmt_pct, fmt_time, fmt_usd
from .metrics import RunMetrics, compute_metrics
from .providers import ProviderMetrics

__all__ = ["StatusReport", "render_status", "render_text", "resolve_target", "run_status"]

PHASES = ("prepared", "generated", "audited", "merged", "reported")
VERDICT_STYLE = {"green": ("GOOD", "bold green"), "amber": ("CHECK", "bold yellow"), "red": ("NOT USABLE", "bold red")}
MAX_PROVIDERS = 6
MAX_FINDINGS = 4


class StatusReport(msgspec.Struct, kw_only=True):
    run_dir: str
    metrics: RunMetrics


def resolve_target(target: str) -> tuple[Path, list[str] | None]:
    """A run directory, or a config file whose ``run_dir`` is read. Returns (run dir, dataset names)."""
    p = Path(target)
    if p.is_dir():
        return p, None
    if p.is_file():
        from ..config import load_config

        cfg = load_config(p)
        return cfg.run_path, [d.name for d in cfg.datasets]
    raise RunDirError(f"{target}: no such run directory or config file; give a run directory or a YAML config")


def _ago(now: float, t: float | None) -> str:
    if t is None:
        return "no activity yet"
    return f"{fmt_time(t)} ({fmt_duration(max(0.0, now - t))} ago)"


def _row(table: Table, d: DatasetMetrics, *, style: str | None = None) -> None:
    prepared = "?" if d.prepared is None else fmt_int(d.prepared)
    table.add_row(
        d.name,
        f"{fmt_int(d.done)} / {prepared}",
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


def _provider_line(p: ProviderMetrics) -> str:
    """One provider in one line: share, quantization, latency, TTFT, and what went wrong."""
    parts = [f"{p.provider} {fmt_int(p.responses)} ({fmt_pct(p.share, 0)})"]
    if p.quantization:
        parts.append(p.quantization)
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
    return "  " + " · ".join(parts)


def render_status(m: RunMetrics, *, now: float) -> RenderableType:
    head = Text()
    head.append("draftgen status ", style="bold")
    head.append(m.run_dir, style="cyan")
    meta = Text()
    if m.model:
        meta.append(f"model {m.model}  ")
    if m.endpoint:
        meta.append(f"endpoint {m.endpoint}  ")
    meta.append("phases: ")
    for ph in PHASES:
        done = m.phases.get(ph, False)
        meta.append(("✓ " if done else "· ") + ph + "  ", style="green" if done else "dim")
    activity = Text(f"latest activity: {_ago(now, m.latest_activity)}")
    label, style = VERDICT_STYLE.get(m.verdict.level, ("?", "bold"))
    verdict = Text()
    verdict.append(f"verdict: {label}", style=style)
    verdict.append(f"  {m.verdict.reason}")
    findings = [*m.verdict.problems, *m.verdict.warnings][1:]
    for x in findings[:MAX_FINDINGS]:
        verdict.append(f"\n  · {x}", style="red" if x in m.verdict.problems else "dim")
    if len(findings) > MAX_FINDINGS:
        verdict.append(f"\n  · … {len(findings) - MAX_FINDINGS} more (report.html lists them)", style="dim")

    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for col, justify in (("dataset", "left"), ("done / prepared", "right"), ("progress", "right"),
                         ("completion tok", "right"), ("reasoning share", "right"), ("cost", "right"),
                         ("failed", "right"), ("truncated", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for d in m.datasets:
        _row(table, d)
    if len(m.datasets) > 1 or not m.datasets:
        table.add_section()
        _row(table, m.total, style="bold")

    t = m.total
    lines: list[RenderableType] = [head, meta, activity, verdict, Text(""), table]
    speed = Text(
        f"prompt tokens {fmt_int(t.prompt_tokens)} · completion tokens {fmt_int(t.completion_tokens)}"
        f" · {fmt_usd(t.usd_per_m_output)}/M output · elapsed {fmt_duration(m.elapsed_s)}"
        + (f" · {m.tokens_per_s:,.0f} tok/s" if m.tokens_per_s else "")
    )
    lines.append(speed)
    if t.failures_by_kind:
        kinds = ", ".join(f"{k} {v}" for k, v in t.failures_by_kind.items())
        lines.append(Text(f"failures by kind (not done yet, retried next run): {kinds}", style="yellow"))
    if t.orphans:
        lines.append(Text(f"orphans: {fmt_int(t.orphans)} records are no longer in the prepared set "
                          f"({fmt_usd(t.orphan_cost_usd)} spent on them); they are not merged", style="yellow"))
    if m.providers_table:
        # the largest providers, and every provider that cooled down or dropped reasoning
        shown = [p for i, p in enumerate(m.providers_table) if i < MAX_PROVIDERS or p.cooldowns or p.dropped_reasoning]
        more = len(m.providers_table) - len(shown)
        lines.append(Text("providers:" + (f" ({len(shown)} of {len(m.providers_table)})" if more else "")))
        for p in shown:
            lines.append(Text(_provider_line(p), style="yellow" if p.cooldowns or p.dropped_reasoning else ""))
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
    return Group(*lines)


def render_text(renderable: RenderableType) -> str:
    """Render to a string at the terminal's width; colour only when stdout is a terminal."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=max(80, shutil.get_terminal_size((110, 24)).columns),
        force_terminal=sys.stdout.isatty(),
        highlight=False,
    )
    console.print(renderable)
    return buf.getvalue().rstrip("\n")


def run_status(target: str, *, echo: Callable[[str], object] = print, now: float | None = None) -> StatusReport:
    """Summarise the run directory ``target`` (or a config's run directory) and echo it."""
    run_dir, names = resolve_target(target)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: the run directory does not exist yet; run `draftgen run CONFIG` first")
    metrics = compute_metrics(run_dir, names)
    echo(redact(render_text(render_status(metrics, now=time.time() if now is None else now))))
    return StatusReport(run_dir=str(run_dir), metrics=metrics)
