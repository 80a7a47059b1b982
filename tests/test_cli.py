"""One CLI convention: the endpoint options (``--base-url``, ``--api-key-file``, ``$DRAFTGEN_BASE_URL``) are the
same on every command that talks to an endpoint, ``-v`` works after the subcommand, ``emulate`` reads its keys
from files or the environment, and a config error is one line with a non-zero exit."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, free_port, write_config
from draftgen.cli import (
    BASE_URL_ENV,
    EMULATOR_API_KEY_ENV,
    EMULATOR_MANAGEMENT_KEY_ENV,
    argv_key_problem,
    cli,
)
from draftgen.emulator.core import emulator_key
from draftgen.emulator.server import EmulatorOptions, RunningEmulator, start_in_thread
from draftgen.errors import ConfigError

ENDPOINT_COMMANDS = ("generate", "run", "plan", "probe")
EMU_KEY = "sk-or-v1-emulator-cli-test"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``-v`` sets the root logger to DEBUG for the process; put it back for the next tests."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(port=0)) as emu:
        yield emu


def _cfg(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "key").write_text("sk-or-v1-test", encoding="utf-8")
    path = tmp_path / "cfg.yaml"
    path.write_text("endpoint:\n  kind: emulator\n  api_key_file: key\nprobe:\n  max_tokens: 2048\n" + extra
                    + "datasets:\n  - name: a\n    path: a.jsonl\n", encoding="utf-8")
    return path


def _options(command: str) -> dict[str, click.Option]:
    cmd = cli.commands[command]
    return {name: p for p in cmd.params if isinstance(p, click.Option) for name in p.opts}


# -- the endpoint options ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ENDPOINT_COMMANDS)
def test_endpoint_commands_share_both_options_with_help(command: str) -> None:
    opts = _options(command)
    for flag in ("--base-url", "--api-key-file"):
        assert flag in opts and opts[flag].help, f"{command} {flag} has no help"
    assert opts["--base-url"].envvar == BASE_URL_ENV == "DRAFTGEN_BASE_URL"
    assert opts["--base-url"].help == _options("generate")["--base-url"].help  # defined once
    assert opts["--api-key-file"].help == _options("generate")["--api-key-file"].help
    res = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert res.exit_code == 0
    assert BASE_URL_ENV in res.output and "File holding only the API key" in res.output


def test_base_url_from_the_environment(tmp_path: Path, emulator: RunningEmulator) -> None:
    """No --base-url, no endpoint.base_url: $DRAFTGEN_BASE_URL points probe at the started emulator."""
    before = emulator.state.requests
    res = CliRunner().invoke(cli, ["probe", str(_cfg(tmp_path))], env={BASE_URL_ENV: emulator.base_url})
    assert res.exit_code == 0, res.output
    assert f":{emulator.port}" in res.output and "probe OK" in res.output
    assert emulator.state.requests > before
    # the flag still wins over the environment
    res = CliRunner().invoke(cli, ["probe", str(_cfg(tmp_path)), "--base-url", emulator.base_url],
                             env={BASE_URL_ENV: "http://127.0.0.1:9/api/v1"})
    assert res.exit_code == 0, res.output


def test_verbose_after_the_subcommand(tmp_path: Path, restore_logging: None) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    res = CliRunner().invoke(cli, ["probe", str(_cfg(tmp_path)), "-v"])
    assert res.exit_code == 0, res.output
    assert logging.getLogger("draftgen").isEnabledFor(logging.DEBUG)
    for name, cmd in cli.commands.items():
        assert any("--verbose" in p.opts and "-v" in p.opts for p in cmd.params), name


# -- emulate: keys from files or the environment ----------------------------------------------------------------


def test_emulator_key_from_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATOR_API_KEY_ENV, raising=False)
    assert emulator_key(None, EMULATOR_API_KEY_ENV, flag="--api-key-file") is None
    monkeypatch.setenv(EMULATOR_API_KEY_ENV, f" {EMU_KEY}\n")
    assert emulator_key(None, EMULATOR_API_KEY_ENV, flag="--api-key-file") == EMU_KEY
    key = tmp_path / "emu.key"
    key.write_text("sk-or-v1-from-file\n", encoding="utf-8")
    assert emulator_key(str(key), EMULATOR_API_KEY_ENV, flag="--api-key-file") == "sk-or-v1-from-file"
    key.write_text("KEY = sk-or-v1-from-file\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must hold only the key") as info:
        emulator_key(str(key), EMULATOR_API_KEY_ENV, flag="--api-key-file")
    assert "sk-or-v1-from-file" not in str(info.value)
    with pytest.raises(ConfigError, match=f"cannot read the key file.*{EMULATOR_API_KEY_ENV}"):
        emulator_key(str(tmp_path / "missing"), EMULATOR_API_KEY_ENV, flag="--api-key-file")


def test_emulate_has_no_key_options_on_argv() -> None:
    opts = _options("emulate")
    assert "--api-key-file" in opts and "--management-key-file" in opts
    assert "--api-key" not in opts and "--management-key" not in opts
    assert EMULATOR_API_KEY_ENV in (opts["--api-key-file"].help or "")
    assert EMULATOR_MANAGEMENT_KEY_ENV in (opts["--management-key-file"].help or "")
    for args in (["emulate", "--api-key", EMU_KEY], ["emulate", f"--management-key={EMU_KEY}"],
                 ["-v", "emulate", "--api-key-file", EMU_KEY]):
        problem = argv_key_problem(args)
        assert problem is not None and EMU_KEY not in problem and EMULATOR_API_KEY_ENV in problem


def _status(url: str, key: str) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _serve(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = open(tmp_path / "emulate.log", "wb")  # noqa: SIM115 (the child's output for its lifetime)
    proc = subprocess.Popen([sys.executable, "-m", "draftgen.cli", "emulate", "--port", str(port), *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    base = f"http://127.0.0.1:{port}/api/v1"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "emulate.log").read_text(errors="replace")[-2000:]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc, base
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the emulator did not answer within 60 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("how", ["file", "env"])
def test_emulate_accepts_only_the_key_from_a_file_or_the_environment(tmp_path: Path, how: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTGEN_EMULATOR_")}
    args: list[str] = []
    if how == "file":
        (tmp_path / "emu.key").write_text(EMU_KEY + "\n", encoding="utf-8")
        (tmp_path / "mgmt.key").write_text("sk-or-mgmt-cli-test\n", encoding="utf-8")
        args = ["--api-key-file", str(tmp_path / "emu.key"), "--management-key-file", str(tmp_path / "mgmt.key")]
    else:
        env[EMULATOR_API_KEY_ENV] = EMU_KEY
        env[EMULATOR_MANAGEMENT_KEY_ENV] = "sk-or-mgmt-cli-test"
    proc, base = _serve(tmp_path, args, env)
    try:
        assert _status(f"{base}/key", EMU_KEY) == 200
        assert _status(f"{base}/key", "sk-or-v1-some-other-key") == 401
        assert _status(f"{base}/credits", "sk-or-mgmt-cli-test") == 200
    finally:
        _stop(proc)
    log = (tmp_path / "emulate.log").read_text(errors="replace")
    assert EMU_KEY not in log and "sk-or-mgmt-cli-test" not in log


def test_emulate_api_key_flag_is_one_line_error() -> None:
    res = subprocess.run([sys.executable, "-m", "draftgen.cli", "emulate", "--api-key", EMU_KEY],
                         capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error:"), res.stderr
    assert "--api-key-file" in lines[0] and EMULATOR_API_KEY_ENV in lines[0] and EMU_KEY not in res.stderr


# -- config errors through the CLI -------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "expected"), [
    ("partitons: {}\n", "unknown key 'partitons' (did you mean 'partitions'?)"),
    ("progress: fancy\n", "valid values: auto, rich, plain, off"),
])
def test_config_error_is_one_line_with_a_fix(tmp_path: Path, extra: str, expected: str) -> None:
    res = CliRunner().invoke(cli, ["plan", str(_cfg(tmp_path, extra))])
    assert res.exit_code != 0
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and expected in lines[0], res.output
    assert "Traceback" not in res.output


def test_token_budget_takes_k_and_m_suffixes() -> None:
    from draftgen.cli import TokenCount

    tc = TokenCount()
    assert [tc.convert(v, None, None) for v in ("10M", "500k", "1.5k", "20,000,000", "2G", "7")] == \
        [10_000_000, 500_000, 1500, 20_000_000, 2_000_000_000, 7]
    for bad in ("10X", "-5", "1.5", "M"):
        with pytest.raises(click.BadParameter):
            tc.convert(bad, None, None)


def test_token_budget_10m_reaches_the_config_and_status_watch_takes_the_config_after_it(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    res = CliRunner().invoke(cli, ["generate", str(cfg), "--token-budget", "10M", "--dataset", "nope"])
    assert res.exit_code == 2 and "no dataset named 'nope'" in res.output  # parsed, loaded, then refused
    res = CliRunner().invoke(cli, ["generate", str(cfg), "--token-budget", "10X"])
    assert res.exit_code == 2 and "not a token count" in res.output
    for args in (["--watch", str(cfg)], [str(cfg), "--watch"], ["--watch", "0.5", str(cfg)]):
        res = CliRunner().invoke(cli, ["status", *args])
        assert "the run directory does not exist yet" in res.output, (args, res.output)
    res = CliRunner().invoke(cli, ["status", "--watch", "soon", str(cfg)])
    assert res.exit_code == 2 and "'soon' is not a number of seconds" in res.output


def test_generate_prepares_the_datasets_not_prepared_yet_first(tmp_path: Path) -> None:
    """``draftgen generate`` on a run never prepared prepares its datasets first, then generates them: the
    command hands generate the prepare phase (``run_generate(prepare=run_prepare)``; a phase imports none)."""
    cfg = write_config(tmp_path, config_dict(tmp_path, [{"name": "chat", "path": "bundled:chat", "max_samples": 4}],
                                             progress="off"))
    res = CliRunner().invoke(cli, ["generate", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "preparing prompts first (chat not prepared yet)" in res.output
    run = tmp_path / "run"
    assert (run / "prepared" / "chat" / "stats.json").is_file()
    raw = (run / "raw" / "chat" / "raw_responses.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(raw) == 4
