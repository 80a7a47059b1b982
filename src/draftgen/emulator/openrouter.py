"""``POST /api/v1/chat/completions``: request validation, routing, money checks, faults, delivery.

Flow of one request: auth (401) → JSON and field validation (400) → prompt ids (cached) → request key
→ the model (an id the scenario does not list: OpenRouter's 404, ``model_not_found``) → attempt number →
routing (404/503) → context check (400) → affordability and in-flight budget
(402) → provider choice with fallbacks over the providers' drawn faults → delivery (streamed or not),
paced by the provider's TTFT and tokens/s on the scenario's clock → billing, ``/generation`` record and
ground truth for every generation delivered in full; a stream the client abandons is billed for the tokens
sent until then and its ``/generation`` record says ``cancelled``.

Honoured request fields: ``model`` (``:nitro``/``:floor`` suffixes), ``messages``, ``tools``,
``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``reasoning``
{effort, max_tokens, exclude, enabled}, ``reasoning_effort``, ``include_reasoning``, ``provider``,
``logprobs``/``top_logprobs``, ``stream``, ``service_tier`` (``emulator.tiers``). Parameters a provider does not support are dropped (they do
not change the output) unless ``provider.require_parameters`` routes around that provider. Every
``provider`` field applies to the one request it came with (a client may send a different ``ignore`` with
each retry); a provider with the ``ignores_routing`` quirk serves that share of the requests whose routing
excluded it all the same (a misroute, drawn per attempt). Reasoning
effort and budgets are accepted and validated but do not shorten the emulated reasoning; ``enabled:
false`` / ``effort: "none"`` switch it off (the profile's non-thinking prompt and output).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from draftgen.emulator.accounting import GenerationInfo, check_affordable, cost_of
from draftgen.emulator.core import CORE, EmulatorCore
from draftgen.emulator.envelopes import USER_ID, ApiError, availability, error_json, error_response
from draftgen.emulator.responses import (
    DONE,
    KEEPALIVE,
    PADDING,
    View,
    chunk,
    chunk_prefix,
    completion_body,
    delta_frags,
    finish_choice,
    sse,
    usage_obj,
    view_of,
)
from draftgen.emulator.routing import ProviderPrefs, parse_prefs, route, used_parameters
from draftgen.emulator.scenarios import FALLBACK_FAULTS, Provider
from draftgen.emulator.scripted import Output, stable_hash
from draftgen.emulator.tiers import parse_tier, tier_pool, with_echo

__all__ = ["ChatRequest", "chat_completions", "error_json", "parse_chat", "reset_connection", "sample_key"]


@dataclass
class ChatRequest:
    model: str
    suffix: str
    messages: Any
    tools: Any
    stream: bool
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: list[str]
    thinking: bool
    exclude_reasoning: bool
    logprobs: bool
    prefs: ProviderPrefs
    used: set[str]


def _bad(msg: str) -> ApiError:
    return ApiError(400, msg, "invalid_request")


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | ApiError | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        return _bad(f"{key} must be a number in [{lo}, {hi}]")
    return float(v)


def parse_chat(body: dict[str, Any], default_thinking: bool) -> ChatRequest | ApiError:
    model = body.get("model") or "moonshotai/kimi-k2.5"
    if not isinstance(model, str):
        return _bad("model must be a string")
    base, _, suffix = model.partition(":")
    mt = body.get("max_completion_tokens")
    if mt is None:
        mt = body.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        return _bad("max_tokens must be a positive integer")
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if isinstance(temperature, ApiError):
        return temperature
    if isinstance(top_p, ApiError):
        return top_p
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return _bad("seed must be an integer")
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4:
        stops = list(stop)
    else:
        return _bad("stop must be a string or a list of at most 4 strings")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        return _bad("reasoning must be an object")
    reasoning = dict(reasoning or {})
    effort = reasoning.get("effort")
    top_effort = body.get("reasoning_effort")
    if top_effort is not None and effort is not None and top_effort != effort:
        return _bad("reasoning_effort conflicts with reasoning.effort; send only one")
    effort = effort if effort is not None else top_effort
    if effort is not None and effort not in ("max", "xhigh", "high", "medium", "low", "minimal", "none"):
        return _bad(f"reasoning.effort must be one of max, xhigh, high, medium, low, minimal, none; got {effort!r}")
    if effort is not None and reasoning.get("max_tokens") is not None:
        return _bad("Only one of reasoning.effort and reasoning.max_tokens may be set")
    exclude = reasoning.get("exclude") is True or body.get("include_reasoning") is False
    thinking = default_thinking and not (reasoning.get("enabled") is False or effort == "none")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        return _bad("logprobs must be a boolean")
    tlp = body.get("top_logprobs")
    if tlp is not None and (isinstance(tlp, bool) or not isinstance(tlp, int) or not 0 <= tlp <= 20):
        return _bad("top_logprobs must be an integer in [0, 20]")
    prefs = parse_prefs(body.get("provider"), suffix)
    if isinstance(prefs, ApiError):
        return prefs
    stream = body.get("stream") is True
    return ChatRequest(base, suffix, body.get("messages"), body.get("tools"), stream, mt,
                       temperature, top_p, seed, stops, thinking, exclude, bool(logprobs), prefs,
                       used_parameters(body))


def sample_key(req: ChatRequest, p: Provider, prompt_hash: bytes) -> int:
    """What the model samples: a function of prompt and sampling, not of max_tokens (which only cuts it).
    Parameters ``p`` drops do not change it (a batch's results are the same samples as synchronous ones)."""
    supported = set(p.supported_parameters)
    return stable_hash("sample", prompt_hash.hex(), req.model, req.thinking,
                       req.temperature if "temperature" in supported else None,
                       req.top_p if "top_p" in supported else None,
                       req.seed if "seed" in supported else None)


def _fail(core: EmulatorCore, err: ApiError, gen_id: str | None = None) -> web.Response:
    core.state.by_status[err.status] += 1
    return error_response(err, {"X-Generation-Id": gen_id} if gen_id else None)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    core = request.app[CORE]
    st = core.state
    st.requests += 1
    key = core.authorize(request)
    if isinstance(key, ApiError):
        return _fail(core, key)
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as exc:
        return _fail(core, _bad(f"request body is not valid JSON ({exc})"))
    if not isinstance(body, dict):
        return _fail(core, _bad("request body must be a JSON object"))
    req = parse_chat(body, core.opts.thinking)
    if isinstance(req, ApiError):
        return _fail(core, req)
    storm = core.storm_retry_after()
    if storm is not None:  # the scenario's rate-limit storm: OpenRouter's own 429, whatever the provider
        st.by_fault["storm"] += 1
        return _fail(core, ApiError(429, f"{req.model} is temporarily rate-limited upstream. Please retry shortly.",
                                    "rate_limit_exceeded", retry_after_s=storm,
                                    availability=availability("capacity_exhausted", True, retry_after=storm)))
    prompt = core.prompt(req.messages, req.tools, req.thinking)
    if isinstance(prompt, ApiError):
        return _fail(core, prompt)
    prompt_hash, prompt_ids = prompt
    tier = parse_tier(body)
    if isinstance(tier, ApiError):
        return _fail(core, tier)
    rkey = stable_hash(prompt_hash.hex(), req.model, req.temperature, req.top_p, req.seed, req.max_tokens,
                       req.stop, req.thinking)
    if not core.scenario.accept_any_model and req.model not in {m.id for m in core.scenario.models}:
        return _fail(core, ApiError(404, f"{req.model} is not a valid model ID", "not_found",
                                    availability=availability("model_not_found", False, requested_models=[req.model])))
    attempt = core.next_attempt(rkey)
    cands = route(tier_pool(core.scenario.providers, tier, req.prefs), req.prefs, req.used,
                  core.uniform("route", rkey, attempt), req.model)
    if isinstance(cands, ApiError):
        return _fail(core, cands)
    cands = with_echo(_misrouted(core, cands, rkey, attempt) + cands, tier)
    first = cands[0]
    n_prompt = len(prompt_ids)
    if n_prompt + (req.max_tokens or 0) > first.context_length:
        return _fail(core, ApiError(
            400, f"This endpoint's maximum context length is {first.context_length} tokens. However, you requested "
                 f"about {n_prompt + (req.max_tokens or 0)} tokens ({n_prompt} of text input, "
                 f"{req.max_tokens or 0} in the output). Please reduce the length of either one.",
            "context_length_exceeded"))
    reserve_tokens = req.max_tokens or first.max_completion_tokens
    prompt_cost = cost_of(n_prompt, 0, first.price_prompt, first.price_completion)
    estimate = cost_of(n_prompt, reserve_tokens, first.price_prompt, first.price_completion)
    err = check_affordable(st, estimate, reserve_tokens, first.price_completion, prompt_cost,
                           core.in_flight_budget, core.scenario.scaled(2.0))
    if err is not None:
        return _fail(core, err)

    st.in_flight_usd += estimate
    try:
        provider, fault = cands[-1], None
        for i, p in enumerate(cands):
            fault = core.draw_fault(p, rkey, attempt)
            provider = p
            if fault in FALLBACK_FAULTS and i < len(cands) - 1:
                st.by_fault[fault] += 1  # hidden by OpenRouter's fallback
                continue
            break
        if fault is not None:
            core.note_fault(rkey, fault)
        return await _serve(request, core, req, provider, fault, rkey, attempt, prompt_hash, prompt_ids)
    finally:
        st.in_flight_usd -= estimate


def _misrouted(core: EmulatorCore, cands: list[Provider], rkey: int, attempt: int) -> list[Provider]:
    """Providers with ``ignores_routing`` that take this request although its routing excluded them."""
    return [p for p in core.scenario.providers
            if p.ignores_routing > 0 and p not in cands
            and core.uniform("misroute", rkey, attempt, p.tag) < p.ignores_routing][:1]


def _provider_error(kind: str, p: Provider, model: str, retry_after: float) -> ApiError:
    if kind == "rate_limit":
        return ApiError(429, f"{model} is temporarily rate-limited upstream. Please retry shortly.",
                        "rate_limit_exceeded", metadata={"provider_name": p.name, "provider_code": "429"},
                        availability=availability("capacity_exhausted", True, retry_after=retry_after,
                                                  requested_models=[model], affected_providers=[p.tag]),
                        retry_after_s=retry_after)
    if kind == "unavailable":
        return ApiError(503, "Provider temporarily unavailable", "provider_overloaded",
                        metadata={"provider_name": p.name, "provider_code": "503"},
                        availability=availability("temporarily_unavailable", True, retry_after=retry_after,
                                                  requested_models=[model], affected_providers=[p.tag]),
                        retry_after_s=retry_after)
    if kind == "server_error":
        return ApiError(502, "Provider returned error", "provider_unavailable",
                        metadata={"provider_name": p.name, "provider_code": "[masked]"})
    if kind == "legacy_raw":
        return ApiError(429, "Provider returned error", None, metadata={
            "raw": f"{model} is temporarily rate-limited upstream. Please retry shortly, or add your own key to "
                   "accumulate your rate limits: https://openrouter.ai/settings/integrations",
            "provider_name": p.name, "is_byok": False, "provider_error_code": "engine_overloaded",
            "limit_source": "upstream_provider_shared_pool",
            "remedy_hint": "Retry with backoff or route to another provider."})
    if kind == "cloudflare_1015":
        return ApiError(429, "error code: 1015", text="error code: 1015")
    if kind == "edge_timeout":
        return ApiError(524, "error code: 524", text="error code: 524")
    raise ValueError(kind)


def _midstream_error(p: Provider, model: str, u: float) -> dict[str, Any]:
    if u < 0.5:
        return {"code": 429, "message": f"{model} is temporarily rate-limited upstream.",
                "metadata": {"error_type": "rate_limit_exceeded", "provider_name": p.name}}
    return {"code": 502, "message": "Provider returned error",
            "metadata": {"error_type": "provider_unavailable", "provider_name": p.name, "provider_code": "[masked]"}}


def reset_connection(request: web.Request) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed upstream does."""
    tr = request.transport
    if tr is None:
        return
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed by the peer: the reset is moot
    tr.abort()


async def _hang_then_close(request: web.Request, seconds: float) -> None:
    await asyncio.sleep(seconds)
    reset_connection(request)
    await asyncio.sleep(3600)  # the handler is cancelled when the connection is lost


async def _stall(request: web.Request, core: EmulatorCore, req: ChatRequest, p: Provider, fault: str, gen_id: str,
                 created: int, model: str) -> web.StreamResponse:
    """keepalive_only / trickle: a 200 that beats every ``keepalive_s`` for ``hang_s`` and never finishes."""
    sc = core.scenario
    headers = {"Content-Type": "text/event-stream" if req.stream else "application/json", "X-Generation-Id": gen_id}
    if req.stream and fault == "trickle":
        beat = sse(chunk(gen_id, created, p, model, [{"index": 0, "delta": {"content": ""}, "finish_reason": None,
                                                       "native_finish_reason": None}]))
    elif req.stream:
        beat = KEEPALIVE
    else:
        beat = b"\n"
    core.state.by_status[200] += 1
    resp = web.StreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    interval = max(sc.scaled(sc.keepalive_s), 1e-3)
    end = time.monotonic() + sc.hang_s
    while time.monotonic() < end:
        await resp.write(beat)
        await asyncio.sleep(interval)
    reset_connection(request)
    await asyncio.sleep(3600)  # the handler is cancelled when the connection is lost
    return resp


_HUGE_MARK = "\u0000huge\u0000"


@functools.lru_cache(maxsize=4)
def _huge_json(size: int, ids: bool) -> bytes:
    """A JSON value of about ``size`` bytes: a list of token ids, or a string of words."""
    if ids:
        block = b",".join(str(1000 + i * 7919 % 140000).encode() for i in range(4096))
        reps = max(1, -(-size // (len(block) + 1)))
        return b"[" + b",".join([block] * reps) + b"]"
    words = b"lorem ipsum dolor sit amet, consectetur adipiscing elit; "
    return b'"' + words * max(1, -(-size // len(words))) + b'"'


async def _huge(request: web.Request, core: EmulatorCore, req: ChatRequest, p: Provider, gen_id: str, created: int,
                model: str, n_prompt: int) -> web.StreamResponse:
    """huge_body: about ``huge_body_bytes`` of ids (or text) whatever ``max_tokens`` was, billed 5 tokens."""
    usage = usage_obj(n_prompt, 5, 0, p)
    core.state.by_status[200] += 1
    headers = {"X-Generation-Id": gen_id}
    if not req.stream:
        view = View(None, "ok" if p.huge_body_ids else _HUGE_MARK, [], None, 0)
        body = completion_body(gen_id, created, p, model, view, "stop", usage)
        if p.huge_body_ids:
            body["choices"][0]["token_ids"] = _HUGE_MARK
        payload = msgspec.json.encode(body).replace(msgspec.json.encode(_HUGE_MARK), _huge_json(p.huge_body_bytes, p.huge_body_ids), 1)
        return web.Response(body=payload, content_type="application/json", headers=headers)
    resp = web.StreamResponse(status=200, headers={**headers, "Content-Type": "text/event-stream"})
    await resp.prepare(request)
    piece_size = 64 * 1024
    if p.huge_body_ids:
        frag = (b'{"index":0,"delta":{"content":""},"finish_reason":null,"token_ids":'
                + _huge_json(piece_size, True) + b"}")
    else:
        frag = b'{"index":0,"delta":{"content":' + _huge_json(piece_size, False) + b'},"finish_reason":null}'
    event = chunk_prefix(gen_id, created, p, model) + frag + b"]}\n\n"
    sent = 0
    while sent < p.huge_body_bytes:
        await resp.write(event)
        sent += len(event)
    tail = sse(chunk(gen_id, created, p, model, [finish_choice("stop")]))
    tail += sse(chunk(gen_id, created, p, model, [], usage=usage)) + DONE
    await resp.write(tail)
    await resp.write_eof()
    return resp


def _model_echo(core: EmulatorCore, req: ChatRequest, p: Provider) -> str:
    if p.model_permaslug:
        for m in core.scenario.models:
            if m.id == req.model and m.canonical_slug:
                return m.canonical_slug
    return req.model


async def _serve(request: web.Request, core: EmulatorCore, req: ChatRequest, p: Provider, fault: str | None,
                 rkey: int, attempt: int, prompt_hash: bytes, prompt_ids: list[int]) -> web.StreamResponse:
    sc = core.scenario
    gen_id = core.new_generation_id()
    created = int(time.time())
    model = _model_echo(core, req, p)
    retry_after = sc.scaled(p.retry_after_s)
    if fault in FALLBACK_FAULTS or fault == "cloudflare_1015":
        return _fail(core, _provider_error(fault, p, req.model, retry_after), gen_id)
    if fault == "edge_timeout":
        await asyncio.sleep(sc.scaled(sc.edge_timeout_s))
        return _fail(core, _provider_error(fault, p, req.model, retry_after), gen_id)
    if fault == "reset" and not req.stream:
        reset_connection(request)
        await asyncio.sleep(3600)
    if fault == "hang" and not req.stream:
        await _hang_then_close(request, sc.hang_s)
    if fault in ("keepalive_only", "trickle"):
        return await _stall(request, core, req, p, fault, gen_id, created, model)
    if fault == "huge_body":
        return await _huge(request, core, req, p, gen_id, created, model, len(prompt_ids))

    skey = sample_key(req, p, prompt_hash)
    cap = min(req.max_tokens or p.max_completion_tokens, p.max_completion_tokens)
    out = await core.output(skey, thinking=req.thinking, max_tokens=cap)
    if req.stop:
        out = core.model.cut_at_stop(out, req.stop, thinking=req.thinking)
    lo, hi = p.ttft_s
    ttft = sc.scaled(lo + (hi - lo) * core.uniform("ttft", rkey, attempt, p.tag)) if hi > 0 else 0.0
    lo, hi = p.tokens_per_s
    tps = lo + (hi - lo) * core.uniform("tps", rkey, attempt, p.tag) if hi > 0 else 0.0
    per_token = sc.scaled(1.0 / tps) if tps > 0 else 0.0
    chunk_tokens = sc.stream_chunk_tokens
    t0 = time.monotonic()
    delivery = _Delivery(request, core, req, p, fault, out, gen_id, created, model, prompt_ids, ttft, per_token,
                         chunk_tokens, t0, core.uniform("partial", rkey, attempt) if fault else 0.0)
    try:
        return await (delivery.stream() if req.stream else delivery.whole())
    except (asyncio.CancelledError, ConnectionResetError):  # the client went away
        delivery.abandoned(req.stream)
        raise


class _SseOut:
    """The bytes of one streamed answer: gathered in ``buf``; with a prepared ``resp`` they go out at each
    ``flush``, else the whole body is one response at ``finish``."""

    def __init__(self, resp: web.StreamResponse | None, headers: dict[str, str], buf: bytearray) -> None:
        self.resp, self.headers, self.buf = resp, headers, buf

    async def flush(self) -> None:
        if self.resp is not None and self.buf:
            await self.resp.write(bytes(self.buf))
            self.buf.clear()

    async def finish(self) -> web.StreamResponse:
        if self.resp is None:
            return web.Response(body=bytes(self.buf), headers=self.headers)
        await self.flush()
        await self.resp.write_eof()
        return self.resp

    async def keepalive_for(self, seconds: float, interval: float) -> None:
        """Wait ``seconds`` (the time to first token), sending a keep-alive comment every ``interval``."""
        await self.flush()
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, interval))
            if time.monotonic() < end:
                self.buf += KEEPALIVE
                await self.flush()


@dataclass
class _Delivery:
    request: web.Request
    core: EmulatorCore
    req: ChatRequest
    p: Provider
    fault: str | None
    out: Output
    gen_id: str
    created: int
    model: str
    prompt_ids: list[int]
    ttft: float
    per_token: float
    chunk_tokens: int
    t0: float
    u_partial: float

    @property
    def partial_tokens(self) -> int:
        return max(1, int(len(self.out.ids) * (0.2 + 0.6 * self.u_partial)))

    def view(self, partial: int | None = None, *, pieces: bool = True) -> View:
        return view_of(self.out, self.p, chunk_tokens=self.chunk_tokens, exclude_reasoning=self.req.exclude_reasoning,
                       logprobs=self.req.logprobs, partial_tokens=partial, pieces=pieces)

    def _error_obj(self) -> dict[str, Any]:
        return _midstream_error(self.p, self.req.model, self.u_partial)

    def complete(self, streamed: bool) -> None:
        out = self.out
        self._record(len(out.ids), out.reasoning_tokens, out.finish_reason, streamed)
        self.core.write_ground_truth(self.gen_id, out.ids, self.prompt_ids, out.non_canonical)

    def abandoned(self, streamed: bool) -> None:
        """The client went away mid-generation: billed for the prompt and the tokens generated by now on the
        scenario's clock (as a provider that stops on a cancel bills); its ``/generation`` record says
        ``cancelled``; no ground truth. Nothing when it was billed in full already, or was a fault."""
        if self.fault is not None or self.gen_id in self.core.state.generations:
            return
        gone = time.monotonic() - self.t0 - self.ttft
        made = min(len(self.out.ids), int(gone / self.per_token)) if self.per_token > 0 and gone > 0 else 0
        self._record(made, min(made, self.out.reasoning_tokens), "cancelled", streamed, cancelled=True)

    def _record(self, completion: int, reasoning: int, finish: str, streamed: bool, *, cancelled: bool = False) -> None:
        n_prompt = len(self.prompt_ids)
        cost = cost_of(n_prompt, completion, self.p.price_prompt, self.p.price_completion)
        elapsed = time.monotonic() - self.t0
        self.core.state.record_generation(GenerationInfo(
            id=self.gen_id, model=self.model, provider_name=self.p.name, total_cost=cost, tokens_prompt=n_prompt,
            tokens_completion=completion, tokens_reasoning=reasoning, finish_reason=finish,
            streamed=streamed, latency_ms=int(self.ttft * 1000), generation_time_ms=int(elapsed * 1000),
            created_at=time.time(), completed_mono=time.monotonic(), cancelled=cancelled))

    # -- non-streamed -------------------------------------------------------------------------------

    async def whole(self) -> web.StreamResponse:
        core, p, out = self.core, self.p, self.out
        headers = {"X-Generation-Id": self.gen_id}
        n_prompt = len(self.prompt_ids)
        fault = self.fault
        if fault == "error_in_200":
            body: dict[str, Any] = {"error": self._error_obj(), "user_id": USER_ID}
        elif fault == "error_in_200_choices":
            v = View(None, "", [], None, 0)
            body = completion_body(self.gen_id, self.created, p, self.model, v, "error", None, self._error_obj())
            body["error"] = self._error_obj()
        elif fault in ("finish_error", "midstream_error"):
            k = self.partial_tokens
            body = completion_body(self.gen_id, self.created, p, self.model, self.view(k, pieces=False), "error",
                                   usage_obj(n_prompt, 0, 0, p), self._error_obj())
        elif fault == "empty_200":
            v = View(None, None, [], None, 0)
            body = completion_body(self.gen_id, self.created, p, self.model, v, "stop", usage_obj(n_prompt, 0, 0, p))
        else:
            body = completion_body(self.gen_id, self.created, p, self.model, self.view(pieces=False), out.finish_reason,
                                   usage_obj(n_prompt, len(out.ids), out.reasoning_tokens, p))
        wait = self.ttft + self.per_token * len(out.ids)
        payload = msgspec.json.encode(body)
        core.state.by_status[200] += 1
        if p.pad_body:
            resp = web.StreamResponse(status=200, headers={**headers, "Content-Type": "application/json"})
            await resp.prepare(self.request)
            await resp.write(PADDING)
            await self._wait_padding(resp, wait)
        elif wait > 0:
            await asyncio.sleep(wait)
        # Recorded before the last byte leaves, so a client that has the response finds its ground truth.
        if fault is None:
            self.complete(streamed=False)
        if p.pad_body:
            await resp.write(payload)
            await resp.write_eof()
            return resp
        return web.Response(body=payload, content_type="application/json", headers=headers)

    async def _wait_padding(self, resp: web.StreamResponse, wait: float) -> None:
        interval = max(self.core.scenario.scaled(self.core.scenario.keepalive_s), 1e-3)
        end = time.monotonic() + wait
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, interval))
            if time.monotonic() < end:
                await resp.write(b"\n")

    # -- streamed -----------------------------------------------------------------------------------

    async def stream(self) -> web.StreamResponse:
        core, p, out, sc = self.core, self.p, self.out, self.core.scenario
        fault = self.fault
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Generation-Id": self.gen_id}
        core.state.by_status[200] += 1
        # With nothing to wait for, the whole stream goes out in one write (fast scenario); otherwise it is
        # sent as it is produced, chunked, like OpenRouter's.
        resp: web.StreamResponse | None = None
        if self.ttft > 0 or self.per_token > 0 or fault in ("hang", "reset"):
            resp = web.StreamResponse(status=200, headers=headers)
            await resp.prepare(self.request)
        o = _SseOut(resp, headers, bytearray(KEEPALIVE * max(0, sc.keepalive_comments)))
        if self.ttft > 0:
            await o.keepalive_for(self.ttft, max(sc.scaled(sc.keepalive_s), 1e-3))
        early = self._fault_body(fault)
        if early is not None:
            o.buf += early
            return await o.finish()
        ck = self._chunk
        partial = self.partial_tokens if fault in ("finish_error", "midstream_error", "hang", "reset") else None
        view = self.view(partial)
        start = time.monotonic()
        prefix = chunk_prefix(self.gen_id, self.created, p, self.model)
        for piece, frag in zip(view.pieces, delta_frags(view, p), strict=True):
            o.buf += prefix + frag + b"]}\n\n"
            if self.per_token > 0:
                delay = start + self.per_token * piece.tok1 - time.monotonic()
                if delay > 0.001:
                    await o.flush()
                    await asyncio.sleep(delay)
        if partial is not None:
            await o.flush()
            if fault == "reset":
                reset_connection(self.request)
                await asyncio.sleep(3600)
            if fault == "hang":
                await _hang_then_close(self.request, sc.hang_s)
            o.buf += ck([{"index": 0, "delta": {"content": ""}, "finish_reason": "error",
                        "native_finish_reason": "error"}], error=self._error_obj())
            return await o.finish()
        fr = out.finish_reason
        usage = usage_obj(len(self.prompt_ids), len(out.ids), out.reasoning_tokens, p)
        o.buf += ck([finish_choice(fr)])
        if p.repeat_finish_chunk:
            o.buf += ck([finish_choice(fr)], usage=usage)
        else:
            o.buf += ck([], usage=usage)
        o.buf += DONE
        self.complete(streamed=True)  # before the last byte leaves (see whole())
        return await o.finish()

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(chunk(self.gen_id, self.created, self.p, self.model, choices, **extra))

    def _fault_body(self, fault: str | None) -> bytes | None:
        """The whole stream of a fault that sends no tokens (an error or an empty answer in a 200), else None."""
        ck = self._chunk
        if fault == "error_in_200":
            return sse({"error": self._error_obj(), "user_id": USER_ID})
        if fault == "error_in_200_choices":
            return ck([{"index": 0, "delta": {"content": ""}, "finish_reason": "error",
                        "native_finish_reason": "error"}], error=self._error_obj())
        if fault == "empty_200":
            return (ck([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                         "native_finish_reason": None}])
                    + ck([finish_choice("stop")]) + ck([], usage=usage_obj(len(self.prompt_ids), 0, 0, self.p)) + DONE)
        return None
