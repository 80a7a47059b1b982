"""``draftgen report CONFIG``: write ``report.html``, one self-contained page about a run directory.

Reads the run directory through ``metrics.compute_metrics`` (so the page shows exactly what ``status``
would) and writes ``<run_dir>/report.html`` (or ``output``) atomically. The page has no external
resources: plotly's JavaScript is inlined once, styles are inline, fonts are the system's. The computed
``RunMetrics`` is embedded as JSON in ``<script type="application/json" id="draftgen-metrics">``; every
number on the page is taken from it, and every number in it can be recomputed from the run directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from ..config import RunConfig
from ..records import DatasetAudit
from ..rundir import writer
from ..secrets import redact
from ..store import atomic_write_bytes
from .format import fmt_duration, fmt_float, fmt_int, fmt_pct, fmt_time, fmt_usd
from .metrics import RunMetrics, compute_metrics

__all__ = ["AuditRow", "audit_rows", "render_html", "run_report"]

_PALETTE = {"reasoning": "#6d5dfc", "content": "#16a394", "cost": "#e8590c", "tput": "#1c7ed6", "fail": "#e03131"}
_PIE = ["#6d5dfc", "#16a394", "#1c7ed6", "#e8590c", "#f59f00", "#c2255c", "#5c940d", "#868e96"]


class AuditRow(msgspec.Struct, kw_only=True):
    """One row of the page's audit table, derived from one DatasetAudit."""

    dataset: str
    records: int
    structural_failures: int
    billed: int
    rebuilt: int
    billing_disagreement: float | None
    billing_mismatched_samples: int
    reference_compared: int
    exact_match: int
    tokenization_mismatch: int
    semantic_mismatch: int


def audit_rows(m: RunMetrics) -> list[AuditRow]:
    if m.audit is None:
        return []
    out: list[AuditRow] = []

    def row(a: DatasetAudit, name: str) -> AuditRow:
        billed = a.billed_completion_tokens
        return AuditRow(
            dataset=name,
            records=a.records,
            structural_failures=sum(a.structural_failures.values()),
            billed=billed,
            rebuilt=a.rebuilt_completion_tokens,
            billing_disagreement=abs(a.rebuilt_completion_tokens - billed) / billed if billed else None,
            billing_mismatched_samples=a.billing_mismatched_samples,
            reference_compared=a.reference_compared,
            exact_match=a.exact_match,
            tokenization_mismatch=a.tokenization_mismatch,
            semantic_mismatch=a.semantic_mismatch,
        )

    for a in m.audit.datasets:
        out.append(row(a, a.dataset))
    out.append(row(m.audit.overall, "all"))
    return out


def _iso(ts: list[float]) -> list[str]:
    return [time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) for t in ts]


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
        "margin": {"l": 56, "r": 18, "t": 44, "b": 44},
        "height": 320,
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12, "color": "#343a40"},
        "xaxis": {"gridcolor": "#eceff3", "zeroline": False},
        "yaxis": {"gridcolor": "#eceff3", "zeroline": False},
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom",
                   "traceorder": "normal"},
    }
    base.update(extra)
    return base


def _figures(m: RunMetrics) -> list[tuple[str, str, dict[str, Any]]]:
    """(div id, caption, plotly figure dict) for every chart."""
    tl, h, t = m.timeline, m.histogram, m.total
    figs: list[tuple[str, str, dict[str, Any]]] = []
    x = _iso(tl.start)
    figs.append(("chart-cost", "Cumulative spend (USD) by response time, UTC.", {
        "data": [{"type": "scatter", "mode": "lines", "x": x, "y": tl.cumulative_cost_usd, "name": "spend",
                  "line": {"color": _PALETTE["cost"], "width": 2.5, "shape": "hv"}, "fill": "tozeroy",
                  "fillcolor": "rgba(232,89,12,0.10)"}],
        "layout": _layout("Cost over time", yaxis={"gridcolor": "#eceff3", "tickprefix": "$", "rangemode": "tozero"}),
    }))
    figs.append(("chart-throughput", f"Completion tokens per second, in buckets of {fmt_duration(tl.bucket_s)}.", {
        "data": [{"type": "bar", "x": x, "y": tl.tokens_per_s, "name": "tokens/s",
                  "marker": {"color": _PALETTE["tput"]}, "customdata": tl.responses,
                  "hovertemplate": "%{y:,.1f} tok/s<br>%{customdata} responses<extra></extra>"}],
        "layout": _layout("Throughput over time", bargap=0.05, yaxis={"gridcolor": "#eceff3", "rangemode": "tozero"}),
    }))
    centers = [(a + b) / 2 for a, b in zip(h.edges, h.edges[1:], strict=False)]
    width = (h.edges[1] - h.edges[0]) if len(h.edges) > 1 else 1
    figs.append(("chart-lengths", "Tokens per response: reasoning vs content (usage.reasoning_tokens and the rest).", {
        "data": [
            {"type": "bar", "x": centers, "y": h.reasoning, "width": width, "name": "reasoning",
             "marker": {"color": _PALETTE["reasoning"]}, "opacity": 0.7},
            {"type": "bar", "x": centers, "y": h.content, "width": width, "name": "content",
             "marker": {"color": _PALETTE["content"]}, "opacity": 0.7},
        ],
        "layout": _layout("Length distribution", barmode="overlay",
                          xaxis={"gridcolor": "#eceff3", "title": {"text": "tokens"}},
                          yaxis={"gridcolor": "#eceff3", "title": {"text": "responses"}}),
    }))
    names = [d.name for d in m.datasets]
    figs.append(("chart-share", f"Completion tokens split into reasoning and content; overall reasoning share {fmt_pct(t.reasoning_share)}.", {
        "data": [
            {"type": "bar", "orientation": "h", "y": names, "x": [d.reasoning_tokens for d in m.datasets],
             "name": "reasoning", "marker": {"color": _PALETTE["reasoning"]}},
            {"type": "bar", "orientation": "h", "y": names, "x": [d.content_tokens for d in m.datasets],
             "name": "content", "marker": {"color": _PALETTE["content"]}},
        ],
        "layout": _layout("Reasoning share by dataset", barmode="stack",
                          yaxis={"automargin": True, "autorange": "reversed"}),
    }))
    figs.append(("chart-providers", "Responses by the provider OpenRouter routed them to.", {
        "data": [{"type": "pie", "hole": 0.55, "labels": list(t.providers), "values": list(t.providers.values()),
                  "marker": {"colors": _PIE}, "sort": False, "textinfo": "percent", "textposition": "inside"}],
        "layout": _layout("Provider mix", legend={"orientation": "v", "x": 1, "xanchor": "left", "y": 0.5}),
    }))
    kinds = t.failures_by_kind
    figs.append(("chart-failures", "Samples not done, by the kind of their latest failure (retried on the next run).", {
        "data": [{"type": "bar", "orientation": "h", "y": list(kinds), "x": list(kinds.values()),
                  "marker": {"color": _PALETTE["fail"]}, "name": "failures"}],
        "layout": _layout("Failures by kind",
                          yaxis={"automargin": True, "autorange": "reversed", "visible": bool(kinds)},
                          xaxis={"gridcolor": "#eceff3", "visible": bool(kinds), "rangemode": "tozero"},
                          annotations=[] if kinds else [{"text": "no failures", "showarrow": False,
                                                         "font": {"size": 16, "color": "#868e96"},
                                                         "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]),
    }))
    return figs


def _compact(x: float | None) -> str:
    if x is None:
        return "–"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _token(text: str) -> str:
    """A token's text with its spaces and line breaks visible."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


def _embed_json(obj: Any) -> str:
    # "<" only occurs inside JSON strings, where \u003c is the same character: no "</script>" can appear.
    return msgspec.json.encode(obj).decode().replace("<", "\\u003c")


def render_html(m: RunMetrics, *, title: str, generated_at: float, settings: dict[str, str]) -> str:
    import jinja2
    from plotly.offline import get_plotlyjs

    from .template import PAGE

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    from ..hidden import format_bytes

    env.filters.update(int=fmt_int, pct=fmt_pct, usd=fmt_usd, dur=fmt_duration, time=fmt_time, num=fmt_float,
                       bytes=format_bytes, tok=_token)
    figs = _figures(m)
    t = m.total
    kpis = [
        ("samples done", f"{fmt_int(t.done)}", f"of {fmt_int(t.prepared)} prepared ({fmt_pct(t.progress)})"),
        ("completion tokens", fmt_int(t.completion_tokens), f"{fmt_float(t.mean_completion_tokens, 0)} per response"),
        ("spend", fmt_usd(t.cost_usd), f"{fmt_usd(t.usd_per_m_output)} per M output tokens"),
        ("reasoning share", fmt_pct(t.reasoning_share), f"{fmt_int(t.reasoning_tokens)} reasoning tokens"),
        ("tokens / second", _compact(m.tokens_per_s), f"{fmt_int(t.completion_tokens)} tokens over {fmt_duration(m.elapsed_s)}"),
        ("failed", fmt_int(t.failed), f"{fmt_int(t.truncated)} truncated responses"),
    ]
    plotly_js = get_plotlyjs()
    page = env.from_string(PAGE).render(
        title=title,
        m=m,
        t=t,
        kpis=kpis,
        settings=settings,
        generated=fmt_time(generated_at),
        audit=audit_rows(m),
        figures=[(div, cap, _embed_json(fig)) for div, cap, fig in figs],
        metrics_json=_embed_json(m),
        plotly_js=plotly_js,
    )
    return _redact_page(page, plotly_js)


def _redact_page(page: str, verbatim: str) -> str:
    """The page with every key-shaped string redacted (its text, tables and embedded JSON), except the
    ``verbatim`` block (plotly's own JavaScript, inlined as it ships)."""
    i = page.find(verbatim) if verbatim else -1
    if i < 0:
        return redact(page)
    return redact(page[:i]) + verbatim + redact(page[i + len(verbatim):])


def run_report(cfg: RunConfig, *, output: Path | None = None, echo: Any = None) -> Path:
    """Compute the run's metrics and write the page (under the run directory's writer lock); returns its path."""
    with writer(cfg, "report"):
        return _report(cfg, output, echo)


def _report(cfg: RunConfig, output: Path | None, echo: Any) -> Path:
    run_dir = cfg.run_path
    out = output if output is not None else run_dir / "report.html"
    m = compute_metrics(run_dir, [d.name for d in cfg.datasets])
    # The page marks the run reported when it lands where compute_metrics looks for it.
    if out.resolve() == (run_dir / "report.html").resolve():
        m.phases["reported"] = True
    settings = {
        "model": m.model or cfg.model.id,
        "profile": cfg.model.profile,
        "endpoint": m.endpoint or cfg.endpoint.kind,
        "run directory": str(run_dir),
        "config hash": m.config_hash or "–",
    }
    page = render_html(m, title=f"draftgen report · {run_dir.name}", generated_at=time.time(), settings=settings)
    atomic_write_bytes(out, page.encode("utf-8"))
    if echo is not None:
        echo(f"report: {out}")
    return out
