"""``runview.grade``: which merge drops make a run amber. Samples the config's ``cap`` / ``weight`` left out are
what the operator asked for (tiny-chain's held-out prompts: 64 of them made its official rehearsal "CHECK" on
a3c8820); a dedupe or length drop is still a finding."""

from __future__ import annotations

from draftgen.records import AuditReport, DatasetAudit, MergedDatasetStats, MergeStats
from draftgen.runview.datasets import DatasetMetrics
from draftgen.runview.grade import grade_run


def _grade(dropped: dict[str, int]) -> tuple[str, list[str]]:
    t = DatasetMetrics(name="all", prepared=320, done=320)
    audit = AuditReport(profile="qwen3", datasets=[], overall=DatasetAudit(dataset="all", records=320))
    total = MergedDatasetStats(dataset="all", records=320, samples=256, unique_samples=256, train=256,
                               dropped=dropped)
    v = grade_run(t, audit, MergeStats(datasets=[], total=total), {"audited": True, "merged": True}, [])
    return v.level, v.warnings


def test_samples_the_cap_left_out_are_no_warning_and_a_dedupe_still_is() -> None:
    assert _grade({"weight_or_cap": 64}) == ("green", [])
    level, warnings = _grade({"weight_or_cap": 64, "duplicate": 3})
    assert level == "amber" and warnings == ["merge excluded 3 samples (duplicate 3)"]
