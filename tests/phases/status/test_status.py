"""draftgen status on complete and partial run directories."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from _report_helpers import T0, held_lock, make_config, run_config, write_attempts_and_health, write_run_dir
from draftgen import rundir
from draftgen.cli import cli
from draftgen.errors import RunDirError
from draftgen.phases.status.run import CLEAR, StatusSummary, run_status, watch_status
from draftgen.records import LockHolder, MergeManifest
from draftgen.store import atomic_write_json


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
    assert "10/20" in out and "0/10" in out and "5/?" in out
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
    assert "notyet" in out and "0/?" in out
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


def test_status_at_80_columns_cuts_nothing_and_shows_token_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns every header, figure and reason is whole (issue 23: ``complet…``, ``reason…``)."""
    run = tmp_path / "run"
    written = write_run_dir(run, failures=True)
    write_attempts_and_health(run_config(run), written)
    cfg = make_config(tmp_path, run, extra="budget: {token_budget: 10000000}")
    monkeypatch.setenv("COLUMNS", "80")
    lines: list[str] = []
    rep = run_status(str(cfg), echo=lines.append, now=T0 + 3600)
    out = "\n".join(lines)
    assert "…" not in out, out
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    for word in ("completion", "tokens", "reasoning", "share", "cost", "failed", "truncated", "failures by kind"):
        assert word in out, word
    # the per-dataset token budget, used / budget, in the text and in --json (issue 23: shown nowhere)
    chat = next(d for d in rep.summary.datasets if d.name == "chat")
    assert chat.token_budget == 10_000_000 and chat.completion_tokens > 0
    assert f"token budget chat: {chat.completion_tokens:,} / 10,000,000" in " ".join(out.split())
    js: list[str] = []
    run_status(str(cfg), echo=js.append, as_json=True)
    got = msgspec.json.decode(js[0], type=StatusSummary)
    assert {d.name: d.token_budget for d in got.datasets} == {"chat": 10_000_000, "code": 10_000_000}


def test_status_cli_and_missing_target(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 5})
    res = CliRunner().invoke(cli, ["status", str(run)])
    assert res.exit_code == 0, res.output
    assert "chat" in res.output and "4/5" in res.output
    res = CliRunner().invoke(cli, ["status", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "no such run directory" in res.output
    with pytest.raises(RunDirError, match="does not exist yet"):
        run_status(str(make_config(tmp_path, tmp_path / "missing")), echo=lambda s: None)


def _states(summary: StatusSummary) -> dict[str, str]:
    return {p.name: p.state for p in summary.phases}


def _touch_later(path: Path, seconds: float = 5.0) -> None:
    """Move ``path``'s mtime ahead, so ordering does not depend on the file system's timestamp granularity."""
    t = time.time() + seconds
    os.utime(path, (t, t))


def test_a_partial_generate_is_incomplete_not_done(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 20, "code": 10}, done_fraction=0.5)
    lines: list[str] = []
    rep = run_status(str(run), echo=lines.append, now=T0 + 3600)
    out = " ".join("\n".join(lines).split())
    gen = next(p for p in rep.summary.phases if p.name == "generate")
    assert (gen.state, gen.done, gen.planned, gen.percent) == ("incomplete", 15, 30, 50.0)
    assert gen.detail == "6 failed"
    assert _states(rep.summary) == {"prepare": "done", "generate": "incomplete", "audit": "done",
                                    "merge": "pending", "report": "pending"}
    assert "◐ generate incomplete 15/30 (50.0%) (6 failed)" in out
    assert "✓ generate" not in out and "✓ prepare" in out and "· merge" in out
    assert rep.summary.lock is None and "writer:" not in out
    # generate appended to a raw log after the audit: the audit is out of date
    _touch_later(run / "raw" / "chat" / "raw_responses.jsonl")
    rep = run_status(str(run), echo=lambda s: None)
    audit = next(p for p in rep.summary.phases if p.name == "audit")
    assert (audit.state, audit.detail) == ("incomplete", "older than the raw logs")


def test_a_complete_run_is_done_phase_by_phase(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 6, "code": 4}, done_fraction=1.0)
    rep = run_status(str(run), echo=lambda s: None)
    assert _states(rep.summary) == {"prepare": "done", "generate": "done", "audit": "done",
                                    "merge": "pending", "report": "pending"}
    (run / "report.html").write_text("<html></html>")
    assert _states(run_status(str(run), echo=lambda s: None).summary)["report"] == "incomplete"  # before merge
    atomic_write_json(run / "merged" / "manifest.json",
                      MergeManifest(files=[], seed=0, merge={}, datasets=["chat", "code"], profile="qwen3", layout=2))
    _touch_later(run / "merged" / "manifest.json", 5)
    rep = run_status(str(run), echo=lambda s: None)
    assert _states(rep.summary)["merge"] == "done"
    report = next(p for p in rep.summary.phases if p.name == "report")
    assert (report.state, report.detail) == ("incomplete", "older than merged/manifest.json")
    _touch_later(run / "report.html", 10)
    lines: list[str] = []
    rep = run_status(str(run), echo=lines.append)
    assert set(_states(rep.summary).values()) == {"done"}
    out = "\n".join(lines)
    assert all(f"✓ {p}" in out for p in ("prepare", "generate", "audit", "merge", "report"))


def test_a_held_lock_shows_generate_running_with_its_progress(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 20, "code": 10}, done_fraction=0.5)
    with held_lock(run, "generate", ("chat", "code")):
        lines: list[str] = []
        rep = run_status(str(run), echo=lines.append)
        out = " ".join("\n".join(lines).split())
        gen = next(p for p in rep.summary.phases if p.name == "generate")
        assert (gen.state, gen.done, gen.planned, gen.percent) == ("running", 15, 30, 50.0)
        assert rep.summary.lock is not None and rep.summary.lock.pid == os.getpid()
        assert rep.summary.lock.command == "generate"
        assert "▶ generate running 15/30 (50.0%)" in out
        assert f"writer: `draftgen generate` (pid {os.getpid()}," in out
    # released: stopped but incomplete
    rep = run_status(str(run), echo=lambda s: None)
    assert _states(rep.summary)["generate"] == "incomplete" and rep.summary.lock is None
    # `draftgen run` holds it: the first phase not done is the one running
    with held_lock(run, "run", ("chat", "code")):
        assert _states(run_status(str(run), echo=lambda s: None).summary)["generate"] == "running"


def test_a_dead_holder_left_in_the_lock_file_is_not_running(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 10}, done_fraction=0.5)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    # what a writer killed with -9 leaves behind: its text, without its flock or its process
    (run / rundir.LOCK_NAME).write_bytes(msgspec.json.encode(LockHolder(pid=gone.pid, command="generate",
                                                                       since=T0)) + b"\n")
    rep = run_status(str(run), echo=lambda s: None)
    assert rep.summary.lock is None and _states(rep.summary)["generate"] == "incomplete"


def test_status_json_decodes_and_matches_the_figures(tmp_path: Path) -> None:
    run = tmp_path / "run"
    written = write_run_dir(run, datasets={"chat": 20, "code": 10}, done_fraction=0.5)
    res = CliRunner().invoke(cli, ["status", str(run), "--json"])
    assert res.exit_code == 0, res.output
    s = msgspec.json.decode(res.output, type=StatusSummary)
    assert s.run_dir == str(run) and s.lock is None
    assert {p.name: p.state for p in s.phases}["generate"] == "incomplete"
    by = {d.name: d for d in s.datasets}
    assert (by["chat"].done, by["chat"].planned, by["chat"].failed, by["chat"].percent) == (10, 20, 3, 50.0)
    assert (by["code"].done, by["code"].planned, by["code"].failed) == (5, 10, 3)
    rows = [r for rs in written.values() for r in rs]
    assert s.tokens.completion == sum(r.usage.completion_tokens for r in rows if r.usage)
    assert s.tokens.reasoning == sum(r.usage.reasoning_tokens or 0 for r in rows if r.usage)
    assert s.spend_usd == pytest.approx(sum(r.usage.cost or 0 for r in rows if r.usage), abs=1e-6)
    assert by["chat"].completion_tokens == sum(r.usage.completion_tokens for r in written["chat"] if r.usage)


def test_watch_redraws_on_a_terminal_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 4})
    shown: list[str] = []
    naps: list[float] = []

    def sleep(s: float) -> None:
        naps.append(s)
        if len(naps) == 3:
            raise KeyboardInterrupt

    assert watch_status(str(run), 0.5, echo=shown.append, tty=True, sleep=sleep) == 3
    assert naps == [0.5] * 3 and all(b.startswith(CLEAR) and "draftgen status" in b for b in shown)
    shown.clear()
    naps.clear()
    assert watch_status(str(run), 0.5, echo=shown.append, as_json=True, tty=True, sleep=sleep) == 3
    assert [msgspec.json.decode(b, type=StatusSummary).datasets[0].done for b in shown] == [3, 3, 3]


def test_watch_in_a_subprocess_prints_blocks_until_sigint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 4})
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", "from draftgen.cli import main; main()", "status", str(run), "--watch", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "120"})
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + 60
    try:
        while out.count(b"draftgen status") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        assert out.count(b"draftgen status") >= 2, out.decode()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"interrupted" not in err
    blocks = (out + rest).decode().split("\n\n" + "draftgen status")
    assert len(blocks) >= 2 and "\x1b[2J" not in (out + rest).decode()  # not a terminal: no clearing


def test_watch_interval_must_be_positive(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 4})
    res = CliRunner().invoke(cli, ["status", str(run), "--watch", "0"])
    assert res.exit_code == 2 and "--watch" in res.output


def test_a_refused_drafter_shows_train_not_done(tmp_path: Path) -> None:
    """train/train.json of a drafter refused (exit_code 3: trained on too few samples) is no done train."""
    from draftgen.records import TrainReport

    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 2}, done_fraction=1.0)
    atomic_write_json(run / "merged" / "manifest.json",
                      MergeManifest(files=[], seed=0, merge={}, datasets=["chat"], profile="qwen3", layout=2))
    report = TrainReport(exit_code=0, message="drafter: x", verifier="t", hidden="h", samples=2, layer_ids=[1],
                         draft_vocab_size=8, ttt_steps=1)
    atomic_write_json(run / "train" / "train.json", report)
    _touch_later(run / "train" / "train.json", 5)
    train = next(p for p in run_status(str(run), echo=lambda s: None).summary.phases if p.name == "train")
    assert (train.state, train.detail) == ("done", None)
    atomic_write_json(run / "train" / "train.json", msgspec.structs.replace(report, exit_code=3, message="0 of 40"))
    _touch_later(run / "train" / "train.json", 5)
    train = next(p for p in run_status(str(run), echo=lambda s: None).summary.phases if p.name == "train")
    assert (train.state, train.detail) == ("incomplete", "drafter refused, not published")
