"""The page of ``draftgen report``: ``render_html`` builds ``report.html``, one self-contained page about a run.

``report.run.run_report`` computes the run's ``RunMetrics`` (``runview.metrics.compute_metrics``, so the page shows
exactly what ``status`` would) and writes the page this module builds; nothing here writes a file. It reads
the run directory only for the sample viewer and the example rows. The page has no external
resources: plotly's JavaScript is inlined once, styles are inline, fonts are the system's. The computed
``RunMetrics`` is embedded as JSON in ``<script type="application/json" id="draftgen-metrics">``; every
number on the page is taken from it, and every number in it can be recomputed from the run directory.

Sections: the verdict banner (``RunMetrics.verdict``: green, amber or red, with the reason), the KPIs, the
datasets and per-provider tables, the charts (cost, throughput, retries and failures, requests in flight, all
on one time axis counted from the run's first activity; lengths, sequence length against
``merge.max_seq_len``, reasoning share, provider mix, failures), the audit with the rows that break a
threshold highlighted and the BPE mismatch chips in their context, the merge, and a sample viewer. The last
two decode token ids with the run's profile tokenizer (``tokens.profile_from_config``), which is why they are
built here and not in ``metrics``; they are left out, with a note, when it does not load. After merge, when the
run has them (``runview.chain.read_chain``, embedded as ``#draftgen-chain``): the hidden set (extract), the
trained drafter (train) and its acceptance (accept: the run's latest pass, with its intervals beside copy-last,
lookup and zero-aux, the paired differences, per position, dataset and tag, per dataset (and tag) and prompt length
beside the share of the training tokens, the verdict sentence, the acceptance and expected speedup by k with the
recommended k and any slow-down warning, and every pass under ``accept/``). With more than one round of
generation, the rounds (``runview.loop.round_rows``, embedded as ``#draftgen-rounds``).
"""

from __future__ import annotations

import codecs
import itertools
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.exporters.parquet import PARQUET, read_merged
from draftgen.fmt import fmt_duration, fmt_float, fmt_held, fmt_int, fmt_pct, fmt_time, fmt_usd
from draftgen.records import DatasetAudit, MergedParquetRow, MismatchExample, ResponseIdsView, tag_label
from draftgen.rundir import RunDir
from draftgen.runview.chain import ChainView, beats, verdict
from draftgen.runview.charts import TIME_UNITS, SeqLengths
from draftgen.runview.loop import RoundsView
from draftgen.runview.metrics import RunMetrics
from draftgen.secrets import redact
from draftgen.store import first_records

if TYPE_CHECKING:
    from draftgen.tokens import Profile, Tokenizer

__all__ = ["AuditRow", "ExampleRow", "SampleView", "audit_rows", "example_rows", "render_html", "sample_view"]

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
    excluded: int = 0
    billing_disagreement_kept: float | None = None
    broken: list[str] = msgspec.field(default_factory=list)
    """Columns whose threshold this row breaks: structural, billing, semantic, tokenization."""


_THRESHOLD_COLUMNS = {"structural_failure_rate": "structural", "billing_disagreement": "billing",
                      "semantic_mismatch_rate": "semantic", "tokenization_mismatch_rate": "tokenization"}


def broken_columns(thresholds_broken: list[str]) -> dict[str, set[str]]:
    """dataset → the audit table columns whose threshold it breaks, from ``AuditReport.thresholds_broken``
    lines (``"<dataset>: <what> <rate> > <limit> (audit.max_<key>)"``)."""
    out: dict[str, set[str]] = {}
    for line in thresholds_broken:
        dataset, _, rest = line.partition(": ")
        key = re.search(r"audit\.max_(\w+)", rest)
        if key and key.group(1) in _THRESHOLD_COLUMNS:
            col = _THRESHOLD_COLUMNS[key.group(1)]
        else:
            col = next((c for c in _THRESHOLD_COLUMNS.values() if c in rest), "")
        if col:
            out.setdefault(dataset.strip(), set()).add(col)
    return out


def audit_rows(m: RunMetrics) -> list[AuditRow]:
    if m.audit is None:
        return []
    out: list[AuditRow] = []
    broken = broken_columns(m.audit.thresholds_broken)

    def row(a: DatasetAudit, name: str) -> AuditRow:
        billed = a.billed_completion_tokens
        kept = a.kept_billed_completion_tokens
        cols = broken.get(a.dataset, set()) | (broken.get("overall", set()) | broken.get("all", set())
                                               if name == "all" else set())
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
            excluded=len(a.excluded) or sum(a.excluded_by_reason.values()),
            billing_disagreement_kept=abs(a.kept_rebuilt_completion_tokens - kept) / kept if kept else None,
            broken=sorted(cols),
        )

    for a in m.audit.datasets:
        out.append(row(a, a.dataset))
    out.append(row(m.audit.overall, "all"))
    return out


#: a chart's height in px unless its layout says another; its div takes the same (a layout taller than its div drew
#: the legend over the caption below it)
CHART_HEIGHT = 350

#: every chart's legend: one row at the bottom of the figure (the toolbar takes its top right corner)
_LEGEND: dict[str, Any] = {"orientation": "h", "x": 0, "xanchor": "left", "y": 0, "yanchor": "bottom",
                           "yref": "container", "traceorder": "normal"}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 15}, "x": 0.01, "xanchor": "left"},
        # the legend sits in the bottom margin, under the axis: the chart toolbar (top right) never covers it
        "margin": {"l": 56, "r": 18, "t": 44, "b": 84},
        "height": CHART_HEIGHT,
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12, "color": "#343a40"},
        "xaxis": {"gridcolor": "#eceff3", "zeroline": False},
        "yaxis": {"gridcolor": "#eceff3", "zeroline": False},
        "legend": _LEGEND,
    }
    base.update(extra)
    return base


def _utc(ts: list[float]) -> list[str]:
    return [time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) for t in ts]


_AXIS = {"gridcolor": "#eceff3", "zeroline": False}
_KINDS = ["#e03131", "#f59f00", "#c2255c", "#1c7ed6", "#5c940d", "#6d5dfc", "#e8590c", "#868e96"]


def _time_axis(m: RunMetrics) -> tuple[float, float, str, dict[str, Any]]:
    """(t0, seconds per unit, unit, plotly x axis) shared by every time chart: time since the run's first
    activity in seconds, minutes or hours (``runview.charts.time_unit``), never epoch floats."""
    act = m.activity
    t0 = act.t0 if act.t0 is not None else (m.timeline.start[0] if m.timeline.start else 0.0)
    unit = act.unit
    axis: dict[str, Any] = {**_AXIS, "title": {"text": f"time since start ({unit})"}, "rangemode": "tozero",
                            "ticksuffix": f" {unit}", "hoverformat": ".2f" if unit != "s" else ".1f"}
    if act.offsets:  # one range for every time chart, so they line up
        axis["range"] = [0, (act.offsets[-1] + act.bucket_s) / TIME_UNITS[unit]]
    return t0, TIME_UNITS[unit], unit, axis


def _empty(text: str) -> list[dict[str, Any]]:
    return [{"text": text, "showarrow": False, "font": {"size": 16, "color": "#868e96"},
             "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]


def _figures(m: RunMetrics) -> list[tuple[str, str, dict[str, Any]]]:
    """(div id, caption, plotly figure dict) for every chart."""
    t0, per_unit, _unit, xaxis = _time_axis(m)
    return [*_time_figures(m, t0, per_unit, xaxis), *_activity_figures(m, per_unit, xaxis),
            *_mix_figures(m)]


Figure = tuple[str, str, dict[str, Any]]


def _time_figures(m: RunMetrics, t0: float, per_unit: float, xaxis: dict[str, Any]) -> list[Figure]:
    """Spend and throughput over time (the response timeline)."""
    tl, act = m.timeline, m.activity
    figs: list[Figure] = []
    since = f"Time since the run's first activity ({fmt_time(t0) if act.t0 is not None or tl.start else '–'})"
    ends = [s + tl.bucket_s for s in tl.start]
    figs.append(("chart-cost", f"Cumulative spend (USD) by response time. {since}.", {
        "data": [{"type": "scatter", "mode": "lines", "x": [(e - t0) / per_unit for e in ends],
                  "y": tl.cumulative_cost_usd, "name": "spend", "customdata": _utc(ends),
                  "hovertemplate": "$%{y:,.4f} by %{customdata}<extra></extra>",
                  "line": {"color": _PALETTE["cost"], "width": 2.5, "shape": "hv"}, "fill": "tozeroy",
                  "fillcolor": "rgba(232,89,12,0.10)"}],
        "layout": _layout("Cost over time", xaxis=xaxis, yaxis={**_AXIS, "tickprefix": "$", "rangemode": "tozero"}),
    }))
    figs.append(("chart-throughput", f"Completion tokens per second, in buckets of {fmt_duration(tl.bucket_s)}.", {
        "data": [{"type": "bar", "x": [(s + tl.bucket_s / 2 - t0) / per_unit for s in tl.start], "y": tl.tokens_per_s,
                  "width": (tl.bucket_s or 1.0) / per_unit, "name": "tokens/s",
                  "marker": {"color": _PALETTE["tput"]}, "customdata": tl.responses,
                  "hovertemplate": "%{y:,.1f} tok/s<br>%{customdata} responses<extra></extra>"}],
        "layout": _layout("Throughput over time", bargap=0.05, xaxis=xaxis, yaxis={**_AXIS, "rangemode": "tozero"}),
    }))
    return figs


def _activity_figures(m: RunMetrics, per_unit: float, xaxis: dict[str, Any]) -> list[Figure]:
    """Retries and failures over time, and the requests in flight (logs/attempts.jsonl)."""
    act = m.activity
    figs: list[Figure] = []
    # Retries (failed attempts, by outcome) and failures (samples given up) over time.
    mid = [(o + act.bucket_s / 2) / per_unit for o in act.offsets]
    data: list[dict[str, Any]] = []
    for i, (kind, counts) in enumerate(act.retries_by_kind.items()):
        data.append({"type": "bar", "x": mid, "y": counts, "name": f"↻ {kind}", "width": act.bucket_s / per_unit,
                     "marker": {"color": _KINDS[i % len(_KINDS)]}, "opacity": 0.85})
    for i, (kind, counts) in enumerate(act.failures_by_kind.items()):
        data.append({"type": "scatter", "mode": "markers", "x": [x for x, c in zip(mid, counts, strict=True) if c],
                     "y": [c for c in counts if c], "name": f"✗ {kind}",
                     "marker": {"symbol": "x", "size": 9, "color": _KINDS[(i + 3) % len(_KINDS)]}})
    have_attempts = bool(act.attempts) and sum(act.attempts) > 0
    retries_caption = (f"Failed attempts per {fmt_duration(act.bucket_s)} by kind (↻ bars, logs/attempts.jsonl), and "
                       "samples given up for this run (✗, failures.jsonl)." if have_attempts else
                       "Samples given up, by kind (failures.jsonl); this run has no logs/attempts.jsonl, so "
                       "retries are not known.")
    figs.append(("chart-retries", retries_caption, {
        "data": data,
        "layout": _layout("Retries and failures over time", barmode="stack", xaxis=xaxis,
                          legend={**_LEGEND, "font": {"size": 10.5}}, height=400,
                          margin={"l": 56, "r": 18, "t": 44, "b": 134},  # room for three rows of legend
                          yaxis={**_AXIS, "rangemode": "tozero", "title": {"text": "per bucket"}},
                          annotations=[] if data else _empty("no retries or failures")),
    }))
    figs.append(("chart-inflight", "Requests in flight (logs/attempts.jsonl: started_at to ended_at): the mean "
                 f"over each {fmt_duration(act.bucket_s)} and the peak.", {
        "data": [
            {"type": "scatter", "mode": "lines", "x": mid, "y": act.in_flight_mean, "name": "mean",
             "line": {"color": _PALETTE["tput"], "width": 2}, "fill": "tozeroy",
             "fillcolor": "rgba(28,126,214,0.10)", "hovertemplate": "%{y:,.1f} in flight<extra>mean</extra>"},
            {"type": "scatter", "mode": "lines", "x": mid, "y": act.in_flight_peak, "name": "peak",
             "line": {"color": "#495057", "width": 1, "dash": "dot", "shape": "hv"}},
        ] if have_attempts else [],
        "layout": _layout("Requests in flight", xaxis=xaxis, yaxis={**_AXIS, "rangemode": "tozero"},
                          annotations=[] if have_attempts else _empty("no logs/attempts.jsonl")),
    }))
    return figs


def _mix_figures(m: RunMetrics) -> list[Figure]:
    """Lengths, sequence lengths, the reasoning share, the provider mix and the failures by kind."""
    h, t, sq = m.histogram, m.total, m.seq_lengths
    figs: list[Figure] = []
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
                          xaxis={**_AXIS, "title": {"text": "tokens"}},
                          yaxis={**_AXIS, "title": {"text": "responses"}}),
    }))
    figs.append(_seq_figure(sq))
    names = [d.name for d in m.datasets]
    shares = [(d.reasoning_share or 0.0) * 100 for d in m.datasets]
    figs.append(("chart-share", f"Share of completion tokens spent reasoning, per dataset; overall {fmt_pct(t.reasoning_share)}.", {
        "data": [
            {"type": "bar", "orientation": "h", "y": names, "x": shares, "name": "reasoning",
             "customdata": [d.reasoning_tokens for d in m.datasets], "marker": {"color": _PALETTE["reasoning"]},
             "hovertemplate": "%{x:.1f}% reasoning<br>%{customdata:,} tokens<extra></extra>"},
            {"type": "bar", "orientation": "h", "y": names, "x": [100 - x if d.completion_tokens else 0
                                                                    for x, d in zip(shares, m.datasets, strict=True)],
             "name": "content", "customdata": [d.content_tokens for d in m.datasets],
             "marker": {"color": _PALETTE["content"]},
             "hovertemplate": "%{x:.1f}% content<br>%{customdata:,} tokens<extra></extra>"},
        ],
        "layout": _layout("Reasoning share by dataset", barmode="stack",
                          xaxis={**_AXIS, "range": [0, 100], "ticksuffix": "%"},
                          yaxis={"automargin": True, "autorange": "reversed"}),
    }))
    figs.append(("chart-providers", "Responses by the provider that served them.", {
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
                          xaxis={**_AXIS, "visible": bool(kinds), "rangemode": "tozero"},
                          annotations=[] if kinds else _empty("no failures")),
    }))
    return figs


def _seq_figure(sq: SeqLengths) -> tuple[str, str, dict[str, Any]]:
    """Prompt + completion per sample against merge.max_seq_len (a dashed marker line)."""
    centers = [(a + b) / 2 for a, b in zip(sq.edges, sq.edges[1:], strict=False)]
    width = (sq.edges[1] - sq.edges[0]) if len(sq.edges) > 1 else 1
    data: list[dict[str, Any]] = []
    if sq.merged:
        data.append({"type": "bar", "x": centers, "y": sq.merged, "width": width, "name": "merged rows (after the cap)",
                     "marker": {"color": _PALETTE["content"]}, "opacity": 0.75})
    data.append({"type": "bar", "x": centers, "y": sq.responses, "width": width,
                 "name": "responses (prompt + completion)" if sq.merged else "responses",
                 "marker": {"color": _PALETTE["reasoning"]}, "opacity": 0.45 if sq.merged else 0.75})
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    cap = sq.max_seq_len
    top = sq.edges[-1] if sq.edges else 0
    if cap is not None and cap <= top:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": cap, "x1": cap, "y0": 0, "y1": 1,
                       "line": {"color": _PALETTE["fail"], "width": 2, "dash": "dash"}})
        notes.append({"x": cap, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
                      "text": f"max_seq_len {cap:,}", "font": {"color": _PALETTE["fail"], "size": 11}})
    parts = [f"Prompt + completion tokens per {'merged row and per response' if sq.merged else 'response'}"]
    if cap is not None:
        parts.append(f"against merge.max_seq_len = {cap:,} (" + ("dashed" if cap <= top else "beyond every sample")
                     + f"): {sq.over_max:,} responses are longer")
    parts.append(f"longest {sq.longest:,}")
    return ("chart-seqlen", "; ".join(parts) + ".", {
        "data": data,
        "layout": _layout("Sequence length", barmode="overlay", shapes=shapes, annotations=notes,
                          xaxis={**_AXIS, "title": {"text": "tokens (prompt + completion)"}, "rangemode": "tozero"},
                          yaxis={**_AXIS, "title": {"text": "samples"}}),
    })


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


class Tok(msgspec.Struct, array_like=True):
    """One token of the sample viewer: its text, its loss mask, and whether it is a control token."""

    text: str
    mask: int
    special: bool = False


class Segment(msgspec.Struct, kw_only=True):
    """Prompt, reasoning or content of the sample: the tokens shown, and how many in the middle are not."""

    name: str
    start: int
    end: int
    head: list[Tok]
    skipped: int = 0
    tail: list[Tok] = msgspec.field(default_factory=list)


class SampleView(msgspec.Struct, kw_only=True):
    """One merged row, decoded token by token, for the page's sample viewer."""

    sample_id: str
    dataset: str
    file: str
    prompt_len: int
    reasoning_len: int
    completion_len: int
    supervised: int
    capped: bool
    segments: list[Segment]
    shown: int


# Tokens shown per segment (head, tail): at most 400 in all.
_SEGMENT_BUDGET = {"prompt": (40, 80), "reasoning": (130, 40), "content": (80, 30)}
_VIEW_ROWS = 256  # the first rows of the shard the shown row is picked from


def _token_texts(tok: Tokenizer, ids: list[int]) -> list[tuple[str, bool]]:
    """(text, is control token) per id. Bytes are decoded incrementally, so a character split over several
    tokens is shown on the token that completes it (the others show nothing)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    specials = tok.special_ids
    names = tok.id_to_special
    out: list[tuple[str, bool]] = []
    for i in ids:
        if i in specials:
            out.append((decoder.decode(b"", final=True) + names[i], True))
            decoder.reset()
            continue
        try:
            b = tok.token_bytes(i)
        except (KeyError, ValueError, IndexError):
            out.append((f"<{i}>", True))
            continue
        out.append((decoder.decode(b), False))
    return out


def _pick_row(rows: list[MergedParquetRow]) -> MergedParquetRow:
    """A row that shows all three parts (short prompt, some reasoning, some content); else the first."""
    for r in rows:
        if r.reasoning_len > 0 and r.completion_len > r.reasoning_len and r.prompt_len <= 300:
            return r
    return next((r for r in rows if r.completion_len > 0), rows[0])


def sample_view(run_dir: Path, m: RunMetrics, profile: Profile) -> SampleView | None:
    """One row of the merged Parquet (the merge manifest's first shard), decoded with the run's profile
    tokenizer and cut to at most ~400 tokens (the start and end of the prompt, reasoning and content).
    None when nothing is merged."""
    shards = sorted((f for f in m.merged_files if f.kind == PARQUET and f.rows > 0),
                    key=lambda f: (f.split != "train", f.path))
    path = next((p for p in (run_dir / f.path for f in shards) if p.is_file()), None)  # paths: run-relative
    if path is None:
        return None
    rows = list(itertools.islice(read_merged([path], MergedParquetRow), _VIEW_ROWS))
    if not rows:
        return None
    row = _pick_row(rows)
    ids, mask = row.input_ids, row.loss_mask
    p, c, r = row.prompt_len, row.completion_len, row.reasoning_len
    bounds = [("prompt", 0, p), ("reasoning", p, p + r), ("content", p + r, p + c)]
    segments: list[Segment] = []
    shown = 0
    for name, a, b in bounds:
        if b <= a:
            continue
        head_n, tail_n = _SEGMENT_BUDGET[name]
        picks = [(a, b)] if b - a <= head_n + tail_n else [(a, a + head_n), (b - tail_n, b)]
        parts: list[list[Tok]] = []
        for lo, hi in picks:
            texts = _token_texts(profile.tokenizer, ids[lo:hi])
            parts.append([Tok(text, mask[lo + k] if lo + k < len(mask) else 0, special)
                          for k, (text, special) in enumerate(texts)])
            shown += hi - lo
        segments.append(Segment(name=name, start=a, end=b, head=parts[0],
                                skipped=(b - a) - sum(len(x) for x in parts),
                                tail=parts[1] if len(parts) > 1 else []))
    return SampleView(sample_id=row.sample_id, dataset=row.dataset, file=str(path.relative_to(run_dir))
                      if path.is_relative_to(run_dir) else str(path), prompt_len=p, reasoning_len=r,
                      completion_len=c, supervised=sum(mask), capped=row.capped, segments=segments,
                      shown=shown)


class ExampleRow(msgspec.Struct, kw_only=True):
    """A BPE mismatch example of the audit with the text around it (decoded from our output ids)."""

    dataset: str
    sample_id: str
    kind: str
    cause: str
    position: int
    ours: list[str]
    reference: list[str]
    before: str = ""
    after: str = ""


_CONTEXT_TOKENS = 16
_CONTEXT_CHARS = 90


def _output_ids(raw: Path, wanted: set[str]) -> dict[str, list[int]]:
    """output_ids of the ``wanted`` sample ids (first record each), found by a byte search of the log."""
    return {sid: rec.output_ids or [] for sid, rec in first_records(raw, ResponseIdsView, wanted).items()}


def example_rows(run_dir: Path, m: RunMetrics, profile: Profile | None, limit: int = 10) -> list[ExampleRow]:
    """The audit's first mismatch examples, each with ~16 tokens of our decoded text before and after."""
    if m.audit is None:
        return []
    picked: list[tuple[str, MismatchExample]] = []
    per = m.audit.datasets or [m.audit.overall]
    for a in per:
        picked += [(a.dataset, e) for e in a.examples]
    if not picked:
        picked = [("", e) for e in m.audit.overall.examples]
    picked = picked[:limit]
    ids: dict[tuple[str, str], list[int]] = {}
    if profile is not None:
        for dataset in {d for d, _ in picked if d}:
            wanted = {e.sample_id for d, e in picked if d == dataset}
            for sid, found in _output_ids(RunDir(run_dir).raw(dataset), wanted).items():
                ids[(dataset, sid)] = found
    rows: list[ExampleRow] = []
    for dataset, e in picked:
        row = ExampleRow(dataset=dataset, sample_id=e.sample_id, kind=e.kind, cause=e.cause, position=e.position,
                         ours=e.ours, reference=e.reference)
        out = ids.get((dataset, e.sample_id))
        if out is not None and profile is not None and e.position <= len(out):
            tok = profile.tokenizer
            before = tok.decode(out[max(0, e.position - _CONTEXT_TOKENS):e.position])
            after_at = e.position + len(e.ours)
            after = tok.decode(out[after_at:after_at + _CONTEXT_TOKENS])
            row.before = ("…" if e.position > _CONTEXT_TOKENS else "") + before[-_CONTEXT_CHARS:]
            row.after = after[:_CONTEXT_CHARS] + ("…" if after_at + _CONTEXT_TOKENS < len(out) else "")
        rows.append(row)
    return rows


def _secs(x: float | None) -> str:
    """Seconds for latency and TTFT cells: milliseconds under a second."""
    if x is None:
        return "–"
    if x < 1:
        return f"{x * 1000:.0f} ms"
    if x < 10:
        return f"{x:.2f} s"
    return fmt_duration(x)


def _ci(ci: list[float] | None, signed: bool = False) -> str:
    """A 95% interval cell: "[low, high]" (signed: "[+low, +high]"), "–" without one."""
    if not ci:
        return "–"
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if signed else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _chain_context(chain: ChainView | None) -> dict[str, Any]:
    """The extract, train and accept sections' values: the chain, its JSON, the accept verdict sentence and
    the comparisons by name."""
    rep = chain.accept if chain is not None else None
    return {"chain": chain, "chain_json": _embed_json(chain) if chain is not None else "",
            "accept_verdict": verdict(rep) if rep is not None else None,
            "accept_beats": beats(rep) if rep is not None else None,
            "comparisons": {c.versus: c for c in rep.comparisons} if rep is not None else {}}


def render_html(m: RunMetrics, *, title: str, generated_at: float, settings: dict[str, str],
                sample: SampleView | None = None, examples: list[ExampleRow] | None = None,
                notes: list[str] | None = None, chain: ChainView | None = None,
                rounds: RoundsView | None = None) -> str:
    import jinja2
    from plotly.offline import get_plotlyjs

    from draftgen.phases.report.template import PAGE

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    from draftgen.hidden.estimate import format_bytes

    env.filters.update(int=fmt_int, pct=fmt_pct, usd=fmt_usd, dur=fmt_duration, time=fmt_time, num=fmt_float,
                       bytes=format_bytes, tok=_token, secs=_secs, ci=_ci, tag=tag_label,
                       ctx=lambda text: text.replace("\n", "↵").replace("\t", "⇥"))
    figs = _figures(m)
    t = m.total
    kpis = [
        ("samples done", f"{fmt_int(t.done)}", f"of {fmt_int(t.prepared)} prepared ({fmt_pct(t.progress)})"),
        ("completion tokens", fmt_int(t.completion_tokens), f"{fmt_float(t.mean_completion_tokens, 0)} per response"),
        ("spend", fmt_usd(m.spend.booked_usd),
         fmt_held(m.spend.billed_usd, m.spend.held_usd, m.spend.abandoned)
         or f"{fmt_usd(t.usd_per_m_output)} per M output tokens"),
        ("reasoning share", fmt_pct(t.reasoning_share), f"{fmt_int(t.reasoning_tokens)} reasoning tokens"),
        ("tokens / second", _compact(m.tokens_per_s), f"{fmt_int(t.completion_tokens)} tokens over {fmt_duration(m.elapsed_s)}"),
        ("failed", fmt_int(t.failed), f"{fmt_int(t.truncated)} truncated responses"),
    ]
    tl = m.tail
    if tl.hedges or tl.slow_streams:
        kpis.append(("tail", f"{fmt_int(tl.hedges)} hedged",
                     f"{fmt_int(tl.hedges_won)} won · {fmt_usd(tl.extra_usd)} extra ({fmt_pct(tl.extra_share)} of "
                     f"spend) · {fmt_int(tl.slow_streams)} slow streams retried"))
    plotly_js = get_plotlyjs()
    page = env.from_string(PAGE).render(
        title=title,
        m=m,
        t=t,
        kpis=kpis,
        settings=settings,
        generated=fmt_time(generated_at),
        audit=audit_rows(m),
        examples=examples if examples is not None else example_rows(Path(m.run_dir), m, None),
        sample=sample,
        notes=notes or [],
        figures=[(div, cap, _embed_json(fig), fig["layout"].get("height", CHART_HEIGHT)) for div, cap, fig in figs],
        metrics_json=_embed_json(m),
        plotly_js=plotly_js,
        **_chain_context(chain),
        rounds=rounds if rounds is not None and (rounds.rows or rounds.notes) else None,
        rounds_json=_embed_json(rounds) if rounds is not None else "",
    )
    return _redact_page(page, plotly_js)


def _redact_page(page: str, verbatim: str) -> str:
    """The page with every key-shaped string redacted (its text, tables and embedded JSON), except the
    ``verbatim`` block (plotly's own JavaScript, inlined as it ships)."""
    i = page.find(verbatim) if verbatim else -1
    if i < 0:
        return redact(page)
    return redact(page[:i]) + verbatim + redact(page[i + len(verbatim):])
