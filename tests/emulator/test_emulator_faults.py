"""Every fault kind as a plain HTTP client sees it; fallbacks; reproducible chaos; retries that succeed."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from _emulator_helpers import Reply, chat, chat_body, parse_sse
from draftgen.emulator import EmulatorOptions, Provider, builtin_scenario, start_in_thread
from draftgen.emulator.core import shared_profile
from draftgen.emulator.scenarios import BOUND_FAULT_KINDS, FAULT_KINDS
from draftgen.emulator.server import RunningEmulator

BROKEN_CONNECTION = (ConnectionError, http.client.HTTPException, TimeoutError)


def _faulty(kind: str) -> Provider:
    return Provider("Faulty", "faulty/int4", "int4", 0.5, 2.0, faults={kind: 1.0}, retry_after_s=3.0)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RunningEmulator]]:
    """One single-provider server per fault kind (each fails every request with that kind)."""
    running: dict[str, RunningEmulator] = {}
    try:
        for kind in FAULT_KINDS:
            sc = builtin_scenario("fast").replace(providers=[_faulty(kind)], time_scale=0.01, edge_timeout_s=10.0,
                                                  hang_s=30.0)
            running[kind] = start_in_thread(EmulatorOptions(scenario_obj=sc))
        yield running
    finally:
        for e in running.values():
            e.stop()


def _call(e: RunningEmulator, stream: bool) -> Reply:
    return chat(e.base_url, chat_body("fault", stream=stream, max_tokens=400), timeout=1.0)


@pytest.mark.parametrize("stream", [False, True])
def test_rate_limit_and_unavailable_carry_retry_after(servers: dict[str, RunningEmulator], stream: bool) -> None:
    for kind, status, code, etype in (("rate_limit", 429, "capacity_exhausted", "rate_limit_exceeded"),
                                      ("unavailable", 503, "temporarily_unavailable", "provider_overloaded")):
        r = _call(servers[kind], stream)
        assert r.status == status and r.headers["retry-after"] == "0.030"  # 3 s on a 0.01 clock
        err = r.json()["error"]
        assert err["code"] == status and err["metadata"]["error_type"] == etype
        assert err["metadata"]["provider_name"] == "Faulty"
        av = err["availability"]
        assert av["code"] == code and av["retryable"] is True and av["retry_after"] == pytest.approx(0.03)
        assert r.json()["user_id"]


def test_server_error_legacy_raw_and_cloudflare(servers: dict[str, RunningEmulator]) -> None:
    r = _call(servers["server_error"], False)
    assert r.status == 502 and r.json()["error"]["metadata"]["error_type"] == "provider_unavailable"
    r = _call(servers["legacy_raw"], False)
    err = r.json()["error"]
    assert r.status == 429 and err["message"] == "Provider returned error" and err["code"] == 429
    meta = err["metadata"]
    assert isinstance(meta["raw"], str) and meta["provider_name"] == "Faulty" and "error_type" not in meta
    assert meta["limit_source"] == "upstream_provider_shared_pool"
    r = _call(servers["cloudflare_1015"], True)
    assert r.status == 429 and r.body == b"error code: 1015" and r.headers["content-type"].startswith("text/plain")


def test_edge_timeout_is_a_late_524(servers: dict[str, RunningEmulator]) -> None:
    r = _call(servers["edge_timeout"], False)
    assert r.status == 524 and r.body == b"error code: 524"


def test_errors_inside_200_bodies(servers: dict[str, RunningEmulator]) -> None:
    r = _call(servers["error_in_200"], False)
    assert r.status == 200 and "choices" not in r.json() and r.json()["error"]["code"] in (429, 502)
    r = _call(servers["error_in_200_choices"], False)
    b = r.json()
    assert r.status == 200 and b["error"] and b["choices"][0]["finish_reason"] == "error"
    r = _call(servers["finish_error"], False)
    b = r.json()
    ch = b["choices"][0]
    assert r.status == 200 and "error" not in b and ch["finish_reason"] == "error" and ch["error"]["code"]
    assert ch["message"]["reasoning"] or ch["message"]["content"]  # partial output came back
    assert b["usage"]["completion_tokens"] == 0  # not billed


def test_errors_inside_200_streams(servers: dict[str, RunningEmulator]) -> None:
    s = parse_sse(_call(servers["error_in_200"], True).body)
    assert not s.done and "error" in s.events[-1] and "choices" not in s.events[-1]
    s = parse_sse(_call(servers["error_in_200_choices"], True).body)
    assert not s.done and s.events[-1]["error"] and s.finish_reasons == ["error"]


@pytest.mark.parametrize("kind", ["midstream_error", "finish_error"])
def test_midstream_error_chunk_after_partial_output(servers: dict[str, RunningEmulator], kind: str) -> None:
    r = _call(servers[kind], True)
    s = parse_sse(r.body)
    assert r.status == 200 and not s.done and s.finish_reasons == ["error"]
    assert s.text("reasoning") or s.text("content")
    last = s.events[-1]
    assert last["error"]["code"] in (429, 502) and last["error"]["metadata"]["error_type"]


@pytest.mark.parametrize("stream", [False, True])
def test_empty_200(servers: dict[str, RunningEmulator], stream: bool) -> None:
    r = _call(servers["empty_200"], stream)
    assert r.status == 200
    if stream:
        s = parse_sse(r.body)
        assert s.done and s.text("content") == "" and s.usage and s.usage["completion_tokens"] == 0
        assert s.finish_reasons == ["stop"]
    else:
        b = r.json()
        assert b["choices"][0]["message"]["content"] is None and b["usage"]["completion_tokens"] == 0
        assert b["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_hang_trips_the_client_idle_timeout(servers: dict[str, RunningEmulator], stream: bool) -> None:
    e = servers["hang"]
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=0.5)
    body = chat_body("hang", stream=stream)
    try:
        conn.request("POST", "/api/v1/chat/completions", body=json.dumps(body),
                     headers={"Authorization": "Bearer sk-or-x", "Content-Type": "application/json"})
        with pytest.raises(TimeoutError):
            r = conn.getresponse()  # non-streamed: no headers ever arrive
            assert stream and r.status == 200  # streamed: headers and some output, then silence
            got = b""
            while True:
                part = r.read1(65536)
                assert part and b"[DONE]" not in got + part  # neither closed nor finished: silent
                got += part
    finally:
        conn.close()


@pytest.mark.parametrize("stream", [False, True])
def test_reset_breaks_the_connection(servers: dict[str, RunningEmulator], stream: bool) -> None:
    with pytest.raises(BROKEN_CONNECTION):
        r = _call(servers["reset"], stream)
        if stream:
            assert b"[DONE]" in r.body  # a stream cut short never gets here


def test_fallback_hides_provider_errors_unless_disabled() -> None:
    bad = Provider("Bad", "bad/int4", "int4", 0.1, 0.5, faults={"rate_limit": 1.0})
    good = Provider("Good", "good/fp8", "fp8", 1.0, 4.0)
    sc = builtin_scenario("fast").replace(providers=[bad, good])
    with start_in_thread(EmulatorOptions(scenario_obj=sc)) as e:
        for i in range(5):
            r = chat(e.base_url, chat_body(f"fb {i}", provider={"sort": "price"}))
            assert r.status == 200 and r.json()["provider"] == "Good"
        assert e.state.by_fault["rate_limit"] == 5 and e.state.by_provider["Good"] == 5
        r = chat(e.base_url, chat_body("nofb", provider={"order": ["bad"], "allow_fallbacks": False}))
        assert r.status == 429


def test_retries_eventually_succeed() -> None:
    sc = builtin_scenario("fast").replace(providers=[_faulty("unavailable")], max_faulty_attempts=3, time_scale=0.0)
    with start_in_thread(EmulatorOptions(scenario_obj=sc)) as e:
        statuses = [chat(e.base_url, chat_body("retry me")).status for _ in range(5)]
        assert statuses == [503, 503, 503, 200, 200]


def _fingerprint(r: Reply | BaseException) -> tuple[Any, ...]:
    if isinstance(r, BaseException):
        return ("broken",)
    return (r.status, hashlib.sha256(_strip_ids(r.body)).hexdigest()[:12])


def _strip_ids(body: bytes) -> bytes:
    # Keep-alive comments and body padding are sent while waiting: their count depends on timing.
    body = re.sub(rb": OPENROUTER PROCESSING\n\n", b"", body).lstrip(b"\n ")
    return re.sub(rb'"(id|created)":("gen-[^"]+"|\d+)', b"", body)


def test_chaos_is_reproducible_with_a_fixed_seed_and_hits_many_kinds() -> None:
    shared_profile("qwen3", "bundled:qwen3").tokenizer.bytes_to_id  # noqa: B018 - warm up outside the timeouts

    def run(seed: int) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
        sc = builtin_scenario("chaos").replace(time_scale=0.001, hang_s=30.0)
        with start_in_thread(EmulatorOptions(scenario_obj=sc, seed=seed)) as e:
            out: list[tuple[Any, ...]] = []
            for i in range(45):
                try:
                    r: Reply | BaseException = chat(e.base_url, chat_body(f"chaos {i % 15}", stream=i % 3 == 0,
                                                                          max_tokens=200), timeout=0.8)
                except BROKEN_CONNECTION as exc:
                    r = exc
                out.append(_fingerprint(r))
            return out, dict(e.state.by_fault)
    a, faults = run(5)
    b, _ = run(5)
    c, _ = run(6)
    assert a == b and a != c
    assert len(faults) >= 5 and sum(1 for f in a if f[0] == 200) >= 8


# -- faults that test a client's bounds (never drawn by the built-ins) ------------------------------------


def _read_for(e: RunningEmulator, stream: bool, seconds: float) -> tuple[int, bytes]:
    """Status and whatever body arrives within ``seconds`` (these responses never end on their own)."""
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=seconds)
    got = b""
    try:
        conn.request("POST", "/api/v1/chat/completions", body=json.dumps(chat_body("bounds", stream=stream)),
                     headers={"Authorization": "Bearer sk-or-x", "Content-Type": "application/json"})
        r = conn.getresponse()
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end and (part := r.read1(65536)):
                got += part
        except TimeoutError:
            pass
        return r.status, got
    finally:
        conn.close()


def _bound_server(**provider: Any) -> RunningEmulator:
    p = Provider("Faulty", "faulty/int4", "int4", 0.5, 2.0, **provider)
    sc = builtin_scenario("fast").replace(providers=[p], keepalive_s=0.02, hang_s=30.0)
    return start_in_thread(EmulatorOptions(scenario_obj=sc))


def test_bound_faults_are_valid_but_not_in_chaos() -> None:
    assert set(BOUND_FAULT_KINDS).isdisjoint(FAULT_KINDS)
    assert {k for p in builtin_scenario("chaos").providers for k in p.faults}.isdisjoint(BOUND_FAULT_KINDS)
    for kind in BOUND_FAULT_KINDS:
        builtin_scenario("fast").replace(providers=[_faulty(kind)]).validate()


@pytest.mark.parametrize("stream", [True, False])
def test_keepalive_only_and_trickle_never_finish(stream: bool) -> None:
    with _bound_server(faults={"keepalive_only": 1.0}) as e:
        status, body = _read_for(e, stream, 0.5)
    assert status == 200
    if stream:
        s = parse_sse(body)
        assert len(s.comments) >= 5 and not s.events and not s.done  # keep-alives only, no data
    else:
        assert body and not body.strip()  # blank-line padding only
    with _bound_server(faults={"trickle": 1.0}) as e:
        status, body = _read_for(e, stream, 0.5)
    assert status == 200
    if stream:
        s = parse_sse(body)
        assert len(s.events) >= 5 and not s.done and s.text("content") == "" and not s.finish_reasons
    else:
        assert body and not body.strip()


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("ids", [True, False])
def test_huge_body_carries_far_more_than_max_tokens_billed_5(stream: bool, ids: bool) -> None:
    with _bound_server(faults={"huge_body": 1.0}, huge_body_bytes=2_000_000, huge_body_ids=ids) as e:
        r = chat(e.base_url, chat_body("huge", stream=stream, max_tokens=256))
        spent = e.state.spend_usd
    assert r.status == 200 and len(r.body) >= 2_000_000
    if stream:
        s = parse_sse(r.body)
        assert s.done and s.usage is not None and s.usage["completion_tokens"] == 5
        n_ids = sum(len(ch.get("token_ids") or ()) for ev in s.events for ch in ev.get("choices") or [])
        text = s.text("content")
    else:
        b = r.json()
        assert b["usage"]["completion_tokens"] == 5
        n_ids = len(b["choices"][0].get("token_ids") or ())
        text = b["choices"][0]["message"]["content"]
    assert (n_ids > 200_000) if ids else (n_ids == 0 and len(text) > 1_900_000)
    assert spent == 0.0  # a fault is not billed


@pytest.mark.parametrize("stream", [True, False])
def test_omit_cost_sends_usage_without_cost(stream: bool) -> None:
    with _bound_server(omit_cost=True) as e:
        r = chat(e.base_url, chat_body("no cost", stream=stream, max_tokens=64))
        billed = e.state.spend_usd
    usage = parse_sse(r.body).usage if stream else r.json()["usage"]
    assert usage is not None and usage["completion_tokens"] > 0
    assert "cost" not in usage and "cost_details" not in usage
    assert billed > 0  # the emulator still bills it


def test_per_request_ignore_lands_elsewhere_and_a_misrouting_provider_ignores_it() -> None:
    dropper = Provider("Dropper", "dropper/int4", "int4", 0.1, 0.5, drop_reasoning=True)
    good = Provider("Good", "good/fp8", "fp8", 1.0, 4.0)
    with start_in_thread(EmulatorOptions(scenario_obj=builtin_scenario("fast").replace(providers=[dropper, good]))) as e:
        for i in range(5):
            first = chat(e.base_url, chat_body(f"drop {i}", provider={"order": ["dropper"]})).json()
            assert first["provider"] == "Dropper" and first["choices"][0]["message"]["reasoning"] is None
            assert first["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
            # The same prompt again, with the dropper in this request's ignore list: served elsewhere, whole.
            again = chat(e.base_url, chat_body(f"drop {i}", provider={"order": ["dropper"], "ignore": ["Dropper"]}))
            body = again.json()
            assert body["provider"] == "Good" and body["choices"][0]["message"]["reasoning"]
    rogue = Provider("Rogue", "rogue/int4", "int4", 0.1, 0.5, ignores_routing=0.5)
    with start_in_thread(EmulatorOptions(scenario_obj=builtin_scenario("fast").replace(providers=[rogue, good]))) as e:
        served = [chat(e.base_url, chat_body(f"route {i}", max_tokens=64, provider={"ignore": ["rogue"]})).json()["provider"]
                  for i in range(40)]
        assert set(served) == {"Rogue", "Good"} and 8 <= served.count("Rogue") <= 32
        only = [chat(e.base_url, chat_body(f"q {i}", max_tokens=64, provider={"quantizations": ["fp8"]})).json()["provider"]
                for i in range(20)]
        assert "Rogue" in only  # a quantization filter is ignored the same way
