from __future__ import annotations

import email.utils
import json
import time

import aiohttp
import pytest

from draftgen.backends.base import Completion
from draftgen.backends.wire import (
    check_completion,
    classify_http,
    completion_from_body,
    decode_chat,
    decode_endpoints,
    parse_retry_after,
    redact,
    translate_exception,
)
from draftgen.errors import (
    AuthError,
    ConfigError,
    PaymentRequired,
    PermanentAPIError,
    RateLimited,
    RetryableAPIError,
)
from draftgen.records import Usage


def _env(code: object, message: str = "m", **meta: object) -> bytes:
    err: dict[str, object] = {"code": code, "message": message}
    avail = meta.pop("availability", None)
    if meta:
        err["metadata"] = meta
    if avail is not None:
        err["availability"] = avail
    return json.dumps({"error": err, "user_id": "user_1"}).encode()


def test_auth_and_money() -> None:
    assert isinstance(classify_http(401, _env(401, "User not found.")), AuthError)
    e = classify_http(402, _env(402, "Insufficient credits"))
    assert isinstance(e, PaymentRequired) and e.kind == "payment_required"
    inflight = classify_http(402, _env(402, "in-flight budget", limit_source="openrouter_in_flight_budget"),
                             headers={"Retry-After": "3"})
    assert isinstance(inflight, RateLimited) and inflight.kind == "in_flight_budget" and inflight.retry_after == 3.0
    weight = classify_http(402, _env(402, "too big", availability={"code": "weight_exceeds_budget", "retryable": False}))
    assert isinstance(weight, PaymentRequired) and weight.kind == "weight_exceeds_budget"
    key_limit = classify_http(403, _env(403, "Key limit exceeded", limit_source="openrouter_key_limit"))
    assert isinstance(key_limit, PaymentRequired)


def test_permanent_errors() -> None:
    mod = classify_http(403, _env(403, "flagged", reasons=["violence"], provider_name="X"))
    assert isinstance(mod, PermanentAPIError) and not isinstance(mod, PaymentRequired)
    ctx = classify_http(400, _env(400, "too long", error_type="context_length_exceeded"))
    assert isinstance(ctx, PermanentAPIError) and ctx.kind == "context_length_exceeded"
    # vLLM's legacy top-level envelope; context length recognised from the message
    vllm = classify_http(400, b'{"object":"error","message":"This model\'s maximum context length is 4096 tokens","type":"BadRequestError","code":400}')
    assert isinstance(vllm, PermanentAPIError) and vllm.kind == "context_length_exceeded"
    assert isinstance(classify_http(404, b'{"error":{"message":"No endpoints found"}}'), PermanentAPIError)


def test_retryable_errors_and_retry_after() -> None:
    rl = classify_http(429, _env(429, "slow down", availability={"code": "capacity_exhausted", "retryable": True, "retry_after": 7}))
    assert isinstance(rl, RateLimited) and rl.retry_after == 7 and rl.kind == "capacity_exhausted"
    hdr = classify_http(429, _env(429, "slow down"), headers={"Retry-After": "2.5"})
    assert isinstance(hdr, RateLimited) and hdr.retry_after == 2.5
    una = classify_http(503, _env(503, "down", availability={"code": "temporarily_unavailable", "retryable": True}))
    assert isinstance(una, RetryableAPIError) and not isinstance(una, RateLimited)
    final = classify_http(503, _env(503, "gone", availability={"code": "no_endpoints", "retryable": False}))
    assert isinstance(final, PermanentAPIError) and final.kind == "no_endpoints"
    srv = classify_http(502, _env(502, "Provider returned error", error_type="provider_unavailable", provider_code="x"))
    assert isinstance(srv, RetryableAPIError) and srv.kind == "provider_unavailable"
    for status in (408, 500, 524, 529):
        assert isinstance(classify_http(status, b"error code: %d" % status), RetryableAPIError)


def test_legacy_metadata_raw_and_plain_text_1015() -> None:
    legacy = classify_http(429, _env(429, "Provider returned error", raw="moonshotai/kimi-k2.5 is temporarily rate-limited upstream",
                                     provider_name="BaseTen", limit_source="upstream_provider_shared_pool"))
    assert isinstance(legacy, RateLimited)
    assert "BaseTen" in str(legacy) and "rate-limited upstream" in str(legacy)
    cf = classify_http(429, b"error code: 1015")
    assert isinstance(cf, RateLimited) and cf.kind == "cloudflare_1015"
    html = classify_http(503, b"<html><body>error code: 1102</body></html>")
    assert isinstance(html, RetryableAPIError)
    raw_obj = classify_http(502, _env(502, "Provider returned error", raw={"upstream": "json object"}))
    assert "json object" in str(raw_obj)


def test_errors_inside_200_bodies() -> None:
    bare = decode_chat(_env(429, "rate limited in a 200"))
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


def test_parse_retry_after() -> None:
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    ra = parse_retry_after(when)
    assert ra is not None and 25 <= ra <= 31


def test_redact_and_no_key_in_messages() -> None:
    key = "sk-or-v1-" + "SECRET" * 3 + "0123456789"  # fake
    assert "SECRETSECRET" not in redact(f"bad key {key} and Bearer {key}")
    e = classify_http(401, _env(401, f"key {key} not found"))
    assert "SECRETSECRET" not in str(e)


def test_decode_endpoints_parses_string_prices() -> None:
    body = json.dumps({"data": {"id": "m", "endpoints": [
        {"provider_name": "DeepInfra", "tag": "deepinfra/fp4", "quantization": "fp4",
         "pricing": {"prompt": "0.00000045", "completion": "0.00000225", "request": "0"}, "status": 0},
    ]}}).encode()
    eps = decode_endpoints(body)
    assert eps[0].pricing.completion == pytest.approx(2.25e-6) and eps[0].tag == "deepinfra/fp4"


class _Key:
    def __init__(self) -> None:
        self.ssl = None
        self.host, self.port, self.is_ssl = "h", 1, False


def test_transport_exceptions_all_map() -> None:
    key = _Key()
    cases: list[tuple[BaseException, str]] = [
        (aiohttp.ConnectionTimeoutError("c"), "connect_timeout"),
        (aiohttp.SocketTimeoutError("s"), "idle_timeout"),
        (TimeoutError(), "idle_timeout"),
        (aiohttp.ClientConnectorError(key, OSError(111, "Connection refused")), "connect_error"),  # type: ignore[arg-type]
        (aiohttp.ServerDisconnectedError(), "connection_reset"),
        (aiohttp.ClientPayloadError("cut"), "connection_reset"),
        (ConnectionResetError(), "connection_reset"),
        (aiohttp.ClientOSError(104, "reset"), "connection_reset"),
        (aiohttp.ClientError("other"), "transport"),
    ]
    for exc, kind in cases:
        out = translate_exception(exc, where="POST x")
        assert isinstance(out, RetryableAPIError), exc
        assert out.kind == kind, (exc, out.kind)
    assert isinstance(translate_exception(aiohttp.InvalidURL("nope")), ConfigError)
    with pytest.raises(TypeError):
        translate_exception(ValueError("not transport"))
