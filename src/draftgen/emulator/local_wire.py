"""The wire of the local-server protocols both emulators serve: request bodies, SGLang ``/generate``
requests, and the vLLM / SGLang error bodies.

Used by ``emulator.local_servers`` (the scripted emulator's SGLang and vLLM routes) and
``emulator.real.server`` (the model-backed server), so both read a request the same way::

    POST /generate  {"text": "…" | ["…"], "input_ids": [..] | [[..]],
                     "sampling_params": {…} | [{…} per prompt], "stream": false}

``input_ids`` wins over ``text``; a list of lists (or a list of texts) is a batch. ``max_new_tokens``
defaults to 128 and must be a positive integer; the other sampling fields are passed on as they came
(each server reads the ones it honours). Errors: SGLang ``{"error": {"message"}}`` with 400; vLLM's
``{"error": {"message", "type", "param", "code"}}`` (``code`` the HTTP status), or the flat legacy
``{"object": "error", …}``. Reads and writes no files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

__all__ = [
    "GenerateRequest",
    "json_body",
    "json_response",
    "parse_generate",
    "send_sse",
    "sglang_error",
    "vllm_chunk",
    "vllm_error",
    "vllm_stream_end",
    "wants_usage",
]

_VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}

#: SGLang's default ``sampling_params.max_new_tokens``
DEFAULT_MAX_NEW_TOKENS = 128


async def json_body(request: web.Request) -> dict[str, Any] | str:
    """The request's JSON object, or why it is not one."""
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as exc:
        return f"request body is not valid JSON ({exc})"
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    return body


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json")


def vllm_error(status: int, message: str, param: str | None = None, *, legacy: bool = False) -> web.Response:
    """vLLM's ErrorResponse: nested ``{"error": {…}}`` now, flat ``{"object": "error", …}`` when ``legacy``."""
    info = {"message": message, "type": _VLLM_ERROR_TYPES.get(status, "BadRequestError"), "param": param,
            "code": status}
    return json_response({"object": "error", **info} if legacy else {"error": info}, status)


def sglang_error(message: str) -> web.Response:
    return json_response({"error": {"message": message}}, 400)


async def send_sse(request: web.Request, data: bytes) -> web.StreamResponse:
    """A whole event stream (``data: …`` events, ``[DONE]`` included) as one ``text/event-stream`` response."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(data)
    await resp.write_eof()
    return resp


def vllm_chunk(gen_id: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    """One ``chat.completion.chunk`` event of a vLLM chat stream."""
    obj = {"id": gen_id, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": choices, **extra}
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def wants_usage(body: dict[str, Any]) -> bool:
    """The stream request asks for the final usage chunk (``stream_options.include_usage``)."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def vllm_stream_end(body: dict[str, Any], usage: dict[str, Any], gen_id: str, created: int, model: str,
                    metrics: dict[str, Any] | None = None) -> bytes:
    """The end of a vLLM chat stream: the ``choices: []`` usage chunk when ``stream_options.include_usage``
    asks for it (dumped without nulls, so no ``prompt_tokens_details``; with the per-request ``metrics``,
    where vLLM puts them), then ``[DONE]``."""
    out = b""
    if wants_usage(body):
        extra = {"metrics": metrics} if metrics else {}
        out += vllm_chunk(gen_id, created, model, [], usage={k: v for k, v in usage.items() if v is not None},
                          **extra)
    return out + b"data: [DONE]\n\n"


@dataclass(frozen=True)
class GenerateRequest:
    """A parsed ``/generate`` body: one entry per prompt in ``prompts``, ``sampling`` and ``max_new``."""

    prompts: list[list[int]]
    sampling: list[dict[str, Any]]
    max_new: list[int]
    batched: bool  # the body held a list of prompts: the answer is a list too
    stream: bool


def _is_ids(p: Any, allow_empty: bool) -> bool:
    return (isinstance(p, list) and (allow_empty or bool(p))
            and all(isinstance(t, int) and not isinstance(t, bool) for t in p))


def parse_generate(body: dict[str, Any], encode: Callable[[str], list[int]], *,
                   allow_empty_ids: bool = True) -> GenerateRequest | str:
    """The request of a ``/generate`` body, or the message of the 400 that refuses it. ``encode``: a text
    prompt's ids (the server's tokenizer, no special tokens added); ``allow_empty_ids``: accept
    ``input_ids: []`` (the scripted emulator serves an empty prompt; a model cannot)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    batched = isinstance(text, list) or (isinstance(input_ids, list) and bool(input_ids)
                                         and isinstance(input_ids[0], list))
    prompts: list[list[int]]
    if input_ids is not None:
        raw = input_ids if batched else [input_ids]
        if not all(_is_ids(p, allow_empty_ids) for p in raw):
            return "input_ids must be a list of integers (or a list of such lists)"
        prompts = [list(p) for p in raw]
    elif text is not None:
        raw_t = text if batched else [text]
        if not all(isinstance(t, str) for t in raw_t):
            return "text must be a string or a list of strings"
        prompts = [list(encode(t)) for t in raw_t]
    else:
        return "either text or input_ids is required"
    sps = body.get("sampling_params") or {}
    sp_list = sps if isinstance(sps, list) else [sps] * len(prompts)
    if len(sp_list) != len(prompts) or not all(isinstance(s, dict) for s in sp_list):
        return "sampling_params must be an object or one object per prompt"
    max_new: list[int] = []
    for sp in sp_list:
        mt = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            return "sampling_params.max_new_tokens must be a positive integer"
        max_new.append(mt)
    return GenerateRequest(prompts=prompts, sampling=sp_list, max_new=max_new, batched=batched,
                           stream=body.get("stream") is True)
