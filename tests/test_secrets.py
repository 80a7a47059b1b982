"""draftgen.secrets: what looks like a key, redaction, and where it is applied (config, CLI, log, report, status).

Keys that these tests plant on disk on purpose (an old run.json holding one) are built here, not taken
from the reliability suite, whose session scan would rightly flag them; the suite's keys are used only
in memory or where draftgen itself must keep them off disk.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest
import yaml
from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from _report_helpers import T0, write_run_dir
from draftgen.backends import errors as backend_errors
from draftgen.cli import argv_key_problem, cli
from draftgen.config import load_config, resolve_api_key
from draftgen.engine.progress import RunLog
from draftgen.errors import ConfigError
from draftgen.phases.report.html import render_html
from draftgen.phases.status.run import run_status
from draftgen.records import RunManifest
from draftgen.runview.metrics import compute_metrics
from draftgen.secrets import contains_key, looks_like_key, redact, redact_obj, url_credentials
from draftgen.store import atomic_write_json
from reliability._helpers import FAKE_KEY, OTHER_FAKE_KEY

#: a key planted on disk by these tests (never one of the reliability suite's)
PLANTED = "sk-or-v1-" + "PL4NT3D" * 8
KEYS = [
    FAKE_KEY,
    OTHER_FAKE_KEY,
    "sk-or-v1-abc",
    "sk-or-mgmt-test",
    "sk-ant-api03-" + "Zx9_Qw-8" * 11,
    "sk-proj-" + "Ab3dE6gH9jK2mN5pQ8sT" * 3,
    "sk-svcacct-" + "Ab3dE6gH9jK2" * 4,
    "sk-" + "aB3cD4eF5gH6" * 4,  # OpenAI legacy: sk- + 48
    "sk-" + hashlib.md5(b"x").hexdigest(),  # sk- + 32 hex (DeepSeek-style)
]
NOT_KEYS = [
    "",
    "sk-",
    "sk-or-",
    "moonshotai/kimi-k2.5",
    "qwen/qwen3-8b",
    "deepseek/deepseek-r1-0528:free",
    "OPENROUTER_API_KEY",
    "DRAFTGEN_TEST_KEY",
    "/home/user/data/prompts.jsonl",
    "~/keys/openrouter.key",
    "runs/sk-learn-experiments-2024/run.json",
    "sk-learn-experiments-2024",
    "sk-0123456789abcdef",  # a sample id of a dataset named "sk"
    "chat-0a1b2c3d4e5f6789",
    "task-" + "0123456789abcdef" * 2,  # built here: a literal would look like a key to a repository scan
    hashlib.sha256(b"x").hexdigest(),
    "gen-1760000000-AbCdEfGhIjKlMnOpQrSt",
    "https://openrouter.ai/api/v1",
    "http://127.0.0.1:8000/v1",
    "bundled:qwen3",
]


@pytest.mark.parametrize("key", KEYS)
def test_keys_are_recognised_and_redacted(key: str) -> None:
    assert looks_like_key(key)
    assert looks_like_key(f"  {key}\n") and looks_like_key(f"'{key}'") and looks_like_key(f"Bearer {key}")
    for text in (key, f"401 bad key {key}, try again", f"Authorization: Bearer {key}", f"key={key}&x=1",
                 f'{{"api_key": "{key}"}}', f"/tmp/{key}", f"https://h/{key}/v1"):
        out = redact(text)
        assert key not in out and (key[12:] or "\0") not in out, out
        assert "[redacted]" in out
    assert contains_key(f"a {key} b")


@pytest.mark.parametrize("value", NOT_KEYS)
def test_no_false_positives(value: str) -> None:
    assert not looks_like_key(value)
    assert not contains_key(value)
    assert redact(value) == value
    assert redact(f"sample {value} failed: HTTP 429 rate_limited") == f"sample {value} failed: HTTP 429 rate_limited"


def test_redact_keeps_the_kind_and_the_rest_of_the_text() -> None:
    assert redact(f"bad key {FAKE_KEY}.") == "bad key sk-or-v1-…[redacted]."
    assert redact("Authorization: Bearer abc.def-123") == "Authorization: Bearer …[redacted]"
    assert redact(f"Bearer {FAKE_KEY}") == "Bearer …[redacted]"
    assert redact("GET https://bob:hunter2@example.com/v1?key=abc&n=1") == \
        "GET https://…[redacted]@example.com/v1?key=…[redacted]&n=1"
    assert redact('{"url": "http://h/v1?token=abc", "n": 1}') == '{"url": "http://h/v1?token=…[redacted]", "n": 1}'
    # the bearer rule, the URL rules and a ``key=`` not in a query string leave ordinary text alone
    assert redact("max_tokens=512 key=value path=/a/b") == "max_tokens=512 key=value path=/a/b"


def test_backend_errors_redact_delegates() -> None:
    assert backend_errors.redact(f"x {FAKE_KEY} y") == redact(f"x {FAKE_KEY} y") == "x sk-or-v1-…[redacted] y"


def test_redact_obj_scrubs_nested_config_and_argv() -> None:
    obj = {
        "config": {"endpoint": {"api_key_file": f"/work/{FAKE_KEY}", "base_url": f"https://u:{FAKE_KEY}@h/v1",
                                "base_urls": [f"http://h/v1?api_key={FAKE_KEY}"], "api_key_env": "OPENROUTER_API_KEY"},
                   "model": {"id": "moonshotai/kimi-k2.5"}, "partitions": {"short": {"concurrency": 8}},
                   FAKE_KEY: True},
        "argv": ["draftgen", "generate", "c.yaml", "--api-key-file", FAKE_KEY, ("x", OTHER_FAKE_KEY)],
        "n": 3, "ok": None,
    }
    out = redact_obj(obj)
    text = msgspec.json.encode(out).decode()
    assert FAKE_KEY not in text and OTHER_FAKE_KEY not in text and "S3CR3TS3CR3T" not in text
    assert out["config"]["model"]["id"] == "moonshotai/kimi-k2.5"
    assert out["config"]["endpoint"]["api_key_env"] == "OPENROUTER_API_KEY"
    assert out["config"]["partitions"] == {"short": {"concurrency": 8}}
    assert out["argv"][:4] == ["draftgen", "generate", "c.yaml", "--api-key-file"]
    assert isinstance(out["argv"][5], tuple) and out["n"] == 3 and out["ok"] is None
    assert obj["argv"][4] == FAKE_KEY  # a copy: the input is untouched


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("https://openrouter.ai/api/v1", None),
        ("http://127.0.0.1:30000", None),
        ("https://user:pass@openrouter.ai/api/v1", "user:password"),
        (f"https://{FAKE_KEY}@openrouter.ai/api/v1", "user:password"),
        ("https://openrouter.ai/api/v1?key=abc", "'key='"),
        ("https://openrouter.ai/api/v1?api_key=abc", "'api_key='"),
        ("https://openrouter.ai/api/v1?x=1&token=abc", "'token='"),
        (f"https://openrouter.ai/api/v1?k={FAKE_KEY}", "API key"),
        (f"https://openrouter.ai/{FAKE_KEY}/api/v1", "API key"),
    ],
)
def test_url_credentials(url: str, what: str | None) -> None:
    got = url_credentials(url)
    if what is None:
        assert got is None
    else:
        assert got is not None and what in got and "abc" not in got and FAKE_KEY not in got


# -- config validation (before anything is written) ---------------------------------------------------------

def _cfg(tmp_path: Path, endpoint: str = "") -> Path:
    """An ``openrouter`` config over the bundled chat prompts in ``tmp_path/c.yaml``; ``endpoint`` is YAML
    text (indented two spaces) of extra ``endpoint`` keys."""
    sections = {"run_dir": "runs/x", "endpoint": {"kind": "openrouter", **(yaml.safe_load(endpoint) or {})}}
    return write_config(tmp_path, config_dict(tmp_path, [{"name": "chat", "path": "bundled:chat"}], **sections),
                        "c.yaml")


def _config_error(path: Path, overrides: dict[str, object] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    for secret in (FAKE_KEY, "S3CR3T", PLANTED, "PL4NT3D", "hunter2", "abc123"):
        assert secret not in msg
    return msg


def test_api_key_file_holding_a_key_is_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    # as the CLI passes it (resolved against the current folder) and as written in the YAML
    for value in (str(Path.cwd() / FAKE_KEY), FAKE_KEY, f"  {FAKE_KEY}\n"):
        msg = _config_error(cfg, {"endpoint.api_key_file": value})
        assert "api_key_file" in msg and "looks like an API key, not a path" in msg
        assert "holding only the key" in msg and "OPENROUTER_API_KEY" in msg
    # a real key file is fine, whatever its name
    keyfile = tmp_path / "openrouter.key"
    keyfile.write_text("sk-or-v1-fromfile\n", encoding="utf-8")
    assert resolve_api_key(load_config(cfg, {"endpoint.api_key_file": str(keyfile)})) == "sk-or-v1-fromfile"


def test_api_key_env_holding_a_key_is_refused(tmp_path: Path) -> None:
    msg = _config_error(_cfg(tmp_path, f"  api_key_env: {PLANTED}\n"))
    assert "endpoint.api_key_env looks like an API key" in msg and "NAME of an environment variable" in msg
    msg = _config_error(_cfg(tmp_path, f"  management_key_env: '{PLANTED}'\n"))
    assert "endpoint.management_key_env" in msg
    msg = _config_error(_cfg(tmp_path, "  api_key_env: 'not a name'\n"))
    assert "name of an environment variable" in msg
    assert load_config(_cfg(tmp_path, "  api_key_env: DRAFTGEN_TEST_KEY\n")).endpoint.api_key_env == "DRAFTGEN_TEST_KEY"


@pytest.mark.parametrize(
    "endpoint",
    [
        "  base_url: https://bob:hunter2@openrouter.ai/api/v1\n",
        f"  base_url: https://{PLANTED}@openrouter.ai/api/v1\n",
        "  base_url: https://openrouter.ai/api/v1?key=abc123\n",
        "  base_url: https://openrouter.ai/api/v1?api_key=abc123\n",
        "  base_url: http://127.0.0.1:8000/v1?token=abc123\n",
        f"  base_url: https://openrouter.ai/api/v1?x={PLANTED}\n",
        f"  base_url: https://openrouter.ai/{PLANTED}/api/v1\n",
        "  base_urls: [http://127.0.0.1:8000/v1, 'http://bob:hunter2@127.0.0.1:8001/v1']\n",
    ],
)
def test_credentials_in_a_base_url_are_refused(tmp_path: Path, endpoint: str) -> None:
    msg = _config_error(_cfg(tmp_path, endpoint))
    assert "base_url" in msg and "credentials never go in the URL" in msg and "OPENROUTER_API_KEY" in msg


def test_credentials_in_base_url_flag_are_refused(tmp_path: Path) -> None:
    msg = _config_error(_cfg(tmp_path), {"endpoint.base_url": f"https://u:{FAKE_KEY}@h/api/v1"})
    assert "endpoint.base_url (--base-url) holds a user:password@ part" in msg


def test_a_key_anywhere_else_in_the_config_is_refused(tmp_path: Path) -> None:
    msg = _config_error(_cfg(tmp_path), {"model.template_kwargs": {"token": FAKE_KEY}})
    assert "model.template_kwargs.token holds what looks like an API key" in msg
    msg = _config_error(_cfg(tmp_path), {"model.template_kwargs": {FAKE_KEY: 1}})
    assert "model.template_kwargs holds what looks like an API key" in msg


def test_ordinary_configs_still_load(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "  base_urls: [http://127.0.0.1:8000/v1, http://127.0.0.1:8001/v1]\n"),
                      {"model.id": "moonshotai/kimi-k2.5", "endpoint.api_key_file": str(tmp_path / "sk-or.key")})
    assert cfg.model.id == "moonshotai/kimi-k2.5"


def test_resolve_api_key_never_echoes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    cfg = load_config(_cfg(tmp_path), {"endpoint.api_key_file": str(tmp_path / "missing.key")})
    with pytest.raises(ConfigError, match="cannot read the API key file"):
        resolve_api_key(cfg)
    two = tmp_path / "two.key"
    two.write_text(f"OPENROUTER_API_KEY = {PLANTED}\n", encoding="utf-8")
    cfg = load_config(_cfg(tmp_path), {"endpoint.api_key_file": str(two)})
    with pytest.raises(ConfigError, match="must hold only the key") as info:
        resolve_api_key(cfg)
    assert PLANTED not in str(info.value)


# -- the CLI ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "c.yaml", "--api-key", FAKE_KEY],
        ["plan", "c.yaml", f"--api-key={FAKE_KEY}"],
        ["status", "run", "--api-key"],
        ["-v", "probe", "c.yaml", "--management-key", FAKE_KEY],
        ["generate", "c.yaml", "--api-key-file", FAKE_KEY],
        ["run", "c.yaml", f"--api-key-file=./{FAKE_KEY}"],
        ["audit", "c.yaml", FAKE_KEY],
    ],
)
def test_argv_with_a_key_is_refused(args: list[str]) -> None:
    problem = argv_key_problem(args)
    assert problem is not None and FAKE_KEY not in problem and "S3CR3T" not in problem
    assert "OPENROUTER_API_KEY" in problem and "--api-key-file" in problem


@pytest.mark.parametrize(
    "args",
    [
        ["emulate", "--api-key-file", "emulator.key", "--management-key-file", "mgmt.key"],
        ["-v", "emulate", "--port", "0", "-v"],
        ["generate", "c.yaml", "--api-key-file", "~/.config/openrouter.key", "--token-budget", "100"],
        ["generate", "c.yaml", "--base-url", "http://127.0.0.1:8000/api/v1", "--dataset", "sk-learn"],
        ["status", "runs/moonshotai-kimi-k2.5"],
        [],
    ],
)
def test_ordinary_argv_passes(args: list[str]) -> None:
    assert argv_key_problem(args) is None


def test_cli_refuses_a_key_as_api_key_file_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without main()'s argv check (click called directly), config validation still stops it at load."""
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path)
    for command in ("generate", "plan", "probe", "run"):
        res = CliRunner().invoke(cli, [command, str(cfg), "--api-key-file", FAKE_KEY])
        assert res.exit_code == 2, res.output
        assert res.output.startswith("Error:") and len(res.output.strip().splitlines()) == 1
        assert "looks like an API key, not a path" in res.output and FAKE_KEY not in res.output
    assert not (tmp_path / "runs").exists()


def test_fail_redacts_every_error_line(tmp_path: Path) -> None:
    cfg = tmp_path / f"{FAKE_KEY}.yaml"
    res = CliRunner().invoke(cli, ["audit", str(cfg)])
    assert res.exit_code == 2 and res.output.startswith("Error:") and "config file not found" in res.output
    assert FAKE_KEY not in res.output and "[redacted]" in res.output


# -- the run log, the report and status -----------------------------------------------------------------------


def test_run_log_redacts_every_line(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "logs" / "generate.log")
    log.write(f"chat-0001 attempt 2: HTTP 401 invalid key {FAKE_KEY}")
    log.write(f"GET https://u:{OTHER_FAKE_KEY}@h/v1 failed\nBearer {FAKE_KEY}")
    log.write("chat-0002 done (moonshotai/kimi-k2.5)")
    log.close()
    text = (tmp_path / "logs" / "generate.log").read_text(encoding="utf-8")
    assert FAKE_KEY not in text and OTHER_FAKE_KEY not in text and "S3CR3T" not in text
    lines = text.splitlines()
    assert len(lines) == 3 and "sk-or-v1-…[redacted]" in lines[0] and "moonshotai/kimi-k2.5" in lines[2]


def _run_dir_with_a_planted_key(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 6}, done_fraction=1.0)
    # a run.json written by an older draftgen, before keys were refused
    atomic_write_json(run / "run.json", RunManifest(
        config_hash="abc123", config={"model": {"id": f"qwen/qwen3-8b {PLANTED}"},
                                      "endpoint": {"kind": f"openrouter Bearer {PLANTED}"}},
        argv=["draftgen", "generate", "--api-key-file", PLANTED], versions={}, created_at=T0))
    return run


def test_status_output_is_redacted(tmp_path: Path) -> None:
    run = _run_dir_with_a_planted_key(tmp_path)
    lines: list[str] = []
    run_status(str(run), echo=lines.append, now=T0 + 60)
    out = "\n".join(lines)
    assert PLANTED not in out and "PL4NT3D" not in out
    assert "qwen/qwen3-8b" in out


def test_report_page_is_redacted(tmp_path: Path) -> None:
    run = _run_dir_with_a_planted_key(tmp_path)
    m = compute_metrics(run, ["chat"])
    assert m.model is not None and PLANTED in m.model
    page = render_html(m, title=f"report {FAKE_KEY}", generated_at=T0,
                       settings={"model": m.model, "run directory": f"/runs/{OTHER_FAKE_KEY}"})
    for secret in (PLANTED, "PL4NT3D", FAKE_KEY, OTHER_FAKE_KEY, "S3CR3T", "W4R0NG"):
        assert secret not in page
    assert "qwen/qwen3-8b" in page and "[redacted]" in page
    # the embedded metrics are still valid JSON
    start = page.index('id="draftgen-metrics">') + len('id="draftgen-metrics">')
    data = msgspec.json.decode(page[start:page.index("</script>", start)].encode())
    assert data["model"].startswith("qwen/qwen3-8b sk-or-v1-…")
