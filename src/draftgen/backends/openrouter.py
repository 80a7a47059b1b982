"""OpenRouter and any OpenAI-compatible chat server: ``POST {base_url}/chat/completions``.

Request body (JSON): ``model``, ``messages``, ``tools``, ``max_tokens``, ``stream`` (+ ``stream_options``
so plain servers send usage), the sampling fields, and with ``openrouter=True`` also the ``provider``
routing object, the ``reasoning`` object and ``service_tier`` (``endpoint.service_tier``; the response
echoes the tier served, ``Completion.service_tier``, and billing follows it: OpenRouter's
``guides/features/service-tiers.mdx``). The parts that are the same for every request are encoded
once; a request only encodes its messages, and its own ``provider`` object when it carries
``provider_ignore`` (the configured routing with those slugs added to ``ignore``; ``allow_fallbacks`` and
the rest as configured).

A streamed completion carries ``ttft_s``: from sending the request to its first SSE data event; while it
streams, the request's ``WireMeter`` (when it has one) counts the text and ids received so far. An error
raised once the stream named its provider is attributed to it (``backends.errors.provider_of``).

Responses are read streamed (SSE, ``backends.sse``) or whole (``wire.decode_chat``; leading whitespace
padding allowed), within the bounds of ``http.Bounds`` (total deadline, data idle timeout, body size).

Account endpoints (OpenRouter only): ``GET /key``, ``GET /credits`` (management key),
``GET /models/{author}/{slug}/endpoints``; their ``{"data": …}`` envelopes are decoded here
(``decode_key_info``, ``decode_credits``, ``decode_endpoints``: unknown keys ignored, prices sent as
strings parsed to floats), a body of another shape being a retryable ``bad_response``, and so is a key
limit that is not a finite number (``"NaN"``, ``"Infinity"``).
``backends.account`` reads them through the ``Backend`` methods.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
import msgspec

from draftgen.backends.base import (
    Capabilities,
    Completion,
    CompletionRequest,
    Credits,
    EndpointInfo,
    GenerationCost,
    KeyInfo,
    reasoning_body,
    sampling_body,
)
from draftgen.backends.errors import TRANSPORT_ERRORS, attribute, classify_http, one_line, translate_exception
from draftgen.backends.http import Bounds, HttpBackend, drop_none, read_body, read_error_body, read_events
from draftgen.backends.sse import ChatStream, SSEParser
from draftgen.backends.wire import check_completion, completion_from_body, decode_chat
from draftgen.errors import APIError, RetryableAPIError

if TYPE_CHECKING:
    from draftgen.config import RunConfig

OPENROUTER_URL = "https://openrouter.ai/api/v1"

#: The key sent to the embedded emulator when none is configured (it accepts any ``sk-or-`` key).
EMULATOR_KEY = "sk-or-v1-draftgen-emulator"

#: A plain OpenAI-compatible chat server: text only, logprobs when asked.
OPENAI_CAPABILITIES = Capabilities(logprobs=True)
#: OpenRouter: a key with money on it, provider endpoints with prices, routing.
OPENROUTER_CAPABILITIES = Capabilities(logprobs=True, account=True, prices=True, requires_key=True,
                                       default_url=OPENROUTER_URL, attribution_headers=True, batch_api=True)
#: The offline OpenRouter emulator: the same protocol; any ``sk-or-`` key, none needed; started in process
#: when no base URL is configured.
EMULATOR_CAPABILITIES = Capabilities(logprobs=True, account=True, prices=True, placeholder_key=EMULATOR_KEY,
                                     attribution_headers=True, embedded_server=True,
                                     play_money=True, batch_api=True)

__all__ = ["OpenAIChatBackend", "chat_body_prefix", "decode_credits", "decode_endpoints", "decode_key_info"]

_enc = msgspec.json.Encoder()


def chat_body_prefix(const: Mapping[str, Any]) -> bytes:
    """``{"k":v,...,`` for the constant fields, ready for the per-request fields to be appended."""
    enc = _enc.encode(dict(const))
    return enc[:-1] + b"," if len(enc) > 2 else b"{"


class OpenAIChatBackend(HttpBackend):
    """OpenAI-compatible chat completions; ``openrouter`` adds routing/reasoning and account calls."""

    capabilities = OPENAI_CAPABILITIES

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        model: str,
        stream: bool = True,
        openrouter: bool = False,
        routing: Mapping[str, Any] | None = None,
        reasoning: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        name: str | None = None,
        bounds: Bounds | None = None,
        service_tier: str | None = None,
    ) -> None:
        super().__init__(session, base_url, bounds=bounds)
        self.name = name or ("openrouter" if openrouter else "openai")
        self.reports_cost = openrouter
        self.model = model
        self.stream = stream
        self.openrouter = openrouter
        if openrouter:
            self.capabilities = OPENROUTER_CAPABILITIES
        const: dict[str, Any] = {"model": model, "stream": stream}
        if stream:
            const["stream_options"] = {"include_usage": True}
        self._routing: dict[str, Any] = drop_none(routing) if openrouter and routing else {}
        if openrouter:
            if reasoning:
                const["reasoning"] = drop_none(reasoning)
        elif reasoning and reasoning.get("effort"):
            const["reasoning_effort"] = reasoning["effort"]
        const.update(drop_none(sampling or {}))
        if openrouter and service_tier:
            const["service_tier"] = service_tier
        const.update(extra or {})
        # Without routing of its own a request uses the one prefix; with ``provider_ignore`` it gets the
        # bare one and a ``provider`` object of its own.
        self._bare_prefix = chat_body_prefix(const)
        self._prefix = chat_body_prefix({**const, "provider": self._routing}) if self._routing else self._bare_prefix
        self._url = self.base_url + "/chat/completions"
        self._where = f"POST {self._url}"

    def routing_for(self, req: CompletionRequest) -> dict[str, Any] | None:
        """The ``provider`` object sent with ``req``: the configured one, with ``req.provider_ignore`` added."""
        if not self.openrouter:
            return None
        if not req.provider_ignore:
            return self._routing or None
        ignore = list(self._routing.get("ignore") or [])
        have = {x.lower() for x in ignore}
        for slug in req.provider_ignore:
            if slug.lower() not in have:
                ignore.append(slug)
                have.add(slug.lower())
        return {**self._routing, "ignore": ignore}

    def encode_body(self, req: CompletionRequest) -> bytes:
        if self.openrouter and req.provider_ignore:
            parts = [self._bare_prefix, b'"provider":', _enc.encode(self.routing_for(req)), b","]
        else:
            parts = [self._prefix]
        parts += [b'"max_tokens":', str(req.max_tokens).encode(), b',"messages":', _enc.encode(req.messages)]
        if req.tools:
            parts.append(b',"tools":')
            parts.append(_enc.encode(req.tools))
        parts.append(b"}")
        return b"".join(parts)

    async def send(self, req: CompletionRequest) -> Completion:
        body = self.encode_body(req)
        bounds = self.bounds
        cap = bounds.body_cap(req.max_tokens)
        acc: ChatStream | None = None
        t0 = time.monotonic()
        first: list[float] = []
        try:
            async with self.session.post(self._url, data=body) as resp:
                if resp.status != 200:
                    raise classify_http(resp.status, await read_error_body(resp), headers=resp.headers,
                                        where=self._where)
                meter = req.meter
                if meter is not None:  # known before any text: an abandoned request can be looked up by it
                    meter.generation_id = resp.headers.get("X-Generation-Id") or meter.generation_id
                if self.stream and resp.content_type == "text/event-stream":
                    acc = chat = ChatStream(self.name)
                    feed = acc.feed

                    def on_event(payload: bytes) -> None:
                        now = time.monotonic()
                        if not first:
                            first.append(now)
                        feed(payload)
                        if meter is not None:
                            meter.data(chat.chars, len(chat.output_ids) if chat.output_ids else 0, now, chat.provider)
                            meter.generation_id = meter.generation_id or chat.generation_id

                    await read_events(resp, on_event, idle_timeout_s=bounds.idle_timeout_s, max_bytes=cap,
                                      where=self._where)
                    comp = acc.result()
                    if first:
                        comp.ttft_s = round(first[0] - t0, 4)
                else:
                    data = await read_body(resp, cap, where=self._where)
                    head = data.lstrip()[:5]
                    if self.stream and (head == b"data:" or head[:1] == b":"):
                        # an SSE body sent with the wrong content type
                        parser = SSEParser()
                        acc = ChatStream(self.name)
                        for payload in (*parser.feed(data), *parser.close()):
                            acc.feed(payload)
                        comp = acc.result()
                    else:
                        comp = completion_from_body(decode_chat(data), backend=self.name)
        except TRANSPORT_ERRORS as exc:
            err = translate_exception(exc, where=self._where)
            raise (attribute(err, acc.provider) if acc is not None else err) from None
        except APIError as exc:
            if acc is not None:  # a stream that named its provider, then failed
                attribute(exc, acc.provider)
            raise
        return check_completion(comp)

    # -- OpenRouter account endpoints ------------------------------------------------------------------

    async def get_key_info(self) -> KeyInfo | None:
        if not self.openrouter:
            return None
        return decode_key_info(await self.get_json("/key"))

    async def get_credits(self, management_key: str | None = None) -> Credits | None:
        if not self.openrouter or not management_key:
            return None
        return decode_credits(await self.get_json("/credits", headers={"Authorization": f"Bearer {management_key}"}))

    async def get_generation(self, generation_id: str) -> GenerationCost | None:
        if not self.openrouter:
            return None
        try:
            body = await self.get_json(f"/generation?id={quote(generation_id, safe='')}")
        except APIError as exc:
            if exc.status == 404:  # not (yet) known: OpenRouter lags about a second behind a generation's end
                return None
            raise
        return decode_generation(body)

    async def get_model_endpoints(self, model: str) -> list[EndpointInfo] | None:
        if not self.openrouter:
            return None
        slug = model.split(":", 1)[0]
        return decode_endpoints(await self.get_json(f"/models/{slug}/endpoints"))


# -- OpenRouter account bodies ---------------------------------------------------------------------------


class _KeyEnv(msgspec.Struct):
    data: KeyInfo


class _CreditsEnv(msgspec.Struct):
    data: Credits


class _EndpointsData(msgspec.Struct):
    endpoints: list[EndpointInfo] = msgspec.field(default_factory=list)


class _EndpointsEnv(msgspec.Struct):
    data: _EndpointsData


def _decode_lenient(body: bytes, type_: type[Any], what: str) -> Any:
    try:
        return msgspec.json.decode(body, type=type_, strict=False)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RetryableAPIError(f"{what}: unexpected response ({one_line(exc, 160)})", kind="bad_response") from None


def decode_key_info(body: bytes) -> KeyInfo:
    """``GET /key``'s body → its ``KeyInfo``. A limit, limit remaining or usage that is not a finite number
    (``"NaN"``, ``"Infinity"``) is refused (retryable ``bad_response``): it must never switch the key's cap off."""
    info: KeyInfo = _decode_lenient(body, _KeyEnv, "GET /key").data
    for name in ("limit", "limit_remaining", "usage", "usage_daily"):
        value = getattr(info, name)
        if value is not None and not math.isfinite(value):
            raise RetryableAPIError(f"GET /key: {name} is {value!r}, not a finite number of dollars; the key's "
                                    "limit cannot be read", kind="bad_response")
    return info


class _GenerationEnv(msgspec.Struct):
    data: GenerationCost


def decode_generation(body: bytes) -> GenerationCost:
    """``GET /generation?id=``'s body → its ``GenerationCost``; a cost that is not a finite number is refused."""
    g: GenerationCost = _decode_lenient(body, _GenerationEnv, "GET /generation").data
    for name in ("total_cost", "upstream_inference_cost"):
        value = getattr(g, name)
        if value is not None and not math.isfinite(value):
            raise RetryableAPIError(f"GET /generation: {name} is {value!r}, not a finite number of dollars",
                                    kind="bad_response")
    return g


def decode_credits(body: bytes) -> Credits:
    """``GET /credits``' body → its ``Credits``."""
    cr: Credits = _decode_lenient(body, _CreditsEnv, "GET /credits").data
    for name in ("total_credits", "total_usage"):
        if not math.isfinite(getattr(cr, name)):
            raise RetryableAPIError(f"GET /credits: {name} is {getattr(cr, name)!r}, not a finite number of dollars",
                                    kind="bad_response")
    return cr


def decode_endpoints(body: bytes) -> list[EndpointInfo]:
    """``GET /models/{author}/{slug}/endpoints``' body → the model's endpoints with their prices."""
    eps: list[EndpointInfo] = _decode_lenient(body, _EndpointsEnv, "GET /endpoints").data.endpoints
    return eps


def _chat(cfg: RunConfig, session: aiohttp.ClientSession, url: str, bounds: Bounds, *,
          openrouter: bool) -> OpenAIChatBackend:
    return OpenAIChatBackend(
        session, url, model=cfg.model.id, stream=cfg.endpoint.stream, openrouter=openrouter,
        routing=msgspec.to_builtins(cfg.routing), reasoning=reasoning_body(cfg), sampling=sampling_body(cfg),
        bounds=bounds, service_tier=cfg.endpoint.service_tier,
    )


def build_openrouter(cfg: RunConfig, session: aiohttp.ClientSession, url: str, bounds: Bounds) -> OpenAIChatBackend:
    """``endpoint.kind`` ``openrouter`` and ``emulator``: routing, reasoning and account calls."""
    return _chat(cfg, session, url, bounds, openrouter=True)


def build_openai(cfg: RunConfig, session: aiohttp.ClientSession, url: str, bounds: Bounds) -> OpenAIChatBackend:
    """``endpoint.kind`` ``openai``: the protocol without OpenRouter-only fields."""
    return _chat(cfg, session, url, bounds, openrouter=False)
