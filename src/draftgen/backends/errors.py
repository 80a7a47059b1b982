"""The one place a backend's failures become draftgen errors: HTTP error classification and the
translation of foreign transport exceptions (aiohttp, asyncio, OS).

Reads an error's status, its JSON error envelope (bytes, or an already decoded ``WireError``) and its
headers; returns an ``errors.APIError`` subclass (``ConfigError`` for a base URL aiohttp refuses). It does
no I/O and keeps no state.

Error classification (``classify_http`` / ``error_from_wire``), in order:

1. 401 or ``error_type: authentication``                          → AuthError (stop the run)
2. 402: in-flight budget (``limit_source: openrouter_in_flight_budget`` or ``availability.retryable``)
   → RateLimited; otherwise → PaymentRequired (stop scheduling)
3. 403 with a key/workspace/guardrail budget ``limit_source``      → PaymentRequired
4. ``error.availability.retryable`` when present decides retryable vs permanent
5. ``error.metadata.error_type`` (token limits, invalid request, policy → permanent; rate limit,
   overload, server, timeout → retryable)
6. the status: 429 → RateLimited; 408, 5xx, 52x → retryable; other 4xx → permanent

Errors inside a 200 body (bare ``{"error":…}`` or ``choices[0].error``) and mid-stream error chunks use
``error.code`` as the status when it is an integer (it may also be a string such as ``"server_error"``).
``Retry-After`` comes from the header (seconds or an HTTP date), ``availability.retry_after``, or
``X-RateLimit-Reset`` (epoch ms); it is clamped to an hour here, and every wait, this one included, to
``retry.max_delay_s`` by ``engine.retry.RetryPolicy``. Messages are one line, truncated, and pass through
``redact`` so a key echoed by a server never reaches a log.

Foreign exceptions (``translate_exception``): ``TRANSLATIONS`` maps each foreign exception class to its
draftgen kind, and an exception takes the entry of the first class of its MRO found there, so the most
specific class wins (as httpx's ``map_httpcore_exceptions`` does). Every exception class aiohttp's client
exports has its own entry (``tests/backends/test_backend_errors.py`` checks it); ``aiohttp.ClientError`` and
``OSError`` themselves are the generic fallback, kind ``transport``. ``TRANSPORT_ERRORS`` is what a
caller catches around a request to hand to ``translate_exception``.

Billing: an error raised for a response that was billed all the same (a body rejected for its shape whose
usage could still be read) carries a ``base.Billing`` (``bill``), read back by ``billing_of``; the engine
books it, so a rejected response is never free.

Attribution: an error that names its provider (``error.metadata.provider_name``, the body's or the
stream's ``provider``) carries it, ``provider_of(exc)`` reads it back; the engine judges provider health
on it. Errors no provider can be blamed for (connect errors, a plain 524) carry none.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import msgspec

from draftgen.errors import (
    APIError,
    AuthError,
    ConfigError,
    PaymentRequired,
    PermanentAPIError,
    RateLimited,
    RetryableAPIError,
)
from draftgen.secrets import redact as _redact

if TYPE_CHECKING:
    from draftgen.backends.base import Billing

__all__ = [
    "GENERIC_KIND",
    "TRANSLATIONS",
    "TRANSPORT_ERRORS",
    "ErrorAvailability",
    "ErrorEnvelope",
    "ErrorMeta",
    "Translation",
    "WireError",
    "attribute",
    "bill",
    "billing_of",
    "classify_http",
    "error_from_wire",
    "one_line",
    "parse_retry_after",
    "provider_of",
    "redact",
    "translate_exception",
    "translation_for",
]

# -- error envelopes (lenient: every field optional, unknown keys ignored) ---------------------------


class ErrorAvailability(msgspec.Struct):
    """``error.availability``: OpenRouter's verdict on retrying."""

    code: Any = None
    retryable: bool | None = None
    retry_after: float | None = None


class ErrorMeta(msgspec.Struct):
    """``error.metadata``."""

    error_type: Any = None
    raw: Any = None
    provider_name: Any = None
    limit_source: Any = None


class WireError(msgspec.Struct):
    """One error object: an envelope's ``error``, a choice's ``error`` or a mid-stream chunk's."""

    code: Any = None
    message: Any = None
    type: Any = None
    metadata: ErrorMeta | None = None
    availability: ErrorAvailability | None = None


class ErrorEnvelope(msgspec.Struct):
    """A non-2xx body: ``{"error": …}``, or vLLM's legacy ``{"object": "error", "message": …, "code": …}``."""

    provider: str | None = None
    error: WireError | None = None
    message: Any = None
    code: Any = None


_envelope_decoder = msgspec.json.Decoder(ErrorEnvelope)

# -- attribution and messages ------------------------------------------------------------------------

_E = TypeVar("_E", bound=BaseException)


def attribute(exc: _E, provider: str | None) -> _E:
    """``exc`` tagged with the provider it came from (a first attribution is kept); returns ``exc``."""
    if provider and provider_of(exc) is None:
        exc.provider = provider  # type: ignore[attr-defined]  # errors.APIError has no field for it
    return exc


def provider_of(exc: BaseException) -> str | None:
    """The provider an error was attributed to (``attribute``), or None."""
    prov = getattr(exc, "provider", None)
    return prov if isinstance(prov, str) and prov else None


def bill(exc: _E, billing: Billing | None) -> _E:
    """``exc`` (a response rejected for its shape, say) tagged with what its body says was billed; a first
    billing is kept; returns ``exc``. The engine books it (``engine.sample``)."""
    if billing is not None and billing_of(exc) is None:
        exc.billing = billing  # type: ignore[attr-defined]  # errors.APIError has no field for it
    return exc


def billing_of(exc: BaseException) -> Billing | None:
    """What an error's response was billed (``bill``), or None."""
    got: Billing | None = getattr(exc, "billing", None)
    return got


def redact(text: str) -> str:
    """Remove anything shaped like an API key or bearer token from a message (see ``draftgen.secrets``)."""
    return _redact(text)


def one_line(text: Any, limit: int = 240) -> str:
    """``text`` (a string, an exception, or JSON-able data) on one line, at most ``limit`` characters,
    redacted."""
    if isinstance(text, BaseException):  # decode errors are passed as exceptions
        text = str(text)
    s = text if isinstance(text, str) else ("" if text is None else msgspec.json.encode(text).decode())
    s = " ".join(s.split())
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return redact(s)


# -- Retry-After ---------------------------------------------------------------------------------------


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta seconds or HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        secs = when.timestamp() - (time.time() if now is None else now)
    if secs != secs:  # NaN
        return None
    return max(0.0, min(secs, 3600.0))


def _retry_after(headers: Mapping[str, str] | None, err: WireError | None) -> float | None:
    if headers is not None:
        ra = parse_retry_after(headers.get("Retry-After"))
        if ra is not None:
            return ra
    if err is not None and err.availability is not None and err.availability.retry_after is not None:
        return max(0.0, min(float(err.availability.retry_after), 3600.0))
    if headers is not None:
        reset = headers.get("X-RateLimit-Reset")
        if reset:
            try:
                secs = float(reset) / 1000.0 - time.time()
            except ValueError:
                return None
            if 0 < secs < 3600:
                return secs
    return None


# -- classification --------------------------------------------------------------------------------------

_TOKEN_LIMIT = {"context_length_exceeded", "max_tokens_exceeded", "token_limit_exceeded", "string_too_long"}
_PERMANENT_TYPES = _TOKEN_LIMIT | {
    "permission_denied", "invalid_request", "invalid_prompt", "not_found", "precondition_failed",
    "payload_too_large", "unprocessable", "content_policy_violation", "refusal",
}
_RATE_TYPES = {"rate_limit_exceeded"}
_RETRY_TYPES = {"provider_overloaded", "provider_unavailable", "server", "timeout", "unmapped"}
_BUDGET_403 = {"openrouter_key_limit", "openrouter_workspace_budget", "openrouter_guardrail_budget"}
_CONTEXT_RE = re.compile(r"context length|context window|maximum context|too many tokens|prompt is too long", re.I)


def _status_of(err: WireError, http_status: int) -> int:
    if http_status != 200:
        return http_status
    code = err.code
    if isinstance(code, int) and 100 <= code <= 599:
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return 200


def error_from_wire(
    err: WireError | None,
    http_status: int,
    *,
    headers: Mapping[str, str] | None = None,
    provider: str | None = None,
    text: str | None = None,
    where: str = "",
) -> APIError:
    """Classify one error (an envelope's ``error``, a choice's ``error`` or a mid-stream chunk's), attributed
    to its provider when it names one."""
    meta = err.metadata if err is not None else None
    prov = provider or (meta.provider_name if meta is not None and isinstance(meta.provider_name, str) else None)
    return attribute(_classify(err, http_status, headers=headers, prov=prov, text=text, where=where), prov)


class _Facts(msgspec.Struct, kw_only=True):
    """What classification reads from one error, and how its message is labelled."""

    status: int
    etype: str | None
    limit_source: str | None
    avail: ErrorAvailability | None
    message: str
    code_kind: str | None
    prov: str | None
    where: str

    def label(self, kind: str) -> str:
        bits = [f"HTTP {self.status}" if self.status != 200 else "in a 200 response"]
        if self.prov:
            bits.append(self.prov)
        if self.where:
            bits.append(self.where)
        return f"{kind} ({', '.join(bits)}): {self.message or 'no message'}"


def _facts(err: WireError | None, http_status: int, *, prov: str | None, text: str | None, where: str) -> _Facts:
    meta = err.metadata if err is not None else None
    message = one_line(err.message if err is not None else text)
    if meta is not None and meta.raw is not None and (not message or message == "Provider returned error"):
        message = f"{message}: {one_line(meta.raw, 160)}" if message else one_line(meta.raw, 200)
    return _Facts(
        status=_status_of(err, http_status) if err is not None else http_status,
        etype=meta.error_type if meta is not None and isinstance(meta.error_type, str) else None,
        limit_source=meta.limit_source if meta is not None and isinstance(meta.limit_source, str) else None,
        avail=err.availability if err is not None else None,
        message=message,
        code_kind=err.code if err is not None and isinstance(err.code, str) and not err.code.isdigit() else None,
        prov=prov,
        where=where,
    )


def _classify(
    err: WireError | None,
    http_status: int,
    *,
    headers: Mapping[str, str] | None,
    prov: str | None,
    text: str | None,
    where: str,
) -> APIError:
    f = _facts(err, http_status, prov=prov, text=text, where=where)
    status, etype, avail, label = f.status, f.etype, f.avail, f.label
    kw: dict[str, Any] = {"status": status, "retry_after": _retry_after(headers, err)}
    # 1. the key
    if status == 401 or etype == "authentication":
        return AuthError(
            label("auth") + "; the API key was rejected: check OPENROUTER_API_KEY / --api-key-file", kind="auth", **kw
        )
    # 2./3. money
    money = _money(f, kw)
    if money is not None:
        return money
    # 4. availability decides when present
    if avail is not None and avail.retryable is not None:
        kind = str(avail.code) if avail.code else (etype or f"http_{status}")
        if avail.retryable:
            cls: type[APIError] = RateLimited if status == 429 else RetryableAPIError
            return cls(label(kind), kind=kind, **kw)
        return PermanentAPIError(label(kind), kind=kind, **kw)
    # 5. typed errors
    if etype in _PERMANENT_TYPES:
        return PermanentAPIError(label(etype), kind=etype, **kw)
    if etype in _RATE_TYPES:
        return RateLimited(label(etype), kind=etype, **kw)
    if etype in _RETRY_TYPES:
        return RetryableAPIError(label(etype), kind=etype, **kw)
    # 6. the status
    return _by_status(f, kw)


def _money(f: _Facts, kw: dict[str, Any]) -> APIError | None:
    """Rules 2 and 3: a 402, or a 403 over a budget; None for any other error."""
    if f.status == 402 or f.etype == "payment_required":
        retryable = f.avail.retryable if f.avail is not None else None
        if f.limit_source == "openrouter_in_flight_budget" or retryable is True:
            return RateLimited(f.label("in_flight_budget"), kind="in_flight_budget", **kw)
        avail_code = str(f.avail.code) if f.avail is not None and f.avail.code else ""
        kind = "weight_exceeds_budget" if "weight_exceeds_budget" in avail_code + f.message else "payment_required"
        return PaymentRequired(f.label(kind), kind=kind, **kw)
    if f.status == 403 and f.limit_source in _BUDGET_403:
        return PaymentRequired(f.label(f.limit_source or "budget"), kind=f.limit_source or "budget", **kw)
    return None


def _by_status(f: _Facts, kw: dict[str, Any]) -> APIError:
    """Rule 6: the status alone (and a context-length message on a 4xx)."""
    status = f.status
    if status == 429:
        kind = "cloudflare_1015" if "1015" in f.message else "rate_limited"
        return RateLimited(f.label(kind), kind=kind, **kw)
    if status == 408 or status >= 500 or status == 200:
        kind = f.code_kind or ("timeout" if status == 408 else "error_in_200" if status == 200 else f"http_{status}")
        return RetryableAPIError(f.label(kind), kind=kind, **kw)
    if 400 <= status < 500:
        if _CONTEXT_RE.search(f.message):
            return PermanentAPIError(f.label("context_length_exceeded"), kind="context_length_exceeded", **kw)
        kind = f"http_{status}"
        return PermanentAPIError(f.label(kind), kind=kind, **kw)
    return RetryableAPIError(f.label(f"http_{status}"), kind=f"http_{status}", **kw)


def classify_http(
    status: int, body: bytes, *, headers: Mapping[str, str] | None = None, where: str = ""
) -> APIError:
    """Classify a non-2xx response from its status, JSON error envelope (if any) and headers."""
    stripped = body.strip()
    if stripped[:1] == b"{":
        try:
            env = _envelope_decoder.decode(stripped)
        except (msgspec.DecodeError, msgspec.ValidationError):
            env = None
        if env is not None:
            err: WireError | None = None
            if env.error is not None:
                err = env.error
            elif env.message is not None:  # legacy vLLM {"object":"error","message":…,"code":…}
                err = WireError(code=env.code, message=env.message)
            return error_from_wire(err, status, headers=headers, provider=env.provider, text=None, where=where)
    text = stripped[:400].decode("utf-8", errors="replace") or None
    return error_from_wire(None, status, headers=headers, text=text, where=where)


# -- foreign exceptions ----------------------------------------------------------------------------------

#: what a caller catches around a request and hands to ``translate_exception``
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError, OSError)

#: the kind of the fallback entries (``aiohttp.ClientError`` and ``OSError`` themselves)
GENERIC_KIND = "transport"


@dataclass(frozen=True)
class Translation:
    """What one foreign exception class becomes. ``kind``: the draftgen kind (``invalid_url`` for the
    ``ConfigError``; ``http_status`` when the exception's HTTP status is classified like a response's)."""

    kind: str
    build: Callable[[BaseException, str], APIError | ConfigError]


def _at(where: str) -> str:
    return f" ({where})" if where else ""


def _retryable(kind: str, text: str) -> Translation:
    """A retryable error; ``text`` may use ``{at}`` (where it happened) and ``{name}`` (the class name)."""
    return Translation(kind, lambda exc, where: RetryableAPIError(
        text.format(at=_at(where), name=one_line(type(exc).__name__)), kind=kind))


def _invalid_url(exc: BaseException, where: str) -> ConfigError:
    url = getattr(exc, "url", exc)
    return ConfigError(f"invalid base URL {str(url)!r}; give an http(s) API root such as http://127.0.0.1:8765/api/v1")


def _cannot_connect(exc: BaseException, where: str) -> RetryableAPIError:
    os_error = getattr(exc, "os_error", None)
    reason = (os_error.strerror if isinstance(os_error, OSError) else None) or exc
    return RetryableAPIError(f"cannot connect{_at(where)}: {one_line(reason)}", kind="connect_error")


def _by_http_status(exc: BaseException, where: str) -> APIError:
    status = getattr(exc, "status", 0)
    return classify_http(status if isinstance(status, int) else 0, b"", where=where)


_CONFIG = Translation("invalid_url", _invalid_url)
_CONNECT = Translation("connect_error", _cannot_connect)
_STATUS = Translation("http_status", _by_http_status)
_CONNECT_TIMEOUT = _retryable("connect_timeout", "connect timeout{at}")
_IDLE = _retryable("idle_timeout", "idle timeout: no bytes received for too long{at}")
_RESET = _retryable("connection_reset", "connection reset{at}: {name}")


def _transport(kind: str) -> Translation:
    return _retryable(kind, "transport error{at}: {name}")


#: foreign exception class → its translation; an exception takes the first class of its MRO found here
TRANSLATIONS: dict[type[BaseException], Translation] = {
    # the base URL (a redirect to an unusable URL is reported as a transport error)
    aiohttp.InvalidURL: _CONFIG,
    aiohttp.InvalidUrlClientError: _CONFIG,
    aiohttp.InvalidUrlRedirectClientError: _CONFIG,
    aiohttp.NonHttpUrlClientError: _transport("non_http_url"),
    aiohttp.RedirectClientError: _transport("bad_redirect"),
    aiohttp.NonHttpUrlRedirectClientError: _transport("bad_redirect"),
    # connecting
    aiohttp.ConnectionTimeoutError: _CONNECT_TIMEOUT,
    aiohttp.ClientConnectorError: _CONNECT,
    aiohttp.ClientConnectorDNSError: _CONNECT,
    aiohttp.ClientProxyConnectionError: _CONNECT,
    aiohttp.ClientSSLError: _CONNECT,
    aiohttp.ClientConnectorSSLError: _CONNECT,
    aiohttp.ClientConnectorCertificateError: _CONNECT,
    aiohttp.ServerFingerprintMismatch: _transport("tls_fingerprint"),
    # waiting
    aiohttp.ServerTimeoutError: _IDLE,
    aiohttp.SocketTimeoutError: _IDLE,
    TimeoutError: _IDLE,
    # a connection that broke
    aiohttp.ServerDisconnectedError: _RESET,
    aiohttp.ClientPayloadError: _RESET,
    aiohttp.ClientOSError: _RESET,
    aiohttp.ClientConnectionResetError: _RESET,
    ConnectionError: _RESET,
    aiohttp.ClientConnectionError: _transport("connection_lost"),
    aiohttp.ServerConnectionError: _transport("server_connection"),
    aiohttp.UploadAbortedError: _transport("upload_aborted"),
    # an HTTP status aiohttp raised itself (redirect loop, proxy refusal, ...)
    aiohttp.ClientResponseError: _STATUS,
    aiohttp.ContentTypeError: _STATUS,
    aiohttp.TooManyRedirects: _STATUS,
    aiohttp.ClientHttpProxyError: _STATUS,
    aiohttp.WSServerHandshakeError: _STATUS,
    # the generic fallback
    aiohttp.ClientError: _transport(GENERIC_KIND),
    OSError: _transport(GENERIC_KIND),
}


def translation_for(cls: type[BaseException]) -> Translation | None:
    """The entry of the most specific class of ``cls``'s MRO in ``TRANSLATIONS``; None for an exception
    that is not a transport error."""
    for base in cls.__mro__:
        found = TRANSLATIONS.get(base)
        if found is not None:
            return found
    return None


def translate_exception(exc: BaseException, *, where: str = "") -> APIError | ConfigError:
    """Map a transport exception (aiohttp, asyncio, OS) to its APIError (or ConfigError); a TypeError for
    any other exception."""
    found = translation_for(type(exc))
    if found is None:
        raise TypeError(f"not a transport exception: {type(exc).__name__}")
    return found.build(exc, where)
