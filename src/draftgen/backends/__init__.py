"""Backends: one module per protocol, each turning a ``CompletionRequest`` into a ``Completion``.

Entry point::

    async with open_backend(cfg, api_key) as backend:
        comp = await backend.complete(CompletionRequest(sample_id=..., messages=..., max_tokens=...))
        key = await backend.get_key_info()            # OpenRouter only, else None
        credits = await backend.get_credits(mgmt_key)  # OpenRouter + management key, else None
        eps = await backend.get_model_endpoints(cfg.model.id)  # OpenRouter only, else None

``endpoint.kind`` picks the protocol: ``openrouter``/``emulator`` → ``openrouter.OpenAIChatBackend``
(with routing and reasoning), ``openai`` → the same without OpenRouter-only fields, ``vllm`` →
``vllm.VLLMBackend`` (exact ids), ``sglang`` → ``sglang.SGLangBackend`` (exact ids). Each base URL gets
one aiohttp session (one connection pool); several URLs (``endpoint.base_urls``) are load-balanced by
fewest requests in flight. Every request is bounded by ``http.Bounds`` (``endpoint.request_timeout_s``,
``idle_timeout_s``, ``max_body_bytes``).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import msgspec

from ..config import RunConfig
from ..errors import ConfigError
from ..tokens import profile_class
from .base import Backend, Completion, CompletionRequest, Credits, EndpointInfo, KeyInfo, LogprobToken
from .http import Bounds, HttpBackend, check_base_url, make_session
from .openrouter import OpenAIChatBackend
from .sglang import SGLangBackend
from .vllm import VLLMBackend

__all__ = [
    "OPENROUTER_URL",
    "Backend",
    "Balanced",
    "Bounds",
    "Completion",
    "CompletionRequest",
    "Credits",
    "EndpointInfo",
    "KeyInfo",
    "LogprobToken",
    "endpoint_urls",
    "open_backend",
]

OPENROUTER_URL = "https://openrouter.ai/api/v1"


def endpoint_urls(cfg: RunConfig) -> list[str]:
    """The configured base URLs (``base_urls`` wins over ``base_url``; OpenRouter has a default)."""
    ep = cfg.endpoint
    urls = list(ep.base_urls) or ([ep.base_url] if ep.base_url else [])
    if not urls:
        if ep.kind == "openrouter":
            urls = [OPENROUTER_URL]
        else:
            raise ConfigError(f"endpoint.base_url is required for endpoint kind {ep.kind!r} (or pass --base-url URL)")
    return [check_base_url(u) for u in urls]


class Balanced:
    """Several endpoints of one protocol; each request goes to the one with fewest in flight."""

    def __init__(self, backends: Sequence[HttpBackend]) -> None:
        if not backends:
            raise ValueError("Balanced needs at least one backend")
        self.backends = list(backends)
        self.name = self.backends[0].name
        self.reports_cost = self.backends[0].reports_cost
        self.in_flight = [0] * len(self.backends)
        self._rr = itertools.cycle(range(len(self.backends)))
        self.sent = [0] * len(self.backends)

    def _pick(self) -> int:
        start = next(self._rr)
        n = len(self.backends)
        best = start
        for k in range(1, n):
            i = (start + k) % n
            if self.in_flight[i] < self.in_flight[best]:
                best = i
        return best

    async def complete(self, req: CompletionRequest) -> Completion:
        i = self._pick()
        self.in_flight[i] += 1
        self.sent[i] += 1
        try:
            return await self.backends[i].complete(req)
        finally:
            self.in_flight[i] -= 1

    async def get_key_info(self) -> KeyInfo | None:
        return await self.backends[0].get_key_info()

    async def get_credits(self, management_key: str | None = None) -> Credits | None:
        return await self.backends[0].get_credits(management_key)

    async def get_model_endpoints(self, model: str) -> list[EndpointInfo] | None:
        return await self.backends[0].get_model_endpoints(model)

    async def aclose(self) -> None:
        for b in self.backends:
            await b.aclose()


def _build(cfg: RunConfig, url: str, api_key: str | None, connections: int) -> HttpBackend:
    ep = cfg.endpoint
    headers = {"HTTP-Referer": "https://github.com/draftgen/draftgen", "X-Title": "draftgen"} if ep.kind in ("openrouter", "emulator") else None
    session = make_session(
        api_key=api_key, connections=connections, connect_timeout_s=ep.connect_timeout_s,
        idle_timeout_s=ep.idle_timeout_s, extra_headers=headers,
    )
    bounds = Bounds(
        connect_timeout_s=ep.connect_timeout_s, idle_timeout_s=ep.idle_timeout_s,
        request_timeout_s=ep.request_timeout_s, slow_tokens_per_s=ep.slow_tokens_per_s,
        max_body_bytes=ep.max_body_bytes,
    )
    sampling = msgspec.to_builtins(cfg.sampling)
    reasoning = msgspec.to_builtins(cfg.reasoning)
    if not cfg.model.thinking and not reasoning:
        # The target profile says the model does not reason: ask the server for that prompt variant.
        reasoning = {"enabled": False}
    if ep.kind in ("openrouter", "emulator", "openai"):
        return OpenAIChatBackend(
            session, url, model=cfg.model.id, stream=ep.stream, openrouter=ep.kind != "openai",
            routing=msgspec.to_builtins(cfg.routing), reasoning=reasoning, sampling=sampling, bounds=bounds,
        )
    if ep.kind == "vllm":
        kwarg = profile_class(cfg.model.profile).thinking_kwarg
        extra = {"chat_template_kwargs": {kwarg: cfg.model.thinking}} if kwarg else None
        return VLLMBackend(session, url, model=cfg.model.id, stream=ep.stream, sampling=sampling, extra=extra,
                           bounds=bounds)
    return SGLangBackend(session, url, stream=ep.stream, sampling=sampling, bounds=bounds)


@asynccontextmanager
async def open_backend(
    cfg: RunConfig,
    api_key: str | None,
    *,
    base_urls: Sequence[str] | None = None,
    connections: int | None = None,
) -> AsyncIterator[Backend]:
    """Open the configured backend (one pool per URL) and close it on exit.

    ``base_urls`` overrides the configured URLs (the embedded emulator's URL, say). ``connections``
    bounds each pool's sockets; the default is the sum of the partitions' concurrency plus headroom.
    """
    urls = [check_base_url(u) for u in base_urls] if base_urls else endpoint_urls(cfg)
    conns = connections if connections is not None else cfg.partitions.short.concurrency + cfg.partitions.long.concurrency + 16
    built: list[HttpBackend] = []
    try:
        for url in urls:
            built.append(_build(cfg, url, api_key, conns))
        yield built[0] if len(built) == 1 else Balanced(built)
    finally:
        for b in built:
            await b.aclose()
