"""Shared HTTP plumbing for every backend: one aiohttp session (one connection pool) per base URL.

Timeouts: a connect timeout and an idle timeout (no bytes for ``idle_timeout_s`` → retryable), never a
total timeout, so long reasoning streams are not killed while they are still producing. Transport
exceptions are translated by ``wire.translate_exception``; non-2xx bodies by ``wire.classify_http``.
The API key lives only in the session's default headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from ..errors import ConfigError
from .base import Completion, CompletionRequest, Credits, EndpointInfo, KeyInfo
from .wire import classify_http, translate_exception

__all__ = ["HttpBackend", "body_or_error", "check_base_url", "drop_none", "make_session"]

_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


def make_session(
    *, api_key: str | None, connections: int, connect_timeout_s: float, idle_timeout_s: float,
    extra_headers: Mapping[str, str] | None = None,
) -> aiohttp.ClientSession:
    """One pool for one endpoint. ``connections`` bounds open sockets (0 = unbounded)."""
    headers = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if extra_headers:
        headers.update(extra_headers)
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=idle_timeout_s)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers=headers, raise_for_status=False, trust_env=True,
    )


class HttpBackend:
    """Base class: owns the session; subclasses implement ``complete``. Account calls default to None."""

    name = "http"

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")

    async def complete(self, req: CompletionRequest) -> Completion:
        raise NotImplementedError

    async def get_json(self, path: str, *, headers: Mapping[str, str] | None = None) -> bytes:
        """GET ``base_url + path``; the body bytes of a 200, else the classified APIError."""
        url = self.base_url + path
        try:
            async with self.session.get(url, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise classify_http(resp.status, body, headers=resp.headers, where=f"GET {path}")
                return body
        except _TRANSPORT_ERRORS as exc:
            raise translate_exception(exc, where=f"GET {self.base_url}{path}") from None

    async def get_key_info(self) -> KeyInfo | None:
        return None

    async def get_credits(self, management_key: str | None = None) -> Credits | None:
        return None

    async def get_model_endpoints(self, model: str) -> list[EndpointInfo] | None:
        return None

    async def aclose(self) -> None:
        await self.session.close()


def check_base_url(url: str, *, what: str = "base_url") -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint.{what} {url!r} must start with http:// or https://")
    return url.rstrip("/")


def body_or_error(status: int, body: bytes, headers: Mapping[str, str], where: str) -> bytes:
    if status != 200:
        raise classify_http(status, body, headers=headers, where=where)
    return body


def drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}

