"""The audit's verdict with its default thresholds, and the exclusions merge follows (``audit.verdict``).

Synthetic run directories whose ground truth we wrote ourselves: a clean run passes, dropped reasoning
and semantic mismatches are excluded and named, a structural failure fails, and billing is judged after
the exclusions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from _tokens_helpers import profile, write_synthetic_run
from draftgen.cli import cli
from draftgen.errors import ThresholdBroken
from draftgen.phases.audit.run import run_audit
from draftgen.phases.audit.verdict import exclusion_reason, verdict_line
from draftgen.phases.merge.run import run_merge
from draftgen.records import DatasetAudit, ExcludedSample, ResponseRecord, Usage
from draftgen.store import JsonlWriter, iter_jsonl

QUIET: dict[str, Any] = {"echo": lambda s: None}


def _rewrite(path: Path, edit: Any) -> None:
    rows = [r for _, r in iter_jsonl(path, ResponseRecord)]
    path.unlink()
    with JsonlWriter(path, fsync=False) as w:
        w.write_many(edit(r) for r in rows)


def _merged_ids(run: Path) -> set[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for f in sorted(run.rglob("train-*.parquet")):
        ids.update(pq.read_table(f, columns=["sample_id"]).column("sample_id").to_pylist())
    return ids


def test_a_clean_run_passes_the_default_thresholds_and_says_so_first(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path, "qwen3", 20, seed=5)
    res = CliRunner().invoke(cli, ["audit", str(tmp_path / "cfg.yaml")])
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("audit verdict: PASS: 40 records; 0 excluded; billing disagreement 0.000% after exclusions")


def test_dropped_reasoning_and_semantic_mismatches_are_excluded_named_and_never_merged(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path, "qwen3", 40, seed=11, drop_rate=0.15, junction_rate=0.1)
    report = run_audit(run.cfg, profile=profile("qwen3"), **QUIET)
    assert report.verdict.startswith("PASS"), report.verdict
    o = report.overall
    by_reason: dict[str, set[str]] = {}
    for e in o.excluded:
        by_reason.setdefault(e.reason, set()).add(e.sample_id)
    dropped = {sid for sid, s in run.samples.items() if s.cause == "reasoning_dropped"}
    junction = {sid for sid, s in run.samples.items() if s.cause == "junction_restored" and s.expected == "semantic"}
    assert dropped and junction
    assert by_reason["reasoning_dropped"] == dropped
    assert by_reason["semantic_mismatch"] == junction
    assert o.excluded_by_reason == {k: len(v) for k, v in by_reason.items()}
    assert o.kept == o.records - len(o.excluded) and o.kept_semantic_mismatch == 0
    lines: list[str] = []
    stats = run_merge(run.cfg, echo=lines.append).stats
    assert stats.total.dropped["reasoning_dropped"] == len(by_reason["reasoning_dropped"])
    assert stats.total.dropped["semantic_mismatch"] == len(by_reason["semantic_mismatch"])
    merged = _merged_ids(run.cfg.run_path)
    assert merged and not merged & (by_reason["reasoning_dropped"] | by_reason["semantic_mismatch"])
    assert any(line.startswith("not merged (wrong data, excluded by default): ") for line in lines)


def test_a_structural_failure_fails_the_default_verdict(tmp_path: Path) -> None:
    write_synthetic_run(tmp_path, "qwen3", 30, seed=3, corrupt_rate=0.1)
    res = CliRunner().invoke(cli, ["audit", str(tmp_path / "cfg.yaml")])
    assert res.exit_code == 3, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("audit verdict: FAIL: alpha: structural failure rate"), first
    assert "(audit.max_structural_failure_rate)" in first
    # The threshold stays configurable: switched off, the same run passes and the failures are excluded.
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(cfg.read_text() + "audit: {max_structural_failure_rate: null}\n")
    res = CliRunner().invoke(cli, ["audit", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "excluded from merge: structural:end_of_turn_missing" in res.output


def test_billing_is_judged_after_the_exclusions(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path, "qwen3", 30, seed=9)
    raw = run.cfg.run_path / "raw" / "alpha" / "raw_responses.jsonl"
    far = "alpha-0004"

    def bill_far_off(r: ResponseRecord) -> ResponseRecord:
        if r.sample_id != far:
            return r
        u = r.usage or Usage()
        return msgspec.structs.replace(r, usage=msgspec.structs.replace(u, completion_tokens=len(r.output_ids or []) * 3))

    _rewrite(raw, bill_far_off)
    report = run_audit(run.cfg, profile=profile("qwen3"), **QUIET)
    alpha = report.datasets[0]
    assert [(e.sample_id, e.reason) for e in alpha.excluded] == [(far, "billing_off")]
    assert report.verdict.startswith("PASS") and "0.000% after exclusions" in report.verdict
    assert "before" in report.verdict  # the disagreement before the exclusions is shown beside it

    # Every kept sample one token off: small each, but over 0.5% together.
    _rewrite(raw, lambda r: r if r.sample_id == far else msgspec.structs.replace(
        r, usage=msgspec.structs.replace(r.usage or Usage(), completion_tokens=len(r.output_ids or []) + 1)))
    with pytest.raises(ThresholdBroken, match=r"alpha: billing disagreement after exclusions .* > 0\.5000%"):
        run_audit(run.cfg, profile=profile("qwen3"), **QUIET)


def test_exclusion_reasons_in_order_and_kept_on_purpose() -> None:
    base: dict[str, Any] = {"structural": [], "flags": [], "reference_kind": "exact", "billed": 100, "rebuilt": 100,
                            "keep_unusable": False, "billing_tolerance": 0.05}
    assert exclusion_reason(**base) is None
    assert exclusion_reason(**{**base, "structural": [("stray_special", "<|im_start|>")],
                               "flags": ["reasoning_dropped"]}) == ("structural:stray_special", "<|im_start|>")
    assert exclusion_reason(**{**base, "flags": ["reasoning_dropped"], "reference_kind": "semantic"}) == \
        ("reasoning_dropped", "")
    assert exclusion_reason(**{**base, "reference_kind": "semantic"}) == ("semantic_mismatch", "")
    assert exclusion_reason(**{**base, "rebuilt": 104}) is None  # 4% off: within the 5% tolerance
    assert exclusion_reason(**{**base, "rebuilt": 106}) == ("billing_off", "rebuilt 106 vs billed 100")
    assert exclusion_reason(**{**base, "billed": 20, "rebuilt": 23}) is None  # at most 3 tokens is never far off
    kept = {**base, "flags": ["reasoning_dropped", "unusable:reasoning_dropped"], "keep_unusable": True}
    assert exclusion_reason(**kept) is None
    assert exclusion_reason(**{**kept, "keep_unusable": False}) == ("reasoning_dropped", "")


def test_the_verdict_line() -> None:
    da = DatasetAudit(dataset="overall", records=10, billed_completion_tokens=1000, rebuilt_completion_tokens=1100,
                      kept_billed_completion_tokens=900, kept_rebuilt_completion_tokens=902,
                      excluded_by_reason={"billing_off": 1})
    da.excluded = [ExcludedSample(sample_id="s1", reason="billing_off")]
    assert verdict_line(da, [], 0.005) == ("PASS: 10 records; 1 excluded (billing_off 1); billing disagreement "
                                           "0.222% after exclusions (max 0.50%), 10.000% before")
    assert verdict_line(da, ["a: x", "b: y"], None).startswith("FAIL: a: x and 1 more; 10 records")
