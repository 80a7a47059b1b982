"""Fuzzed response parsing: whatever a server sends, the client classifies it and never crashes.

Every input (a status plus a JSON body, random bytes, or an SSE stream cut at random chunk boundaries)
must end as exactly one of: a completion, a retryable failure (``RetryableAPIError``) or a permanent
failure (``PermanentAPIError``). Any other exception is a crash and fails the test. The pure path
mirrors ``OpenAIChatBackend.complete``; a smaller run sends the same inputs over real HTTP to the real
backend.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftgen.backends.base import Completion, CompletionRequest
from draftgen.backends.errors import billing_of, classify_http
from draftgen.backends.openrouter import OpenAIChatBackend
from draftgen.backends.sse import ChatStream, SSEParser
from draftgen.backends.wire import check_completion, completion_from_body, decode_chat
from draftgen.errors import APIError, PermanentAPIError, RetryableAPIError
from draftgen.records import Message

from ._helpers import fuzz_examples

STATUSES = [200, 200, 200, 400, 401, 402, 403, 404, 408, 413, 418, 422, 429, 500, 502, 503, 504, 524, 529]

# -- strategies -------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), st.text(max_size=30)
)
any_json = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)),
    max_leaves=20,
)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The field's plausible value, or any JSON value (a wrong type), or absent (None → dropped)."""
    return st.one_of(strategy, any_json, st.just(None))


text_vals = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
finish = st.sampled_from(["stop", "length", "tool_calls", "content_filter", "error", None, ""])
error_types = st.sampled_from([
    "context_length_exceeded", "rate_limit_exceeded", "provider_overloaded", "invalid_request",
    "authentication", "payment_required", "server", "timeout", "refusal", "unmapped", "what",
])
error_obj = st.fixed_dictionaries({}, optional={
    "code": st.one_of(st.integers(0, 999), st.sampled_from(["server_error", "429", "rate_limit_exceeded"]), any_json),
    "message": maybe(text_vals),
    "metadata": maybe(st.fixed_dictionaries({}, optional={
        "error_type": maybe(error_types),
        "raw": maybe(text_vals),
        "provider_name": maybe(text_vals),
        "limit_source": maybe(st.sampled_from(["openrouter_in_flight_budget", "openrouter_key_limit", "x"])),
    })),
    "availability": maybe(st.fixed_dictionaries({}, optional={
        "code": maybe(st.sampled_from(["capacity_exhausted", "model_not_found", "temporarily_unavailable"])),
        "retryable": maybe(st.booleans()),
        "retry_after": maybe(st.floats(-10, 1e6, allow_nan=False)),
    })),
})
message = st.fixed_dictionaries({}, optional={
    "role": maybe(st.just("assistant")),
    "content": maybe(text_vals),
    "reasoning": maybe(text_vals),
    "reasoning_content": maybe(text_vals),
    "reasoning_details": maybe(st.lists(st.fixed_dictionaries({}, optional={
        "type": maybe(st.just("reasoning.text")), "text": maybe(text_vals)}), max_size=3)),
    "tool_calls": maybe(st.lists(st.fixed_dictionaries({}, optional={
        "index": maybe(st.integers(0, 3)), "id": maybe(text_vals), "type": maybe(st.just("function")),
        "function": maybe(st.fixed_dictionaries({}, optional={"name": maybe(text_vals),
                                                                "arguments": maybe(text_vals)})),
    }), max_size=2)),
})
usage = st.fixed_dictionaries({}, optional={
    "prompt_tokens": maybe(st.integers(0, 10**6)),
    "completion_tokens": maybe(st.integers(0, 10**6)),
    "cost": maybe(st.floats(0, 10, allow_nan=False)),
    "is_byok": maybe(st.booleans()),
    "completion_tokens_details": maybe(st.fixed_dictionaries({}, optional={
        "reasoning_tokens": maybe(st.integers(0, 10**6))})),
    "cost_details": maybe(st.fixed_dictionaries({}, optional={
        "upstream_inference_cost": maybe(st.floats(0, 10, allow_nan=False))})),
})


def choice(delta: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "index": maybe(st.integers(0, 2)),
        ("delta" if delta else "message"): maybe(message),
        "finish_reason": maybe(finish),
        "native_finish_reason": maybe(finish),
        "error": maybe(error_obj),
        "logprobs": maybe(st.fixed_dictionaries({"content": maybe(st.lists(st.fixed_dictionaries({
            "token": maybe(text_vals), "bytes": maybe(st.lists(st.integers(0, 255), max_size=4))}), max_size=3))})),
    })


def chat_body(delta: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "id": maybe(st.just("gen-1")),
        "object": maybe(st.just("chat.completion.chunk" if delta else "chat.completion")),
        "provider": maybe(text_vals),
        "model": maybe(text_vals),
        "choices": maybe(st.lists(choice(delta), max_size=2)),
        "usage": maybe(usage),
        "error": maybe(error_obj),
    })


def _dump(obj: Any) -> bytes:
    return json.dumps(_drop_none(obj), ensure_ascii=False).encode("utf-8", errors="surrogatepass")


def _drop_none(obj: Any) -> Any:
    """None in an optional slot means "absent"; a None inside a list stays (a wrong type)."""
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj]
    return obj


@st.composite
def mutated(draw: st.DrawFn, obj: dict[str, Any]) -> dict[str, Any]:
    """A well-formed object with up to two random edits: a key dropped or a value of the wrong type."""
    for _ in range(draw(st.integers(0, 2))):
        path = [obj]
        node: Any = obj
        while isinstance(node, dict | list) and node and draw(st.booleans()):
            key = draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
            path.append(node[key])
            parent, node = node, node[key]
        if len(path) > 1:
            if draw(st.booleans()) and isinstance(parent, dict):
                del parent[key]
            else:
                parent[key] = draw(any_json)
    return obj


@st.composite
def good_body(draw: st.DrawFn) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": draw(st.text(min_size=1, max_size=30))}
    msg[draw(st.sampled_from(["reasoning", "reasoning_content"]))] = draw(st.text(max_size=30))
    body = {"id": "gen-1", "provider": "P", "model": "m", "object": "chat.completion",
            "choices": [{"index": 0, "message": msg, "finish_reason": draw(finish),
                         "native_finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 50)), "cost": 0.001,
                      "completion_tokens_details": {"reasoning_tokens": 2}}}
    return draw(mutated(body))


@st.composite
def good_stream_events(draw: st.DrawFn) -> list[bytes]:
    content = draw(st.text(min_size=1, max_size=20))
    cut = draw(st.integers(0, len(content)))
    chunks: list[dict[str, Any]] = [
        {"id": "gen-1", "provider": "P", "choices": [{"delta": {"role": "assistant", "reasoning": "hm"}}]},
        {"id": "gen-1", "choices": [{"delta": {"content": content[:cut]}}]},
        {"id": "gen-1", "choices": [{"delta": {"content": content[cut:]}, "finish_reason": draw(finish)}]},
        {"id": "gen-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, "cost": 0.001}},
    ]
    if draw(st.booleans()):  # an error chunk mid-stream
        chunks.insert(2, {"id": "gen-1", "error": draw(error_obj),
                          "choices": [{"delta": {"content": ""}, "finish_reason": "error"}]})
    events = [b"data: " + _dump(draw(mutated(c))) for c in chunks]
    if draw(st.integers(0, 3)):
        events.append(b"data: [DONE]")
    for _ in range(draw(st.integers(0, 2))):
        events.insert(draw(st.integers(0, len(events))), b": OPENROUTER PROCESSING")
    return events


padding = st.sampled_from([b"", b"", b"\n\n", b"\r\n  \n", b" "])
json_body = st.one_of(
    st.builds(lambda pad, b: pad + _dump(b), padding, good_body()),
    st.builds(lambda pad, b: pad + _dump(b), padding, chat_body(delta=False)),
    st.builds(lambda b: _dump(b), any_json),
    st.binary(max_size=200),
    st.builds(lambda b, cut: _dump(b)[:cut], chat_body(delta=False), st.integers(0, 400)),
)

sse_event = st.one_of(
    st.builds(lambda b: b"data: " + _dump(b), chat_body(delta=True)),
    st.just(b"data: [DONE]"),
    st.just(b": OPENROUTER PROCESSING"),
    st.builds(lambda b: b"data:" + b, st.binary(max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b)),
    st.sampled_from([b"event: message", b"id: 7", b"retry: 100", b"data:", b"garbage line"]),
)


@st.composite
def sse_stream(draw: st.DrawFn) -> list[bytes]:
    events = draw(st.one_of(good_stream_events(), st.lists(sse_event, max_size=8)))
    nl = draw(st.sampled_from([b"\n", b"\r\n"]))
    body = b"".join(e + nl + nl for e in events)
    if draw(st.booleans()):
        body = body[: draw(st.integers(0, len(body)))]  # the connection dropped mid-stream
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=6)))
    pieces, last = [], 0
    for c in [*cuts, len(body)]:
        pieces.append(body[last:c])
        last = c
    return pieces


# -- the classifier under test ------------------------------------------------------------------------


def outcome(exc_or_comp: object) -> str:
    if isinstance(exc_or_comp, Completion):
        return "completion"
    if isinstance(exc_or_comp, PermanentAPIError):
        return "permanent"
    if isinstance(exc_or_comp, RetryableAPIError):
        return "retryable"
    raise AssertionError(f"not classified: {type(exc_or_comp).__name__}: {exc_or_comp}")


def classify_body(status: int, body: bytes) -> str:
    """What ``OpenAIChatBackend.complete`` does with a whole (non-streamed) response."""
    if status != 200:
        err = classify_http(status, body, headers={"Retry-After": "1"})
        assert isinstance(err, APIError) and str(err)
        return outcome(err)
    try:
        return outcome(check_completion(completion_from_body(decode_chat(body), backend="openrouter")))
    except APIError as exc:
        return outcome(exc)


def classify_stream(pieces: list[bytes]) -> str:
    parser, acc = SSEParser(), ChatStream("openrouter")
    try:
        for piece in pieces:
            for payload in parser.feed(piece):
                acc.feed(payload)
        for payload in parser.close():
            acc.feed(payload)
        return outcome(check_completion(acc.result()))
    except APIError as exc:
        return outcome(exc)


FUZZ = settings(max_examples=fuzz_examples(400), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(status=st.sampled_from(STATUSES), body=json_body)
def test_any_body_is_classified(status: int, body: bytes) -> None:
    assert classify_body(status, body) in ("completion", "retryable", "permanent")


@FUZZ
@given(pieces=sse_stream())
def test_any_stream_is_classified(pieces: list[bytes]) -> None:
    assert classify_stream(pieces) in ("completion", "retryable", "permanent")


@FUZZ
@given(pieces=sse_stream())
def test_chunk_boundaries_do_not_change_the_outcome(pieces: list[bytes]) -> None:
    whole = b"".join(pieces)
    byte_by_byte = [whole[i : i + 1] for i in range(len(whole))]
    assert classify_stream([whole]) == classify_stream(byte_by_byte) == classify_stream(pieces)


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(
    content=st.text(min_size=1, max_size=60),
    reasoning=st.one_of(st.none(), st.text(max_size=60)),
    pad=padding,
    field=st.sampled_from(["reasoning", "reasoning_content"]),
)
def test_valid_completions_keep_their_text_exactly(content: str, reasoning: str | None, pad: bytes, field: str) -> None:
    body = {"id": "gen-1", "provider": "P", "choices": [{"message": {"content": content, field: reasoning},
                                                        "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "cost": 0.001}}
    comp = completion_from_body(decode_chat(pad + json.dumps(body).encode()), backend="openrouter")
    check_completion(comp)
    assert comp.content == content
    assert comp.reasoning == (reasoning or None)
    events = [{"id": "gen-1", "choices": [{"delta": {"content": content[:1], field: reasoning}}]},
              {"id": "gen-1", "choices": [{"delta": {"content": content[1:]}, "finish_reason": "stop"}]},
              {"id": "gen-1", "choices": [], "usage": {"completion_tokens": 5}}]
    stream = b"".join(b": OPENROUTER PROCESSING\n\ndata: " + json.dumps(e).encode() + b"\n\n" for e in events)
    acc, parser = ChatStream("openrouter"), SSEParser()
    for payload in [*parser.feed(stream + b"data: [DONE]\n\n"), *parser.close()]:
        acc.feed(payload)
    got = check_completion(acc.result())
    assert got.content == content and got.reasoning == (reasoning or None)


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(status=st.sampled_from([408, 429, 500, 502, 503, 504, 524, 529]), text=st.binary(max_size=80))
def test_throttling_and_server_errors_are_retryable(status: int, text: bytes) -> None:
    if text.lstrip()[:1] == b"{":
        text = b"x" + text  # a JSON envelope may legitimately say otherwise; this is about bare statuses
    assert classify_body(status, text) == "retryable"


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(status=st.sampled_from([400, 401, 404, 413, 422]), text=st.binary(max_size=80))
def test_client_errors_are_permanent(status: int, text: bytes) -> None:
    if text.lstrip()[:1] == b"{":
        text = b"x" + text
    assert classify_body(status, text) == "permanent"


# -- the same over real HTTP, through the real backend --------------------------------------------------


class _FuzzServer:
    """An aiohttp server (own loop, own thread) replying with whatever ``reply`` holds."""

    def __init__(self) -> None:
        self.reply: tuple[int, str, bytes] = (200, "application/json", b"{}")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = self._call(self._start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=20)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        status, ctype, body = self.reply
        return web.Response(status=status, body=body, headers={"Content-Type": ctype})

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_post("/api/v1/chat/completions", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=10))
        self.backends = {
            stream: OpenAIChatBackend(session, f"http://127.0.0.1:{port}/api/v1", model="m", stream=stream,
                                      openrouter=True)
            for stream in (True, False)
        }
        self.session = session
        return f"http://127.0.0.1:{port}/api/v1"

    def complete(self, stream: bool) -> str:
        req = CompletionRequest(sample_id="s", messages=[Message(role="user", content="hi")], max_tokens=8)

        async def go() -> object:
            try:
                return await self.backends[stream].complete(req)
            except APIError as exc:
                return exc

        return outcome(self._call(go()))

    def close(self) -> None:
        async def stop() -> None:
            await self.session.close()
            await self.runner.cleanup()

        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[_FuzzServer]:
    srv = _FuzzServer()
    yield srv
    srv.close()


@settings(max_examples=fuzz_examples(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(status=st.sampled_from(STATUSES), body=json_body, pieces=sse_stream(), stream=st.booleans(),
       ctype=st.sampled_from(["application/json", "text/event-stream", "text/plain"]))
def test_the_backend_over_http_classifies_everything(
    fuzz_server: _FuzzServer, status: int, body: bytes, pieces: list[bytes], stream: bool, ctype: str
) -> None:
    payload = b"".join(pieces) if ctype == "text/event-stream" else body
    fuzz_server.reply = (status, ctype, payload)
    got = fuzz_server.complete(stream)
    assert got in ("completion", "retryable", "permanent")
    if status != 200:
        assert got != "completion"
        assert got == classify_body(status, payload)
        return
    head = payload.lstrip()
    sse_looking = stream and (head[:5] == b"data:" or head[:1] == b":")
    if ctype != "text/event-stream" and not sse_looking:  # read as a whole JSON body, like classify_body
        assert got == classify_body(status, payload)


# -- the shapes of a server that lies (issue 22): money, choices, providers, reasoning -----------------------

lying_number = st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                         st.sampled_from(["154", "0.001", "NaN", "Infinity", "-0.01", "abc", ""]), st.none(),
                         st.booleans())
lying_usage = st.fixed_dictionaries({}, optional={
    "prompt_tokens": lying_number, "completion_tokens": lying_number, "cost": lying_number,
    "is_byok": st.one_of(st.booleans(), st.just("yes")),
    "completion_tokens_details": st.fixed_dictionaries({}, optional={"reasoning_tokens": lying_number}),
    "cost_details": st.fixed_dictionaries({}, optional={"upstream_inference_cost": lying_number}),
})


def _json(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(usage=lying_usage, bad_choices=st.booleans())
def test_usage_of_any_shape_is_read_never_as_a_credit(usage: dict[str, Any], bad_choices: bool) -> None:
    body = {"id": "g", "provider": "P", "usage": usage,
            "choices": 7 if bad_choices else [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}
    try:
        comp = completion_from_body(decode_chat(_json(body)), backend="openrouter")
    except RetryableAPIError as exc:  # rejected for its shape: it still says what it was billed
        assert bad_choices
        billing = billing_of(exc)
        if billing is not None and billing.usage is not None:
            assert billing.usage.cost >= 0 and billing.usage.completion_tokens >= 0
        return
    u = comp.usage
    assert u is not None and u.cost >= 0 and u.completion_tokens >= 0 and u.prompt_tokens >= 0
    if usage.get("cost") is None:
        assert comp.cost_missing  # the engine prices it
    elif "cost_invalid" not in comp.flags:
        assert not comp.cost_missing and u.cost == pytest.approx(float(usage["cost"]))


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(texts=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6),
       fields=st.lists(st.sampled_from(["reasoning", "reasoning_details", "both"]), min_size=6, max_size=6),
       other=st.text(min_size=1, max_size=8).map(lambda t: "\x00" + t), index_first=st.booleans())
def test_stream_choices_apart_and_reasoning_from_every_field(texts: list[str], fields: list[str], other: str,
                                                            index_first: bool) -> None:
    chunks: list[dict[str, Any]] = []
    texts = [f"{i}:{t}" for i, t in enumerate(texts)]  # distinct pieces (equal whole texts read as one repeat)
    for text, field in zip(texts, fields, strict=False):
        delta: dict[str, Any] = {}
        if field in ("reasoning", "both"):
            delta["reasoning"] = text
        if field in ("reasoning_details", "both"):
            delta["reasoning_details"] = [{"type": "reasoning.text", "text": text}]
        mine = {"index": 0, "delta": delta}
        theirs = {"index": 1, "delta": {"content": other, "reasoning": other}}
        chunks.append({"provider": "P", "choices": [theirs, mine] if index_first else [mine, theirs]})
    chunks.append({"provider": "P", "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]})
    acc = ChatStream("openrouter")
    for c in chunks:
        acc.feed(_json(c))
    acc.feed(b"[DONE]")
    comp = acc.result()
    assert comp.reasoning == "".join(texts) and comp.content == "ok"
    assert "extra_choices" in comp.flags and comp.providers == ["P"]


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(providers=st.lists(st.sampled_from(["A", "B", None]), min_size=1, max_size=5),
       models=st.lists(st.sampled_from(["m", "m-0127", "x", None]), min_size=1, max_size=5))
def test_every_chunk_names_its_provider_and_model(providers: list[str | None], models: list[str | None]) -> None:
    acc = ChatStream("openrouter")
    for i, (prov, model) in enumerate(zip(providers, models, strict=False)):
        acc.feed(_json({"provider": prov, "model": model,
                        "choices": [{"index": 0, "delta": {"content": str(i)}, "finish_reason": None}]}))
    acc.feed(_json({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    comp = acc.result()
    n = min(len(providers), len(models))
    assert comp.providers == list(dict.fromkeys(p for p in providers[:n] if p))
    assert comp.models == list(dict.fromkeys(m for m in models[:n] if m))
