"""draftgen probe against the emulator: a good run, a bad key, no credits, routing rules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from draftgen.backends import Completion, EndpointInfo
from draftgen.cli import cli
from draftgen.config import load_config
from draftgen.emulator.server import EmulatorOptions, RunningEmulator, start_in_thread
from draftgen.probe import _Probe, run_probe
from draftgen.records import Usage
from draftgen.tokens import profile_from_config


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(port=0, management_key="sk-or-mgmt-test")) as emu:
        yield emu


def _cfg(tmp_path: Path, base_url: str | None, extra: str = "", key: str = "sk-or-v1-test") -> Path:
    """The emulator keyed by ``tmp_path/key`` (management key from ``DRAFTGEN_TEST_MGMT``), dataset ``a``;
    ``extra`` is YAML text whose top-level sections are added to (or replace) the config's. The key file
    lies in pytest's temp folder, so it never holds ``FAKE_KEY`` (the reliability suite scans for it)."""
    (tmp_path / "key").write_text(key, encoding="utf-8")
    endpoint = {"kind": "emulator", **({"base_url": base_url} if base_url else {}),
                "api_key_file": "key", "management_key_env": "DRAFTGEN_TEST_MGMT"}
    sections = {"endpoint": endpoint, "probe": {"max_tokens": 2048}, **(yaml.safe_load(extra) or {})}
    return write_config(tmp_path, config_dict(tmp_path, ["a"], **sections))


def test_probe_reports_everything(tmp_path: Path, emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_TEST_MGMT", "sk-or-mgmt-test")
    lines: list[str] = []
    rep = run_probe(load_config(_cfg(tmp_path, emulator.base_url)), echo=lines.append)
    out = "\n".join(lines)
    assert rep.ok, out
    assert rep.key_valid is True
    assert rep.credits_remaining is not None and 0 < rep.credits_remaining <= 100
    assert rep.provider and rep.quantization and rep.endpoint_tag
    assert rep.reasoning_field in ("reasoning", "reasoning_content", "reasoning_details")
    assert rep.completion_tokens and rep.cost_usd and rep.cost_usd > 0
    assert rep.usd_per_m_output == pytest.approx(rep.cost_usd / rep.completion_tokens * 1e6)
    assert rep.reasoning_share is not None and 0 < rep.reasoning_share <= 1
    # The emulator's model is the Qwen3 profile: the rebuild must match the bill exactly.
    assert rep.rebuilt_tokens == rep.completion_tokens
    for label in ("key", "credits", "provider", "reasoning", "content", "cost", "share", "rebuild"):
        assert any(line.strip().startswith(label) for line in lines), label
    assert "sk-or-v1-test" not in out and "sk-or-mgmt-test" not in out
    assert out.rstrip().endswith("probe OK")


def test_probe_embedded_emulator_and_cli_exit_codes(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["probe", str(_cfg(tmp_path, None))])
    assert res.exit_code == 0, res.output
    assert "127.0.0.1" in res.output and "probe OK" in res.output


def test_probe_bad_key(tmp_path: Path) -> None:
    with start_in_thread(EmulatorOptions(port=0, api_key="sk-or-v1-the-right-one")) as emu:
        lines: list[str] = []
        rep = run_probe(load_config(_cfg(tmp_path, emu.base_url, key="sk-or-v1-wrong")), echo=lines.append)
        res = CliRunner().invoke(cli, ["probe", str(tmp_path / "cfg.yaml")])
    out = "\n".join(lines)
    assert not rep.ok and rep.key_valid is False
    assert "API key was rejected" in out and "api-key-file" in out
    assert "sk-or-v1-wrong" not in out
    assert rep.completion_tokens is None  # nothing was sent after the key failed
    assert res.exit_code == 1 and "probe FAILED" in res.output


def test_probe_no_credits(tmp_path: Path) -> None:
    with start_in_thread(EmulatorOptions(port=0, credits=0.0001)) as emu:
        lines: list[str] = []
        rep = run_probe(load_config(_cfg(tmp_path, emu.base_url)), echo=lines.append)
    out = "\n".join(lines)
    assert not rep.ok
    assert "payment required" in out.lower()
    assert rep.cost_usd is None


def test_probe_honours_ignore(tmp_path: Path, emulator: RunningEmulator) -> None:
    first = run_probe(load_config(_cfg(tmp_path, emulator.base_url)), echo=lambda s: None)
    assert first.ok and first.provider
    ignored = first.provider
    rep = run_probe(load_config(_cfg(tmp_path, emulator.base_url, f"routing:\n  ignore: [{ignored}]\n")),
                    echo=lambda s: None)
    assert rep.ok, rep.errors
    assert rep.provider and rep.provider.lower() != ignored.lower()
    assert rep.eligible_endpoints == (rep.endpoints or 0) - 1
    # Excluding everything is a failure before any money is spent.
    rep = run_probe(load_config(_cfg(tmp_path, emulator.base_url, "routing:\n  only: [nobody]\n")), echo=lambda s: None)
    assert not rep.ok and any("excludes every endpoint" in e for e in rep.errors)
    assert rep.completion_tokens is None and len(rep.errors) == 1


def test_served_by_flags_routing_violations(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "http://127.0.0.1:9/api/v1",
                           "routing:\n  ignore: [siliconflow]\n  quantizations: [fp8]\n"))
    eps = [EndpointInfo(provider_name="SiliconFlow", tag="siliconflow/int4", quantization="int4"),
           EndpointInfo(provider_name="DeepInfra", tag="deepinfra/fp8", quantization="fp8")]
    probe = _Probe(cfg, lambda s: None)
    probe.served_by(Completion(backend="openrouter", provider="SiliconFlow", usage=Usage()), eps)
    assert any("routing.ignore" in e for e in probe.rep.errors)
    assert any("quantization int4" in e for e in probe.rep.errors)
    ok = _Probe(cfg, lambda s: None)
    ok.served_by(Completion(backend="openrouter", provider="DeepInfra"), eps)
    assert ok.rep.errors == [] and ok.rep.quantization == "fp8"


def test_probe_warns_on_missing_reasoning_and_truncation(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "http://127.0.0.1:9/api/v1"))
    probe = _Probe(cfg, lambda s: None)
    probe.response(Completion(backend="openrouter", content="Blue light scatters more.", finish_reason="length",
                              usage=Usage(completion_tokens=10, reasoning_tokens=0, cost=0.00002)), 0.5)
    probe.rebuild(Completion(backend="openrouter", content="Blue light scatters more.", finish_reason="length",
                             usage=Usage(completion_tokens=10)), profile_from_config(cfg))
    assert any("no reasoning" in w for w in probe.rep.warnings)
    assert any("truncated" in w for w in probe.rep.warnings)
    assert probe.rep.usd_per_m_output == pytest.approx(2.0)
    assert probe.rep.errors == []
