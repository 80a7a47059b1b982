"""Chat-completion wire bodies: the decoding of what OpenAI-compatible chat servers send.

Reads response bodies and stream chunks (bytes) of ``POST /chat/completions``; decodes them with msgspec
into the lenient ``Wire*`` structs below (every field optional, unknown keys ignored) and turns a body
into a ``base.Completion``. An error found inside a body (a bare ``{"error":…}``, ``choices[0].error``) is
classified by ``backends.errors``, which also owns every other error classification; a body that is not
JSON or not of this shape is a retryable ``bad_json`` / ``bad_response``. Writes nothing.

Money first: ``usage`` is decoded apart from the rest and leniently (``usage_from_wire``): a count sent as
``154.0`` or ``"154"``, a cost sent as ``"0.001"``, are read (flagged ``usage_coerced``); a negative,
NaN, infinite or unreadable cost is never taken as a credit: it is dropped (flagged ``cost_invalid``) and
the engine computes the cost from the counts and the routed prices. A body rejected for its shape still
says what it was billed: ``decode_chat`` re-reads its usage (or, failing that, the size of its text) and
attaches it to the error (``backends.errors.bill``); so does a body rejected for what it holds (an error
inside a 200, no choice 0, ``finish_reason: error``, nothing in it: ``completion_from_body``,
``check_completion``).

One answer, from every field: only choice 0 counts (``choice_zero``; other choices are flagged
``extra_choices``), and reasoning is assembled from every field that carried it (``ReasoningParts``):
``reasoning``, ``reasoning_content`` and ``reasoning_details[].text`` (``reasoning.text`` blocks), in
arrival order; text that disagrees between fields is flagged.

OpenRouter's account bodies (``/key``, ``/credits``, endpoint lists) are decoded by ``backends.openrouter``,
the only backend that reads them.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from draftgen.backends.base import Billing, Completion, LogprobToken, SpecDecodeMetrics
from draftgen.backends.errors import WireError, attribute, bill, error_from_wire, one_line
from draftgen.errors import RetryableAPIError
from draftgen.records import FunctionCall, ToolCall, Usage

__all__ = [
    "ReasoningParts",
    "WireBody",
    "WireChoice",
    "WireFunction",
    "WireLogprob",
    "WireLogprobs",
    "WireMessage",
    "WireReasoningDetail",
    "WireToolCall",
    "WireUsage",
    "check_completion",
    "choice_zero",
    "completion_from_body",
    "decode_chat",
    "details_text",
    "loose_billing",
    "spec_decode_from_wire",
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
    index: Any = None
    message: WireMessage | None = None
    delta: WireMessage | None = None
    finish_reason: str | None = None
    native_finish_reason: Any = None
    error: WireError | None = None
    logprobs: WireLogprobs | None = None
    token_ids: list[int] | None = None  # vLLM return_token_ids


class WireUsage(msgspec.Struct):
    """``usage``, every field of any type: read by ``usage_from_wire``, which decides what a value means."""

    prompt_tokens: Any = None
    completion_tokens: Any = None
    prompt_tokens_details: Any = None
    completion_tokens_details: Any = None
    cost: Any = None
    is_byok: Any = None
    cost_details: Any = None


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
    metrics: Any = None  # vLLM's per-request metrics: ``speculative_decoding`` is read (``spec_decode_from_wire``)


_chat_decoder = msgspec.json.Decoder(WireBody)


class _LooseBody(msgspec.Struct):
    """What a body rejected for its shape is still read for: its usage and its text."""

    usage: Any = None
    choices: Any = None


_loose_decoder = msgspec.json.Decoder(_LooseBody)

# -- usage, leniently ------------------------------------------------------------------------------------


def _number(v: Any) -> float | None:
    """A JSON number, or a string holding one; None for anything else (bools included)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _count(v: Any, flags: set[str]) -> int:
    """A token count: an int as sent; a whole float or a numeric string read (``usage_coerced``); a
    negative, fractional, non-finite or unreadable value is 0 (``usage_coerced``); absent is 0."""
    if v is None:
        return 0
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    flags.add("usage_coerced")
    x = _number(v)
    if x is None or not math.isfinite(x) or x < 0:
        return 0
    return math.ceil(x)  # a fractional count is no count: round up, never down


def _money(v: Any, flags: set[str]) -> float | None:
    """A dollar amount: a finite, non-negative number (a numeric string is read, ``usage_coerced``);
    None when absent; None and ``cost_invalid`` when negative, NaN, infinite or unreadable."""
    if v is None:
        return None
    x = _number(v)
    if x is not None and not isinstance(v, int | float):
        flags.add("usage_coerced")
    if x is None or not math.isfinite(x) or x < 0:
        flags.add("cost_invalid")
        return None
    return x


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else None


def usage_from_wire(u: WireUsage | None) -> tuple[Usage | None, bool, list[str]]:
    """The record's usage, whether its ``cost`` is known, and the flags of what was wrong with it.

    A missing or invalid ``cost`` becomes 0.0 here and ``cost_known`` is False: the engine fills it from the
    routed prices (``Usage.cost_computed``). An invalid one is also flagged ``cost_invalid``: never a
    credit. ``is_byok`` is true only when sent as ``true``."""
    if u is None:
        return None, False, []
    flags: set[str] = set()
    cost = _money(u.cost, flags)
    upstream = _money(_field(u.cost_details, "upstream_inference_cost"), flags)
    usage = Usage(
        prompt_tokens=_count(u.prompt_tokens, flags),
        completion_tokens=_count(u.completion_tokens, flags),
        reasoning_tokens=_count(_field(u.completion_tokens_details, "reasoning_tokens"), flags),
        cached_tokens=_count(_field(u.prompt_tokens_details, "cached_tokens"), flags),
        cost=cost or 0.0,
        is_byok=u.is_byok is True,
        upstream_cost=upstream,
    )
    return usage, cost is not None, sorted(flags)


def _loose_text_bytes(obj: Any, depth: int = 0) -> int:
    """UTF-8 bytes of the text fields anywhere in a decoded ``choices`` value (content, reasoning, text,
    arguments), for pricing a rejected body that has no usage."""
    if depth > 8:
        return 0
    if isinstance(obj, list):
        return sum(_loose_text_bytes(x, depth + 1) for x in obj)
    if not isinstance(obj, dict):
        return 0
    n = 0
    for k, v in obj.items():
        if isinstance(v, str) and k in ("content", "reasoning", "reasoning_content", "text", "arguments"):
            n += len(v.encode("utf-8", errors="replace"))
        elif isinstance(v, dict | list):
            n += _loose_text_bytes(v, depth + 1)
    return n


def loose_billing(body: bytes) -> Billing | None:
    """What a body that failed decoding says it was billed: its usage read leniently, else the size of
    its text; None when it holds neither (or is not JSON at all)."""
    try:
        loose = _loose_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    usage = None
    cost_known = False
    if isinstance(loose.usage, dict):
        try:
            wire = msgspec.convert(loose.usage, WireUsage)
        except msgspec.ValidationError:
            wire = None
        usage, cost_known, _ = usage_from_wire(wire)
    text = _loose_text_bytes(loose.choices)
    if usage is None and not text:
        return None
    return Billing(usage=usage, cost_known=cost_known, text_bytes=text)


# -- decoding chat bodies ------------------------------------------------------------------------------


def decode_chat(body: bytes, *, where: str = "") -> WireBody:
    """Decode a chat completion or chunk; leading blank-line padding is allowed (it is JSON whitespace).
    A body rejected for its shape carries what it says it was billed (``loose_billing``)."""
    try:
        return _chat_decoder.decode(body)
    except msgspec.ValidationError as exc:
        err = RetryableAPIError(f"malformed response{' (' + where + ')' if where else ''}: {one_line(exc)}",
                                kind="bad_response")
        raise bill(err, loose_billing(body)) from None
    except msgspec.DecodeError:
        snippet = one_line(body[:120].decode("utf-8", errors="replace"))
        raise RetryableAPIError(f"response is not JSON{' (' + where + ')' if where else ''}: {snippet!r}", kind="bad_json") from None


class ReasoningParts:
    """Reasoning assembled from every field that carried it, in arrival order.

    Each ``add`` is one message or delta: its ``reasoning``, ``reasoning_content`` and details text. Texts
    that agree (the usual case: OpenRouter sends each delta as both ``reasoning`` and
    ``reasoning_details``) count once; a delta whose fields disagree contributes the first of them, in
    that order, and the result is flagged ``reasoning_fields_disagree``. ``result``:

    - every field that carried text carried the same whole text (all in each delta, or one field's deltas
      then another's repeat): that text;
    - the same modulo whitespace at the edges: the first field's text, ``reasoning_fields_disagree``;
    - else the deltas' texts joined in arrival order, ``reasoning_fields_mixed`` when they came from more
      than one field (``reasoning`` in some deltas, ``reasoning_details`` in others).

    ``reasoning_field`` names the field of the first delta that carried reasoning.
    """

    _NAMES = ("reasoning", "reasoning_content", "reasoning_details")

    __slots__ = ("chosen", "disagree", "fields", "first", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.fields: dict[str, list[str]] = {}
        self.chosen: set[str] = set()
        self.first: str | None = None
        self.disagree = False

    def add(self, reasoning: str | None, reasoning_content: str | None, details: str | None) -> None:
        got = [(n, t) for n, t in zip(self._NAMES, (reasoning, reasoning_content, details), strict=True) if t]
        if not got:
            return
        name, text = got[0]
        for n, t in got:
            self.fields.setdefault(n, []).append(t)
            if t != text:
                self.disagree = True
        if self.first is None:
            self.first = name
        self.chosen.add(name)
        self.parts.append(text)

    def result(self) -> tuple[str | None, str | None, list[str]]:
        """(text, the field it came from, flags); (None, None, []) when no field carried any."""
        if not self.parts:
            return None, None, []
        whole = {n: "".join(ts) for n, ts in self.fields.items()}
        first = whole[self.first] if self.first is not None else ""
        if len(set(whole.values())) == 1:
            return first, self.first, []
        if len({w.strip() for w in whole.values()}) == 1:
            return first, self.first, ["reasoning_fields_disagree"]
        flags = ["reasoning_fields_disagree"] if self.disagree else []
        if len(self.chosen) > 1:
            flags.append("reasoning_fields_mixed")
        return "".join(self.parts), self.first, flags


def details_text(details: list[WireReasoningDetail] | None) -> str | None:
    """The ``text`` of the blocks of ``reasoning_details`` (``reasoning.text`` blocks; summaries and
    encrypted blocks carry theirs in ``summary`` / ``data``, no text of the model's own)."""
    if not details:
        return None
    parts = [d.text for d in details if d.text]
    return "".join(parts) if parts else None


def choice_zero(choices: list[WireChoice]) -> tuple[WireChoice | None, int]:
    """The choice with ``index`` 0 (a choice without an integer index takes its position), and how many
    others there were."""
    zero: WireChoice | None = None
    others = 0
    for pos, ch in enumerate(choices):
        idx = ch.index if isinstance(ch.index, int) and not isinstance(ch.index, bool) else pos
        if idx == 0 and zero is None:
            zero = ch
        else:
            others += 1
    return zero, others


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


def _text_bytes(*texts: str | None) -> int:
    return sum(len(t.encode("utf-8", errors="replace")) for t in texts if t)


def spec_decode_from_wire(metrics: Any) -> tuple[SpecDecodeMetrics | None, list[str]]:
    """A body's (or chunk's) ``metrics.speculative_decoding`` as ``SpecDecodeMetrics``, and the flags to carry:
    none sent is (None, []); one of another shape (a field missing, a count not an integer) is
    (None, ["spec_decode_unreadable"])."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is None:
        return None, []
    try:
        return msgspec.convert(spec, SpecDecodeMetrics), []
    except msgspec.ValidationError:
        return None, ["spec_decode_unreadable"]


def completion_from_body(body: WireBody, *, backend: str, status: int = 200, where: str = "") -> Completion:
    """A non-streaming chat body → Completion (choice 0 only); an error inside the 200 body raises its
    APIError."""
    usage, cost_known, usage_flags = usage_from_wire(body.usage)
    billed = Billing(usage=usage, cost_known=cost_known) if usage is not None else None
    if body.error is not None:
        raise bill(error_from_wire(body.error, status, provider=body.provider, where=where), billed)
    ch, others = choice_zero(body.choices or [])
    if ch is None:
        raise bill(attribute(RetryableAPIError(f"empty_response (no choice 0{', ' + body.provider if body.provider else ''})",
                                               kind="empty_response"), body.provider), billed)
    if ch.error is not None:
        raise bill(error_from_wire(ch.error, status, provider=body.provider, where=where), billed)
    msg = ch.message or ch.delta or WireMessage()
    parts = ReasoningParts()
    parts.add(msg.reasoning, msg.reasoning_content, details_text(msg.reasoning_details))
    reasoning, field, flags = parts.result()
    logprobs = None
    if ch.logprobs is not None and ch.logprobs.content:
        logprobs = [LogprobToken(lp.token, lp.bytes) for lp in ch.logprobs.content]
    nfr = ch.native_finish_reason
    tools = _tool_calls(msg.tool_calls)
    spec, spec_flags = spec_decode_from_wire(body.metrics)
    return Completion(
        backend=backend,
        reasoning=reasoning,
        content=msg.content,
        tool_calls=tools,
        reasoning_field=field,
        finish_reason=ch.finish_reason,
        native_finish_reason=nfr if nfr is None or isinstance(nfr, str) else str(nfr),
        provider=body.provider,
        model=body.model,
        generation_id=body.id,
        usage=usage,
        output_ids=ch.token_ids,
        prompt_ids=body.prompt_token_ids,
        logprobs=logprobs,
        cost_missing=usage is not None and not cost_known,
        flags=usage_flags + flags + spec_flags + (["extra_choices"] if others else []),
        providers=[body.provider] if body.provider else [],
        models=[body.model] if body.model else [],
        text_bytes=_text_bytes(reasoning, msg.content, *((t.function.arguments if t.function else None)
                                                           for t in tools or ())),
        service_tier=body.service_tier,
        spec_decode=spec,
    )


def check_completion(comp: Completion) -> Completion:
    """Reject what must be retried although it came back as a 200: ``finish_reason: error`` and empty
    responses (no text, no tool calls, and no completion tokens or no finish reason). The error carries
    what the response was billed (``bill``): the engine books it."""
    prov = f", {comp.provider}" if comp.provider else ""
    billed = Billing(usage=comp.usage, cost_known=not comp.cost_missing, text_bytes=comp.text_bytes)
    if comp.finish_reason == "error":
        raise bill(attribute(RetryableAPIError(f"finish_error (finish_reason error{prov})", kind="finish_error"),
                             comp.provider), billed)
    if not comp.content and not comp.reasoning and not comp.tool_calls and not comp.output_ids:
        completion_tokens = comp.usage.completion_tokens if comp.usage is not None else 0
        if completion_tokens == 0 or comp.finish_reason is None:
            raise bill(attribute(RetryableAPIError(f"empty_response (no text, finish_reason {comp.finish_reason}{prov})",
                                                   kind="empty_response"), comp.provider), billed)
    return comp
