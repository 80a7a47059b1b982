"""report.metrics and report.html: figures recomputed from the files equal what the page shows."""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path

import msgspec
import pytest

from _report_helpers import make_config, run_config, write_run_dir
from draftgen.config import load_config
from draftgen.importer import run_import
from draftgen.report.format import fmt_int, fmt_usd
from draftgen.report.html import run_report
from draftgen.report.metrics import RunMetrics, compute_metrics


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
    assert run_import(run_config(run, ("chat",)), "chat", source, echo=lambda s: None).imported == 1
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
    path = run_report(cfg)
    assert path == run / "report.html"
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
    out = run_report(cfg, output=tmp_path / "elsewhere" / "r.html")
    page = out.read_text(encoding="utf-8")
    assert not (run / "report.html").exists()
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
    page = run_report(cfg).read_text(encoding="utf-8")
    m = msgspec.json.decode(_embedded(page, "draftgen-metrics"), type=RunMetrics)
    assert m.total.done == 0 and [d.prepared for d in m.datasets] == [None, None]
    assert "no failures" in page
