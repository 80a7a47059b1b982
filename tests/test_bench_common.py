"""bench/_common.py (the result-line convention, measurement helpers) and the orchestrator's report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import __main__ as orchestrator  # noqa: E402
from bench._common import (  # noqa: E402
    RESULT_PREFIX,
    CpuTimer,
    emit_result,
    machine_info,
    parse_results,
    peak_rss_mb,
    quick_mode,
)
from bench.bench_resume import write_log  # noqa: E402


def test_emit_and_parse_round_trip(capsys: pytest.CaptureFixture[str]) -> None:
    print("some table\nRESULT-JSON: not json")
    emit_result("demo", {"cpu_s_per_1k": 1.25, "ok": True, "note": "a | b"})
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(RESULT_PREFIX)
    got = parse_results(out)
    assert got == [{"name": "demo", "figures": {"cpu_s_per_1k": 1.25, "ok": True, "note": "a | b"}}]


def test_quick_mode_reads_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["x"])
    monkeypatch.delenv("DRAFTGEN_BENCH_QUICK", raising=False)
    assert not quick_mode()
    monkeypatch.setenv("DRAFTGEN_BENCH_QUICK", "1")
    assert quick_mode()
    monkeypatch.setenv("DRAFTGEN_BENCH_QUICK", "0")
    monkeypatch.setattr(sys, "argv", ["x", "--quick"])
    assert quick_mode()


def test_measurements_are_plausible() -> None:
    with CpuTimer() as t:
        sum(i * i for i in range(300_000))
    assert t.cpu_s > 0 and t.wall_s > 0
    assert 5 < peak_rss_mb() < 100_000
    info = machine_info()
    assert info["cores"] >= 1 and info["python"].count(".") == 2


def test_synthetic_resume_log_has_the_asked_size(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    write_log(path, records=400, total_tokens=400 * 1000)
    from draftgen.store import iter_responses, scan_responses

    idx = scan_responses(path)
    assert len(idx.done) == 400 and idx.completion_tokens == 400_000
    recs = list(iter_responses(path))
    assert sum(len(r.output_ids or []) for r in recs) == 400_000
    assert all(r.usage is not None and r.usage.completion_tokens == len(r.output_ids or []) for r in recs)


def test_orchestrator_isolates_a_failing_script_and_writes_results(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    (bench_dir / "bench_good.py").write_text(
        "import json\nprint('table')\nprint('RESULT-JSON: ' + json.dumps({'name': 'good', "
        "'figures': {'max_sustained_tokens_per_s': 500000}}))\n")
    (bench_dir / "bench_bad.py").write_text("raise SystemExit('boom')\n")
    (bench_dir / "bench_slow.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    (bench_dir / "bench_plain.py").write_text("print('no machine-readable line; rate (3581/s)')\n")
    monkeypatch.setattr(orchestrator, "BENCH_DIR", bench_dir)
    monkeypatch.setattr(orchestrator, "TARGETS", [
        orchestrator.Target("rate", ("bench_good",), ("max_sustained_tokens_per_s",), ">=", 460_000, "issue 7"),
        orchestrator.Target("absent", ("bench_nope",), ("x",), "<=", 1, "issue 3"),
        orchestrator.Target("printed", ("bench_plain",), ("x",), ">=", 4000, "issue 2", pattern=r"rate \((\d+)/s\)"),
    ])
    out = tmp_path / "RESULTS.md"
    rc = orchestrator.main(["--timeout", "3", "--output", str(out)])
    assert rc == 1
    text = out.read_text()
    assert "| bench_good | ok |" in text
    assert "| bench_bad | failed (exit 1) |" in text
    assert "| bench_slow | timed out after 3 s |" in text
    assert "| bench_plain | ok (no RESULT-JSON; raw output only) |" in text
    assert "no machine-readable line" in text and "boom" in text
    assert "| rate | issue 7 | >= 460,000 | met | bench_good: max_sustained_tokens_per_s = 500,000 |" in text
    assert "| absent | issue 3 | <= 1 | not measured | bench_nope: script absent |" in text
    assert "| printed | issue 2 | >= 4,000 | NOT met | bench_plain: 3,581 (read from its printed output) |" in text
    only = tmp_path / "only.md"
    assert orchestrator.main(["--only", "good", "--output", str(only)]) == 0
    assert "bench_bad" not in only.read_text()
