"""The report's and status's read of a large run directory: ``compute_metrics`` vs decoding whole records.

Writes a synthetic raw log (``bench_resume.write_log``: 20,000 records, 69M completion tokens;
``--quick``: 2,000 and 6.9M) into a temp folder, deleted afterwards, then times in this process:

- ``draftgen``: ``draftgen.runview.metrics.compute_metrics`` (a narrow struct; text and id arrays skipped);
- ``full_records``: the straightforward way, ``store.iter_responses`` (every field of ``ResponseRecord``
  decoded) with the same aggregation of tokens, cost and providers;
- ``orjson_loads``: ``orjson.loads`` per line with the same aggregation;
- ``resume_scan``: ``store.scan_responses`` (ids, tokens and spend only), the floor: what resume reads;
- ``render``: ``render_html`` of the computed metrics (page with plotly inlined), for scale.

Prints a table, the ratios and ``RESULT-JSON``. Best of 2 per method; the file is in the page cache.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    from bench._common import CpuTimer, emit_result, quick_mode
    from bench.bench_resume import write_log
except ModuleNotFoundError:  # run as `python bench/bench_report.py`
    from _common import CpuTimer, emit_result, quick_mode  # type: ignore[no-redef]
    from bench_resume import write_log  # type: ignore[no-redef]


def _full_records(run: Path) -> tuple[int, int]:
    from draftgen.store import iter_responses

    done: set[str] = set()
    tokens = 0
    cost = 0.0
    providers: Counter[str] = Counter()
    for rec in iter_responses(run / "raw" / "bench" / "raw_responses.jsonl"):
        if rec.sample_id in done:
            continue
        done.add(rec.sample_id)
        if rec.usage is not None:
            tokens += rec.usage.completion_tokens
            cost += rec.usage.cost
        providers[rec.provider or "unknown"] += 1
    return len(done), tokens


def _orjson(run: Path) -> tuple[int, int]:
    import orjson

    done: set[str] = set()
    tokens = 0
    cost = 0.0
    providers: Counter[str] = Counter()
    with open(run / "raw" / "bench" / "raw_responses.jsonl", "rb") as fh:
        for line in fh:
            rec = orjson.loads(line)
            if rec["sample_id"] in done:
                continue
            done.add(rec["sample_id"])
            tokens += rec["usage"]["completion_tokens"]
            cost += rec["usage"]["cost"]
            providers[rec.get("provider") or "unknown"] += 1
    return len(done), tokens


def _scan(run: Path) -> tuple[int, int]:
    from draftgen.store import scan_responses

    idx = scan_responses(run / "raw" / "bench" / "raw_responses.jsonl")
    return len(idx.done), idx.completion_tokens


def _draftgen(run: Path) -> tuple[int, int]:
    from draftgen.runview.metrics import compute_metrics

    m = compute_metrics(run)
    return m.total.done, m.total.completion_tokens


def _best(fn: Any, run: Path, repeats: int = 2) -> tuple[float, float, tuple[int, int]]:
    best: tuple[float, float, tuple[int, int]] | None = None
    for _ in range(repeats):
        with CpuTimer() as t:
            got = fn(run)
        if best is None or t.wall_s < best[0]:
            best = (t.wall_s, t.cpu_s, got)
    assert best is not None
    return best


def main() -> None:
    quick = quick_mode()
    records, total_tokens = (2_000, 6_900_000) if quick else (20_000, 69_000_000)
    tmp = Path(tempfile.mkdtemp(prefix="draftgen-bench-report-", dir=os.environ.get("DRAFTGEN_BENCH_TMP")))
    try:
        run = tmp / "run"
        size = write_log(run / "raw" / "bench" / "raw_responses.jsonl", records, total_tokens)
        print(f"synthetic log: {records:,} records, {total_tokens / 1e6:.1f}M completion tokens, {size / 1e9:.2f} GB")
        results = {name: _best(fn, run) for name, fn in
                   (("draftgen", _draftgen), ("full_records", _full_records), ("orjson_loads", _orjson),
                    ("resume_scan", _scan))}
        from draftgen.phases.report.html import render_html
        from draftgen.runview.metrics import compute_metrics

        m = compute_metrics(run)
        t0 = time.perf_counter()
        page = render_html(m, title="bench", generated_at=0.0, settings={})
        render_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name, (_, _, got) in results.items():
        if got != (records, total_tokens):
            raise SystemExit(f"{name} read {got}, expected {(records, total_tokens)}")
    ours = results["draftgen"][0]
    print(f"\n{'method':<14}{'wall s':>9}{'cpu s':>9}{'vs draftgen':>13}")
    for name, (wall, cpu, _) in results.items():
        print(f"{name:<14}{wall:>9.3f}{cpu:>9.3f}{wall / ours:>12.1f}x")
    print(f"render_html: {render_s:.3f} s for a {len(page) / 1e6:.1f} MB page")
    emit_result("report", {
        "records": records,
        "completion_tokens": total_tokens,
        "log_gb": round(size / 1e9, 3),
        "metrics_wall_s": round(ours, 3),
        "full_records_wall_s": round(results["full_records"][0], 3),
        "orjson_wall_s": round(results["orjson_loads"][0], 3),
        "speedup_vs_full_records": round(results["full_records"][0] / ours, 2),
        "speedup_vs_orjson": round(results["orjson_loads"][0] / ours, 2),
        "ratio_vs_resume_scan": round(ours / results["resume_scan"][0], 2),
        "render_s": round(render_s, 3),
        "page_mb": round(len(page) / 1e6, 2),
    })


if __name__ == "__main__":
    main()
