"""Every config-level range check holds for the file as for the flags, and a value a flag set is blamed on
the flag, not on the config file (issue 34)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from draftgen.cli import cli


def _cfg(tmp: Path, **sections: object) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n', encoding="utf-8")
    return write_config(tmp, config_dict(tmp, **sections))


def test_a_negative_token_budget_in_the_file_is_refused_like_the_flag(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, budget={"token_budget": -100})
    res = CliRunner().invoke(cli, ["plan", str(cfg)])
    assert res.exit_code == 2, res.output
    assert "budget.token_budget -100 must be >= 0" in res.output and str(cfg) in res.output
    assert "Traceback" not in res.output
    flag = CliRunner().invoke(cli, ["generate", str(_cfg(tmp_path / "b")), "--token-budget", "-100"])
    assert flag.exit_code == 2 and "--token-budget" in flag.output


def test_a_bad_flag_value_is_blamed_on_the_flag(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    for args, flag, key in ((["--short-concurrency", "0"], "--short-concurrency 0", "partitions.short.concurrency"),
                            (["--max-spend", "-1"], "--max-spend -1.0", "budget.max_spend_usd")):
        res = CliRunner().invoke(cli, ["generate", str(cfg), *args])
        assert res.exit_code == 2, res.output
        line = res.output.strip().splitlines()[-1]
        assert line.startswith(f"Error: {flag}: {key}"), line
    # The file's own bad value is still the file's.
    bad = _cfg(tmp_path / "c", partitions={"short": {"concurrency": 0, "max_tokens": 10}})
    res = CliRunner().invoke(cli, ["generate", str(bad), "--max-spend", "5"])
    assert res.exit_code == 2 and f"Error: {bad}: partitions.short.concurrency 0 must be >= 1" in res.output
