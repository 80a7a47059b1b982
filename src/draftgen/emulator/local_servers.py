"""Local-server protocols on the emulator's root URL, so exact-id backends can be tested offline.

SGLang native ``POST /generate``::

    in:  {"text": "<rendered prompt>" | ["…"], "input_ids": [..] | [[..]], "sampling_params":
          {"max_new_tokens": 128, "temperature", "top_p", "sampling_seed", "stop"}, "stream": false}
    out: {"text": "…", "output_ids": [..], "meta_info": {"id", "prompt_tokens", "completion_tokens",
          "cached_tokens": 0, "finish_reason": {"type": "stop", "matched": <eot id>} | {"type": "length",
          "length": n}, "e2e_latency"}}            (a list of those for batched input)

``output_ids`` are the true ids including the end-of-turn token; ``text`` is their decode without it.
Streaming sends ``data: {…}`` events, then ``data: [DONE]``. By default each event carries the
cumulative text and ids so far (SGLang's default); with ``Scenario.sglang_incremental`` (the server's
``--incremental-streaming-output``) each carries only the new text and ids, while
``meta_info.completion_tokens`` stays the running total in both modes (sgl-project/sglang
``managers/tokenizer_manager_components/output_processor.py``). Intermediate text never ends inside a
character (the detokenizer holds incomplete bytes back), so incremental texts concatenate to the whole.
``meta_info.finish_reason`` is null until the last event; ``e2e_latency`` comes with it. Errors:
``{"error": {"message": …}}`` with 400 (``http_server._create_error_response``). Reasoning is off when
the prompt ends with the end-of-think marker (e.g. Qwen3's ``<think>\\n\\n</think>\\n\\n`` generation
prompt with thinking off).

vLLM OpenAI-compatible ``POST /v1/chat/completions`` (reasoning parser on), as current vLLM sends it
(vllm-project/vllm ``entrypoints/openai/chat_completion/protocol.py``, ``engine/protocol.py``; PR #33402
removed ``reasoning_content``): ``message.reasoning`` and ``message.content``. A whole response is the
full model dump: ``choices[].token_ids`` and top-level ``prompt_token_ids`` are the ids with
``return_token_ids: true`` and ``null`` without. Streamed chunks are dumped with ``exclude_unset``:
the first carries ``delta: {role, content: ""}`` and ``prompt_token_ids`` (null unless asked), the next
``delta.reasoning`` / ``delta.content`` with that chunk's ``token_ids`` (null unless asked), the last
``finish_reason`` and ``stop_reason``; usage comes in a final ``choices: []`` chunk when
``stream_options.include_usage`` is set. Errors are ``{"error": {"message", "type", "param", "code"}}``
with ``code`` the HTTP status (``BadRequestError`` 400: bad fields, prompt plus ``max_tokens`` over the
model's context; ``NotFoundError`` 404: an unknown model when the scenario does not accept any).

``Scenario.vllm_legacy`` gives the older shape instead: ``message.reasoning_content`` /
``delta.reasoning_content``, flat ``{"object": "error", "message", "type", "param", "code"}`` errors, and
no ``token_ids`` / ``prompt_token_ids`` keys unless asked (the first streamed chunk then has
``token_ids: []``). ``chat_template_kwargs`` switches thinking with the profile's keyword
(``enable_thinking`` / ``thinking``).

Request bodies, the ``/generate`` parser and the error and stream framing are ``emulator.local_wire``'s,
shared with the model-backed server (``emulator.real.server``). No faults and no latency here: these stand
in for the user's own servers.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import msgspec
from aiohttp import web

from draftgen.emulator.accounting import GenerationInfo
from draftgen.emulator.core import CORE, EmulatorCore
from draftgen.emulator.envelopes import ApiError
from draftgen.emulator.local_wire import (
    json_body,
    json_response,
    parse_generate,
    send_sse,
    sglang_error,
    vllm_chunk,
    vllm_error,
    vllm_stream_end,
)
from draftgen.emulator.scenarios import ModelInfo
from draftgen.emulator.scripted import Output, stable_hash

__all__ = ["sglang_generate", "vllm_chat", "vllm_models"]


def _vllm_error(core: EmulatorCore, status: int, message: str, param: str | None = None) -> web.Response:
    """vLLM's ErrorResponse in the scenario's shape (flat when ``vllm_legacy``)."""
    return vllm_error(status, message, param, legacy=core.scenario.vllm_legacy)


def _record(core: EmulatorCore, gen_id: str, out: Output, prompt_ids: list[int], server: str) -> None:
    core.state.record_generation(GenerationInfo(
        id=gen_id, model=server, provider_name=server, total_cost=0.0, tokens_prompt=len(prompt_ids),
        tokens_completion=len(out.ids), tokens_reasoning=out.reasoning_tokens, finish_reason=out.finish_reason,
        streamed=False, latency_ms=0, generation_time_ms=0, created_at=time.time(), completed_mono=time.monotonic()))
    core.write_ground_truth(gen_id, out.ids, prompt_ids, out.non_canonical)


# -- SGLang ---------------------------------------------------------------------------------------

async def _sglang_one(core: EmulatorCore, prompt_ids: list[int], sp: dict[str, Any], max_new: int) -> tuple[str, Output]:
    think_end = core.model.profile(True).think_end_id
    thinking = core.opts.thinking and not (think_end is not None and think_end in prompt_ids[-8:])
    digest = hashlib.blake2b(msgspec.json.encode(prompt_ids), digest_size=16).hexdigest()
    key = stable_hash("sample", digest, "sglang", thinking, sp.get("temperature"), sp.get("top_p"),
                      sp.get("sampling_seed"))
    out = await core.output(key, thinking=thinking, max_tokens=max_new)
    stop = sp.get("stop")
    if stop:
        out = core.model.cut_at_stop(out, [stop] if isinstance(stop, str) else list(stop), thinking=thinking)
    return core.new_generation_id().replace("gen-", ""), out


def _sglang_text(core: EmulatorCore, out: Output, ids: list[int]) -> str:
    """The text of the ids so far: without the end-of-turn token once it came, and, before the end,
    without a trailing incomplete character (the detokenizer holds those bytes back)."""
    eot = core.model.profile(True).end_of_turn_ids
    final = len(ids) == len(out.ids)
    text = core.model.tokenizer.decode(ids[:-1] if final and ids and ids[-1] in eot else ids)
    return text if final else text.rstrip("\ufffd")


def _sglang_result(core: EmulatorCore, rid: str, out: Output, prompt_ids: list[int], t0: float,
                   ids: list[int] | None = None) -> dict[str, Any]:
    ids = out.ids if ids is None else ids
    eot = core.model.profile(True).end_of_turn_ids
    ended = bool(ids) and ids[-1] in eot and len(ids) == len(out.ids)
    if len(ids) < len(out.ids):
        finish: dict[str, Any] | None = None
    elif ended:
        finish = {"type": "stop", "matched": ids[-1]}
    elif out.finish_reason == "length":
        finish = {"type": "length", "length": len(ids)}
    else:
        finish = {"type": "stop", "matched": None}
    meta: dict[str, Any] = {"id": rid, "prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                            "cached_tokens": 0, "finish_reason": finish}
    if finish is not None:
        meta["e2e_latency"] = round(time.monotonic() - t0, 6)
    return {"text": _sglang_text(core, out, ids), "output_ids": list(ids), "meta_info": meta}


def _sglang_events(core: EmulatorCore, rid: str, out: Output, prompt_ids: list[int], t0: float) -> bytes:
    """The SSE body of one streamed generation: cumulative events, or incremental ones (only the new text
    and ids; ``completion_tokens`` still the running total), then ``[DONE]``."""
    buf = bytearray()
    step = core.scenario.stream_chunk_tokens
    incremental = core.scenario.sglang_incremental
    final_text = _sglang_text(core, out, out.ids) if incremental else ""
    sent_ids = 0
    sent_text = ""
    for n in range(step, len(out.ids) + step, step):
        ev = _sglang_result(core, rid, out, prompt_ids, t0, out.ids[: min(n, len(out.ids))])
        if incremental:
            text = ev["text"]
            if len(text) < len(sent_text) or not final_text.startswith(text):  # not settled yet
                text = sent_text
            ev["text"], sent_text = text[len(sent_text):], text
            ev["output_ids"] = ev["output_ids"][sent_ids:]
            sent_ids += len(ev["output_ids"])
        buf += b"data: " + msgspec.json.encode(ev) + b"\n\n"
    buf += b"data: [DONE]\n\n"
    return bytes(buf)


async def sglang_generate(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    core.state.requests += 1
    t0 = time.monotonic()
    body = await json_body(request)
    if isinstance(body, str):
        return sglang_error(body)
    req = parse_generate(body, core.model.tokenizer.encode)
    if isinstance(req, str):
        return sglang_error(req)
    results = [(await _sglang_one(core, p, s, n), p) for p, s, n in zip(req.prompts, req.sampling, req.max_new, strict=True)]
    for (rid, out), p in results:
        _record(core, rid, out, p, "sglang")
    core.state.by_status[200] += 1
    if req.stream:
        if req.batched:
            return sglang_error("the emulator streams only single prompts")
        (rid, out), p = results[0]
        return await send_sse(request, _sglang_events(core, rid, out, p, t0))
    payload = [_sglang_result(core, rid, out, p, t0) for (rid, out), p in results]
    return json_response(payload if req.batched else payload[0])


# -- vLLM -----------------------------------------------------------------------------------------

async def vllm_models(request: web.Request) -> web.Response:
    core = request.app[CORE]
    data = [{"id": m.id, "object": "model", "created": 0, "owned_by": "vllm", "root": m.id,
             "max_model_len": m.context_length} for m in core.scenario.models]
    return json_response({"object": "list", "data": data})


def _vllm_model(core: EmulatorCore, requested: Any) -> ModelInfo | None:
    """The served model a request names (the first one when it names none); None when unknown and the
    scenario does not accept any model id."""
    models = core.scenario.models
    if requested is None:
        return models[0]
    for m in models:
        if m.id == requested:
            return m
    return models[0] if core.scenario.local_accept_any_model else None


async def vllm_chat(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    core.state.requests += 1
    legacy = core.scenario.vllm_legacy
    body = await json_body(request)
    if isinstance(body, str):
        return _vllm_error(core, 400, body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        return _vllm_error(core, 400, "chat_template_kwargs must be an object", "chat_template_kwargs")
    model = _vllm_model(core, body.get("model"))
    if model is None:
        return _vllm_error(core, 404, f"The model `{body.get('model')}` does not exist.", "model")
    base = core.model.profile(core.opts.thinking)
    thinking = core.opts.thinking
    if base.thinking_kwarg and base.thinking_kwarg in kwargs:
        thinking = bool(kwargs[base.thinking_kwarg])
    prompt = core.prompt(body.get("messages"), body.get("tools"), thinking)
    if isinstance(prompt, ApiError):
        return _vllm_error(core, 400, prompt.message, "messages")
    digest, prompt_ids = prompt
    mt = body.get("max_completion_tokens")
    if mt is None:
        mt = body.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        return _vllm_error(core, 400, "max_tokens must be a positive integer", "max_tokens")
    model_id = str(body.get("model") or model.id)
    ctx = model.context_length
    if len(prompt_ids) + (mt or 0) > ctx or len(prompt_ids) >= ctx:
        want = len(prompt_ids) + (mt or 0)
        return _vllm_error(core, 400, f"This model's maximum context length is {ctx} tokens. However, you "
                           f"requested {want} tokens ({len(prompt_ids)} in the messages, {mt or 0} in the "
                           "completion). Please reduce the length of the messages or completion.", "max_tokens")
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
    usage: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(out.ids),
                             "completion_tokens": len(out.ids), "prompt_tokens_details": None}
    if body.get("stream") is True:
        return await _vllm_stream(request, core, body, out, gen_id, created, model_id, prompt_ids, with_ids, usage)
    message: dict[str, Any] = {"role": "assistant", "content": out.content}
    if legacy:
        message.update(reasoning_content=out.reasoning, tool_calls=[])
    else:
        message.update(refusal=None, annotations=None, audio=None, function_call=None, tool_calls=[],
                       reasoning=out.reasoning)
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                              "finish_reason": out.finish_reason, "stop_reason": None}
    resp_body: dict[str, Any] = {"id": gen_id, "object": "chat.completion", "created": created, "model": model_id,
                                 "choices": [choice]}
    if legacy:
        resp_body.update(usage=usage, prompt_logprobs=None)
        if with_ids:
            choice["token_ids"] = out.ids
            resp_body["prompt_token_ids"] = prompt_ids
    else:
        choice["token_ids"] = out.ids if with_ids else None
        resp_body.update(service_tier=None, system_fingerprint=None, usage=usage, prompt_logprobs=None,
                         prompt_token_ids=prompt_ids if with_ids else None, kv_transfer_params=None)
    return json_response(resp_body)


async def _vllm_stream(request: web.Request, core: EmulatorCore, body: dict[str, Any], out: Output, gen_id: str,
                       created: int, model_id: str, prompt_ids: list[int], with_ids: bool,
                       usage: dict[str, Any]) -> web.StreamResponse:
    legacy = core.scenario.vllm_legacy

    def ev(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return vllm_chunk(gen_id, created, model_id, choices, **extra)

    def ids(part: list[int]) -> dict[str, Any]:
        # current vLLM sets token_ids on every content chunk (null unless asked); legacy only when asked
        if with_ids:
            return {"token_ids": part}
        return {} if legacy else {"token_ids": None}

    buf = bytearray()
    first: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}
    if legacy:
        if with_ids:
            first["token_ids"] = []
        buf += ev([first], **({"prompt_token_ids": prompt_ids} if with_ids else {}))
    else:
        buf += ev([first], prompt_token_ids=prompt_ids if with_ids else None)
    reasoning_key = "reasoning_content" if legacy else "reasoning"
    sent = 0
    for seg in out.segments(core.scenario.stream_chunk_tokens):
        key = reasoning_key if seg.field == "reasoning" else "content"
        ch: dict[str, Any] = {"index": 0, "delta": {key: seg.text}, "logprobs": None, "finish_reason": None,
                              **ids(out.ids[sent: seg.tok1])}
        sent = seg.tok1
        buf += ev([ch])
    last: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": out.finish_reason,
                            "stop_reason": None, **ids(out.ids[sent:])}
    buf += ev([last])
    buf += vllm_stream_end(body, usage, gen_id, created, model_id)
    return await send_sse(request, bytes(buf))
