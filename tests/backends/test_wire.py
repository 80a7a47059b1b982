from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from draftgen.backends.base import Completion, CompletionRequest, token_limit
from draftgen.backends.http import Bounds, make_session
from draftgen.backends.openrouter import OpenAIChatBackend, decode_endpoints
from draftgen.backends.wire import check_completion, completion_from_body, decode_chat
from draftgen.config import RetryConfig
from draftgen.emulator import EmulatorOptions, Provider, builtin_scenario, start_in_thread
from draftgen.engine import RetryPolicy
from draftgen.errors import (
    APIError,
    RateLimited,
    RetryableAPIError,
)
from draftgen.records import Message, Usage


def test_errors_inside_200_bodies() -> None:
    bare = decode_chat(json.dumps({"error": {"code": 429, "message": "rate limited in a 200"}}).encode())
    with pytest.raises(RateLimited):
        completion_from_body(bare, backend="openrouter")
    choice_err = decode_chat(json.dumps({
        "id": "g", "provider": "Chutes",
        "choices": [{"index": 0, "finish_reason": "error", "message": {"content": "partial"},
                     "error": {"code": "server_error", "message": "upstream died"}}],
    }).encode())
    with pytest.raises(RetryableAPIError) as ei:
        completion_from_body(choice_err, backend="openrouter")
    assert ei.value.kind == "server_error" and "Chutes" in str(ei.value)
    with pytest.raises(RetryableAPIError):
        completion_from_body(decode_chat(b'{"id": "g", "choices": []}'), backend="openrouter")


def test_blank_line_padded_json_and_garbage() -> None:
    body = b"\n         \n\n" + json.dumps({
        "id": "gen-1", "provider": "Chutes", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "native_finish_reason": "stop",
                     "message": {"role": "assistant", "content": " The answer", "reasoning": " thinking",
                                 "reasoning_details": [{"type": "reasoning.text", "text": " thinking"}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 2},
                  "prompt_tokens_details": {"cached_tokens": 3}, "cost": 0.5, "is_byok": True,
                  "cost_details": {"upstream_inference_cost": 0.25}},
    }).encode()
    comp = completion_from_body(decode_chat(body), backend="openrouter")
    assert comp.content == " The answer" and comp.reasoning == " thinking" and comp.reasoning_field == "reasoning"
    assert comp.usage == Usage(prompt_tokens=10, completion_tokens=4, reasoning_tokens=2, cached_tokens=3, cost=0.5,
                               is_byok=True, upstream_cost=0.25)
    with pytest.raises(RetryableAPIError) as ei:
        decode_chat(b"<html>bad gateway</html>")
    assert ei.value.kind == "bad_json"


def test_check_completion_rejects_empty_and_finish_error() -> None:
    with pytest.raises(RetryableAPIError) as ei:
        check_completion(Completion(backend="openrouter", content=None, finish_reason="stop", usage=Usage()))
    assert ei.value.kind == "empty_response"
    with pytest.raises(RetryableAPIError) as ei:
        check_completion(Completion(backend="openrouter", content="part", finish_reason="error"))
    assert ei.value.kind == "finish_error"
    # hidden reasoning: no text but billed tokens and a finish reason: a valid (flagged later) record
    ok = Completion(backend="openrouter", content="", finish_reason="length",
                    usage=Usage(completion_tokens=50, reasoning_tokens=50))
    assert check_completion(ok) is ok


def test_decode_endpoints_parses_string_prices() -> None:
    body = json.dumps({"data": {"id": "m", "endpoints": [
        {"provider_name": "DeepInfra", "tag": "deepinfra/fp4", "quantization": "fp4",
         "pricing": {"prompt": "0.00000045", "completion": "0.00000225", "request": "0"}, "status": 0},
    ]}}).encode()
    eps = decode_endpoints(body)
    assert eps[0].pricing.completion == pytest.approx(2.25e-6) and eps[0].tag == "deepinfra/fp4"


def test_missing_usage_cost_is_flagged_not_guessed() -> None:
    body = b'{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
    comp = completion_from_body(decode_chat(body), backend="openai")
    assert comp.cost_missing and comp.usage is not None and comp.usage.cost == 0.0
    priced = completion_from_body(decode_chat(body.replace(b'"completion_tokens":1', b'"completion_tokens":1,"cost":0.5')),
                                  backend="openrouter")
    assert not priced.cost_missing and priced.usage is not None and priced.usage.cost == 0.5


def test_bounds_follow_max_tokens_unless_set() -> None:
    b = Bounds(connect_timeout_s=30.0, idle_timeout_s=180.0, slow_tokens_per_s=5.0)
    assert b.deadline_s(10_240) == pytest.approx(30 + 180 + 2048)
    assert b.deadline_s(256) == pytest.approx(30 + 180 + 51.2)
    assert Bounds(request_timeout_s=12.0).deadline_s(10_240) == 12.0
    assert b.body_cap(256) == 2 * 1024 * 1024  # 1 MiB + 4 KiB per token
    assert b.body_cap(16_384) == 1024 * 1024 + 16_384 * 4096
    assert Bounds(max_body_bytes=1000).body_cap(10**6) == 1000
    assert token_limit(256) == 272 and token_limit(10_240) == 10_343  # + max(16, 1 %)


def _bounded_call(kind: str | None, *, stream: bool, bounds: Bounds, **provider: Any) -> tuple[float, Any]:
    """One request through the real backend to an emulator whose only provider always has ``kind``."""
    p = Provider("F", "f/int4", "int4", 0.5, 2.0, faults={kind: 1.0} if kind else {}, **provider)
    sc = builtin_scenario("fast").replace(providers=[p], keepalive_s=0.02, hang_s=30.0)

    async def go(url: str) -> Any:
        session = make_session(api_key="sk-or-x", connections=2, connect_timeout_s=bounds.connect_timeout_s,
                               idle_timeout_s=bounds.idle_timeout_s)
        be = OpenAIChatBackend(session, url, model="qwen/qwen3-8b", stream=stream, openrouter=True, bounds=bounds)
        try:
            return await be.complete(CompletionRequest(sample_id="s", messages=[Message(role="user", content="hi")],
                                                       max_tokens=256))
        except APIError as exc:
            return exc
        finally:
            await be.aclose()

    with start_in_thread(EmulatorOptions(scenario_obj=sc)) as emu:
        t0 = time.monotonic()
        got = asyncio.run(go(emu.base_url))
        return time.monotonic() - t0, got


def test_keepalive_comments_do_not_reset_the_idle_timeout() -> None:
    took, exc = _bounded_call("keepalive_only", stream=True, bounds=Bounds(idle_timeout_s=0.4))
    assert isinstance(exc, RetryableAPIError) and exc.kind == "idle_timeout" and took < 3.0
    assert "keep-alive comments do not count" in str(exc) and "\n" not in str(exc)


@pytest.mark.parametrize("stream", [True, False])
def test_every_request_has_a_total_deadline(stream: bool) -> None:
    # Data (or padding) every 20 ms for 30 s: only the deadline ends it.
    took, exc = _bounded_call("trickle", stream=stream, bounds=Bounds(idle_timeout_s=0.4, request_timeout_s=0.8))
    assert isinstance(exc, RetryableAPIError) and exc.kind == "request_timeout" and 0.7 < took < 3.0


@pytest.mark.parametrize("stream", [True, False])
def test_a_body_over_the_cap_is_refused_as_soon_as_it_passes(stream: bool) -> None:
    took, exc = _bounded_call("huge_body", stream=stream, bounds=Bounds(), huge_body_bytes=20_000_000)
    assert isinstance(exc, RetryableAPIError) and exc.kind == "body_too_large" and took < 5.0
    assert "2,097,152 bytes" in str(exc)
    if not stream:
        assert "Content-Length" in str(exc)  # refused before reading it


def test_a_day_long_retry_after_reaches_the_policy_which_caps_it() -> None:
    _, exc = _bounded_call("rate_limit", stream=True, bounds=Bounds(), retry_after_s=86400.0)
    assert isinstance(exc, RateLimited) and exc.retry_after == 3600.0
    pol = RetryPolicy(RetryConfig(max_delay_s=60.0))
    assert 54.0 <= pol.delay(1, exc.retry_after) <= 60.0


SPEC = {"mean_acceptance_length": 1.25, "draft_acceptance_rate": 0.0833, "acceptance_histogram": [3, 1, 0, 0],
        "num_spec_steps": 4, "num_accepted_draft_tokens": 1, "num_draft_tokens": 12, "num_spec_tokens": 3}


def test_per_request_spec_decode_metrics_are_read_or_flagged() -> None:
    """vLLM's ``metrics.speculative_decoding`` (PR #48915) lands typed on the completion; one of another shape
    is None with the flag ``spec_decode_unreadable``; none sent is None, unflagged."""
    base = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
    comp = completion_from_body(decode_chat(json.dumps({**base, "metrics": {"speculative_decoding": SPEC}}).encode()),
                                backend="vllm")
    assert comp.spec_decode is not None and comp.spec_decode.acceptance_histogram == [3, 1, 0, 0]
    assert comp.spec_decode.num_spec_steps == 4 and "spec_decode_unreadable" not in comp.flags
    odd = {**SPEC, "num_spec_steps": "four"}
    bad = completion_from_body(decode_chat(json.dumps({**base, "metrics": {"speculative_decoding": odd}}).encode()),
                               backend="vllm")
    assert bad.spec_decode is None and "spec_decode_unreadable" in bad.flags
    plain = completion_from_body(decode_chat(json.dumps({**base, "metrics": {"timing": 1}}).encode()), backend="vllm")
    assert plain.spec_decode is None and "spec_decode_unreadable" not in plain.flags
