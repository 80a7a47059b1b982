"""draftgen run: every phase in order, resume after a hard kill, skip what is up to date, audit gates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import yaml
from click.testing import CliRunner

from _common_helpers import config_dict
from _common_helpers import write_config as write_shared_config
from draftgen.cli import cli
from draftgen.config import load_config
from draftgen.emulator.server import EmulatorOptions, RunningEmulator, start_in_thread
from draftgen.errors import ConfigError
from draftgen.phases.pipeline import run_pipeline, spend_question
from draftgen.records import PromptRecord, ResponseRecord
from draftgen.store import iter_jsonl

SLOW_SCENARIO = """\
base: fast
providers:
  - {name: DeepInfra, tag: deepinfra/fp4, quantization: fp4, price_prompt: 0.45, price_completion: 2.25,
     ttft_s: [0.15, 0.25]}
"""


def write_config(tmp: Path, *, n: int = 12, scenario: str = "fast", extra: str = "", concurrency: int = 8) -> Path:
    rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Explain idea number {i} briefly."}]})
            for i in range(n)]
    (tmp / "prompts.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    if scenario == "slow":
        (tmp / "slow.yaml").write_text(SLOW_SCENARIO, encoding="utf-8")
        scenario = "slow.yaml"
    sections = {
        "endpoint": {"kind": "emulator", "emulator": {"scenario": scenario}},
        "partitions": {"short": {"concurrency": concurrency, "max_tokens": 256},
                       "long": {"concurrency": 2, "max_tokens": 256}},
        "progress": "off",
        **(yaml.safe_load(extra) or {}),
    }
    return write_shared_config(tmp, config_dict(tmp, [{"name": "ideas", "path": "prompts.jsonl"}], **sections))


def _ids(run: Path) -> list[str]:
    return [r.sample_id for _, r in iter_jsonl(run / "raw" / "ideas" / "raw_responses.jsonl", ResponseRecord)]


QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def test_quickstart_runs_every_phase_then_skips_what_is_up_to_date(tmp_path: Path) -> None:
    run = tmp_path / "qs"
    cfg = load_config(QUICKSTART, {"run_dir": str(run), "progress": "off"})
    lines: list[str] = []
    rep = run_pipeline(cfg, argv=["draftgen", "run", str(QUICKSTART)], echo=lines.append)
    assert rep.exit_code == 0, lines
    assert rep.phases_run == ["prepare", "generate", "audit", "merge", "report"]
    assert rep.report_path == str(run / "report.html")
    assert lines[-1] == f"report: {run / 'report.html'}"
    for d in cfg.datasets:
        prepared = sum(1 for _ in iter_jsonl(run / "prepared" / d.name / "prompts.jsonl", PromptRecord))
        ids = [r.sample_id for _, r in iter_jsonl(run / "raw" / d.name / "raw_responses.jsonl", ResponseRecord)]
        assert len(ids) == len(set(ids)) == prepared > 0
    assert (run / "audit" / "audit.json").is_file() and (run / "merged" / "manifest.json").is_file()
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "Merged training data" in page and "merged/train-" in page
    # The CLI, run again, finds nothing to do and ends by saying where the report is.
    res = CliRunner().invoke(cli, ["run", str(QUICKSTART), "--run-dir", str(run)])
    assert res.exit_code == 0, res.output
    assert "audit: up to date" in res.output and "merge: up to date" in res.output
    assert res.output.rstrip().splitlines()[-1] == f"report: {run / 'report.html'}"


def test_broken_audit_threshold_still_writes_the_report(tmp_path: Path) -> None:
    cfg_path = write_config(tmp_path, n=4, extra="audit: {max_structural_failure_rate: -1.0}\n")
    res = CliRunner().invoke(cli, ["run", str(cfg_path)])
    run = tmp_path / "run"
    assert res.exit_code == 3, res.output
    assert "audit thresholds broken" in res.output
    assert (run / "report.html").is_file() and not (run / "merged" / "manifest.json").exists()
    assert f"report: {run / 'report.html'}" in res.output
    assert "Audit thresholds broken" in (run / "report.html").read_text(encoding="utf-8")


def test_run_resumes_after_a_hard_kill(tmp_path: Path) -> None:
    cfg_path = write_config(tmp_path, n=40, scenario="slow", concurrency=2)
    raw = tmp_path / "run" / "raw" / "ideas" / "raw_responses.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "draftgen.cli", "run", str(cfg_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if raw.is_file() and raw.read_bytes().count(b"\n") >= 4:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            time.sleep(0.05)
        else:
            raise AssertionError("generate never wrote 4 records")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()
    killed_at = len(_ids(tmp_path / "run"))
    assert 4 <= killed_at < 40
    assert not (tmp_path / "run" / "report.html").exists()
    # Simulate a write cut mid-line by the kill, too.
    with open(raw, "ab") as fh:
        fh.write(b'{"sample_id":"ideas-partial","dat')
    lines: list[str] = []
    rep = run_pipeline(load_config(cfg_path), argv=["draftgen", "run"], echo=lines.append)
    assert rep.exit_code == 0, lines
    ids = _ids(tmp_path / "run")
    assert len(ids) == len(set(ids)) == 40
    assert "ideas-partial" not in ids
    assert any(f"{40 - killed_at} done now, {killed_at} before" in line for line in lines), lines
    assert (tmp_path / "run" / "report.html").is_file()


# -- the plan before spending ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(port=0)) as emu:
        yield emu


def paid_config(tmp: Path, emu: RunningEmulator, *, n: int = 6, threshold: float = 0.000001) -> Path:
    """An ``openrouter`` run (a backend that costs money) pointed at the loopback emulator, which prices
    it; the plan's expected cost is far over ``threshold``."""
    (tmp / "key").write_text("sk-or-v1-pipeline-test", encoding="utf-8")
    return write_config(tmp, n=n, extra=yaml.safe_dump({
        "endpoint": {"kind": "openrouter", "base_url": emu.base_url, "api_key_file": "key"},
        "plan": {"confirm_above_usd": threshold},
    }))


def _raw(tmp: Path) -> Path:
    return tmp / "run" / "raw" / "ideas" / "raw_responses.jsonl"


def test_dry_run_prints_the_plan_and_sends_nothing(tmp_path: Path, emulator: RunningEmulator) -> None:
    cfg_path = paid_config(tmp_path, emulator)
    sent = emulator.state.requests
    res = CliRunner().invoke(cli, ["run", str(cfg_path), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "expected out" in res.output and "cost" in res.output  # the plan's table
    assert "dry run: stopped after the plan; nothing was sent" in res.output
    assert (tmp_path / "run" / "prepared" / "ideas" / "prompts.jsonl").is_file()
    assert not _raw(tmp_path).exists() and not (tmp_path / "run" / "report.html").exists()
    assert "── generate" not in res.output and emulator.state.requests == sent


def test_a_declined_confirmation_spends_nothing_and_exits_1(tmp_path: Path, emulator: RunningEmulator) -> None:
    cfg = load_config(paid_config(tmp_path, emulator))
    sent = emulator.state.requests
    asked: list[str] = []
    lines: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lines.append, confirm=no)
    assert rep.exit_code == 1 and rep.phases_run == ["prepare"], lines
    assert len(asked) == 1 and "plan.confirm_above_usd" in asked[0] and asked[0].endswith("Generate?")
    assert lines[-1] == "not confirmed; nothing was sent (pass --yes to skip the question)"
    assert not _raw(tmp_path).exists() and not (tmp_path / "run" / "report.html").exists()
    assert emulator.state.requests == sent
    # A yes goes on to generate and the rest.
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lambda s: None, confirm=lambda q: True)
    assert rep.exit_code == 0 and "generate" in rep.phases_run
    assert len(_ids(tmp_path / "run")) == 6


def test_yes_skips_the_question(tmp_path: Path, emulator: RunningEmulator) -> None:
    cfg_path = paid_config(tmp_path, emulator, n=4)

    def never(question: str) -> bool:
        raise AssertionError("--yes must not ask")

    rep = run_pipeline(load_config(cfg_path), argv=["draftgen", "run"], echo=lambda s: None, yes=True, confirm=never)
    assert rep.exit_code == 0 and rep.phases_run == ["prepare", "generate", "audit", "merge", "report"]
    assert len(_ids(tmp_path / "run")) == 4


def test_yes_on_the_cli_runs_without_a_terminal(tmp_path: Path, emulator: RunningEmulator) -> None:
    res = CliRunner().invoke(cli, ["run", str(paid_config(tmp_path, emulator, n=4)), "--yes"])
    assert res.exit_code == 0, res.output
    assert "── plan" in res.output and len(_ids(tmp_path / "run")) == 4


def test_no_terminal_and_no_yes_over_the_threshold_refuses_in_one_line(tmp_path: Path,
                                                                       emulator: RunningEmulator) -> None:
    sent = emulator.state.requests
    res = CliRunner().invoke(cli, ["run", str(paid_config(tmp_path, emulator))])  # CliRunner: stdin is no TTY
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "pass --yes" in errors[0] and "plan.confirm_above_usd" in errors[0]
    assert not _raw(tmp_path).exists() and emulator.state.requests == sent
    # The library without a callback refuses the same way.
    with pytest.raises(ConfigError, match="pass --yes"):
        run_pipeline(load_config(paid_config(tmp_path, emulator)), argv=["draftgen", "run"], echo=lambda s: None)


def test_under_the_threshold_or_a_free_backend_never_asks(tmp_path: Path, emulator: RunningEmulator) -> None:
    cfg = load_config(paid_config(tmp_path, emulator, threshold=1e9))
    assert spend_question(cfg, 5.0) is None and spend_question(cfg, None) is None
    assert spend_question(msgspec.structs.replace(
        cfg, plan=msgspec.structs.replace(cfg.plan, confirm_above_usd=1.0)), 5.0) is not None
    # The emulator kind charges play credits only: no question at any threshold (nor on the CLI, no TTY).
    (tmp_path / "free").mkdir()
    free = write_config(tmp_path / "free", n=3, extra="plan: {confirm_above_usd: 0.0}\n")
    assert spend_question(load_config(free), 5.0) is None
    res = CliRunner().invoke(cli, ["run", str(free)])
    assert res.exit_code == 0, res.output
    assert "── plan" in res.output and len(_ids(tmp_path / "free" / "run")) == 3
