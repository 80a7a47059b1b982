"""draftgen status on complete and partial run directories."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from _report_helpers import T0, make_config, run_config, write_attempts_and_health, write_run_dir
from draftgen.cli import cli
from draftgen.errors import RunDirError
from draftgen.report.status import run_status


def test_status_on_a_partial_run_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = write_run_dir(run, datasets={"chat": 20, "code": 10}, done_fraction=0.5, audit=False, manifest=False)
    # generate is mid-write: the last line of a raw log is unterminated.
    with open(run / "raw" / "chat" / "raw_responses.jsonl", "ab") as fh:
        fh.write(b'{"sample_id":"chat-0019","dataset":"chat","usage":{"completion_')
    # A dataset prepared but not started, and one configured but not prepared yet.
    (run / "raw" / "code").rename(run / "raw" / "code-later")
    lines: list[str] = []
    rep = run_status(str(run), echo=lines.append, now=T0 + 3600)
    out = "\n".join(lines)
    m = rep.metrics
    by = {d.name: d for d in m.datasets}
    assert by["chat"].done == len(written["chat"]) == 10
    assert by["chat"].prepared == 20
    assert by["code"].done == 0 and by["code"].prepared == 10
    assert by["code-later"].prepared is None and by["code-later"].done == 5
    assert m.phases["audited"] is False and m.phases["merged"] is False
    assert m.model is None and m.config_hash is None  # no run.json
    assert "10 / 20" in out and "0 / 10" in out and "5 / ?" in out
    assert "rate_limited" in out and "context_length_exceeded" in out
    assert "latest activity" in out and "ago" in out
    assert "audit:" not in out
    # The raw log was only read: the partial tail is still there for generate's writer to repair.
    assert not (run / "raw" / "chat" / "raw_responses.jsonl").read_bytes().endswith(b"\n")


def test_status_from_a_config_and_after_the_audit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run)
    cfg = make_config(tmp_path, run, datasets=("chat", "code", "notyet"))
    lines: list[str] = []
    rep = run_status(str(cfg), echo=lines.append)
    out = "\n".join(lines)
    assert [d.name for d in rep.metrics.datasets] == ["chat", "code", "notyet"]
    assert "audit: 52 records" in out and "BPE exact 50/52" in out
    assert "notyet" in out and "0 / ?" in out
    # the verdict in one line (failures and nothing merged: red), then the other findings
    flat = " ".join(out.split())
    assert rep.metrics.verdict.level == "red"
    assert f"verdict: NOT USABLE {rep.metrics.verdict.reason}" in flat
    assert rep.metrics.verdict.reason.startswith("6 samples failed (context_length_exceeded 4, rate_limited 2) and "
                                                 "nothing was merged")
    assert "· 2 responses with dropped reasoning (DeepInfra 2)" in flat


def test_status_shows_the_providers_briefly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = write_run_dir(run)
    write_attempts_and_health(run_config(run), written)
    lines: list[str] = []
    rep = run_status(str(run), echo=lines.append, now=T0 + 3600)
    out = "\n".join(lines)
    table = rep.metrics.providers_table
    assert [p.provider for p in table] == ["DeepInfra", "SiliconFlow", "Chutes"]
    provider_lines = [line.strip() for line in out.splitlines() if line.startswith("  ") and " · latency p50 " in line]
    assert len(provider_lines) == 3
    deep = " ".join(out.split("  DeepInfra ", 1)[1].split("\n  SiliconFlow", 1)[0].split())
    assert deep.startswith("18 (35%) · bf16 · latency p50 ")
    assert "retries 18 (rate_limited 7, server_error 6, reasoning_dropped 5)" in deep
    assert "dropped reasoning 5 · cool-downs 1" in deep
    assert "  Chutes 16 (31%) · latency p50 " in out  # no quantization known for Chutes
    assert "verdict: NOT USABLE" in out and "· provider cool-downs: DeepInfra 1" in out


def test_status_cli_and_missing_target(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 5})
    res = CliRunner().invoke(cli, ["status", str(run)])
    assert res.exit_code == 0, res.output
    assert "chat" in res.output and "4 / 5" in res.output
    res = CliRunner().invoke(cli, ["status", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "no such run directory" in res.output
    with pytest.raises(RunDirError, match="does not exist yet"):
        run_status(str(make_config(tmp_path, tmp_path / "missing")), echo=lambda s: None)
