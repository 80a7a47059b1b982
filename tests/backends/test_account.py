"""``account.read_account`` against the emulator: one set of rules for generate, plan and probe.

A valid key gives key, credits, endpoints and routed prices; a rejected API key raises AuthError; a failed
``/credits`` or endpoint list is a reason in the snapshot, never raised; a backend without the account or
prices capability (vLLM, SGLang) is not asked at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftgen.backends.account import AccountSnapshot, read_account_at
from draftgen.config import RunConfig, load_config
from draftgen.emulator.scenarios import builtin_scenario
from draftgen.emulator.server import EmulatorOptions, RunningEmulator, start_in_thread
from draftgen.errors import AuthError, ConfigError

MGMT = "sk-or-mgmt-account-test"


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(port=0, management_key=MGMT, credits=42.0)) as e:
        yield e


def _cfg(tmp_path: Path, base_url: str, *, kind: str = "emulator", key: str = "sk-or-v1-test",
         model: str = "qwen/qwen3-8b", extra: str = "") -> RunConfig:
    (tmp_path / "key").write_text(key, encoding="utf-8")
    text = (f"endpoint:\n  kind: {kind}\n  base_url: {base_url}\n  api_key_file: key\n"
            "  management_key_env: DRAFTGEN_TEST_ACCOUNT_MGMT\n"
            f"model: {{id: {model}}}\n" + extra + "datasets:\n  - name: a\n    path: a.jsonl\n")
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    return load_config(tmp_path / "c.yaml")


def _read(cfg: RunConfig) -> AccountSnapshot:
    return asyncio.run(read_account_at(cfg))


def test_valid_key_reads_everything(tmp_path: Path, emu: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_TEST_ACCOUNT_MGMT", MGMT)
    snap = _read(_cfg(tmp_path, emu.base_url))
    assert snap.has_account and snap.has_prices and snap.management_key
    assert snap.key is not None and snap.key_error is None
    assert snap.credits is not None and snap.credits_error is None and snap.credits.total_credits == 42.0
    assert snap.endpoints and snap.endpoints_error is None
    assert snap.prices is not None and snap.prices.completion > 0 and snap.priced_over
    assert snap.prices_missing("qwen/qwen3-8b") is None
    assert snap.remaining is not None and snap.remaining <= 42.0
    # no management key: credits are not asked for, and that is no error
    monkeypatch.delenv("DRAFTGEN_TEST_ACCOUNT_MGMT")
    snap = _read(_cfg(tmp_path, emu.base_url))
    assert not snap.management_key and snap.credits is None and snap.credits_error is None


def test_rejected_key_raises_auth_error(tmp_path: Path) -> None:
    with (start_in_thread(EmulatorOptions(port=0, api_key="sk-or-v1-the-right-one")) as e,
          pytest.raises(AuthError, match="rejected")):
        _read(_cfg(tmp_path, e.base_url, key="sk-or-v1-wrong"))


def test_credits_failure_is_a_reason(tmp_path: Path, emu: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    # a management key that is not one: /credits answers 403; a rejected one 401. Neither is raised.
    for mgmt in ("sk-or-v1-not-a-management-key", "bogus"):
        monkeypatch.setenv("DRAFTGEN_TEST_ACCOUNT_MGMT", mgmt)
        snap = _read(_cfg(tmp_path, emu.base_url))
        assert snap.management_key and snap.credits is None
        assert snap.credits_error and mgmt not in snap.credits_error
        assert snap.key is not None and snap.prices is not None  # the rest is read all the same


def test_an_unknown_model_is_a_config_error_naming_model_id(tmp_path: Path) -> None:
    # A model id it does not list is OpenRouter's 404 (model_not_found): every request would fail the same
    # way, so it is raised (plan and run stop, exit 2), never a reason to plan around (issue 34).
    sc = builtin_scenario("fast")
    with start_in_thread(EmulatorOptions(port=0, scenario_obj=sc)) as e, \
            pytest.raises(ConfigError, match=r"model.id 'nobody/no-such-model' is not a model .*check model.id"):
        _read(_cfg(tmp_path, e.base_url, model="nobody/no-such-model"))


def test_routing_that_excludes_everything_prices_over_all(tmp_path: Path, emu: RunningEmulator) -> None:
    snap = _read(_cfg(tmp_path, emu.base_url, extra="routing: {only: [nobody]}\n"))
    # generate.routed_prices falls back to every endpoint when the filters leave none (worst case)
    assert snap.endpoints and snap.prices is not None and len(snap.priced_over) == len(snap.endpoints)


@pytest.mark.parametrize("kind", ["vllm", "sglang", "openai"])
def test_backend_without_account_is_not_asked(tmp_path: Path, emu: RunningEmulator, kind: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTGEN_TEST_ACCOUNT_MGMT", MGMT)
    url = {"vllm": emu.root_url + "/v1", "sglang": emu.root_url, "openai": emu.base_url}[kind]
    snap = _read(_cfg(tmp_path, url, kind=kind))
    assert not snap.has_account and not snap.has_prices
    assert snap == AccountSnapshot(backend=snap.backend)  # nothing read, nothing failed
    assert snap.remaining is None
    assert snap.prices_missing("qwen/qwen3-8b") == f"the {snap.backend} endpoint publishes no prices"
