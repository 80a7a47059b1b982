"""A default ``draftgen run`` on the ``realistic`` and ``chaos`` emulator scenarios (clock compressed):
no merged row has dropped reasoning, every sample that is not merged is accounted for with its reason,
and the audit's exit code follows its default thresholds exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from _common_helpers import config_dict
from draftgen.records import AuditReport, FailureRecord, MergeStats, ResponseRecord
from draftgen.rundir import RunDir

from ._helpers import run_cli, write_config, write_prompts


def _config(tmp: Path, scenario: str, n: int) -> Path:
    (tmp / "scenario.yaml").write_text(f"base: {scenario}\ntime_scale: 0.002\nmax_faulty_attempts: 3\n",
                                       encoding="utf-8")
    prompts = write_prompts(tmp / "prompts.jsonl", n)
    cfg = config_dict(
        tmp, [{"name": "rel", "path": str(prompts)}],
        endpoint={"kind": "emulator", "idle_timeout_s": 20,
                  "emulator": {"scenario": str(tmp / "scenario.yaml"), "seed": 3}},
        partitions={"short": {"concurrency": 32, "max_tokens": 2048}, "long": {"concurrency": 4, "max_tokens": 2048}},
        retry={"max_attempts": 8, "base_delay_s": 0.01, "max_delay_s": 0.1},
        progress="plain",
    )
    return write_config(tmp, cfg)


def _lines(path: Path, kind: type[Any]) -> list[Any]:
    if not path.is_file():
        return []
    dec = msgspec.json.Decoder(kind)
    return [dec.decode(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.mark.parametrize("scenario", ["realistic", "chaos"])
def test_a_default_run_merges_no_dropped_reasoning_and_accounts_for_every_sample(tmp_path: Path, scenario: str) -> None:
    n = 120
    cfg = _config(tmp_path, scenario, n)
    res = run_cli(["run", str(cfg)], timeout=600)
    rd = RunDir(tmp_path / "run")
    audit = msgspec.json.decode(rd.audit_json.read_bytes(), type=AuditReport)
    # The exit code follows the verdict: 3 exactly when a default threshold broke, else 0 or 4 (failures).
    assert audit.verdict.startswith("FAIL") == bool(audit.thresholds_broken)
    if audit.thresholds_broken:
        assert res.returncode == 3, res.stdout[-3000:]
        return
    assert res.returncode in (0, 4), res.stdout[-3000:] + res.stderr[-2000:]
    assert f"audit verdict: {audit.verdict}" in res.stdout

    records = {r.sample_id: r for r in _lines(rd.raw("rel"), ResponseRecord)}
    failures = {f.sample_id: f for f in _lines(rd.failures("rel"), FailureRecord)}
    dropped = {sid for sid, r in records.items()
               if r.usage is not None and r.usage.reasoning_tokens > 0 and not r.reasoning}
    merged: set[str] = set()
    for f in sorted(rd.root.rglob("train-*.parquet")):
        merged.update(pq.read_table(f, columns=["sample_id"]).column("sample_id").to_pylist())
    assert merged, "nothing was merged"
    assert not merged & dropped, "a merged row has dropped reasoning"

    # Every prepared sample is merged, or excluded with a reason, or a failure with a reason.
    prepared = [json.loads(line)["sample_id"] for line in rd.prepared("rel").read_text().splitlines()]
    excluded = {e.sample_id: e.reason for d in audit.datasets for e in d.excluded}
    stats = msgspec.json.decode(rd.merged_stats.read_bytes(), type=MergeStats)
    for sid in prepared:
        if sid in merged:
            continue
        if sid in excluded:
            assert excluded[sid], sid
        elif sid in records:
            raise AssertionError(f"{sid}: a record that is neither merged nor excluded")
        else:
            assert sid in failures and failures[sid].reason, f"{sid}: neither done nor failed with a reason"
    assert sum(v for k, v in stats.total.dropped.items() if k != "duplicate") >= len(excluded)
    assert set(dropped) <= set(excluded)
