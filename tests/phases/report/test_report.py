"""runview.metrics and report.html: figures recomputed from the files equal what the page shows."""

from __future__ import annotations

import html as htmllib
import os
import re
from pathlib import Path

import msgspec
import pytest

from _report_helpers import make_config, run_config, write_run_dir
from draftgen.config import load_config
from draftgen.fmt import fmt_int, fmt_usd
from draftgen.phases.importer.run import run_import
from draftgen.phases.report.run import run_report
from draftgen.runview.metrics import RunMetrics, compute_metrics


def _quiet(line: str) -> None:
    pass


def _embedded(page: str, element_id: str) -> bytes:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    assert m is not None, element_id
    return m.group(1).encode()


def _cells(page: str, dataset: str) -> list[str]:
    m = re.search(rf'<tr[^>]*data-dataset="{dataset}">(.*?)</tr>', page, re.S)
    assert m is not None
    return [htmllib.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", m.group(1), re.S)]


def test_metrics_count_what_the_files_hold(tmp_path: Path) -> None:
    written = write_run_dir(tmp_path / "run", datasets={"chat": 40, "code": 25})
    m = compute_metrics(tmp_path / "run")
    by = {d.name: d for d in m.datasets}
    for name, rows in written.items():
        d = by[name]
        assert d.done == len(rows)
        assert d.completion_tokens == sum(r.usage.completion_tokens for r in rows if r.usage)
        assert d.reasoning_tokens == sum(r.usage.reasoning_tokens for r in rows if r.usage)
        assert d.cost_usd == pytest.approx(sum(r.usage.cost for r in rows if r.usage))
        assert d.truncated == sum(r.finish_reason == "length" for r in rows)
        # 3 unresolved failures; the one followed by a response does not count.
        assert d.failed == 3 and d.failure_events == 4
        assert set(d.failures_by_kind) == {"rate_limited", "context_length_exceeded"}
    assert m.total.done == 52 and m.total.prepared == 65
    assert m.total.progress == pytest.approx(52 / 65)
    assert sum(m.histogram.reasoning) == sum(m.histogram.content) == 52
    assert sum(m.timeline.responses) == 52
    assert m.timeline.cumulative_cost_usd[-1] == pytest.approx(m.total.cost_usd)
    assert sum(m.total.providers.values()) == 52
    assert m.model == "qwen/qwen3-8b" and m.endpoint == "emulator"
    assert m.phases == {"prepared": True, "generated": True, "audited": True, "merged": False, "reported": False}


def test_duplicates_count_once_and_legacy_rows_use_output_ids(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = write_run_dir(run, datasets={"chat": 10}, audit=False, failures=False)
    from draftgen.store import JsonlWriter

    gone = msgspec.structs.replace(written["chat"][1], sample_id="chat-gone")
    with JsonlWriter(run / "raw" / "chat" / "raw_responses.jsonl", fsync=False) as w:
        w.write(written["chat"][0])  # duplicate id
        w.write(gone)  # an orphan: its sample is not in the prepared set
    # A legacy local-SGLang row (ids only, no usage) of a prepared sample, brought in by `draftgen import`.
    source = tmp_path / "sglang.jsonl"
    source.write_bytes(msgspec.json.encode({"sample_id": "chat-0008", "output_ids": [1, 2, 3, 4, 5]}) + b"\n")
    assert run_import(run_config(run, ("chat",)), echo=lambda s: None, dataset="chat", source=source).imported == 1
    m = compute_metrics(run)
    d = m.datasets[0]
    assert d.duplicates == 1
    assert d.orphans == 1 and gone.usage is not None and d.orphan_cost_usd == pytest.approx(gone.usage.cost)
    assert d.done == len(written["chat"]) + 1
    assert d.completion_tokens == sum(r.usage.completion_tokens for r in written["chat"] if r.usage) + 5
    assert m.audit is None and m.model == "qwen/qwen3-8b"


def test_report_embeds_the_recomputable_metrics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run)
    cfg = load_config(make_config(tmp_path, run))
    lines: list[str] = []
    path = run_report(cfg, echo=lines.append).path
    assert path == run / "report.html" and lines == [f"report: {path}"]
    page = path.read_text(encoding="utf-8")
    embedded = msgspec.json.decode(_embedded(page, "draftgen-metrics"), type=RunMetrics)
    # The page was written into the run dir, so recomputing now also sees "reported".
    assert embedded == compute_metrics(run, ["chat", "code"])
    # What the tables show is the embedded numbers.
    for d in [*embedded.datasets, embedded.total]:
        cells = _cells(page, d.name)
        assert cells[0] == d.name
        assert cells[1] == f"{fmt_int(d.done)} / {fmt_int(d.prepared)}"
        assert cells[4] == fmt_int(d.completion_tokens)
        assert cells[6] == fmt_usd(d.cost_usd)
        assert cells[9] == fmt_int(d.failed)
    # Charts carry the same series.
    cost = msgspec.json.decode(_embedded(page, "chart-cost-data"))
    assert cost["data"][0]["y"] == embedded.timeline.cumulative_cost_usd
    lengths = msgspec.json.decode(_embedded(page, "chart-lengths-data"))
    assert lengths["data"][0]["y"] == embedded.histogram.reasoning
    assert "BPE mismatch examples" in page and "Ġab" in page


def test_report_is_self_contained(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = write_run_dir(run, datasets={"chat": 3}, audit=False)
    from draftgen.store import JsonlWriter

    with JsonlWriter(run / "raw" / "chat" / "raw_responses.jsonl", fsync=False) as w:
        # chat-0002 is prepared but not done yet (an orphan would not count in the providers)
        w.write(msgspec.structs.replace(written["chat"][0], sample_id="chat-0002", provider="evil</script><b>"))
    cfg = load_config(make_config(tmp_path, run))
    out = run_report(cfg, echo=_quiet, output=tmp_path / "elsewhere" / "r.html").path
    page = out.read_text(encoding="utf-8")
    assert not (run / "report.html").exists()
    mask = os.umask(0o022)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # a page to share, not a private file (mkstemp's 0600)
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["']?https?:""", page)
    # The only </script> closers are the page's own: a hostile name cannot end a JSON block early.
    assert page.count("</script>") == page.count("<script")
    m = msgspec.json.decode(_embedded(page, "draftgen-metrics"), type=RunMetrics)
    assert "evil</script><b>" in m.total.providers
    assert "No audit yet" in page


def test_report_of_an_empty_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    cfg = load_config(make_config(tmp_path, run))
    page = run_report(cfg, echo=_quiet).path.read_text(encoding="utf-8")
    m = msgspec.json.decode(_embedded(page, "draftgen-metrics"), type=RunMetrics)
    assert m.total.done == 0 and [d.prepared for d in m.datasets] == [None, None]
    assert "no failures" in page


# -- issue 11: providers, verdict, activity over time, sequence lengths, sample viewer ---------------------

from _report_helpers import T0, response, synthetic_attempts, write_attempts_and_health, write_logs  # noqa: E402
from draftgen.phases.report.html import audit_rows, example_rows  # noqa: E402
from draftgen.records import (  # noqa: E402
    AttemptRecord,
    AuditReport,
    DatasetAudit,
    FailureRecord,
    HealthEvent,
    MergedDatasetStats,
    MergeManifest,
    MergeStats,
    MismatchExample,
    Usage,
)
from draftgen.rundir import RunDir  # noqa: E402
from draftgen.runview.providers import provider_metrics  # noqa: E402
from draftgen.store import atomic_write_json  # noqa: E402


def _attempt(sid: str, provider: str | None, outcome: str = "ok", *, at: float = T0, dur: float = 1.0,
             **kw: object) -> AttemptRecord:
    return AttemptRecord(sample_id=sid, dataset="chat", attempt=1, started_at=at, ended_at=at + dur, outcome=outcome,
                         provider=provider, **kw)  # type: ignore[arg-type]


def test_provider_metrics_exact_numbers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = run_config(run, ("chat",))
    u = Usage(prompt_tokens=10, completion_tokens=100, reasoning_tokens=40, cost=0.001)
    responses = [
        response(cfg, f"chat-{i:04d}", "chat", provider="A", quantization="fp8", usage=u, latency_s=float(i + 1),
                 ttft_s=0.1 * (i + 1), reasoning="" if i == 1 else "thinking")
        for i in range(4)
    ]
    responses += [
        # BYOK: cost 0, the upstream cost is what it cost; no TTFT in the attempts, so the record's counts
        response(cfg, "chat-0004", "chat", provider="B", quantization="bf16", latency_s=10.0, ttft_s=0.9,
                 usage=Usage(completion_tokens=50, reasoning_tokens=0, cost=0.0, is_byok=True, upstream_cost=0.02)),
        response(cfg, "chat-0000", "chat", provider="B", usage=u, latency_s=99.0),  # duplicate: not counted
        response(cfg, "chat-9999", "chat", provider="B", usage=u, latency_s=99.0),  # orphan: not counted
    ]
    attempts = [_attempt(f"chat-{i:04d}", "A", ttft_s=0.5 * (i + 1)) for i in range(4)]
    attempts += [_attempt("chat-0000", "A", "rate_limited"), _attempt("chat-0001", "A", "rate_limited"),
                 _attempt("chat-0001", "A", "reasoning_dropped", ttft_s=9.0)]
    attempts += [_attempt("chat-0004", "B"), _attempt("chat-0004", "B", "server_error")]
    attempts += [_attempt("chat-0005", "C", "idle_timeout", quantization="int4"),
                 _attempt("chat-0005", "C", "idle_timeout", quantization="int4")]
    health = [HealthEvent(at=T0, provider="A", event="cooldown", until=T0 + 300),
              HealthEvent(at=T0 + 300, provider="A", event="restored"),
              HealthEvent(at=T0 + 5, provider="C", event="cooldown"), HealthEvent(at=T0 + 400, provider="C", event="cooldown")]
    write_logs(cfg, prompts={"chat": 6}, responses=responses, attempts=attempts, health=health)

    got = provider_metrics(run, ["chat"])
    assert [p.provider for p in got] == ["A", "B", "C"]
    a, b, c = got
    assert (a.responses, a.attempts, a.retries, a.cooldowns, a.dropped_reasoning) == (4, 7, 3, 1, 1)
    assert a.failures_by_kind == {"rate_limited": 2, "reasoning_dropped": 1}
    assert a.quantization == "fp8" and a.completion_tokens == 400
    assert a.cost_usd == pytest.approx(0.004) and a.usd_per_m_output == pytest.approx(10.0)
    assert a.latency_p50_s == pytest.approx(2.5) and a.latency_p95_s == pytest.approx(3.85)
    # TTFT from the attempts (every one that has it, the failed one too): 0.5, 1.0, 1.5, 2.0, 9.0
    assert a.ttft_p50_s == pytest.approx(1.5) and a.ttft_p95_s == pytest.approx(2.0 + 0.8 * 7.0)
    assert a.share == pytest.approx(0.8) and a.failure_rate == pytest.approx(3 / 7)
    assert (b.responses, b.attempts, b.retries, b.failures_by_kind) == (1, 2, 1, {"server_error": 1})
    assert b.cost_usd == pytest.approx(0.02) and b.usd_per_m_output == pytest.approx(400.0)
    assert b.latency_p50_s == b.latency_p95_s == pytest.approx(10.0)
    assert b.ttft_p50_s == pytest.approx(0.9) and b.quantization == "bf16" and b.dropped_reasoning == 0
    assert (c.responses, c.attempts, c.retries, c.cooldowns, c.quantization) == (0, 2, 2, 2, "int4")
    assert c.latency_p50_s is None and c.share == 0.0
    # compute_metrics carries the same table.
    m = compute_metrics(run, ["chat"])
    assert m.providers_table == got
    assert m.verdict.level == "amber" and any("cool-downs: C 2, A 1" in w for w in m.verdict.warnings)

    # An older run: no logs/attempts.jsonl, no logs/health.jsonl.
    RunDir(run).attempts.unlink()
    RunDir(run).health.unlink()
    old = provider_metrics(run, ["chat"])
    assert [p.provider for p in old] == ["A", "B"]
    assert old[0].attempts == old[0].retries == old[0].cooldowns == 0 and old[0].failures_by_kind == {}
    assert old[0].ttft_p50_s == pytest.approx(0.25)  # from the records now: 0.1, 0.2, 0.3, 0.4
    assert old[0].failure_rate is None


def _verdict_run(tmp: Path, *, failed: int = 0, merged_rows: int | None = 3, dropped: dict[str, int] | None = None,
                 broken: bool = False, cooldown: bool = False) -> RunMetrics:
    run = tmp / "run"
    cfg = run_config(run, ("chat",))
    done = 3
    rd = RunDir(run)
    write_logs(cfg, prompts={"chat": done + failed},
               responses=[response(cfg, f"chat-{i:04d}", "chat", provider="A",
                                   usage=Usage(prompt_tokens=5, completion_tokens=20, reasoning_tokens=5))
                          for i in range(done)],
               failures=[FailureRecord(sample_id=f"chat-{done + i:04d}", dataset="chat", kind="rate_limited",
                                       reason="429", created_at=T0 + 1) for i in range(failed)],
               health=[HealthEvent(at=T0, provider="A", event="cooldown")] if cooldown else None)
    overall = DatasetAudit(dataset="overall", records=done)
    atomic_write_json(rd.audit_json, AuditReport(
        profile="qwen3", datasets=[DatasetAudit(dataset="chat", records=done)], overall=overall,
        thresholds_broken=["chat: semantic mismatch rate 5.0000% > 1.0000% (audit.max_semantic_mismatch_rate)"]
        if broken else []))
    if merged_rows is not None:
        total = MergedDatasetStats(dataset="all", records=done, samples=merged_rows, dropped=dropped or {})
        atomic_write_json(rd.merged_stats, MergeStats(datasets=[], total=total))
        atomic_write_json(rd.merged_manifest, MergeManifest(files=[], seed=0, merge={"max_seq_len": 8192},
                                                            datasets=["chat"], profile="qwen3", layout=2))
    return compute_metrics(run, ["chat"])


@pytest.mark.parametrize(("case", "level", "reason"), [
    ("clean", "green", "3 samples done, audit passed, 3 rows merged"),
    ("failures", "amber", "1 sample failed (rate_limited 1); retried on the next run"),
    ("exclusions", "amber", "merge excluded 2 samples (reasoning_dropped 2)"),
    ("cooldown", "amber", "provider cool-downs: A 1"),
    ("not merged", "amber", "not merged yet"),
    ("threshold", "red", "audit threshold broken: chat: semantic mismatch rate"),
    ("failures, nothing merged", "red", "2 samples failed (rate_limited 2) and nothing was merged"),
    ("merge wrote nothing", "red", "merge wrote no rows"),
])
def test_verdict_colours(tmp_path: Path, case: str, level: str, reason: str) -> None:
    kw: dict[str, object] = {
        "clean": {}, "failures": {"failed": 1}, "exclusions": {"dropped": {"reasoning_dropped": 2, "duplicate_record": 1}},
        "cooldown": {"cooldown": True}, "not merged": {"merged_rows": None}, "threshold": {"broken": True},
        "failures, nothing merged": {"failed": 2, "merged_rows": None}, "merge wrote nothing": {"merged_rows": 0},
    }[case]
    v = _verdict_run(tmp_path, **kw).verdict  # type: ignore[arg-type]
    assert v.level == level
    assert v.reason.startswith(reason), v.reason
    assert (v.problems == []) == (level != "red")
    assert (v.warnings == [] and v.problems == []) == (level == "green")


def test_report_page_shows_the_verdict_and_highlights_broken_thresholds(tmp_path: Path) -> None:
    m = _verdict_run(tmp_path, broken=True, cooldown=True)
    rows = audit_rows(m)
    assert [(r.dataset, r.broken) for r in rows] == [("chat", ["semantic"]), ("all", [])]
    page = run_report(load_config(make_config(tmp_path, tmp_path / "run", ("chat",))), echo=_quiet).path.read_text(encoding="utf-8")
    assert re.search(r'<section class="verdict red" id="verdict" data-level="red">', page)
    assert "NOT USABLE" in page and "provider cool-downs: A 1" in page
    assert re.search(r'<tr class=" broken" data-audit="chat"', page)
    assert '<tr data-provider="A"' not in page and re.search(r'<tr class="warn" data-provider="A">', page)


def _time_run(tmp: Path, span_s: float) -> RunMetrics:
    """Two overlapping attempts over [0, span_s] and one failed attempt: the run lasts span_s seconds."""
    run = tmp / "run"
    cfg = run_config(run, ("chat",))
    half = span_s / 2
    attempts = [_attempt("chat-0000", "A", at=T0, dur=half), _attempt("chat-0001", "A", at=T0 + half / 2, dur=half * 1.5),
                _attempt("chat-0002", "A", "rate_limited", at=T0 + half / 2, dur=0.0)]
    write_logs(cfg, prompts={"chat": 3}, responses=[
        response(cfg, "chat-0000", "chat", provider="A", created_at=T0 + half,
                 usage=Usage(completion_tokens=10, cost=0.5)),
        response(cfg, "chat-0001", "chat", provider="A", created_at=T0 + span_s,
                 usage=Usage(completion_tokens=10, cost=0.5))], attempts=attempts)
    return compute_metrics(run, ["chat"])


@pytest.mark.parametrize(("span_s", "unit", "last_tick"), [(20.0, "s", 20.0), (5 * 3600.0, "h", 5.0)])
def test_time_axes_count_from_the_start_in_a_unit_that_suits_the_span(tmp_path: Path, span_s: float, unit: str,
                                                                      last_tick: float) -> None:
    from draftgen.phases.report.html import _figures

    m = _time_run(tmp_path, span_s)
    act = m.activity
    assert act.t0 == T0 and act.span_s == span_s and act.unit == unit
    n = len(act.offsets)
    assert 20 <= n <= 61 and act.offsets[-1] <= span_s < act.offsets[-1] + act.bucket_s
    assert sum(act.attempts) == 3 and list(act.retries_by_kind) == ["rate_limited"]
    quarter = int(span_s / 4 // act.bucket_s)
    assert act.retries_by_kind["rate_limited"] == [int(i == quarter) for i in range(n)]
    # Requests in flight: 1 over [0, span/4), 2 over [span/4, span/2), 1 after: the time-weighted mean.
    area = sum(mean * min(act.bucket_s, span_s - off) for mean, off in zip(act.in_flight_mean, act.offsets, strict=True))
    assert area == pytest.approx(span_s / 2 + span_s * 3 / 4)
    assert max(act.in_flight_peak) == 2
    figs = {div: fig for div, _, fig in _figures(m)}
    for div in ("chart-cost", "chart-throughput", "chart-retries", "chart-inflight"):
        axis = figs[div]["layout"]["xaxis"]
        assert axis["title"]["text"] == f"time since start ({unit})", div
    xs = figs["chart-inflight"]["data"][0]["x"]
    assert 0 < xs[0] < xs[-1] <= last_tick * 1.05  # bucket middles, in the unit: never epoch floats
    cost_x = figs["chart-cost"]["data"][0]["x"]
    assert max(cost_x) == pytest.approx(last_tick, rel=0.1)
    assert figs["chart-cost"]["data"][0]["customdata"][0].endswith("UTC")


def test_sequence_lengths_against_max_seq_len(tmp_path: Path) -> None:
    from _merge_helpers import chat_rows, prepared_run
    from draftgen.phases.merge.run import run_merge
    from draftgen.phases.report.html import _figures

    cfg = prepared_run(tmp_path, {"chat": chat_rows("chat", 30)}, merge={"max_seq_len": 120}, long_every=4)
    before = compute_metrics(cfg.run_path, ["chat"])
    sq = before.seq_lengths
    assert sq.merged == [] and sq.max_seq_len == 120  # not merged: the run's config (run.json), every response
    assert sum(sq.responses) == before.total.done == 30
    run_merge(cfg, echo=lambda s: None)
    m = compute_metrics(cfg.run_path, ["chat"])
    sq = m.seq_lengths
    assert sq.max_seq_len == 120  # what the merge used (its manifest, then run.json)
    assert m.merged is not None and sum(sq.merged) == sq.merged_rows == m.merged.total.samples > 0
    assert sum(sq.responses) == 30
    # merged rows are cut at 120; responses are not, and those over it are counted
    assert all(c == 0 for c, lo in zip(sq.merged, sq.edges, strict=False) if lo > 120)
    assert sq.over_max == m.merged.total.capped + m.merged.total.dropped.get("prompt_over_max_seq_len", 0) > 0
    assert sum(c for c, lo in zip(sq.responses, sq.edges, strict=False) if lo > 120) > 0
    fig = {div: f for div, _, f in _figures(m)}["chart-seqlen"]
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [120]
    assert [d["name"] for d in fig["data"]] == ["merged rows (after the cap)", "responses (prompt + completion)"]


def test_sample_viewer_and_mismatch_context(tmp_path: Path) -> None:
    from _merge_helpers import chat_rows, prepared_run
    from draftgen.phases.merge.run import run_merge
    from draftgen.tokens import profile_from_config

    cfg = prepared_run(tmp_path, {"chat": chat_rows("chat", 8)})
    run = cfg.run_path
    prof = profile_from_config(cfg)
    from draftgen.records import ResponseRecord
    from draftgen.store import iter_jsonl

    rec = next(r for _, r in iter_jsonl(RunDir(run).raw("chat"), ResponseRecord) if len(r.output_ids or []) > 30)
    out = rec.output_ids or []
    pos = 20
    example = MismatchExample(sample_id=rec.sample_id, kind="tokenization", position=pos,
                              ours=prof.tokenizer.token_strs(out[pos:pos + 2]), reference=["Ġab"],
                              cause="non_canonical_segmentation")
    da = DatasetAudit(dataset="chat", records=8, examples=[example])
    atomic_write_json(RunDir(run).audit_json, AuditReport(profile="qwen3", datasets=[da], overall=da))
    run_merge(cfg, echo=lambda s: None)
    m = compute_metrics(run, ["chat"])
    rows = example_rows(run, m, prof)
    assert len(rows) == 1
    assert rows[0].before == "…" + prof.tokenizer.decode(out[pos - 16:pos])[-90:]
    assert rows[0].after.startswith(prof.tokenizer.decode(out[pos + 2:pos + 18])[:90])

    page = run_report(cfg, echo=_quiet).path.read_text(encoding="utf-8")
    assert 'id="sample-viewer"' in page and 'id="mismatches"' in page
    viewer = page[page.index('id="sample-viewer"'):page.index("<footer>")]
    segs = re.findall(r'data-segment="(\w+)"', viewer)
    assert segs == ["prompt", "reasoning", "content"]
    tokens = re.findall(r'<span class="t (m[01])( sp)?">(.*?)</span>', viewer, re.S)
    assert 30 < len(tokens) <= 400
    prompt_part = viewer[viewer.index('data-segment="prompt"'):viewer.index('data-segment="reasoning"')]
    content_part = viewer[viewer.index('data-segment="content"'):]
    assert 'class="t m1' not in prompt_part and 'class="t m0' not in content_part  # loss mask: 0 prompt, 1 answer
    assert "&lt;|im_start|&gt;" in prompt_part and "Answer" in content_part
    # the embedded metrics are still exactly what the files give
    assert msgspec.json.decode(_embedded(page, "draftgen-metrics"), type=RunMetrics) == compute_metrics(run, ["chat"])


def test_report_shares_and_synthetic_attempts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = write_run_dir(run)
    attempts = write_attempts_and_health(run_config(run), written)
    assert attempts == synthetic_attempts(written)
    m = compute_metrics(run, ["chat", "code"])
    assert sum(p.responses for p in m.providers_table) == m.total.done
    assert sum(p.attempts for p in m.providers_table) == len(attempts)
    page = run_report(load_config(make_config(tmp_path, run)), echo=_quiet).path.read_text(encoding="utf-8")
    # reasoning share is a percentage wherever it is shown
    for d in [*m.datasets, m.total]:
        assert _cells(page, d.name)[5] == f"{d.reasoning_share * 100:.1f}%"  # type: ignore[operator]
    share = msgspec.json.decode(_embedded(page, "chart-share-data"))
    assert share["layout"]["xaxis"]["ticksuffix"] == "%"
    assert share["data"][0]["x"] == [pytest.approx((d.reasoning_share or 0) * 100) for d in m.datasets]
