"""Current server shapes (issue 11, item 6), end to end: vLLM current and legacy, SGLang cumulative and
incremental streaming, nested vLLM errors, and OpenRouter ``max_price`` values given as strings.

Shapes checked against: vllm-project/vllm ``entrypoints/openai/chat_completion/protocol.py`` (ChatMessage
has ``reasoning`` only; PR #33402 removed ``reasoning_content``), ``engine/protocol.py`` (ErrorResponse
``{"error": {message, type, param, code}}``), ``chat_completion/serving.py`` (whole responses are full model
dumps, chunks ``exclude_unset``); sgl-project/sglang ``managers/tokenizer_manager_components/
output_processor.py`` (``--incremental-streaming-output``: only the new text/ids per event,
``completion_tokens`` the running total) and ``entrypoints/http_server.py`` (``{"error": {"message"}}``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from _emulator_helpers import chat, chat_body, parse_sse, request
from _generate_helpers import claim, emulator, fast, make_config, prompt, responses, write_prompts
from draftgen.backends import CompletionRequest, open_backend
from draftgen.backends.sglang import SGLangBackend
from draftgen.backends.vllm import VLLMBackend
from draftgen.emulator.envelopes import ApiError
from draftgen.emulator.routing import ProviderPrefs, parse_prefs
from draftgen.errors import PermanentAPIError, RetryableAPIError
from draftgen.phases.generate.run import run_generate
from draftgen.records import GroundTruthRecord
from draftgen.store import iter_jsonl
from draftgen.tokens import Profile

quiet = {"echo": lambda s: None}


def _truth(path: Path) -> dict[str, GroundTruthRecord]:
    return {r.generation_id.replace("gen-", ""): r for _, r in iter_jsonl(path, GroundTruthRecord)}


# -- end to end through generate ----------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "option", "stream"), [
    ("vllm", "current", False), ("vllm", "current", True),
    ("vllm", "legacy", False), ("vllm", "legacy", True),
    ("sglang", "cumulative", True), ("sglang", "incremental", True), ("sglang", "incremental", False),
])
def test_each_shape_through_generate_gives_the_true_ids(tmp_path: Path, qwen3_profile: Profile, kind: str,
                                                        option: str, stream: bool) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 10)
    gt = tmp_path / "gt.jsonl"
    sc = fast(vllm_legacy=option == "legacy", sglang_incremental=option == "incremental", stream_chunk_tokens=7)
    with emulator(sc, ground_truth=str(gt)) as emu:
        url = emu.root_url + "/v1" if kind == "vllm" else emu.root_url
        cfg = make_config(tmp_path, ["a"], kind=kind, base_url=url, endpoint={"stream": stream})
        rep = run_generate(cfg, **quiet)
    truth = _truth(gt)
    recs = responses(run_dir, "a")
    assert rep.done == 10 and rep.failed == 0 and len(recs) == 10
    for r in recs:
        t = truth[r.generation_id or ""]
        assert r.ids_source == "exact" and r.backend == kind
        assert r.output_ids == t.output_ids and r.prompt_ids == t.prompt_ids
        parsed = qwen3_profile.parse_output(t.output_ids)
        assert (r.reasoning, r.content) == (parsed.reasoning, parsed.content) and r.reasoning
        if kind == "vllm":
            assert r.reasoning_field == ("reasoning_content" if option == "legacy" else "reasoning")


# -- the emulator's shapes ------------------------------------------------------------------------------

def _vllm(url: str, **extra: Any) -> Any:
    body = {"model": "qwen/qwen3-8b", "messages": [{"role": "user", "content": "shapes"}], "max_tokens": 4096,
            **extra}
    return request(f"{url}/v1/chat/completions", "POST", body, key=None)


def test_vllm_current_shape_has_nulls_where_there_are_no_ids() -> None:
    with emulator() as emu:
        whole = _vllm(emu.root_url).json()
        s = parse_sse(_vllm(emu.root_url, stream=True).body)
    ch = whole["choices"][0]
    assert whole["prompt_token_ids"] is None and ch["token_ids"] is None
    assert set(ch["message"]) == {"role", "content", "refusal", "annotations", "audio", "function_call",
                                  "tool_calls", "reasoning"}
    assert ch["message"]["reasoning"] and whole["kv_transfer_params"] is None
    first, *rest = s.events
    assert first["prompt_token_ids"] is None and first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    chunks = [c for ev in rest for c in ev["choices"]]
    assert chunks and all("token_ids" in c and c["token_ids"] is None for c in chunks)
    assert all("reasoning_content" not in c["delta"] for c in chunks)
    assert s.text("reasoning") == ch["message"]["reasoning"] and s.text("content") == ch["message"]["content"]


def test_vllm_errors_nested_now_flat_when_legacy() -> None:
    long_prompt = {"messages": [{"role": "user", "content": "x " * 10}], "max_tokens": 131072}
    with emulator(fast(local_accept_any_model=False)) as emu:
        bad = _vllm(emu.root_url, max_tokens=0)
        ctx = _vllm(emu.root_url, **long_prompt)
        unknown = request(f"{emu.root_url}/v1/chat/completions", "POST",
                          {"model": "no/such-model", "messages": [{"role": "user", "content": "hi"}]}, key=None)
    assert bad.status == 400 and set(bad.json()) == {"error"}
    assert bad.json()["error"] == {"message": "max_tokens must be a positive integer", "type": "BadRequestError",
                                   "param": "max_tokens", "code": 400}
    assert ctx.status == 400 and "maximum context length is 131072 tokens" in ctx.json()["error"]["message"]
    assert unknown.status == 404 and unknown.json()["error"]["type"] == "NotFoundError"
    assert unknown.json()["error"]["code"] == 404
    with emulator(fast(vllm_legacy=True)) as emu:
        legacy = _vllm(emu.root_url, max_tokens=0)
    assert legacy.status == 400 and legacy.json() == {
        "object": "error", "message": "max_tokens must be a positive integer", "type": "BadRequestError",
        "param": "max_tokens", "code": 400}


def test_sglang_incremental_events_carry_only_the_new_text_and_ids(qwen3_profile: Profile) -> None:
    tok = qwen3_profile.tokenizer
    body = {"text": "incremental please", "sampling_params": {"max_new_tokens": 4096}}
    with emulator(fast(stream_chunk_tokens=5)) as emu:
        whole = request(f"{emu.root_url}/generate", "POST", body, key=None).json()
        cum = parse_sse(request(f"{emu.root_url}/generate", "POST", {**body, "stream": True}, key=None).body)
    with emulator(fast(stream_chunk_tokens=5, sglang_incremental=True)) as emu:
        inc = parse_sse(request(f"{emu.root_url}/generate", "POST", {**body, "stream": True}, key=None).body)
        err = request(f"{emu.root_url}/generate", "POST", {"sampling_params": {}}, key=None)
    ids = whole["output_ids"]
    assert len(inc.events) == len(cum.events) > 2 and inc.done and cum.done
    assert [t for ev in inc.events for t in ev["output_ids"]] == ids
    ended = ids[-1] in qwen3_profile.end_of_turn_ids
    assert "".join(ev["text"] for ev in inc.events) == whole["text"] == tok.decode(ids[:-1] if ended else ids)
    assert [ev["meta_info"]["completion_tokens"] for ev in inc.events] == \
        [ev["meta_info"]["completion_tokens"] for ev in cum.events] == [len(ev["output_ids"]) for ev in cum.events]
    assert all(len(ev["output_ids"]) <= 5 for ev in inc.events)
    assert cum.events[-1]["output_ids"] == ids and cum.events[-1]["text"] == whole["text"]
    assert all(ev["meta_info"]["finish_reason"] is None for ev in inc.events[:-1])
    assert inc.events[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert "e2e_latency" in inc.events[-1]["meta_info"] and "e2e_latency" not in inc.events[0]["meta_info"]
    assert err.status == 400 and set(err.json()["error"]) == {"message"}


# -- the clients against canned servers -----------------------------------------------------------------

@contextlib.asynccontextmanager
async def _canned(handler: Callable[[web.Request], Any]) -> AsyncIterator[str]:
    """A one-route server (any path) on a free port; yields its root URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _json(status: int, obj: Any) -> Callable[[web.Request], Any]:
    async def h(request: web.Request) -> web.Response:
        return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json")
    return h


def _sse(events: list[Any]) -> Callable[[web.Request], Any]:
    async def h(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(b"data: " + (ev if isinstance(ev, bytes) else msgspec.json.encode(ev)) + b"\n\n")
        await resp.write_eof()
        return resp
    return h


def _req(prompt_ids: list[int] | None = None) -> CompletionRequest:
    p = prompt("e", 0)
    return CompletionRequest(sample_id=p.sample_id, messages=p.messages, max_tokens=64, prompt_ids=prompt_ids)


async def _vllm_call(handler: Callable[[web.Request], Any], stream: bool = False) -> Any:
    import aiohttp

    async with _canned(handler) as url, aiohttp.ClientSession() as session:
        be = VLLMBackend(session, url + "/v1", model="m", stream=stream)
        return await be.complete(_req())


def _err(code: int, message: str, etype: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


@pytest.mark.parametrize(("status", "body", "cls", "kind"), [
    (400, _err(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
                    "(904 in the messages, 4096 in the completion).", "BadRequestError", "max_tokens"),
     PermanentAPIError, "context_length_exceeded"),
    (400, _err(400, "temperature must be non-negative", "BadRequestError", "temperature"), PermanentAPIError,
     "http_400"),
    (404, _err(404, "The model `m` does not exist.", "NotFoundError", "model"), PermanentAPIError, "http_404"),
    (500, _err(500, "EngineCore encountered an issue.", "InternalServerError"), RetryableAPIError, "http_500"),
    (503, _err(503, "The server is overloaded.", "ServiceUnavailableError"), RetryableAPIError, "http_503"),
    (400, {"object": "error", "message": "temperature must be non-negative", "type": "BadRequestError",
           "param": None, "code": 400}, PermanentAPIError, "http_400"),
    (500, {"object": "error", "message": "boom", "type": "InternalServerError", "param": None, "code": 500},
     RetryableAPIError, "http_500"),
])
def test_vllm_error_bodies_are_classified(status: int, body: dict[str, Any], cls: type, kind: str) -> None:
    with pytest.raises(cls) as ei:
        asyncio.run(_vllm_call(_json(status, body)))
    e = ei.value
    assert type(e) is cls and e.kind == kind and e.status == status  # type: ignore[attr-defined]
    msg = body["error"]["message"] if "error" in body else body["message"]
    assert msg in str(e)


def test_vllm_nested_error_mid_stream_uses_its_code() -> None:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}], "prompt_token_ids": [1, 2]}
    part = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"reasoning": "so"}, "logprobs": None, "finish_reason": None,
                         "token_ids": [7]}]}
    for code, cls in ((500, RetryableAPIError), (400, PermanentAPIError)):
        events = [head, part, _err(code, "Error in chat completion stream generator.", "InternalServerError"),
                  b"[DONE]"]
        with pytest.raises(cls) as ei:
            asyncio.run(_vllm_call(_sse(events), stream=True))
        assert ei.value.status == code and "stream generator" in str(ei.value)  # type: ignore[attr-defined]


def test_vllm_ids_that_do_not_match_usage_are_refused() -> None:
    def chunk(**choice: Any) -> dict[str, Any]:
        return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "logprobs": None, "finish_reason": None, **choice}]}
    events: list[Any] = [
        {**chunk(delta={"role": "assistant", "content": ""}), "prompt_token_ids": [1, 2, 3]},
        chunk(delta={"reasoning": "a"}, token_ids=[10, 11]),
        chunk(delta={"reasoning": "b"}),  # a proxy dropped this chunk's token_ids
        chunk(delta={}, finish_reason="stop", stop_reason=None, token_ids=[13]),
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}},
        b"[DONE]",
    ]
    with pytest.raises(RetryableAPIError) as ei:
        asyncio.run(_vllm_call(_sse(events), stream=True))
    assert ei.value.kind == "bad_response"
    events[2] = chunk(delta={"reasoning": "b"}, token_ids=[12])
    comp = asyncio.run(_vllm_call(_sse(events), stream=True))
    assert comp.output_ids == [10, 11, 12, 13] and comp.prompt_ids == [1, 2, 3] and comp.reasoning == "ab"


def _gen_event(ids: list[int], text: str, total: int | None, finish: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": "r", "prompt_tokens": 3, "finish_reason": finish, "cached_tokens": 0}
    if total is not None:
        meta["completion_tokens"] = total
    return {"text": text, "output_ids": ids, "meta_info": meta}


async def _sglang_call(handler: Callable[[web.Request], Any]) -> Any:
    import aiohttp

    async with _canned(handler) as url, aiohttp.ClientSession() as session:
        be = SGLangBackend(session, url, stream=True)
        return await be.complete(_req([1, 2, 3]))


STOP = {"type": "stop", "matched": 9}


@pytest.mark.parametrize("events", [
    # incremental whose second event repeats the first id: completion_tokens says it is new output
    [_gen_event([5], "a", 1), _gen_event([5, 6], "bc", 3), _gen_event([9], "", 4, STOP)],
    # incremental with an empty last event (the finish only)
    [_gen_event([5, 6], "ab", 2), _gen_event([7, 9], "c", 4), _gen_event([], "", 4, STOP)],
])
def test_sglang_incremental_detection_is_by_the_running_total(events: list[Any]) -> None:
    comp = asyncio.run(_sglang_call(_sse([*events, b"[DONE]"])))
    want = [t for ev in events for t in ev["output_ids"]]
    assert comp.output_ids == want and comp.content == "".join(ev["text"] for ev in events)
    assert comp.usage.completion_tokens == len(want)


@pytest.mark.parametrize("events", [
    # cumulative events that do not extend the ids so far
    [_gen_event([5, 6], "ab", 2), _gen_event([5, 7, 8], "acd", 3), _gen_event([5, 7, 8, 9], "acd", 4, STOP)],
    # a total that fits neither reading
    [_gen_event([5, 6], "ab", 2), _gen_event([7], "c", 5), _gen_event([8, 9], "d", 7, STOP)],
    # incremental, then an event that breaks the running total
    [_gen_event([5], "a", 1), _gen_event([6], "b", 2), _gen_event([7, 9], "c", 5, STOP)],
    # a single whole event whose ids do not number completion_tokens
    [_gen_event([5, 6, 9], "ab", 4, STOP)],
])
def test_sglang_streams_that_fit_no_mode_are_refused(events: list[Any]) -> None:
    with pytest.raises(RetryableAPIError) as ei:
        asyncio.run(_sglang_call(_sse([*events, b"[DONE]"])))
    assert ei.value.kind in ("bad_stream", "bad_response")


# -- OpenRouter max_price as strings -----------------------------------------------------------------------

def test_max_price_strings_are_routed() -> None:
    prefs = parse_prefs({"max_price": {"prompt": "0.5", "completion": "2.25", "request": 0}})
    assert isinstance(prefs, ProviderPrefs)
    assert prefs.max_price == {"prompt": 0.5, "completion": 2.25, "request": 0.0}
    for bad in ("cheap", "-1", "nan", True, None, [1]):
        err = parse_prefs({"max_price": {"completion": bad}})
        assert isinstance(err, ApiError) and err.status == 400 and "max_price.completion" in err.message, bad
    with emulator() as emu:
        seen = set()
        for i in range(12):
            r = chat(emu.base_url, chat_body(f"price {i}", provider={"max_price": {"completion": "2.25"}}))
            assert r.status == 200, r.body
            seen.add(r.json()["provider"])
        capped = chat(emu.base_url, chat_body("none left", provider={"max_price": {"completion": "1"}}))
    assert seen <= {"DeepInfra", "Chutes"} and seen  # Baseten ($3.00) is over the cap
    assert capped.status == 503


def test_max_price_strings_through_generate(tmp_path: Path) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 12)
    with emulator() as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url, routing={"max_price": {"completion": "2.25"}})

        async def go() -> None:  # the backend sends the strings as configured
            async with open_backend(cfg, "sk-or-test") as be:
                c = await be.complete(_req())
                assert c.provider in ("DeepInfra", "Chutes")

        asyncio.run(go())
        rep = run_generate(cfg, **quiet)
    recs = responses(run_dir, "a")
    assert rep.done == 12 and rep.failed == 0
    assert {r.provider for r in recs} <= {"DeepInfra", "Chutes"}
