"""A fake OpenRouter that lies and logs what it billed: a loopback proxy in front of a real emulator.

``LyingOpenRouter(emu, lie=...)`` (a ``_common_helpers.AppServer``) forwards every request to the emulator
running in a thread (``_generate_helpers.emulator``), which generates real Qwen3 text, bills every
generation it delivers in full at the serving provider's true price and writes the ground truth. The
proxy rewrites what comes back with its ``Lie`` (each SSE chunk, or the whole body, as decoded JSON) and
reads the upstream body to its end even after the client has gone, so a request the client abandons is
still finished and billed, as a real provider does. ``billed`` is the emulator's ledger: what was
really paid. ``key`` overrides ``GET /key`` (a callable of the proxy, so a limit can change mid-run).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from _common_helpers import AppServer
from draftgen.emulator import RunningEmulator

Obj = dict[str, Any]


class Lie:
    """What a lying server changes. ``chunk`` maps one decoded stream chunk to the chunks sent instead (the
    request's state ``st`` lives as long as its stream); ``body`` rewrites a whole non-streamed body."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        return [obj]

    def body(self, obj: Obj, st: Obj) -> Obj:
        return obj


async def _drain(queue: asyncio.Queue[bytes | None]) -> bytes:
    parts = []
    while (piece := await queue.get()) is not None:
        parts.append(piece)
    return b"".join(parts)


class LyingOpenRouter(AppServer):
    def __init__(self, emu: RunningEmulator, lie: Lie | None = None,
                 key: Callable[[LyingOpenRouter], Obj] | None = None) -> None:
        super().__init__()
        self.emu, self.lie, self.key = emu, lie or Lie(), key
        self.chats = 0
        self.billed_at_end = 0.0
        self.session: aiohttp.ClientSession | None = None
        self._pumps: set[asyncio.Future[None]] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    @property
    def billed(self) -> float:
        """Dollars the upstream billed (every generation delivered in full)."""
        return float(self.emu.state.spend_usd)

    def routes(self, app: web.Application) -> None:
        async def start(_: web.Application) -> None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60))

        async def stop(_: web.Application) -> None:
            if self.session is not None:
                await self.session.close()

        app.on_startup.append(start)
        app.on_cleanup.append(stop)
        app.router.add_route("*", "/{tail:.*}", self._forward)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        if request.path.endswith("/key") and self.key is not None:
            return web.json_response({"data": self.key(self)})
        body = await request.read()
        url = self.emu.root_url + request.path_qs
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        chat = request.path.endswith("/chat/completions")
        if chat:
            self.chats += 1
        upstream = await self.session.request(request.method, url, data=body, headers=headers)
        # The upstream body is read to its end by a task of its own, even when the client leaves (and this
        # handler is cancelled): the generation completes and is billed in full.
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        pump = asyncio.ensure_future(self._pump(upstream, queue))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        if not chat or upstream.status != 200:
            out = {k: v for k, v in upstream.headers.items() if k.lower() in ("retry-after", "content-type")}
            return web.Response(status=upstream.status, body=await _drain(queue), headers=out)
        st: Obj = {"request": json.loads(body)}
        if upstream.content_type == "text/event-stream":
            return await self._stream(request, queue, st)
        return web.json_response(self.lie.body(json.loads(await _drain(queue)), st))

    async def _pump(self, upstream: aiohttp.ClientResponse, queue: asyncio.Queue[bytes | None]) -> None:
        try:
            async for piece in upstream.content.iter_any():
                queue.put_nowait(piece)
        finally:
            queue.put_nowait(None)
            upstream.release()

    async def _stream(self, request: web.Request, queue: asyncio.Queue[bytes | None], st: Obj) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        buf = b""
        while (piece := await queue.get()) is not None:
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                await resp.write(self._rewrite(event, st))
        await resp.write_eof()
        return resp

    def _rewrite(self, event: bytes, st: Obj) -> bytes:
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            return event + b"\n\n"
        return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n"
                        for o in self.lie.chunk(json.loads(event[6:]), st))
