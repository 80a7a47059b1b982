"""Server-sent events: framing (bytes → event payloads) and chat-chunk accumulation (payloads → Completion).

Framing (``SSEParser``), per the SSE spec as servers really send it:
- lines end in ``\\n`` or ``\\r\\n``; an empty line ends an event; ``data:`` lines of one event are joined
  with ``\\n``; a single space after the colon is dropped;
- lines starting with ``:`` are comments (OpenRouter's ``: OPENROUTER PROCESSING`` keep-alives) and are
  skipped wherever they arrive; ``event:``, ``id:`` and ``retry:`` fields are ignored;
- a chunk boundary may fall anywhere, even inside a line.

Accumulation (``ChatStream``) of OpenAI-style ``chat.completion.chunk`` payloads:
- ``data: [DONE]`` ends the stream;
- only choice 0 counts (by ``index``; a choice without one takes its position): another choice's deltas
  never reach the text, and the completion is flagged ``extra_choices``;
- reasoning is assembled from every field, delta by delta, in arrival order (``wire.ReasoningParts``);
- every chunk's ``provider`` and ``model`` count: the completion lists each distinct one in order
  (``Completion.providers`` / ``models``), so a stream that changed provider or model mid-way is seen;
- a chunk of the wrong shape does not end the reading: the rest of the stream is read for its usage, and
  ``result`` raises the ``bad_response`` carrying what the stream said it was billed (``errors.bill``);
- the usage may come in a final chunk with ``choices: []`` or on a repeated finish chunk (Kimi via
  OpenRouter sends the finish chunk twice, the second time with usage): the last usage seen wins, and a
  repeated finish reason is not an error;
- a chunk with a top-level ``error`` (HTTP status still 200) is a mid-stream error: it raises the
  classified APIError (retryable unless the error says otherwise); so does ``finish_reason: error``;
- a stream that ends without ``[DONE]`` and without a finish reason was cut: retryable.
"""

from __future__ import annotations

from typing import Any

from draftgen.backends.base import Billing, Completion, LogprobToken
from draftgen.backends.errors import attribute, billing_of, error_from_wire
from draftgen.backends.wire import (
    ReasoningParts,
    WireToolCall,
    WireUsage,
    choice_zero,
    decode_chat,
    details_text,
    spec_decode_from_wire,
    usage_from_wire,
)
from draftgen.errors import RetryableAPIError
from draftgen.records import FunctionCall, ToolCall

__all__ = ["ChatStream", "SSEParser"]


class SSEParser:
    """Incremental SSE framing. ``feed`` returns the payloads of the events completed by ``chunk``.

    Linear in the bytes fed, however a long line is split (the pieces of an unfinished line are joined
    once, when its newline arrives). ``pending`` is the size of what is buffered for the next event, so a
    caller can refuse an event that grows without bound.
    """

    __slots__ = ("_data", "_data_size", "_parts", "_parts_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # an unfinished line, in pieces
        self._parts_size = 0
        self._data: list[bytes] = []
        self._data_size = 0

    @property
    def pending(self) -> int:
        """Bytes held for the event not yet complete (its data lines and the unfinished line)."""
        return self._parts_size + self._data_size

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\n" not in chunk:
            if chunk:
                self._parts.append(chunk)
                self._parts_size += len(chunk)
            return []
        if self._parts:
            self._parts.append(chunk)
            buf = b"".join(self._parts)
            self._parts.clear()
            self._parts_size = 0
        else:
            buf = chunk
        lines = buf.split(b"\n")
        tail = lines.pop()
        if tail:
            self._parts.append(tail)
            self._parts_size = len(tail)
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
                    self._data_size = 0
                continue
            first = line[0]
            if first == 58:  # ":" comment / keep-alive
                continue
            if line[:5] == b"data:":
                value = line[5:]
                if value[:1] == b" ":
                    value = value[1:]
                data.append(value)
                self._data_size += len(value) + 1
            # other fields (event, id, retry) carry nothing draftgen uses
        return out

    def close(self) -> list[bytes]:
        """End of body: a last event not followed by a blank line is still delivered."""
        out = self.feed(b"\n\n") if self._parts else []
        if self._data:
            out.append(b"\n".join(self._data))
            self._data.clear()
            self._data_size = 0
        return out


class _ToolAcc:
    __slots__ = ("args", "id", "name", "type")

    def __init__(self) -> None:
        self.id = ""
        self.type = "function"
        self.name = ""
        self.args: list[str] = []


class ChatStream:
    """Accumulates the chunks of one streamed chat completion."""

    __slots__ = (
        "_bad", "_content", "_logprobs", "_reasoning", "_tools", "backend", "chars", "done", "extra_choices",
        "finish_reason", "generation_id", "metrics", "model", "models", "native_finish_reason", "output_ids",
        "prompt_ids", "provider", "providers", "service_tier", "text_bytes", "usage", "where",
    )

    def __init__(self, backend: str, *, where: str = "") -> None:
        self.backend = backend
        self.where = where
        self._content: list[str] = []
        self._reasoning = ReasoningParts()
        self._tools: dict[int, _ToolAcc] | None = None
        self._logprobs: list[LogprobToken] | None = None
        self._bad: RetryableAPIError | None = None  # the first chunk of the wrong shape
        self.done = False
        self.extra_choices = 0
        self.finish_reason: str | None = None
        self.native_finish_reason: str | None = None
        self.provider: str | None = None
        self.providers: list[str] = []
        self.model: str | None = None
        self.models: list[str] = []
        self.generation_id: str | None = None
        self.usage: WireUsage | None = None
        self.output_ids: list[int] | None = None
        self.prompt_ids: list[int] | None = None
        self.text_bytes = 0
        self.service_tier: str | None = None
        self.metrics: Any = None  # the last chunk's ``metrics`` (vLLM: with the usage, at the end)
        self.chars = 0  # characters of content and reasoning text so far (a progress figure, ``WireMeter``)

    def feed(self, payload: bytes) -> None:
        """One event payload. Raises the classified APIError on an error chunk; a chunk of the wrong shape
        is kept for ``result`` (the usage may still follow)."""
        if payload[:6] == b"[DONE]":
            self.done = True
            return
        try:
            chunk = decode_chat(payload, where=self.where)
        except RetryableAPIError as exc:
            if self._bad is None:
                self._bad = exc
            return
        if chunk.provider is not None:
            self.provider = chunk.provider
            if chunk.provider not in self.providers:
                self.providers.append(chunk.provider)
        if chunk.error is not None:
            raise error_from_wire(chunk.error, 200, provider=self.provider, where=self.where or "mid-stream")
        if self.generation_id is None and chunk.id is not None:
            self.generation_id = chunk.id
        if chunk.model is not None:
            self.model = chunk.model
            if chunk.model not in self.models:
                self.models.append(chunk.model)
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.prompt_token_ids is not None:
            self.prompt_ids = chunk.prompt_token_ids
        if chunk.service_tier is not None:
            self.service_tier = chunk.service_tier
        if chunk.metrics is not None:
            self.metrics = chunk.metrics
        if not chunk.choices:
            return
        ch, others = choice_zero(chunk.choices)
        self.extra_choices += others
        if ch is None:
            return
        if ch.error is not None:
            raise error_from_wire(ch.error, 200, provider=self.provider, where=self.where or "mid-stream")
        d = ch.delta if ch.delta is not None else ch.message
        if d is not None:
            if d.content is not None:
                self._content.append(d.content)
                self.text_bytes += len(d.content.encode("utf-8", errors="replace"))
                self.chars += len(d.content)
            details = details_text(d.reasoning_details)
            self._reasoning.add(d.reasoning, d.reasoning_content, details)
            for text in (d.reasoning, d.reasoning_content, details):
                if text:  # the same text under several names counts once
                    self.text_bytes += len(text.encode("utf-8", errors="replace"))
                    self.chars += len(text)
                    break
            if d.tool_calls:
                self._add_tools(d.tool_calls)
        if ch.token_ids:
            if self.output_ids is None:
                self.output_ids = []
            self.output_ids.extend(ch.token_ids)
        if ch.logprobs is not None and ch.logprobs.content:
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(LogprobToken(lp.token, lp.bytes) for lp in ch.logprobs.content)
        if ch.finish_reason is not None:
            self.finish_reason = ch.finish_reason
            nfr = ch.native_finish_reason
            self.native_finish_reason = nfr if nfr is None or isinstance(nfr, str) else str(nfr)

    def _add_tools(self, calls: list[WireToolCall]) -> None:
        tools = self._tools if self._tools is not None else {}
        self._tools = tools
        for i, c in enumerate(calls):
            idx = c.index if c.index is not None else i
            acc = tools.get(idx)
            if acc is None:
                acc = tools[idx] = _ToolAcc()
            if c.id:
                acc.id = c.id
            if c.type:
                acc.type = c.type
            if c.function is not None:
                if c.function.name:
                    acc.name += c.function.name
                if c.function.arguments:
                    acc.args.append(c.function.arguments)
                    self.text_bytes += len(c.function.arguments.encode("utf-8", errors="replace"))

    def billing(self) -> Billing | None:
        """What the stream said it was billed so far: its last usage, else a malformed chunk's, else the
        size of the text received (None when there is nothing)."""
        if self.usage is not None:
            usage, cost_known, _ = usage_from_wire(self.usage)
            return Billing(usage=usage, cost_known=cost_known, text_bytes=self.text_bytes)
        loose = billing_of(self._bad) if self._bad is not None else None
        if loose is not None and loose.usage is not None:
            return loose
        text = self.text_bytes + (loose.text_bytes if loose is not None else 0)
        return Billing(text_bytes=text) if text else None

    def result(self) -> Completion:
        """The completion once the body has ended. A cut stream is a retryable error; so is a stream with a
        chunk of the wrong shape (billed: it carries the stream's usage)."""
        prov = f", {self.provider}" if self.provider else ""
        if self._bad is not None:
            bad = self._bad
            billing = self.billing()
            if billing is not None:
                bad.billing = billing  # type: ignore[attr-defined]  # the stream's, over the one chunk's
            raise attribute(bad, self.provider)
        if not self.done and self.finish_reason is None:
            raise attribute(RetryableAPIError(
                f"stream_truncated (the stream ended without a finish reason{prov})", kind="stream_truncated",
            ), self.provider)
        reasoning, field, flags = self._reasoning.result()
        tool_calls = None
        if self._tools:
            tool_calls = [
                ToolCall(id=a.id, type=a.type, function=FunctionCall(name=a.name, arguments="".join(a.args)))
                for _, a in sorted(self._tools.items())
            ]
        usage, cost_known, usage_flags = usage_from_wire(self.usage)
        spec, spec_flags = spec_decode_from_wire(self.metrics)
        return Completion(
            backend=self.backend,
            reasoning=reasoning,
            content="".join(self._content) if self._content else None,
            tool_calls=tool_calls,
            reasoning_field=field,
            finish_reason=self.finish_reason,
            native_finish_reason=self.native_finish_reason,
            provider=self.provider,
            model=self.model,
            generation_id=self.generation_id,
            usage=usage,
            output_ids=self.output_ids,
            prompt_ids=self.prompt_ids,
            logprobs=self._logprobs,
            cost_missing=usage is not None and not cost_known,
            flags=usage_flags + flags + spec_flags + (["extra_choices"] if self.extra_choices else []),
            providers=list(self.providers),
            models=list(self.models),
            text_bytes=self.text_bytes,
            service_tier=self.service_tier,
            spec_decode=spec,
        )
