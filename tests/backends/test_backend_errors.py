"""``backends.errors``: HTTP error classification, Retry-After, and the translation of every foreign
transport exception (aiohttp's exported classes, asyncio and OS errors) to its most specific draftgen kind."""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import json
import time
from collections.abc import Iterator

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from draftgen.backends.errors import (
    GENERIC_KIND,
    TRANSLATIONS,
    TRANSPORT_ERRORS,
    classify_http,
    parse_retry_after,
    redact,
    translate_exception,
    translation_for,
)
from draftgen.errors import (
    APIError,
    AuthError,
    ConfigError,
    PaymentRequired,
    PermanentAPIError,
    RateLimited,
    RetryableAPIError,
)


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


# -- every foreign exception class -------------------------------------------------------------------------


class _Key:
    """The connection key aiohttp's connector errors print."""

    def __init__(self) -> None:
        self.ssl = None
        self.host, self.port, self.is_ssl = "h", 1, False


def _subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _subclasses(sub)


def _exported() -> set[type[BaseException]]:
    """Every exception class aiohttp exports."""
    out = set()
    for name in aiohttp.__all__:
        obj = getattr(aiohttp, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            out.add(obj)
    return out


#: aiohttp's client exceptions: every exported one, and every subclass of ClientError (exported or not)
CLIENT = sorted({c for c in _exported() if issubclass(c, aiohttp.ClientError)} | set(_subclasses(aiohttp.ClientError)),
                key=lambda c: c.__qualname__)
#: the asyncio and OS exceptions translated too: timeouts, and every OSError (connection errors among them)
OS = sorted(set(_subclasses(OSError)) | {asyncio.TimeoutError}, key=lambda c: (c.__module__, c.__qualname__))
#: the fallback entries themselves
ROOTS = {aiohttp.ClientError, OSError}


def _instance(cls: type[BaseException]) -> BaseException:
    """One instance of an aiohttp client exception, built with the arguments its class takes."""
    request = aiohttp.RequestInfo(URL("http://h/x"), "GET", CIMultiDictProxy(CIMultiDict()), URL("http://h/x"))
    if issubclass(cls, aiohttp.ClientResponseError):
        return cls(request, (), status=503, message="m")
    if issubclass(cls, aiohttp.ClientConnectorCertificateError):
        return cls(_Key(), Exception("bad cert"))  # type: ignore[arg-type]
    if issubclass(cls, aiohttp.ClientConnectorError):
        if "path" in inspect.signature(cls).parameters:  # UnixClientConnectorError
            return cls("/tmp/sock", _Key(), OSError(111, "Connection refused"))  # type: ignore[call-arg, arg-type]
        return cls(_Key(), OSError(111, "Connection refused"))  # type: ignore[arg-type]
    if issubclass(cls, aiohttp.ServerFingerprintMismatch):
        return cls(b"a", b"b", "h", 1)
    if issubclass(cls, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return cls(URL("ftp://x"))
    if issubclass(cls, aiohttp.ServerDisconnectedError):
        return cls()
    return cls("m")


def test_every_exported_client_exception_has_its_own_entry() -> None:
    missing = [c.__qualname__ for c in _exported() if issubclass(c, aiohttp.ClientError) and c not in TRANSLATIONS]
    assert not missing, f"add these aiohttp exceptions to backends.errors.TRANSLATIONS: {missing}"


@pytest.mark.parametrize("cls", CLIENT, ids=lambda c: c.__qualname__)
def test_every_aiohttp_client_exception_maps_to_a_specific_kind(cls: type[BaseException]) -> None:
    found = translation_for(cls)
    assert found is not None
    assert (found.kind == GENERIC_KIND) == (cls in ROOTS), (cls, found.kind)
    out = translate_exception(_instance(cls), where="GET http://h/x")
    if found.kind == "invalid_url":
        assert isinstance(out, ConfigError) and "ftp://x" in str(out)
    elif found.kind == "http_status":
        assert isinstance(out, RetryableAPIError) and out.kind == "http_503" and out.status == 503
    else:
        assert isinstance(out, RetryableAPIError) and out.kind == found.kind
        assert "(GET http://h/x)" in str(out)


@pytest.mark.parametrize("cls", OS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_os_and_asyncio_error_is_translated(cls: type[BaseException]) -> None:
    found = translation_for(cls)
    assert found is not None and issubclass(cls, TRANSPORT_ERRORS)
    if issubclass(cls, aiohttp.ClientError):
        return  # its own class decides (above)
    expected = ("idle_timeout" if issubclass(cls, TimeoutError) else
                "connection_reset" if issubclass(cls, ConnectionError) else GENERIC_KIND)
    assert found.kind == expected, (cls, found.kind)


def test_exported_exceptions_that_are_not_transport_errors_are_refused() -> None:
    others = [c for c in _exported() if not issubclass(c, TRANSPORT_ERRORS)]
    assert others  # websocket, multipart and stream internals
    for cls in others:
        assert translation_for(cls) is None, cls
    with pytest.raises(TypeError, match="not a transport exception"):
        translate_exception(aiohttp.WebSocketError(1000, "bye"))


def test_the_most_specific_class_wins() -> None:
    # a connect timeout is also a ServerTimeoutError and a TimeoutError
    assert translate_exception(aiohttp.ConnectionTimeoutError("c")).kind == "connect_timeout"  # type: ignore[union-attr]
    # a reset is also a ClientConnectionError (connection_lost) and a ConnectionResetError
    assert translate_exception(aiohttp.ClientConnectionResetError("r")).kind == "connection_reset"  # type: ignore[union-attr]
    # a redirect to an invalid URL is also a RedirectClientError: the URL decides
    assert isinstance(translate_exception(aiohttp.InvalidUrlRedirectClientError(URL("x"))), ConfigError)
    assert translate_exception(aiohttp.NonHttpUrlRedirectClientError(URL("ftp://x"))).kind == "bad_redirect"  # type: ignore[union-attr]

    class Sub(aiohttp.ServerDisconnectedError):  # a class the table does not list: its nearest ancestor's entry
        pass

    assert translate_exception(Sub()).kind == "connection_reset"  # type: ignore[union-attr]


def test_status_exceptions_are_classified_like_responses() -> None:
    request = aiohttp.RequestInfo(URL("http://h/x"), "GET", CIMultiDictProxy(CIMultiDict()), URL("http://h/x"))
    refused = translate_exception(aiohttp.ClientHttpProxyError(request, (), status=407), where="POST x")
    assert isinstance(refused, PermanentAPIError) and refused.kind == "http_407"
    loop = translate_exception(aiohttp.TooManyRedirects(request, (), status=502))
    assert isinstance(loop, RetryableAPIError) and not isinstance(loop, RateLimited)
    throttled = translate_exception(aiohttp.ClientResponseError(request, (), status=429))
    assert isinstance(throttled, RateLimited)
    # a connect error says why the socket failed
    conn = translate_exception(aiohttp.ClientConnectorError(_Key(), OSError(111, "Connection refused")))  # type: ignore[arg-type]
    assert "Connection refused" in str(conn) and isinstance(conn, APIError)
