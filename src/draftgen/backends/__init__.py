"""Backends: one module per protocol, each turning a ``CompletionRequest`` into a ``Completion``.

Entry point::

    async with open_backend(cfg, api_key_for(cfg)) as backend:
        comp = await backend.complete(CompletionRequest(sample_id=..., messages=..., max_tokens=...))
        key = await backend.get_key_info()            # capabilities.account, else None
        credits = await backend.get_credits(mgmt_key)  # capabilities.account + management key, else None
        eps = await backend.get_model_endpoints(cfg.model.id)  # capabilities.prices, else None

``BACKENDS`` (a ``draftgen.registry.Registry``) maps each ``endpoint.kind`` to a ``BackendKind``: its
``Capabilities`` and its factory.
``openrouter``/``emulator`` → ``openrouter.OpenAIChatBackend`` (with routing and reasoning), ``openai`` →
the same without OpenRouter-only fields, ``vllm`` → ``vllm.VLLMBackend`` (exact ids), ``sglang`` →
``sglang.SGLangBackend`` (exact ids, prompt ids in). Callers decide behaviour from ``capabilities(kind)``,
never from a kind's or backend's name; adding a backend is its module plus one ``BACKENDS.register`` line.

Each base URL gets one aiohttp session (one connection pool); several URLs (``endpoint.base_urls``) are
load-balanced by fewest requests in flight. Every request is bounded by ``http.Bounds``
(``endpoint.request_timeout_s``, ``idle_timeout_s``, ``max_body_bytes``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from draftgen.backends.base import (
    Backend,
    BackendKind,
    Capabilities,
    Completion,
    CompletionRequest,
    Credits,
    EndpointInfo,
    GenerationCost,
    KeyInfo,
    LogprobToken,
    SpecDecodeMetrics,
    WireMeter,
)
from draftgen.backends.http import Bounds, HttpBackend, check_base_url, make_session
from draftgen.backends.openrouter import (
    EMULATOR_CAPABILITIES,
    EMULATOR_KEY,
    OPENAI_CAPABILITIES,
    OPENROUTER_CAPABILITIES,
    OPENROUTER_URL,
    build_openai,
    build_openrouter,
)
from draftgen.backends.sglang import SGLANG_CAPABILITIES, build_sglang
from draftgen.backends.vllm import VLLM_CAPABILITIES, build_vllm
from draftgen.config import RunConfig, resolve_api_key
from draftgen.errors import ConfigError
from draftgen.registry import Registry

__all__ = [
    "BACKENDS",
    "EMULATOR_KEY",
    "OPENROUTER_URL",
    "Backend",
    "BackendKind",
    "Balanced",
    "Bounds",
    "Capabilities",
    "Completion",
    "CompletionRequest",
    "Credits",
    "EndpointInfo",
    "GenerationCost",
    "KeyInfo",
    "LogprobToken",
    "SpecDecodeMetrics",
    "WireMeter",
    "api_key_for",
    "capabilities",
    "endpoint_urls",
    "management_key_for",
    "open_backend",
]

#: ``endpoint.kind`` → its capabilities and factory, with a doc for docs/config.md (``docgen``). One line per
#: backend: the config accepts exactly these kinds (``extensions.check_config``).
BACKENDS: Registry[BackendKind] = Registry("endpoint.kind", "backend kind")
BACKENDS.register("emulator", BackendKind(EMULATOR_CAPABILITIES, build_openrouter),
                  doc="the offline OpenRouter emulator, embedded")
BACKENDS.register("openrouter", BackendKind(OPENROUTER_CAPABILITIES, build_openrouter),
                  doc="OpenRouter, with routing and account")
BACKENDS.register("openai", BackendKind(OPENAI_CAPABILITIES, build_openai), doc="any OpenAI-compatible chat server")
BACKENDS.register("vllm", BackendKind(VLLM_CAPABILITIES, build_vllm), doc="vLLM, exact ids via return_token_ids")
BACKENDS.register("sglang", BackendKind(SGLANG_CAPABILITIES, build_sglang),
                  doc="SGLang native /generate, exact output_ids")


def capabilities(kind: str) -> Capabilities:
    """What a backend of ``endpoint.kind`` can do."""
    return BACKENDS.get(kind).capabilities


def api_key_for(cfg: RunConfig) -> str | None:
    """The API key to send: the configured one (required where the backend ``requires_key``), else the
    backend's ``placeholder_key`` (the embedded emulator accepts any ``sk-or-`` key), else None."""
    caps = capabilities(cfg.endpoint.kind)
    key = resolve_api_key(cfg, required=caps.requires_key)
    if not key and caps.placeholder_key:
        return caps.placeholder_key
    return key


def management_key_for(cfg: RunConfig) -> str | None:
    """The management key (``endpoint.management_key_env``) for ``GET /credits``; None when unset or empty."""
    env = cfg.endpoint.management_key_env
    return (os.environ.get(env, "").strip() or None) if env else None


def endpoint_urls(cfg: RunConfig) -> list[str]:
    """The configured base URLs (``base_urls`` wins over ``base_url``; some backends have a default)."""
    ep = cfg.endpoint
    urls = list(ep.base_urls) or ([ep.base_url] if ep.base_url else [])
    if not urls:
        default = capabilities(ep.kind).default_url
        if default:
            urls = [default]
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
        self.capabilities = self.backends[0].capabilities
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

    async def get_generation(self, generation_id: str) -> GenerationCost | None:
        return await self.backends[0].get_generation(generation_id)

    async def get_model_endpoints(self, model: str) -> list[EndpointInfo] | None:
        return await self.backends[0].get_model_endpoints(model)

    async def aclose(self) -> None:
        for b in self.backends:
            await b.aclose()


def _build(cfg: RunConfig, url: str, api_key: str | None, connections: int) -> HttpBackend:
    ep = cfg.endpoint
    kind = BACKENDS.get(ep.kind)
    headers = ({"HTTP-Referer": "https://github.com/draftgen/draftgen", "X-Title": "draftgen"}
               if kind.capabilities.attribution_headers else None)
    session = make_session(
        api_key=api_key, connections=connections, connect_timeout_s=ep.connect_timeout_s,
        idle_timeout_s=ep.idle_timeout_s, extra_headers=headers,
    )
    bounds = Bounds(
        connect_timeout_s=ep.connect_timeout_s, idle_timeout_s=ep.idle_timeout_s,
        request_timeout_s=ep.request_timeout_s, slow_tokens_per_s=ep.slow_tokens_per_s,
        max_body_bytes=ep.max_body_bytes,
    )
    backend = kind.factory(cfg, session, url, bounds)
    backend.capabilities = kind.capabilities  # one class may serve several kinds (openrouter, emulator)
    return backend


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
