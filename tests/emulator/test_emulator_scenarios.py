"""Scenarios (built-ins, YAML, Python API) and provider routing rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftgen.emulator.envelopes import ApiError
from draftgen.emulator.routing import ProviderPrefs, parse_prefs, route
from draftgen.emulator.scenarios import FAULT_KINDS, Provider, builtin_scenario, load_scenario
from draftgen.errors import ConfigError


def test_builtins_load_and_chaos_covers_every_fault_kind() -> None:
    fast, realistic, chaos = (load_scenario(n) for n in ("fast", "realistic", "chaos"))
    assert all(p.fault_total == 0 and p.ttft_s == (0.0, 0.0) for p in fast.providers)
    assert all(p.fault_total < 0.05 for p in realistic.providers)
    assert {k for p in chaos.providers for k in p.faults} == set(FAULT_KINDS)
    assert chaos.time_scale < 1 and chaos.max_faulty_attempts is not None
    fp4 = [p for p in realistic.providers if p.quantization == "fp4"]
    int4 = [p for p in realistic.providers if p.quantization == "int4"]
    assert min(p.tokens_per_s[0] for p in fp4) >= 150 and max(p.tokens_per_s[1] for p in int4) <= 70


def test_python_api_changes_one_provider_only() -> None:
    sc = builtin_scenario("fast").with_provider("chutes", faults={"rate_limit": 0.5}, retry_after_s=0.1)
    assert sc.provider("chutes/int4").faults == {"rate_limit": 0.5}
    assert builtin_scenario("fast").provider("Chutes").faults == {}
    assert sc.provider("deepinfra").fault_total == 0


def test_yaml_scenario_with_base_and_providers(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text(
        "base: realistic\ntime_scale: 0.01\nproviders:\n"
        "  - {name: Solo, tag: solo/fp8, quantization: fp8, price_prompt: 1, price_completion: 4,\n"
        "     ttft_s: [0.5, 1], tokens_per_s: [100, 200], faults: {rate_limit: 0.25, reset: 0.1}}\n",
        encoding="utf-8")
    sc = load_scenario(str(f))
    assert sc.name == "mine" and sc.time_scale == 0.01 and sc.pool_size == 1024  # base kept
    (p,) = sc.providers
    assert p.ttft_s == (0.5, 1.0) and p.faults == {"rate_limit": 0.25, "reset": 0.1}


@pytest.mark.parametrize("text, needle", [
    ("time_scal: 1\n", "time_scal: unknown key"),
    ("providers:\n  - {name: A, tag: a, faults: {explode: 0.1}}\n", "unknown fault kind"),
    ("providers:\n  - {name: A, tag: a, faults: {reset: 0.8, hang: 0.8}}\n", "add up to"),
    ("providers:\n  - {name: A, tag: a, ttft_s: fast}\n", "ttft_s"),
])
def test_bad_yaml_scenarios_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=needle):
        load_scenario(str(f))


def test_unknown_scenario_name() -> None:
    with pytest.raises(ConfigError, match="fast, realistic, chaos"):
        load_scenario("nope")


# -- routing ---------------------------------------------------------------------------------------

PROVIDERS = [
    Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, ttft_s=(0.3, 1.0), tokens_per_s=(150, 250),
             supports_logprobs=True),
    Provider("DeepInfra Turbo", "deepinfra/turbo", "fp8", 0.60, 3.00, ttft_s=(0.2, 0.4), tokens_per_s=(300, 400)),
    Provider("Chutes", "chutes/int4", "int4", 0.44, 2.00, ttft_s=(1, 8), tokens_per_s=(20, 70)),
    Provider("Moonshot AI", "moonshotai/int4", "int4", 0.60, 3.00, ttft_s=(1, 4), tokens_per_s=(30, 60),
             unsupported_parameters=("temperature", "top_p")),
]


def _route(prefs: dict[str, object] | None, used: set[str] | None = None, u: float = 0.3) -> list[str]:
    p = parse_prefs(prefs)
    assert isinstance(p, ProviderPrefs)
    out = route(PROVIDERS, p, used or set(), u, "m")
    assert not isinstance(out, ApiError), out
    return [x.tag for x in out]


def test_ignored_provider_never_chosen_and_base_slug_matches_variants() -> None:
    for i in range(200):
        tags = _route({"ignore": ["deepinfra"]}, u=i / 200)
        assert not any(t.startswith("deepinfra") for t in tags)
    assert _route({"only": ["deepinfra"]}, u=0.99)[0].startswith("deepinfra")
    assert set(_route({"only": ["DeepInfra Turbo"]})) == {"deepinfra/turbo"}  # display name matches too
    assert set(_route({"only": ["deepinfra/fp4"]})) == {"deepinfra/fp4"}


def test_default_routing_prefers_cheap_providers() -> None:
    firsts = [_route(None, u=i / 400)[0] for i in range(400)]
    assert firsts.count("chutes/int4") > firsts.count("moonshotai/int4")
    assert len(set(firsts)) > 1  # load balanced, not pinned


def test_order_sort_and_fallbacks() -> None:
    assert _route({"order": ["moonshotai", "chutes"]})[:2] == ["moonshotai/int4", "chutes/int4"]
    assert _route({"order": ["moonshotai", "chutes"], "allow_fallbacks": False}) == ["moonshotai/int4", "chutes/int4"]
    assert _route({"allow_fallbacks": False}, u=0.0) == ["chutes/int4"]
    assert _route({"sort": "price"})[0] == "chutes/int4"
    assert _route({"sort": "throughput"})[0] == "deepinfra/turbo"
    assert _route({"sort": {"by": "latency"}})[0] == "deepinfra/turbo"
    assert _route({"quantizations": ["int4"]}, u=0.0)[0] in ("chutes/int4", "moonshotai/int4")
    assert set(_route({"max_price": {"completion": 2.5}})) == {"deepinfra/fp4", "chutes/int4"}


def test_no_provider_left_is_an_error() -> None:
    p = parse_prefs({"only": ["nobody"]})
    assert isinstance(p, ProviderPrefs)
    err = route(PROVIDERS, p, set(), 0.5, "m")
    assert isinstance(err, ApiError) and err.status == 503
    assert err.availability is not None and err.availability["retryable"] is False
    p = parse_prefs({"require_parameters": True, "only": ["moonshotai"]})
    assert isinstance(p, ProviderPrefs)
    err = route(PROVIDERS, p, {"temperature"}, 0.5, "m")
    assert isinstance(err, ApiError) and err.status == 404 and err.availability is not None
    assert err.availability["code"] == "no_endpoints"
    assert _route({"require_parameters": True}, {"logprobs"}) == ["deepinfra/fp4"]


def test_bad_provider_object_is_400() -> None:
    for bad in ({"order": "chutes"}, {"sort": "vibes"}, {"allow_fallbacks": "no"}, {"max_price": {"prompt": "one"}}):
        err = parse_prefs(bad)
        assert isinstance(err, ApiError) and err.status == 400
