"""probe stops on what it finds (issue 34): no request when the tokenizer cannot load (its answer could not
be checked), and a failure, exit 1, on a rebuilt token count off the billed one beyond the tolerance."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from _common_helpers import config_dict, load, need_assets, write_config
from _generate_helpers import emulator
from draftgen.cli import cli
from draftgen.phases.probe.run import run_probe


def test_probe_does_not_send_when_the_tokenizer_cannot_load(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-or-v1-t", encoding="utf-8")
    with emulator() as emu:
        cfg = load(write_config(tmp_path, config_dict(
            tmp_path, model={"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": str(tmp_path / "missing")},
            endpoint={"kind": "emulator", "base_url": emu.base_url, "api_key_file": "key"})))
        said: list[str] = []
        rep = run_probe(cfg, echo=said.append)
    assert not rep.ok and rep.errors
    assert rep.completion_tokens is None and rep.latency_s is None  # nothing was asked
    assert any("not sent: the tokenizer did not load" in s for s in said), said


def test_probe_fails_on_a_rebuild_off_the_billed_count(tmp_path: Path) -> None:
    # Another family's config rehearsed against the default emulator (profile qwen3; the trial's was Kimi's,
    # whose tokenizer file is not available offline): its text rebuilds to other counts than the qwen3 tokens
    # billed, far beyond an end token: a failure (exit 1), not a warning.
    r1 = need_assets() / "deepseek-r1"
    (tmp_path / "key").write_text("sk-or-v1-t", encoding="utf-8")
    with emulator() as emu:
        path = write_config(tmp_path, config_dict(
            tmp_path, model={"id": "deepseek/deepseek-r1", "profile": "deepseek-r1", "tokenizer": str(r1)},
            endpoint={"kind": "emulator", "base_url": emu.base_url, "api_key_file": "key"}))
        rep = run_probe(load(path), echo=lambda _: None)
        res = CliRunner().invoke(cli, ["probe", str(path)])
    assert rep.rebuilt_tokens is not None and rep.completion_tokens is not None
    assert abs(rep.rebuilt_tokens - rep.completion_tokens) > 3
    assert not rep.ok and any("quality.billing_tolerance" in e and "model.profile" in e for e in rep.errors)
    assert res.exit_code == 1 and "probe FAILED" in res.output
