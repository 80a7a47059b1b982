"""The API key never reaches a run directory, a log, a report or an output.

A recognisable fake key (``_helpers.FAKE_KEY``) is the only key the emulator accepts. It is given to
``draftgen`` through the environment and through ``--api-key-file`` (the key file lives outside pytest's
temp folders, which ``conftest`` scans after the session). The run, against the ``chaos`` scenario so that
every error path (error bodies, resets, hangs, retries) is logged, then goes through generate, audit,
merge, status and report, plus a run with a wrong key (401). Every file written and every line printed is
scanned for the key (and for any long run of its characters).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftgen.emulator.server import EmulatorOptions, RunningEmulator, start_in_thread

from ._helpers import (
    FAKE_KEY,
    OTHER_FAKE_KEY,
    SECRETS,
    base_config,
    cli_env,
    error_lines,
    files_holding,
    run_cli,
    write_config,
    write_prompts,
)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    gt = tmp_path_factory.mktemp("secrets-emulator") / "ground_truth.jsonl"
    with start_in_thread(EmulatorOptions(scenario="chaos", seed=3, api_key=FAKE_KEY, credits=1e6,
                                         ground_truth=str(gt))) as emu:
        yield emu


@pytest.fixture()
def key_file() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="draftgen-keyfile-"))
    path = folder / "openrouter.key"
    path.write_text(FAKE_KEY + "\n", encoding="utf-8")
    yield path
    shutil.rmtree(folder, ignore_errors=True)


def _config(tmp_path: Path, emu: RunningEmulator, run: Path, n: int = 40) -> Path:
    prompts = write_prompts(tmp_path / "prompts.jsonl", n, seed=41)
    cfg = base_config(prompts, run, base_url=emu.base_url, concurrency=16, max_tokens=256)
    cfg["endpoint"]["idle_timeout_s"] = 2.0
    cfg["retry"] = {"max_attempts": 8, "base_delay_s": 0.05, "max_delay_s": 0.5}
    return write_config(tmp_path, cfg)


def _no_secret(res: subprocess.CompletedProcess[str]) -> None:
    for s in SECRETS:
        assert s not in res.stdout and s not in res.stderr


def test_key_from_env_and_file_never_reaches_disk_or_output(
    emulator: RunningEmulator, tmp_path: Path, key_file: Path
) -> None:
    run = tmp_path / "run"
    cfg = _config(tmp_path, emulator, run)
    # the key from a file (its path is in argv, which run.json keeps), then from the environment
    res = run_cli(["generate", str(cfg), "--api-key-file", str(key_file)], env=cli_env(key=None), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    res_env = run_cli(["generate", str(cfg), "--base-url", emulator.base_url], env=cli_env(), timeout=300)
    assert res_env.returncode == 0, res_env.stderr[-2000:]
    assert (run / "raw" / "rel" / "raw_responses.jsonl").stat().st_size > 0
    for args in (["audit", str(cfg)], ["merge", str(cfg)], ["status", str(run)],
                 ["report", str(cfg), "--output", str(run / "report.html")]):
        out = run_cli(args, env=cli_env(), timeout=300)
        assert "Traceback" not in out.stderr, out.stderr[-2000:]
        _no_secret(out)
    assert (run / "report.html").exists()
    assert (run / "run.json").exists() and (run / "logs").is_dir()
    assert files_holding(run) == []
    assert files_holding(tmp_path) == []


def test_a_rejected_key_is_not_echoed(emulator: RunningEmulator, tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = _config(tmp_path, emulator, run, n=5)
    res = run_cli(["generate", str(cfg)], env=cli_env(key=OTHER_FAKE_KEY), timeout=120)
    assert res.returncode != 0
    lines = error_lines(res.stderr)
    assert lines and lines[-1].startswith("Error:") and "key" in lines[-1].lower(), res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert files_holding(tmp_path) == []


def test_the_scan_finds_a_planted_key(tmp_path: Path) -> None:
    """The scanner itself works: a key written anywhere under a folder is found."""
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "log.txt").write_text("prefix " + FAKE_KEY[:30] + " suffix", encoding="utf-8")
    assert files_holding(tmp_path) != []
    (tmp_path / "deep" / "er" / "log.txt").write_text("clean", encoding="utf-8")
    assert files_holding(tmp_path) == []
