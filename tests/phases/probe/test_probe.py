"""draftgen probe against the emulator: a good run, a bad key, no credits, routing rules, quantization
warnings, the thinking default of max_tokens and the one-line verdict."""

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
from draftgen.phases.probe.run import _Probe, probe_max_tokens, run_probe
from draftgen.records import Usage
from draftgen.tokens import profile_from_config


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(port=0, management_key="sk-or-mgmt-test")) as emu:
        yield emu


def _cfg(tmp_path: Path, base_url: str | None, extra: str = "", key: str = "sk-or-v1-test",
         max_tokens: int | None = 2048) -> Path:
    """The emulator keyed by ``tmp_path/key`` (management key from ``DRAFTGEN_TEST_MGMT``), dataset ``a``;
    ``extra`` is YAML text whose top-level sections are added to (or replace) the config's. The key file
    lies in pytest's temp folder, so it never holds ``FAKE_KEY`` (the reliability suite scans for it)."""
    (tmp_path / "key").write_text(key, encoding="utf-8")
    endpoint = {"kind": "emulator", **({"base_url": base_url} if base_url else {}),
                "api_key_file": "key", "management_key_env": "DRAFTGEN_TEST_MGMT"}
    probe = {"max_tokens": max_tokens} if max_tokens is not None else {}
    sections = {"endpoint": endpoint, "probe": probe, **(yaml.safe_load(extra) or {})}
    return write_config(tmp_path, config_dict(tmp_path, ["a"], **sections))


def test_probe_reports_everything(tmp_path: Path, emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_TEST_MGMT", "sk-or-mgmt-test")
    lines: list[str] = []
    accept_fp4 = "routing:\n  quantizations: [fp4, int4]\n"  # the fast scenario serves fp4 too
    rep = run_probe(load_config(_cfg(tmp_path, emulator.base_url, accept_fp4)), echo=lines.append)
    out = "\n".join(lines)
    assert rep.ok, out
    assert rep.warnings == [], out
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


def _scenario(tmp_path: Path, providers: str, extra: str = "") -> str:
    """A scenario YAML over ``fast`` with only ``providers`` (YAML flow mappings, one a line); the
    ``endpoint.emulator`` section that starts the embedded emulator on it (seed 0, so the run repeats)."""
    (tmp_path / "sc.yaml").write_text(f"base: fast\n{extra}providers:\n{providers}", encoding="utf-8")
    return "endpoint:\n  kind: emulator\n  api_key_file: key\n  emulator: {scenario: sc.yaml, seed: 0}\n"


INT4 = "  - {name: Chutes, tag: chutes/int4, quantization: int4, price_prompt: 0.44, price_completion: 2.0}\n"
FP4 = "  - {name: DeepInfra, tag: deepinfra/fp4, quantization: fp4, price_prompt: 0.45, price_completion: 2.25}\n"


def test_thinking_probe_default_lets_the_reasoning_finish(tmp_path: Path) -> None:
    lines: list[str] = []
    cfg = load_config(_cfg(tmp_path, None, _scenario(tmp_path, INT4), max_tokens=None))
    assert cfg.model.thinking and cfg.probe.max_tokens is None
    rep = run_probe(cfg, echo=lines.append)
    out = "\n".join(lines)
    assert rep.ok and rep.max_tokens == 4096, out
    assert rep.finish_reason == "stop" and rep.content and rep.reasoning, out
    assert rep.warnings == [] and "truncated" not in out, out
    assert lines[-1] == "probe OK"


def test_thinking_probe_cut_inside_reasoning_is_a_note_not_a_warning(tmp_path: Path) -> None:
    # Reasoning far longer than the default: the probe is cut inside it, which says nothing about the setup.
    sc = _scenario(tmp_path, INT4, "reasoning_tokens_median: 60000\nlength_sigma: 0.01\nmax_generated_tokens: 90000\n")
    lines: list[str] = []
    rep = run_probe(load_config(_cfg(tmp_path, None, sc, max_tokens=None)), echo=lines.append)
    out = "\n".join(lines)
    assert rep.ok and rep.finish_reason == "length" and not rep.content, out
    assert rep.completion_tokens == 4096, out
    assert rep.warnings == [] and lines[-1] == "probe OK", out
    notes = [ln for ln in lines if ln.strip().startswith("note")]
    assert len(notes) == 1 and "probe.max_tokens=4096" in notes[0] and "higher" in notes[0], out


def test_non_thinking_default_and_truncated_answer_still_warn(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "http://127.0.0.1:9/api/v1", "model:\n  thinking: false\n", max_tokens=None))
    assert probe_max_tokens(cfg) == 512
    assert probe_max_tokens(load_config(_cfg(tmp_path, "http://127.0.0.1:9/api/v1", max_tokens=300))) == 300
    # A thinking model cut in its answer (not its reasoning) is still a warning.
    thinking = load_config(_cfg(tmp_path, "http://127.0.0.1:9/api/v1", max_tokens=None))
    probe = _Probe(thinking, lambda s: None)
    probe.response(Completion(backend="openrouter", reasoning="Rayleigh.", reasoning_field="reasoning",
                              content="Blue light", finish_reason="length", usage=Usage(completion_tokens=9)), 0.1)
    assert [w for w in probe.rep.warnings if "truncated at probe.max_tokens=4096" in w]


def test_fp4_served_probe_warns_with_the_fix(tmp_path: Path) -> None:
    lines: list[str] = []
    rep = run_probe(load_config(_cfg(tmp_path, None, _scenario(tmp_path, FP4))), echo=lines.append)
    out = "\n".join(lines)
    assert rep.ok and rep.provider == "DeepInfra" and rep.quantization == "fp4", out
    assert len(rep.warnings) == 1, out
    w = rep.warnings[0]
    assert "DeepInfra" in w and "fp4" in w, w
    assert "routing.ignore: [deepinfra/fp4]" in w and "routing.quantizations" in w, w
    assert f"! warning: {w}" in out
    assert lines[-1] == "probe OK with 1 warning"
    res = CliRunner().invoke(cli, ["probe", str(tmp_path / "cfg.yaml")])
    assert res.exit_code == 0, res.output
    assert res.output.rstrip().splitlines()[-1] == "probe OK with 1 warning"


def test_fp4_listed_in_routing_quantizations_is_allowed(tmp_path: Path) -> None:
    extra = _scenario(tmp_path, FP4) + "routing:\n  quantizations: [FP4, int4]\n"
    lines: list[str] = []
    rep = run_probe(load_config(_cfg(tmp_path, None, extra)), echo=lines.append)
    out = "\n".join(lines)
    assert rep.ok and rep.quantization == "fp4", out
    assert rep.warnings == [] and lines[-1] == "probe OK", out


def test_served_by_warns_when_fp4_may_have_run(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, "http://127.0.0.1:9/api/v1"))
    eps = [EndpointInfo(provider_name="Baseten", tag="baseten/fp4", quantization="fp4"),
           EndpointInfo(provider_name="Baseten", tag="baseten/fp8", quantization="fp8"),
           EndpointInfo(provider_name="Chutes", tag="chutes/nvfp4", quantization="nvfp4")]
    probe = _Probe(cfg, lambda s: None)
    probe.served_by(Completion(backend="openrouter", provider="Baseten"), eps)
    assert probe.rep.errors == [] and len(probe.rep.warnings) == 1
    assert "which one ran is unknown" in probe.rep.warnings[0]
    assert "routing.ignore: [baseten/fp4]" in probe.rep.warnings[0]
    nv = _Probe(cfg, lambda s: None)
    nv.served_by(Completion(backend="openrouter", provider="Chutes"), eps)
    assert len(nv.rep.warnings) == 1 and "nvfp4" in nv.rep.warnings[0] and "Chutes" in nv.rep.warnings[0]
    fp8 = _Probe(cfg, lambda s: None)
    fp8.served_by(Completion(backend="openrouter", provider="baseten/fp8"), eps)
    assert fp8.rep.warnings == [] and fp8.rep.quantization == "fp8"


def test_probe_lists_every_problem_in_one_pass(tmp_path: Path, emulator: RunningEmulator,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The rehearsal: a tokenizer that cannot load, no key, and a Kimi model id under the Qwen3 profile.
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    data = config_dict(tmp_path, ["a"], endpoint={"kind": "openrouter", "base_url": emulator.base_url},
                       model={"id": "moonshotai/kimi-k2.5", "profile": "qwen3", "tokenizer": "./nope"})
    lines: list[str] = []
    rep = run_probe(load_config(write_config(tmp_path, data)), echo=lines.append)
    out = "\n".join(lines)
    assert not rep.ok and len(rep.errors) == 2, out
    assert "tokenizer folder not found" in rep.errors[0] and "no API key: set OPENROUTER_API_KEY" in rep.errors[1]
    assert len(rep.warnings) == 1 and "does not look like a model of profile 'qwen3'" in rep.warnings[0]
    assert "kimi-k2.5" in rep.warnings[0].split("for this model:")[1]
    assert rep.endpoints and rep.eligible_endpoints  # what needs no key was still checked
    assert "request" in out and "not sent" in out
    assert out.rstrip().endswith("probe FAILED (2 problems)")


def test_the_probe_says_what_it_is_waiting_for() -> None:
    """While its request is out, probe echoes a line every few seconds: nothing yet, then what has streamed."""
    import asyncio
    import time

    from draftgen.backends import Completion, WireMeter
    from draftgen.phases.probe.run import wait_with_progress

    meter = WireMeter()
    lines: list[str] = []

    async def slow_answer() -> Completion:
        await asyncio.sleep(0.25)
        meter.data(400, 0, time.monotonic(), "Chutes")  # 100 tokens arrive
        await asyncio.sleep(0.2)
        return Completion(backend="openai", content="Hi.", finish_reason="stop")

    comp = asyncio.run(wait_with_progress(slow_answer(), meter, lines.append, every_s=0.1))
    assert comp.content == "Hi."
    assert lines and "no data yet" in lines[0]
    assert any("~100 tokens streamed so far from Chutes" in line for line in lines[2:])
