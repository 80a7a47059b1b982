from __future__ import annotations

import json

import pytest

from draftgen.backends.sse import ChatStream, SSEParser
from draftgen.errors import PermanentAPIError, RateLimited, RetryableAPIError


def _feed_all(raw: bytes, step: int) -> list[bytes]:
    p = SSEParser()
    out: list[bytes] = []
    for i in range(0, len(raw), step):
        out += p.feed(raw[i:i + step])
    return out + p.close()


def _chunk(**kw: object) -> bytes:
    base: dict[str, object] = {"id": "gen-1", "object": "chat.completion.chunk", "model": "m", "provider": "P"}
    base.update(kw)
    return b"data: " + json.dumps(base).encode() + b"\n\n"


def _delta(**delta: object) -> dict[str, object]:
    return {"index": 0, "delta": delta, "finish_reason": None}


STREAM = (
    b": OPENROUTER PROCESSING\n\n"
    + _chunk(choices=[_delta(role="assistant", content="", reasoning=" Let me", reasoning_details=[{"type": "reasoning.text", "text": " Let me"}])])
    + b": OPENROUTER PROCESSING\n\n"
    + _chunk(choices=[_delta(content="", reasoning=" think.\n")])
    + _chunk(choices=[_delta(content="Héllo ")])
    + _chunk(choices=[_delta(content="wörld 🌍")])
    + _chunk(choices=[{"index": 0, "delta": {"content": ""}, "finish_reason": "stop", "native_finish_reason": "stop"}])
    + _chunk(choices=[], usage={"prompt_tokens": 5, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 4},
                                "cost": 0.001, "is_byok": False})
    + b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 100000])
def test_framing_survives_any_chunk_boundary(step: int) -> None:
    payloads = _feed_all(STREAM, step)
    assert payloads[-1] == b"[DONE]"
    assert len(payloads) == 7  # comments are not events
    acc = ChatStream("openrouter")
    for p in payloads:
        acc.feed(p)
    comp = acc.result()
    assert comp.content == "Héllo wörld 🌍"
    assert comp.reasoning == " Let me think.\n"  # leading space and trailing newline kept
    assert comp.reasoning_field == "reasoning"
    assert comp.finish_reason == "stop" and comp.native_finish_reason == "stop"
    assert comp.usage is not None and comp.usage.completion_tokens == 9 and comp.usage.reasoning_tokens == 4
    assert comp.usage.cost == pytest.approx(0.001)
    assert comp.provider == "P" and comp.generation_id == "gen-1"


def test_crlf_multiline_data_and_other_fields() -> None:
    raw = b"event: message\r\nid: 3\r\nretry: 100\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n:comment\r\ndata: [DONE]\r\n\r\n"
    assert _feed_all(raw, 5) == [b'{"a":\n1}', b"[DONE]"]


def test_event_without_trailing_blank_line_is_delivered_at_eof() -> None:
    assert _feed_all(b"data: [DONE]", 4) == [b"[DONE]"]


def test_repeated_finish_chunk_with_usage_in_nonempty_choices() -> None:
    fin = {"index": 0, "delta": {"content": "", "reasoning": None}, "finish_reason": "tool_calls", "native_finish_reason": "tool_calls"}
    raw = (_chunk(choices=[_delta(content=None, tool_calls=[{"index": 0, "id": "functions.weather:0", "type": "function",
                                                             "function": {"name": "weather", "arguments": ""}}])])
           + _chunk(choices=[_delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}])])
           + _chunk(choices=[_delta(tool_calls=[{"index": 0, "function": {"arguments": '"Florence"}'}}])])
           + _chunk(choices=[fin])
           + _chunk(choices=[fin], usage={"prompt_tokens": 3, "completion_tokens": 12})
           + b"data: [DONE]\n\n")
    acc = ChatStream("openrouter")
    for p in _feed_all(raw, 11):
        acc.feed(p)
    comp = acc.result()
    assert comp.finish_reason == "tool_calls"
    assert comp.usage is not None and comp.usage.completion_tokens == 12
    assert comp.tool_calls is not None and len(comp.tool_calls) == 1
    tc = comp.tool_calls[0]
    assert tc.id == "functions.weather:0" and tc.function is not None
    assert tc.function.name == "weather" and tc.function.arguments == '{"city": "Florence"}'
    assert comp.content == ""  # only empty content deltas: an empty string, as a whole body would say


def test_mid_stream_error_chunk_raises_classified_error() -> None:
    err = {"code": 429, "message": "temporarily rate-limited upstream", "metadata": {"error_type": "rate_limit_exceeded"}}
    raw = (_chunk(choices=[_delta(content="partial")])
           + _chunk(error=err, choices=[{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]))
    acc = ChatStream("openrouter")
    payloads = _feed_all(raw, 9)
    acc.feed(payloads[0])
    with pytest.raises(RateLimited) as ei:
        acc.feed(payloads[1])
    assert ei.value.kind == "rate_limit_exceeded"
    assert "P" in str(ei.value)


@pytest.mark.parametrize(("code", "cls"), [("server_error", RetryableAPIError), (502, RetryableAPIError),
                                           ("400", PermanentAPIError)])
def test_mid_stream_error_code_int_or_string(code: object, cls: type[Exception]) -> None:
    acc = ChatStream("openrouter")
    with pytest.raises(cls):
        acc.feed(_feed_all(_chunk(error={"code": code, "message": "boom"}), 1000)[0])


def test_truncated_stream_is_retryable() -> None:
    acc = ChatStream("openrouter")
    for p in _feed_all(_chunk(choices=[_delta(content="half an ans")]), 1000):
        acc.feed(p)
    with pytest.raises(RetryableAPIError) as ei:
        acc.result()
    assert ei.value.kind == "stream_truncated"


@pytest.mark.parametrize(
    ("fields", "want", "field"),
    [
        ({"reasoning": "", "reasoning_content": "rc"}, "rc", "reasoning_content"),
        ({"reasoning": None, "reasoning_details": [{"type": "reasoning.text", "text": "a"}, {"text": "b"}]}, "ab", "reasoning_details"),
        ({"reasoning": "r", "reasoning_content": "rc"}, "r", "reasoning"),
        ({"reasoning": "", "reasoning_content": None, "reasoning_details": []}, None, None),
    ],
)
def test_reasoning_field_precedence(fields: dict[str, object], want: str | None, field: str | None) -> None:
    acc = ChatStream("openrouter")
    for p in _feed_all(_chunk(choices=[{"index": 0, "delta": {"content": "x", **fields}, "finish_reason": "stop"}]) + b"data: [DONE]\n\n", 1000):
        acc.feed(p)
    comp = acc.result()
    assert comp.reasoning == want
    assert comp.reasoning_field == field


def test_vllm_token_ids_per_delta_and_prompt_ids() -> None:
    raw = (_chunk(prompt_token_ids=[1, 2, 3], choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}])
           + _chunk(choices=[{"index": 0, "delta": {"reasoning_content": "hm"}, "token_ids": [10, 11]}])
           + _chunk(choices=[{"index": 0, "delta": {"content": "ok"}, "token_ids": [12]}])
           + _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [13]}])
           + b"data: [DONE]\n\n")
    acc = ChatStream("vllm")
    for p in _feed_all(raw, 13):
        acc.feed(p)
    comp = acc.result()
    assert comp.prompt_ids == [1, 2, 3]
    assert comp.output_ids == [10, 11, 12, 13]
    assert comp.reasoning == "hm" and comp.reasoning_field == "reasoning_content"


def test_a_long_line_split_in_many_chunks_is_buffered_once_and_measured() -> None:
    # 300 KB in one data line, fed 1 KB at a time: ``pending`` lets a reader refuse an event that grows
    # without bound, and the pieces are joined once (not re-copied on every feed).
    line = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 300_000 + b'"}}]}'
    p = SSEParser()
    for i in range(0, len(line), 1024):
        assert p.feed(line[i:i + 1024]) == []
        assert p.pending == min(i + 1024, len(line))
    assert p.feed(b"\n") == [] and p.pending == len(line) - 5  # the data value, held until the blank line
    assert p.feed(b": keep-alive\n\n") == [line[6:]] and p.pending == 0
    assert p.feed(b"data: [DONE]") == [] and p.close() == [b"[DONE]"] and p.pending == 0


def test_usage_without_cost_is_flagged_for_pricing() -> None:
    def stream(usage: dict[str, object]) -> bytes:
        return (_chunk(choices=[_delta(content="hi")])
                + _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}], usage=usage)
                + b"data: [DONE]\n\n")

    for usage, missing in (({"prompt_tokens": 5, "completion_tokens": 2}, True),
                           ({"prompt_tokens": 5, "completion_tokens": 2, "cost": 0.0}, False),
                           ({"prompt_tokens": 5, "completion_tokens": 2, "cost": 0.002}, False)):
        acc = ChatStream("openai")
        for payload in _feed_all(stream(usage), 64):
            acc.feed(payload)
        comp = acc.result()
        assert comp.cost_missing is missing and comp.usage is not None and not comp.usage.cost_computed


def test_a_streams_per_request_spec_decode_metrics_come_with_its_usage() -> None:
    """vLLM sends ``metrics.speculative_decoding`` in the final ``choices: []`` usage chunk."""
    spec = {"acceptance_histogram": [1, 0, 2], "num_spec_steps": 3, "num_accepted_draft_tokens": 4,
            "num_draft_tokens": 6, "num_spec_tokens": 2, "mean_acceptance_length": 2.333}
    raw = (_chunk(choices=[_delta(role="assistant", content="hi")])
           + _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
           + _chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 7},
                    metrics={"speculative_decoding": spec})
           + b"data: [DONE]\n\n")
    acc = ChatStream("vllm")
    for p in _feed_all(raw, 7):
        acc.feed(p)
    comp = acc.result()
    assert comp.spec_decode is not None and comp.spec_decode.acceptance_histogram == [1, 0, 2]
    assert comp.spec_decode.num_accepted_draft_tokens == 4 and comp.usage is not None
