"""Serving one aiohttp application: in a daemon thread on its own event loop, or in the foreground.

The one harness of every server draftgen runs: both emulator servers (``emulator.server``, the scripted
OpenRouter/vLLM/SGLang emulator, and ``emulator.real.server``, the model-backed one) and the checking proxy
of ``train --online`` (``phases.train.proxy``): ``start_in_thread`` returns once the socket listens (tests,
the embedded emulator, the proxy), ``serve_until_signal`` blocks until SIGINT/SIGTERM (the CLI). Imported
only by what starts a server (it loads ``aiohttp.web``; ``backends`` itself does not import it). Either way the application is built on the serving loop, the runner is cleaned up and then the
owner's ``close`` runs, once, when serving ends. A socket that cannot be bound is a ConfigError naming
``host:port`` and the fix. Reads and writes nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from aiohttp import web

from draftgen.errors import ConfigError

__all__ = ["Serving", "ThreadedServer", "root_url", "serve_until_signal", "start_in_thread"]

App = Callable[[], web.Application]


def root_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` (an IPv6 host in brackets)."""
    h = f"[{host}]" if ":" in host else host
    return f"http://{h}:{port}"


async def _listen(make_app: App, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the site; returns the runner and the port bound (port 0 picks a free one)."""
    runner = web.AppRunner(make_app(), access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    return runner, int(runner.addresses[0][1]) if runner.addresses else port


def _listen_error(what: str, host: str, port: int, exc: OSError) -> ConfigError:
    return ConfigError(f"{what}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                       "choose another --port (0 picks a free one)")


@dataclass(frozen=True)
class Serving:
    """What ``start_in_thread`` started: the serving loop and thread, the event that stops serving (set on
    that loop only), and the port bound."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    stop_event: asyncio.Event
    port: int


class ThreadedServer:
    """A server running in a background thread: ``with start_in_thread(...) as srv: srv.root_url ...``.
    ``stop()`` (also on leaving the ``with``) ends serving and waits for the thread."""

    def __init__(self, serving: Serving, host: str) -> None:
        self._serving = serving
        self.port = serving.port
        self.root_url = root_url(host, serving.port)

    @property
    def alive(self) -> bool:
        """The serving thread still runs (False once ``stop()`` returned)."""
        return self._serving.thread.is_alive()

    def stop(self) -> None:
        s = self._serving
        if s.thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                s.loop.call_soon_threadsafe(s.stop_event.set)
            s.thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_in_thread(
    make_app: App, host: str, port: int, *, close: Callable[[], None], what: str, thread_name: str
) -> Serving:
    """Serve ``make_app()`` on a new event loop in a daemon thread; returns once listening. When the socket
    cannot be bound, ``close`` runs and a ConfigError (``what``: the command) is raised."""
    ready = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop_event = asyncio.Event()

        async def main() -> None:
            try:
                runner, bound = await _listen(make_app, host, port)
            except OSError as exc:
                box["error"] = exc
                ready.set()
                return
            box.update(loop=loop, stop=stop_event, port=bound)
            ready.set()
            try:
                await stop_event.wait()
            finally:
                await runner.cleanup()
                close()

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name=thread_name, daemon=True)
    thread.start()
    ready.wait()
    err = box.get("error")
    if isinstance(err, OSError):
        close()
        raise _listen_error(what, host, port, err)
    loop, stop_event, bound = box["loop"], box["stop"], box["port"]
    assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop_event, asyncio.Event)
    assert isinstance(bound, int)
    return Serving(loop, thread, stop_event, bound)


def serve_until_signal(
    make_app: App, host: str, port: int, *, close: Callable[[], None], what: str,
    on_listening: Callable[[int], None],
) -> None:
    """Serve ``make_app()`` in the foreground until SIGINT/SIGTERM; ``on_listening(port bound)`` runs once
    the socket listens. A socket that cannot be bound is a ConfigError (``what``: the command)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop_event = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # platforms without loop signal handlers
                loop.add_signal_handler(sig, stop_event.set)
        try:
            runner, bound = await _listen(make_app, host, port)
        except OSError as exc:
            raise _listen_error(what, host, port, exc) from None
        on_listening(bound)
        try:
            await stop_event.wait()
        finally:
            await runner.cleanup()
            close()

    asyncio.run(main())
