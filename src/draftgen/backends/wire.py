"""The one place HTTP/JSON wire data and foreign transport exceptions become draftgen types.

Reads response bodies (bytes) of OpenAI-compatible chat servers, OpenRouter's account endpoints and
SGLang's native ``/generate``; decodes them with msgspec into the private ``_Wire*`` structs below and
turns them into ``base.Completion`` or an ``errors.APIError`` subclass.

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
``retry.max_delay_s`` by ``engine.retry.RetryPolicy``. Messages are one line, truncated, and pass through ``redact`` so a key
echoed by a server never reaches a log.

Attribution: an error that names its provider (``error.metadata.provider_name``, the body's or the
stream's ``provider``) carries it, ``provider_of(exc)`` reads it back; the engine judges provider health
on it. Errors no provider can be blamed for (connect errors, a plain 524) carry none.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import aiohttp
import msgspec

from draftgen.backends.base import Completion, Credits, EndpointInfo, KeyInfo, LogprobToken
from draftgen.errors import (
    APIError,
    AuthError,
    ConfigError,
    PaymentRequired,
    PermanentAPIError,
    RateLimited,
    RetryableAPIError,
)
from draftgen.records import FunctionCall, ToolCall, Usage
from draftgen.secrets import redact as _redact

__all__ = [
    "WireBody",
    "WireError",
    "attribute",
    "check_completion",
    "classify_http",
    "completion_from_body",
    "decode_chat",
    "decode_credits",
    "decode_endpoints",
    "decode_key_info",
    "error_from_wire",
    "parse_retry_after",
    "pick_reasoning",
    "provider_of",
    "redact",
    "translate_exception",
    "usage_from_wire",
]

# -- wire structs (lenient: every field optional, unknown keys ignored) ------------------------------


class _Availability(msgspec.Struct):
    code: Any = None
    retryable: bool | None = None
    retry_after: float | None = None


class _ErrorMeta(msgspec.Struct):
    error_type: Any = None
    raw: Any = None
    provider_name: Any = None
    limit_source: Any = None


class WireError(msgspec.Struct):
    code: Any = None
    message: Any = None
    type: Any = None
    metadata: _ErrorMeta | None = None
    availability: _Availability | None = None


class _Fn(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: _Fn | None = None


class _ReasoningDetail(msgspec.Struct):
    type: str | None = None
    text: str | None = None
    summary: str | None = None


class _Logprob(msgspec.Struct):
    token: str = ""
    bytes: list[int] | None = None


class _Logprobs(msgspec.Struct):
    content: list[_Logprob] | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    reasoning_details: list[_ReasoningDetail] | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None
    native_finish_reason: Any = None
    error: WireError | None = None
    logprobs: _Logprobs | None = None
    token_ids: list[int] | None = None  # vLLM return_token_ids


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _CostDetails(msgspec.Struct):
    upstream_inference_cost: float | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    cost: float | None = None
    is_byok: bool | None = None
    cost_details: _CostDetails | None = None


class WireBody(msgspec.Struct):
    """A chat completion, a stream chunk, or an error envelope (all share this shape)."""

    id: str | None = None
    object: str | None = None
    provider: str | None = None
    model: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: WireError | None = None
    message: Any = None  # legacy vLLM top-level error: {"object": "error", "message": ..., "code": ...}
    code: Any = None
    prompt_token_ids: list[int] | None = None  # vLLM return_token_ids


_chat_decoder = msgspec.json.Decoder(WireBody)

# -- helpers -----------------------------------------------------------------------------------------

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


def redact(text: str) -> str:
    """Remove anything shaped like an API key or bearer token from a message (see ``draftgen.secrets``)."""
    return _redact(text)


def _one_line(text: Any, limit: int = 240) -> str:
    if isinstance(text, BaseException):  # decode errors are passed as exceptions
        text = str(text)
    s = text if isinstance(text, str) else ("" if text is None else msgspec.json.encode(text).decode())
    s = " ".join(s.split())
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return redact(s)


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


def _classify(
    err: WireError | None,
    http_status: int,
    *,
    headers: Mapping[str, str] | None,
    prov: str | None,
    text: str | None,
    where: str,
) -> APIError:
    status = _status_of(err, http_status) if err is not None else http_status
    meta = err.metadata if err is not None else None
    avail = err.availability if err is not None else None
    etype = meta.error_type if meta is not None and isinstance(meta.error_type, str) else None
    limit_source = meta.limit_source if meta is not None and isinstance(meta.limit_source, str) else None
    message = _one_line(err.message if err is not None else text)
    if meta is not None and meta.raw is not None and (not message or message == "Provider returned error"):
        message = f"{message}: {_one_line(meta.raw, 160)}" if message else _one_line(meta.raw, 200)
    retry_after = _retry_after(headers, err)
    code_kind = err.code if err is not None and isinstance(err.code, str) and not err.code.isdigit() else None

    def label(kind: str) -> str:
        bits = [f"HTTP {status}" if status != 200 else "in a 200 response"]
        if prov:
            bits.append(prov)
        if where:
            bits.append(where)
        return f"{kind} ({', '.join(bits)}): {message or 'no message'}"

    kw: dict[str, Any] = {"status": status, "retry_after": retry_after}
    # 1. the key
    if status == 401 or etype == "authentication":
        return AuthError(
            label("auth") + "; the API key was rejected: check OPENROUTER_API_KEY / --api-key-file", kind="auth", **kw
        )
    # 2./3. money
    if status == 402 or etype == "payment_required":
        retryable = avail.retryable if avail is not None else None
        if limit_source == "openrouter_in_flight_budget" or retryable is True:
            return RateLimited(label("in_flight_budget"), kind="in_flight_budget", **kw)
        avail_code = str(avail.code) if avail is not None and avail.code else ""
        kind = "weight_exceeds_budget" if "weight_exceeds_budget" in avail_code + message else "payment_required"
        return PaymentRequired(label(kind), kind=kind, **kw)
    if status == 403 and limit_source in _BUDGET_403:
        return PaymentRequired(label(limit_source or "budget"), kind=limit_source or "budget", **kw)
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
    if status == 429:
        kind = "cloudflare_1015" if "1015" in message else "rate_limited"
        return RateLimited(label(kind), kind=kind, **kw)
    if status == 408 or status >= 500 or status == 200:
        kind = code_kind or ("timeout" if status == 408 else "error_in_200" if status == 200 else f"http_{status}")
        return RetryableAPIError(label(kind), kind=kind, **kw)
    if 400 <= status < 500:
        if _CONTEXT_RE.search(message):
            return PermanentAPIError(label("context_length_exceeded"), kind="context_length_exceeded", **kw)
        kind = f"http_{status}"
        return PermanentAPIError(label(kind), kind=kind, **kw)
    return RetryableAPIError(label(f"http_{status}"), kind=f"http_{status}", **kw)


def classify_http(
    status: int, body: bytes, *, headers: Mapping[str, str] | None = None, where: str = ""
) -> APIError:
    """Classify a non-2xx response from its status, JSON error envelope (if any) and headers."""
    err: WireError | None = None
    text: str | None = None
    stripped = body.strip()
    if stripped[:1] == b"{":
        try:
            env = _chat_decoder.decode(stripped)
        except (msgspec.DecodeError, msgspec.ValidationError):
            env = None
        if env is not None:
            if env.error is not None:
                err = env.error
            elif env.message is not None:  # legacy vLLM {"object":"error","message":…,"code":…}
                err = WireError(code=env.code, message=env.message)
            provider = env.provider
            return error_from_wire(err, status, headers=headers, provider=provider, text=None, where=where)
    text = stripped[:400].decode("utf-8", errors="replace") or None
    return error_from_wire(None, status, headers=headers, text=text, where=where)


def translate_exception(exc: BaseException, *, where: str = "") -> APIError | ConfigError:
    """Map a transport exception (aiohttp, asyncio, OS) to a retryable APIError (or ConfigError)."""
    at = f" ({where})" if where else ""
    if isinstance(exc, aiohttp.InvalidURL):
        return ConfigError(f"invalid base URL {str(exc.url)!r}; give an http(s) API root such as http://127.0.0.1:8765/api/v1")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return RetryableAPIError(f"connect timeout{at}", kind="connect_timeout")
    if isinstance(exc, aiohttp.ServerTimeoutError | TimeoutError):
        return RetryableAPIError(f"idle timeout: no bytes received for too long{at}", kind="idle_timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return RetryableAPIError(f"cannot connect{at}: {_one_line(exc.os_error.strerror or exc)}", kind="connect_error")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError | ConnectionError):
        return RetryableAPIError(f"connection reset{at}: {_one_line(type(exc).__name__)}", kind="connection_reset")
    if isinstance(exc, aiohttp.ClientResponseError):
        return classify_http(exc.status, b"", where=where)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return RetryableAPIError(f"transport error{at}: {_one_line(type(exc).__name__)}", kind="transport")
    raise TypeError(f"not a transport exception: {type(exc).__name__}")


# -- decoding chat bodies ------------------------------------------------------------------------------


def decode_chat(body: bytes, *, where: str = "") -> WireBody:
    """Decode a chat completion or chunk; leading blank-line padding is allowed (it is JSON whitespace)."""
    try:
        return _chat_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise RetryableAPIError(f"malformed response{' (' + where + ')' if where else ''}: {_one_line(exc)}", kind="bad_response") from None
    except msgspec.DecodeError:
        snippet = _one_line(body[:120].decode("utf-8", errors="replace"))
        raise RetryableAPIError(f"response is not JSON{' (' + where + ')' if where else ''}: {snippet!r}", kind="bad_json") from None


def usage_from_wire(u: _Usage | None) -> Usage | None:
    """The record's usage. A missing ``cost`` becomes 0.0 here; the completion's ``cost_missing`` says so,
    and the engine fills it from the routed prices (``Usage.cost_computed``)."""
    if u is None:
        return None
    return Usage(
        prompt_tokens=u.prompt_tokens or 0,
        completion_tokens=u.completion_tokens or 0,
        reasoning_tokens=(u.completion_tokens_details.reasoning_tokens or 0) if u.completion_tokens_details else 0,
        cached_tokens=(u.prompt_tokens_details.cached_tokens or 0) if u.prompt_tokens_details else 0,
        cost=u.cost or 0.0,
        is_byok=bool(u.is_byok),
        upstream_cost=u.cost_details.upstream_inference_cost if u.cost_details else None,
    )


def pick_reasoning(reasoning: str | None, reasoning_content: str | None, details: str | None) -> tuple[str | None, str | None]:
    """First non-empty of the three fields and its name; ``""``, null and missing are alike."""
    if reasoning:
        return reasoning, "reasoning"
    if reasoning_content:
        return reasoning_content, "reasoning_content"
    if details:
        return details, "reasoning_details"
    return None, None


def _details_text(details: list[_ReasoningDetail] | None) -> str | None:
    if not details:
        return None
    parts = [d.text for d in details if d.text]
    return "".join(parts) if parts else None


def _tool_calls(calls: list[_ToolCall] | None) -> list[ToolCall] | None:
    if not calls:
        return None
    out = []
    for c in calls:
        fn = c.function
        out.append(ToolCall(
            id=c.id or "", type=c.type or "function",
            function=FunctionCall(name=fn.name or "", arguments=fn.arguments or "") if fn is not None else None,
        ))
    return out


def completion_from_body(body: WireBody, *, backend: str, status: int = 200, where: str = "") -> Completion:
    """A non-streaming chat body → Completion; an error inside the 200 body raises its APIError."""
    if body.error is not None:
        raise error_from_wire(body.error, status, provider=body.provider, where=where)
    if not body.choices:
        raise attribute(RetryableAPIError(f"empty_response (no choices{', ' + body.provider if body.provider else ''})",
                                          kind="empty_response"), body.provider)
    ch = body.choices[0]
    if ch.error is not None:
        raise error_from_wire(ch.error, status, provider=body.provider, where=where)
    msg = ch.message or ch.delta or _Message()
    reasoning, field = pick_reasoning(msg.reasoning, msg.reasoning_content, _details_text(msg.reasoning_details))
    logprobs = None
    if ch.logprobs is not None and ch.logprobs.content:
        logprobs = [LogprobToken(lp.token, lp.bytes) for lp in ch.logprobs.content]
    nfr = ch.native_finish_reason
    return Completion(
        backend=backend,
        reasoning=reasoning,
        content=msg.content,
        tool_calls=_tool_calls(msg.tool_calls),
        reasoning_field=field,
        finish_reason=ch.finish_reason,
        native_finish_reason=nfr if nfr is None or isinstance(nfr, str) else str(nfr),
        provider=body.provider,
        model=body.model,
        generation_id=body.id,
        usage=usage_from_wire(body.usage),
        output_ids=ch.token_ids,
        prompt_ids=body.prompt_token_ids,
        logprobs=logprobs,
        cost_missing=body.usage is not None and body.usage.cost is None,
    )


def check_completion(comp: Completion) -> Completion:
    """Reject what must be retried although it came back as a 200: ``finish_reason: error`` and empty
    responses (no text, no tool calls, and no completion tokens or no finish reason)."""
    prov = f", {comp.provider}" if comp.provider else ""
    if comp.finish_reason == "error":
        raise attribute(RetryableAPIError(f"finish_error (finish_reason error{prov})", kind="finish_error"),
                        comp.provider)
    if not comp.content and not comp.reasoning and not comp.tool_calls and not comp.output_ids:
        completion_tokens = comp.usage.completion_tokens if comp.usage is not None else 0
        if completion_tokens == 0 or comp.finish_reason is None:
            raise attribute(RetryableAPIError(f"empty_response (no text, finish_reason {comp.finish_reason}{prov})",
                                              kind="empty_response"), comp.provider)
    return comp


# -- account endpoints ---------------------------------------------------------------------------------


class _KeyEnv(msgspec.Struct):
    data: KeyInfo


class _CreditsEnv(msgspec.Struct):
    data: Credits


class _EndpointsData(msgspec.Struct):
    endpoints: list[EndpointInfo] = msgspec.field(default_factory=list)


class _EndpointsEnv(msgspec.Struct):
    data: _EndpointsData


def _decode_lenient(body: bytes, type_: type[Any], what: str) -> Any:
    try:
        return msgspec.json.decode(body, type=type_, strict=False)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RetryableAPIError(f"{what}: unexpected response ({_one_line(exc, 160)})", kind="bad_response") from None


def decode_key_info(body: bytes) -> KeyInfo:
    info: KeyInfo = _decode_lenient(body, _KeyEnv, "GET /key").data
    return info


def decode_credits(body: bytes) -> Credits:
    cr: Credits = _decode_lenient(body, _CreditsEnv, "GET /credits").data
    return cr


def decode_endpoints(body: bytes) -> list[EndpointInfo]:
    eps: list[EndpointInfo] = _decode_lenient(body, _EndpointsEnv, "GET /endpoints").data.endpoints
    return eps
