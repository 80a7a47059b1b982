"""Chat-completion wire bodies: the decoding of what OpenAI-compatible chat servers send.

Reads response bodies and stream chunks (bytes) of ``POST /chat/completions``; decodes them with msgspec
into the lenient ``Wire*`` structs below (every field optional, unknown keys ignored) and turns a body
into a ``base.Completion``. An error found inside a body (a bare ``{"error":…}``, ``choices[0].error``) is
classified by ``backends.errors``, which also owns every other error classification; a body that is not
JSON or not of this shape is a retryable ``bad_json`` / ``bad_response``. Writes nothing.

OpenRouter's account bodies (``/key``, ``/credits``, endpoint lists) are decoded by ``backends.openrouter``,
the only backend that reads them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from draftgen.backends.base import Completion, LogprobToken
from draftgen.backends.errors import WireError, attribute, error_from_wire, one_line
from draftgen.errors import RetryableAPIError
from draftgen.records import FunctionCall, ToolCall, Usage

__all__ = [
    "WireBody",
    "WireChoice",
    "WireCompletionDetails",
    "WireCostDetails",
    "WireFunction",
    "WireLogprob",
    "WireLogprobs",
    "WireMessage",
    "WirePromptDetails",
    "WireReasoningDetail",
    "WireToolCall",
    "WireUsage",
    "check_completion",
    "completion_from_body",
    "decode_chat",
    "pick_reasoning",
    "usage_from_wire",
]

# -- wire structs (lenient: every field optional, unknown keys ignored) ------------------------------


class WireFunction(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class WireToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: WireFunction | None = None


class WireReasoningDetail(msgspec.Struct):
    type: str | None = None
    text: str | None = None
    summary: str | None = None


class WireLogprob(msgspec.Struct):
    token: str = ""
    bytes: list[int] | None = None


class WireLogprobs(msgspec.Struct):
    content: list[WireLogprob] | None = None


class WireMessage(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    reasoning_details: list[WireReasoningDetail] | None = None
    tool_calls: list[WireToolCall] | None = None


class WireChoice(msgspec.Struct):
    message: WireMessage | None = None
    delta: WireMessage | None = None
    finish_reason: str | None = None
    native_finish_reason: Any = None
    error: WireError | None = None
    logprobs: WireLogprobs | None = None
    token_ids: list[int] | None = None  # vLLM return_token_ids


class WirePromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class WireCompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class WireCostDetails(msgspec.Struct):
    upstream_inference_cost: float | None = None


class WireUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: WirePromptDetails | None = None
    completion_tokens_details: WireCompletionDetails | None = None
    cost: float | None = None
    is_byok: bool | None = None
    cost_details: WireCostDetails | None = None


class WireBody(msgspec.Struct):
    """A chat completion, a stream chunk, or an error envelope (all share this shape)."""

    id: str | None = None
    object: str | None = None
    provider: str | None = None
    model: str | None = None
    choices: list[WireChoice] | None = None
    usage: WireUsage | None = None
    error: WireError | None = None
    message: Any = None  # legacy vLLM top-level error: {"object": "error", "message": ..., "code": ...}
    code: Any = None
    prompt_token_ids: list[int] | None = None  # vLLM return_token_ids
    service_tier: str | None = None  # the tier that served it (OpenRouter echoes it at the top level)


_chat_decoder = msgspec.json.Decoder(WireBody)

# -- decoding chat bodies ------------------------------------------------------------------------------


def decode_chat(body: bytes, *, where: str = "") -> WireBody:
    """Decode a chat completion or chunk; leading blank-line padding is allowed (it is JSON whitespace)."""
    try:
        return _chat_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise RetryableAPIError(f"malformed response{' (' + where + ')' if where else ''}: {one_line(exc)}", kind="bad_response") from None
    except msgspec.DecodeError:
        snippet = one_line(body[:120].decode("utf-8", errors="replace"))
        raise RetryableAPIError(f"response is not JSON{' (' + where + ')' if where else ''}: {snippet!r}", kind="bad_json") from None


def usage_from_wire(u: WireUsage | None) -> Usage | None:
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


def _details_text(details: list[WireReasoningDetail] | None) -> str | None:
    if not details:
        return None
    parts = [d.text for d in details if d.text]
    return "".join(parts) if parts else None


def _tool_calls(calls: list[WireToolCall] | None) -> list[ToolCall] | None:
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
    msg = ch.message or ch.delta or WireMessage()
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
        service_tier=body.service_tier,
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
