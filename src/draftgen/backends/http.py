"""Shared HTTP plumbing for every backend: one aiohttp session (one connection pool) per base URL, and
the bounds every request is held to (``Bounds``).

Time: a connect timeout; an idle timeout that counts *data* only (for a stream, SSE data events: keep-alive
comments such as ``: OPENROUTER PROCESSING`` do not extend it; for a whole body, any byte, since a
non-streamed body says nothing until it is done); and a total deadline per request,
``endpoint.request_timeout_s``, by default ``connect_timeout_s + idle_timeout_s + max_tokens /
slow_tokens_per_s``, so a stream that keeps trickling never holds its slot for ever. Size: a response
body (the streamed total, or the whole body) may be at most ``endpoint.max_body_bytes``, by default
``1 MiB + 4 KiB × max_tokens``; reading stops as soon as it is passed. All of these are retryable, with
the kinds ``idle_timeout``, ``request_timeout`` and ``body_too_large``.

Transport exceptions (``backends.errors.TRANSPORT_ERRORS``) are translated by
``backends.errors.translate_exception``; non-2xx bodies by ``backends.errors.classify_http``. The API key
lives only in the session's default headers.

Requests outside a backend's ``complete`` (the vllm capture backend's ``/v1/completions`` and
``/v1/models``, accept's ``/metrics`` and SGLang ``/generate``) go through ``fetch_bytes`` /
``post_json`` / ``get_bytes`` on such a session, within ``within_deadline``: the same translation, the
same body caps; they are retried by ``engine.retry.retrying`` (the one ``RetryPolicy``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from draftgen.backends.base import (
    Capabilities,
    Completion,
    CompletionRequest,
    Credits,
    EndpointInfo,
    GenerationCost,
    KeyInfo,
)
from draftgen.backends.errors import TRANSPORT_ERRORS, classify_http, translate_exception
from draftgen.backends.sse import SSEParser
from draftgen.errors import ConfigError, RetryableAPIError

__all__ = [
    "Bounds",
    "HttpBackend",
    "check_base_url",
    "drop_none",
    "fetch_bytes",
    "get_bytes",
    "make_session",
    "post_json",
    "read_body",
    "read_error_body",
    "read_events",
    "within_deadline",
]

T = TypeVar("T")

_KIB = 1024
_MIB = 1024 * 1024
#: an error body, or an account answer, is read up to this much (the rest is not needed)
ERROR_BODY_BYTES = 64 * _KIB
ACCOUNT_BODY_BYTES = 16 * _MIB


@dataclass(frozen=True)
class Bounds:
    """Time and size limits of one request (from ``endpoint.*``; see the module docstring)."""

    connect_timeout_s: float = 30.0
    idle_timeout_s: float = 180.0
    request_timeout_s: float | None = None
    slow_tokens_per_s: float = 5.0
    max_body_bytes: int | None = None

    def deadline_s(self, max_tokens: int) -> float:
        """Total seconds one request may take: ``request_timeout_s``, else connect + idle + the time to
        generate ``max_tokens`` at ``slow_tokens_per_s`` (the slowest rate still considered alive)."""
        if self.request_timeout_s is not None:
            return self.request_timeout_s
        rate = self.slow_tokens_per_s if self.slow_tokens_per_s > 0 else 5.0
        return self.connect_timeout_s + self.idle_timeout_s + max_tokens / rate

    def body_cap(self, max_tokens: int) -> int:
        """Largest response body accepted: ``max_body_bytes``, else ``1 MiB + 4 KiB × max_tokens``.

        The fixed MiB covers headers of the stream, keep-alive comments, the usage chunk and error
        envelopes; 4 KiB per token covers OpenRouter's SSE framing of one token per chunk (about 300
        bytes of ``id``/``provider``/``model``/``created`` per chunk, reasoning sent twice as ``reasoning``
        and ``reasoning_details``) with ``top_logprobs`` up to 20 (about 1.5 KiB a token), with room to
        spare. A request asking for more than that per token should set ``endpoint.max_body_bytes``.
        """
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return _MIB + 4 * _KIB * max(0, max_tokens)


def _at(where: str) -> str:
    return f" ({where})" if where else ""


def body_too_large(cap: int, where: str, *, announced: int | None = None, what: str = "response body") -> RetryableAPIError:
    """The retryable error of a body (or one event of it) over its cap."""
    size = f" (Content-Length {announced:,})" if announced is not None else ""
    return RetryableAPIError(
        f"body_too_large: the {what} is over {cap:,} bytes{size}{_at(where)}; an invalid response "
        "(endpoint.max_body_bytes)", kind="body_too_large",
    )


async def read_body(resp: aiohttp.ClientResponse, cap: int, *, where: str = "") -> bytes:
    """The whole body, refused (retryable ``body_too_large``) as soon as it passes ``cap`` bytes: at once
    when ``Content-Length`` announces more, else while reading."""
    announced = resp.content_length
    if announced is not None and announced > cap and not resp.headers.get("Content-Encoding"):
        raise body_too_large(cap, where, announced=announced)
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > cap:
            raise body_too_large(cap, where)
        parts.append(chunk)
    return b"".join(parts)


async def read_error_body(resp: aiohttp.ClientResponse, limit: int = ERROR_BODY_BYTES) -> bytes:
    """At most ``limit`` bytes of a body read for its error message (the rest is left unread)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


async def read_events(
    resp: aiohttp.ClientResponse,
    on_event: Callable[[bytes], None],
    *,
    idle_timeout_s: float,
    max_bytes: int | None,
    max_event_bytes: int | None = None,
    where: str = "",
) -> None:
    """Feed each SSE data payload of a streamed body to ``on_event``, until the body ends.

    The idle timeout restarts only when a data event arrives, never on a comment or a blank line, so a
    stream that only sends keep-alives times out (retryable ``idle_timeout``). ``max_bytes`` bounds the
    whole body; ``max_event_bytes`` one event (for servers that resend everything in each event).
    """
    loop = asyncio.get_running_loop()
    parser = SSEParser()
    total = 0
    idle = asyncio.timeout(idle_timeout_s)
    try:
        async with idle:
            async for chunk in resp.content.iter_any():
                total += len(chunk)
                if max_bytes is not None and total > max_bytes:
                    raise body_too_large(max_bytes, where)
                events = parser.feed(chunk)
                if events:
                    idle.reschedule(loop.time() + idle_timeout_s)
                    for ev in events:
                        if max_event_bytes is not None and len(ev) > max_event_bytes:
                            raise body_too_large(max_event_bytes, where, what="event")
                        on_event(ev)
                if max_event_bytes is not None and parser.pending > max_event_bytes:
                    raise body_too_large(max_event_bytes, where, what="event")
            for ev in parser.close():
                on_event(ev)
    except TimeoutError:
        if idle.expired():
            raise RetryableAPIError(
                f"idle timeout: no data for {idle_timeout_s:g}s (keep-alive comments do not count){_at(where)}",
                kind="idle_timeout",
            ) from None
        raise


async def within_deadline(aw: Awaitable[T], seconds: float, *, where: str = "") -> T:
    """``aw`` within a total deadline of ``seconds`` (retryable ``request_timeout`` past it)."""
    cm = asyncio.timeout(seconds)
    try:
        async with cm:
            return await aw
    except TimeoutError:
        if cm.expired():
            raise RetryableAPIError(
                f"request timeout: no complete response within {seconds:g}s (endpoint.request_timeout_s)"
                f"{_at(where)}", kind="request_timeout",
            ) from None
        raise


async def fetch_bytes(
    session: aiohttp.ClientSession, method: str, url: str, *, data: bytes | None = None, cap: int,
    where: str | None = None, headers: Mapping[str, str] | None = None,
) -> bytes:
    """One request on ``session``: the body of a 2xx (at most ``cap`` bytes, else retryable
    ``body_too_large``; a batch submission answers 202), else the classified error of its status and body
    (``classify_http``, labelled ``where``, by default ``"METHOD url"``); a transport exception becomes its
    ``translate_exception``."""
    label = where if where is not None else f"{method} {url}"
    try:
        async with session.request(method, url, data=data, headers=headers) as resp:
            if not 200 <= resp.status < 300:
                body = await read_error_body(resp)
                raise classify_http(resp.status, body, headers=resp.headers, where=label)
            return await read_body(resp, cap, where=label)
    except TRANSPORT_ERRORS as exc:
        raise translate_exception(exc, where=f"{method} {url}") from None


async def post_json(session: aiohttp.ClientSession, url: str, body: bytes, *, cap: int, where: str | None = None) -> bytes:
    """POST an encoded JSON ``body`` (``fetch_bytes``)."""
    return await fetch_bytes(session, "POST", url, data=body, cap=cap, where=where,
                             headers={"Content-Type": "application/json"})


async def get_bytes(session: aiohttp.ClientSession, url: str, *, cap: int = ACCOUNT_BODY_BYTES,
                    where: str | None = None, headers: Mapping[str, str] | None = None) -> bytes:
    """GET (``fetch_bytes``)."""
    return await fetch_bytes(session, "GET", url, cap=cap, where=where, headers=headers)


def make_session(
    *, api_key: str | None, connections: int, connect_timeout_s: float, idle_timeout_s: float,
    extra_headers: Mapping[str, str] | None = None,
) -> aiohttp.ClientSession:
    """One pool for one endpoint. ``connections`` bounds open sockets (0 = unbounded). ``sock_read`` is the
    byte-level idle timeout (a silent socket); the data-level one and the deadline are per request."""
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
    """Base class: owns the session and the bounds. Subclasses implement ``send``; ``complete`` holds it to
    the request's total deadline. Account calls default to None."""

    name = "http"
    capabilities = Capabilities()
    reports_cost = False

    def __init__(self, session: aiohttp.ClientSession, base_url: str, *, bounds: Bounds | None = None) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.bounds = bounds if bounds is not None else _bounds_of(session)
        self._where = self.base_url

    async def complete(self, req: CompletionRequest) -> Completion:
        """``send`` within the request's total deadline (retryable ``request_timeout`` past it)."""
        return await within_deadline(self.send(req), self.bounds.deadline_s(req.max_tokens), where=self._where)

    async def send(self, req: CompletionRequest) -> Completion:
        raise NotImplementedError

    async def get_json(self, path: str, *, headers: Mapping[str, str] | None = None) -> bytes:
        """GET ``base_url + path``; the body bytes of a 200, else the classified APIError."""
        return await get_bytes(self.session, self.base_url + path, where=f"GET {path}", headers=headers)

    async def get_key_info(self) -> KeyInfo | None:
        return None

    async def get_credits(self, management_key: str | None = None) -> Credits | None:
        return None

    async def get_generation(self, generation_id: str) -> GenerationCost | None:
        return None

    async def get_model_endpoints(self, model: str) -> list[EndpointInfo] | None:
        return None

    async def aclose(self) -> None:
        await self.session.close()


def check_base_url(url: str, *, what: str = "base_url") -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint.{what} {url!r} must start with http:// or https://")
    return url.rstrip("/")


def drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}



def _bounds_of(session: aiohttp.ClientSession) -> Bounds:
    """Default bounds of a backend built on a bare session: its own connect and read timeouts."""
    t = session.timeout
    return Bounds(
        connect_timeout_s=t.sock_connect if t.sock_connect is not None else 30.0,
        idle_timeout_s=t.sock_read if t.sock_read is not None else 180.0,
    )
