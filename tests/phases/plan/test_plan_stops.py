"""plan and run stop on a wrong model slug with one line naming model.id (rc 2), never suggesting
budget.allow_unpriced; with no key set at all they say so (issue 34)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from _generate_helpers import emulator
from draftgen.cli import cli


def test_a_wrong_model_slug_stops_plan_and_run(tmp_path: Path) -> None:
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n', encoding="utf-8")
    (tmp_path / "key").write_text("sk-or-v1-t", encoding="utf-8")
    with emulator() as emu:
        cfg = write_config(tmp_path, config_dict(
            tmp_path, model={"id": "qwen/qwen3-8b-typo", "profile": "qwen3", "tokenizer": "bundled:qwen3"},
            endpoint={"kind": "emulator", "base_url": emu.base_url, "api_key_file": "key"},
            budget={"max_spend_usd": 5}, progress="off"))
        for cmd in (["plan", str(cfg)], ["run", str(cfg), "--yes"]):
            res = CliRunner().invoke(cli, cmd)
            assert res.exit_code == 2, res.output
            err = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
            assert len(err) == 1 and "model.id 'qwen/qwen3-8b-typo'" in err[0], res.output
            assert "allow_unpriced" not in res.output
        assert not (tmp_path / "run" / "raw" / "chat" / "raw_responses.jsonl").exists()


def test_no_key_at_all_is_said_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A server that wants a key (`draftgen emulate` with one), and none set: not "User not found … check
    # OPENROUTER_API_KEY", which reads as a wrong key, but that none is set and how to set it.
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n', encoding="utf-8")
    with emulator(api_key="sk-or-v1-the-right-one") as emu:
        cfg = write_config(tmp_path, config_dict(tmp_path, endpoint={"kind": "emulator", "base_url": emu.base_url},
                                                 progress="off"))
        res = CliRunner().invoke(cli, ["plan", str(cfg)])
    assert res.exit_code != 0
    err = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and "no API key is set" in err[0] and "export OPENROUTER_API_KEY=" in err[0], res.output
    assert "User not found" not in res.output
