"""Local-server protocols on the emulator's root URL, so exact-id backends can be tested offline.

SGLang native ``POST /generate``::

    in:  {"text": "<rendered prompt>" | ["…"], "input_ids": [..] | [[..]], "sampling_params":
          {"max_new_tokens": 128, "temperature", "top_p", "sampling_seed", "stop"}, "stream": false}
    out: {"text": "…", "output_ids": [..], "meta_info": {"id", "prompt_tokens", "completion_tokens",
          "cached_tokens": 0, "finish_reason": {"type": "stop", "matched": <eot id>} | {"type": "length",
          "length": n}, "e2e_latency"}}            (a list of those for batched input)

``output_ids`` are the true ids including the end-of-turn token; ``text`` is their decode without it.
Streaming sends ``data: {…}`` events with the cumulative text and ids so far, then ``data: [DONE]``.
Reasoning is off when the prompt ends with the end-of-think marker (e.g. Qwen3's
``<think>\\n\\n</think>\\n\\n`` generation prompt with thinking off).

vLLM OpenAI-compatible ``POST /v1/chat/completions`` (reasoning parser on): ``message.reasoning_content``
and ``message.content``; with ``return_token_ids: true`` also top-level ``prompt_token_ids`` and
``choices[].token_ids`` (all generated ids, end-of-turn included). ``chat_template_kwargs`` switches
thinking with the profile's keyword (``enable_thinking`` / ``thinking``). Streamed chunks carry
``delta`` and that chunk's ``token_ids``; the first chunk carries ``prompt_token_ids``; usage comes in a
final chunk when ``stream_options.include_usage`` is set.

No faults and no latency here: these stand in for the user's own servers.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson
from aiohttp import web

from .accounting import GenerationInfo
from .core import CORE, EmulatorCore
from .envelopes import ApiError
from .model import Output, stable_hash

__all__ = ["sglang_generate", "vllm_chat", "vllm_models"]


def _oai_error(status: int, message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def _json_body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return _oai_error(400, f"request body is not valid JSON ({exc})")
    if not isinstance(body, dict):
        return _oai_error(400, "request body must be a JSON object")
    return body


def _record(core: EmulatorCore, gen_id: str, out: Output, prompt_ids: list[int], server: str) -> None:
    core.state.record_generation(GenerationInfo(
        id=gen_id, model=server, provider_name=server, total_cost=0.0, tokens_prompt=len(prompt_ids),
        tokens_completion=len(out.ids), tokens_reasoning=out.reasoning_tokens, finish_reason=out.finish_reason,
        streamed=False, latency_ms=0, generation_time_ms=0, created_at=time.time(), completed_mono=time.monotonic()))
    core.write_ground_truth(gen_id, out.ids, prompt_ids, out.non_canonical)


# -- SGLang ---------------------------------------------------------------------------------------

async def _sglang_one(core: EmulatorCore, prompt_ids: list[int], sp: dict[str, Any]) -> tuple[str, Output]:
    think_end = core.model.profile(True).think_end_id
    thinking = core.opts.thinking and not (think_end is not None and think_end in prompt_ids[-8:])
    max_new = sp.get("max_new_tokens", 128)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise _Bad("sampling_params.max_new_tokens must be a positive integer")
    digest = hashlib.blake2b(orjson.dumps(prompt_ids), digest_size=16).hexdigest()
    key = stable_hash("sample", digest, "sglang", thinking, sp.get("temperature"), sp.get("top_p"),
                      sp.get("sampling_seed"))
    out = await core.output(key, thinking=thinking, max_tokens=max_new)
    stop = sp.get("stop")
    if stop:
        out = core.model.cut_at_stop(out, [stop] if isinstance(stop, str) else list(stop), thinking=thinking)
    return core.new_generation_id().replace("gen-", ""), out


class _Bad(Exception):
    pass


def _sglang_result(core: EmulatorCore, rid: str, out: Output, prompt_ids: list[int], t0: float,
                   ids: list[int] | None = None) -> dict[str, Any]:
    ids = out.ids if ids is None else ids
    eot = core.model.profile(True).end_of_turn_ids
    ended = bool(ids) and ids[-1] in eot and len(ids) == len(out.ids)
    text_ids = ids[:-1] if ended else ids
    if len(ids) < len(out.ids):
        finish: dict[str, Any] | None = None
    elif ended:
        finish = {"type": "stop", "matched": ids[-1]}
    elif out.finish_reason == "length":
        finish = {"type": "length", "length": len(ids)}
    else:
        finish = {"type": "stop", "matched": None}
    return {"text": core.model.tokenizer.decode(text_ids), "output_ids": list(ids),
            "meta_info": {"id": rid, "prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                          "cached_tokens": 0, "finish_reason": finish,
                          "e2e_latency": round(time.monotonic() - t0, 6)}}


async def sglang_generate(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    core.state.requests += 1
    t0 = time.monotonic()
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    text, input_ids = body.get("text"), body.get("input_ids")
    tok = core.model.tokenizer
    batched = isinstance(text, list) or (isinstance(input_ids, list) and bool(input_ids)
                                         and isinstance(input_ids[0], list))
    prompts: list[list[int]]
    if input_ids is not None:
        raw = input_ids if batched else [input_ids]
        if not all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in raw):
            return _oai_error(400, "input_ids must be a list of integers (or a list of such lists)")
        prompts = [list(p) for p in raw]
    elif text is not None:
        raw_t = text if batched else [text]
        if not all(isinstance(t, str) for t in raw_t):
            return _oai_error(400, "text must be a string or a list of strings")
        prompts = [tok.encode(t) for t in raw_t]
    else:
        return _oai_error(400, "either text or input_ids is required")
    sps = body.get("sampling_params") or {}
    sp_list = sps if isinstance(sps, list) else [sps] * len(prompts)
    if len(sp_list) != len(prompts) or not all(isinstance(s, dict) for s in sp_list):
        return _oai_error(400, "sampling_params must be an object or one object per prompt")
    try:
        results = [(await _sglang_one(core, p, s), p) for p, s in zip(prompts, sp_list, strict=True)]
    except _Bad as exc:
        return _oai_error(400, str(exc))
    for (rid, out), p in results:
        _record(core, rid, out, p, "sglang")
    core.state.by_status[200] += 1
    if body.get("stream") is True:
        if batched:
            return _oai_error(400, "the emulator streams only single prompts")
        (rid, out), p = results[0]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        buf = bytearray()
        step = core.scenario.stream_chunk_tokens
        for n in range(step, len(out.ids) + step, step):
            ids = out.ids[: min(n, len(out.ids))]
            buf += b"data: " + orjson.dumps(_sglang_result(core, rid, out, p, t0, ids)) + b"\n\n"
        buf += b"data: [DONE]\n\n"
        await resp.write(bytes(buf))
        await resp.write_eof()
        return resp
    payload = [_sglang_result(core, rid, out, p, t0) for (rid, out), p in results]
    return web.Response(body=orjson.dumps(payload if batched else payload[0]), content_type="application/json")


# -- vLLM -----------------------------------------------------------------------------------------

async def vllm_models(request: web.Request) -> web.Response:
    core = request.app[CORE]
    data = [{"id": m.id, "object": "model", "created": 0, "owned_by": "vllm", "root": m.id,
             "max_model_len": m.context_length} for m in core.scenario.models]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")


async def vllm_chat(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    core.state.requests += 1
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        return _oai_error(400, "chat_template_kwargs must be an object")
    base = core.model.profile(core.opts.thinking)
    thinking = core.opts.thinking
    if base.thinking_kwarg and base.thinking_kwarg in kwargs:
        thinking = bool(kwargs[base.thinking_kwarg])
    prompt = core.prompt(body.get("messages"), body.get("tools"), thinking)
    if isinstance(prompt, ApiError):
        return _oai_error(400, prompt.message)
    digest, prompt_ids = prompt
    mt = body.get("max_completion_tokens")
    if mt is None:
        mt = body.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        return _oai_error(400, "max_tokens must be a positive integer")
    model_id = str(body.get("model") or core.scenario.models[0].id)
    ctx = core.scenario.models[0].context_length
    cap = mt if mt is not None else max(1, ctx - len(prompt_ids))
    key = stable_hash("sample", digest.hex(), "vllm", thinking, body.get("temperature"), body.get("top_p"),
                      body.get("seed"))
    out = await core.output(key, thinking=thinking, max_tokens=cap)
    stop = body.get("stop")
    if stop:
        out = core.model.cut_at_stop(out, [stop] if isinstance(stop, str) else list(stop), thinking=thinking)
    gen_id = "chatcmpl-" + core.new_generation_id()[4:]
    created = int(time.time())
    with_ids = body.get("return_token_ids") is True
    _record(core, gen_id, out, prompt_ids, "vllm")
    core.state.by_status[200] += 1
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out.ids),
             "total_tokens": len(prompt_ids) + len(out.ids), "prompt_tokens_details": None}
    if body.get("stream") is True:
        return await _vllm_stream(request, core, body, out, gen_id, created, model_id, prompt_ids, with_ids, usage)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": out.content, "reasoning_content": out.reasoning,
                    "tool_calls": []},
        "logprobs": None, "finish_reason": out.finish_reason, "stop_reason": None,
    }
    resp_body: dict[str, Any] = {"id": gen_id, "object": "chat.completion", "created": created, "model": model_id,
                                 "choices": [choice], "usage": usage, "prompt_logprobs": None}
    if with_ids:
        choice["token_ids"] = out.ids
        resp_body["prompt_token_ids"] = prompt_ids
    return web.Response(body=orjson.dumps(resp_body), content_type="application/json")


async def _vllm_stream(request: web.Request, core: EmulatorCore, body: dict[str, Any], out: Output, gen_id: str,
                       created: int, model_id: str, prompt_ids: list[int], with_ids: bool,
                       usage: dict[str, Any]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    def ev(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {"id": gen_id, "object": "chat.completion.chunk", "created": created, "model": model_id,
               "choices": choices, **extra}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    buf = bytearray()
    first: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}
    if with_ids:
        first["token_ids"] = []
    buf += ev([first], **({"prompt_token_ids": prompt_ids} if with_ids else {}))
    sent = 0
    for seg in out.segments(core.scenario.stream_chunk_tokens):
        key = "reasoning_content" if seg.field == "reasoning" else "content"
        ch: dict[str, Any] = {"index": 0, "delta": {key: seg.text}, "logprobs": None, "finish_reason": None}
        if with_ids:
            ch["token_ids"] = out.ids[sent: seg.tok1]
        sent = seg.tok1
        buf += ev([ch])
    last: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": out.finish_reason,
                            "stop_reason": None}
    if with_ids:
        last["token_ids"] = out.ids[sent:]
    buf += ev([last])
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        buf += ev([], usage=usage)
    buf += b"data: [DONE]\n\n"
    await resp.write(bytes(buf))
    await resp.write_eof()
    return resp
