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


# -- a key where a path, a variable name or a URL belongs; a key on the command line ---------------------------
# Each is refused at load time (or before click parses argv) with one line that never echoes the key, and
# nothing is written: no run directory, no run.json.


@pytest.fixture()
def outside() -> Iterator[Path]:
    """A folder outside pytest's temp folders, for config files that hold a key on purpose."""
    folder = Path(tempfile.mkdtemp(prefix="draftgen-keyconfig-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _one_error_line(res: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert res.returncode == code, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    lines = error_lines(res.stderr)
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.stderr[-2000:]
    _no_secret(res)
    return lines[0]


def _plain_config(folder: Path, run: Path, **endpoint: object) -> Path:
    prompts = write_prompts(folder / "prompts.jsonl", 3, seed=7)
    cfg = base_config(prompts, run)
    cfg["endpoint"].update(endpoint)
    return write_config(folder, cfg)


@pytest.mark.parametrize("command", ["generate", "run", "plan", "probe"])
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_a_key_given_as_api_key_file_is_refused(tmp_path: Path, command: str, form: str) -> None:
    run = tmp_path / "run"
    cfg = _plain_config(tmp_path, run)
    flag = ["--api-key-file", FAKE_KEY] if form == "separate" else [f"--api-key-file={FAKE_KEY}"]
    res = run_cli([command, str(cfg), *flag], env=cli_env(key=None), cwd=tmp_path, timeout=60)
    line = _one_error_line(res)
    assert "looks like" in line and "key" in line and "PATH" in line and "OPENROUTER_API_KEY" in line
    assert not run.exists() and not (tmp_path / FAKE_KEY).exists()
    assert files_holding(tmp_path) == []


def test_a_key_given_as_api_key_file_in_the_config_is_refused(tmp_path: Path, outside: Path) -> None:
    run = tmp_path / "run"
    cfg = _plain_config(outside, run, api_key_file=FAKE_KEY)
    line = _one_error_line(run_cli(["generate", str(cfg)], env=cli_env(key=None), timeout=60))
    assert "endpoint.api_key_file" in line and "looks like an API key, not a path" in line
    assert "a file holding only the key" in line and "OPENROUTER_API_KEY" in line
    assert not run.exists()


@pytest.mark.parametrize("field", ["api_key_env", "management_key_env"])
def test_a_key_given_as_api_key_env_is_refused(tmp_path: Path, outside: Path, field: str) -> None:
    run = tmp_path / "run"
    cfg = _plain_config(outside, run, **{field: FAKE_KEY})
    for command in ("generate", "plan", "probe"):
        line = _one_error_line(run_cli([command, str(cfg)], timeout=60))
        assert f"endpoint.{field} looks like an API key" in line and "NAME of an environment variable" in line
    assert not run.exists()
    assert files_holding(tmp_path) == []


@pytest.mark.parametrize(
    "url",
    [
        f"https://user:{FAKE_KEY}@openrouter.ai/api/v1",
        f"https://{FAKE_KEY}@openrouter.ai/api/v1",
        f"https://openrouter.ai/api/v1?key={FAKE_KEY}",
        f"https://openrouter.ai/api/v1?api_key={FAKE_KEY}",
        f"http://127.0.0.1:9/api/v1?token={FAKE_KEY}",
        f"https://openrouter.ai/api/v1?x={FAKE_KEY}",
        f"https://openrouter.ai/api/v1/{FAKE_KEY}",
    ],
)
def test_credentials_in_base_url_are_refused(tmp_path: Path, outside: Path, url: str) -> None:
    run = tmp_path / "run"
    cfg = _plain_config(tmp_path, run)
    for args in (["generate", str(cfg), "--base-url", url], ["run", str(cfg), f"--base-url={url}"],
                 ["probe", str(cfg), "--base-url", url], ["plan", str(cfg), "--base-url", url]):
        line = _one_error_line(run_cli(args, timeout=60))
        assert "endpoint.base_url" in line and "credentials never go in the URL" in line
    in_file = _plain_config(outside, run, base_url=url)
    line = _one_error_line(run_cli(["generate", str(in_file)], timeout=60))
    assert "endpoint.base_url" in line and "credentials never go in the URL" in line
    many = _plain_config(outside, run, base_urls=["http://127.0.0.1:9/api/v1", url])
    line = _one_error_line(run_cli(["generate", str(many)], timeout=60))
    assert "endpoint.base_urls[1]" in line
    assert not run.exists()
    assert files_holding(tmp_path) == []


def _commands() -> list[str]:
    from draftgen.cli import cli

    return sorted(set(cli.commands) - {"emulate"})


@pytest.mark.parametrize("command", _commands())
def test_api_key_on_the_command_line_is_refused(tmp_path: Path, command: str) -> None:
    run = tmp_path / "run"
    cfg = _plain_config(tmp_path, run)
    for flag in (["--api-key", FAKE_KEY], [f"--api-key={FAKE_KEY}"], ["--api-key"]):
        line = _one_error_line(run_cli([command, str(cfg), *flag], timeout=60))
        assert "never passed on the command line" in line and "OPENROUTER_API_KEY" in line
        assert "--api-key-file PATH" in line and "holding only the key" in line
        assert "Did you mean" not in line
    assert not run.exists()


def test_emulate_takes_its_keys_from_files_or_the_environment() -> None:
    for flag in (["--api-key", FAKE_KEY, "--help"], ["--management-key", FAKE_KEY]):
        line = _one_error_line(run_cli(["emulate", *flag], timeout=60))
        assert "never passed on the command line" in line and "DRAFTGEN_EMULATOR_API_KEY" in line
    res = run_cli(["emulate", "--help"], timeout=60)
    assert res.returncode == 0 and "--api-key-file" in res.stdout and "--api-key " not in res.stdout


def test_a_key_as_any_argument_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = _plain_config(tmp_path, run)
    for args in (["generate", str(cfg), FAKE_KEY], ["status", FAKE_KEY], ["generate", str(cfg), "--run-dir", FAKE_KEY]):
        line = _one_error_line(run_cli(args, cwd=tmp_path, timeout=60))
        assert "looks like an API key" in line and "never passed on the command line" in line
    assert not run.exists() and not (tmp_path / FAKE_KEY).exists()
