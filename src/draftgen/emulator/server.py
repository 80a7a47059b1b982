"""The emulator's HTTP server: routes, lifecycle, and the two ways to run it.

Routes (API root ``http://HOST:PORT/api/v1``; local-server protocols at the server root)::

    POST /api/v1/chat/completions                 OpenRouter chat completions (streamed or not)
    GET  /api/v1/key | /api/v1/auth/key | /api/v1/credits | /api/v1/generation?id=
    GET  /api/v1/models | /api/v1/models/{author}/{slug}/endpoints
    POST /generate                                SGLang native (cumulative or incremental streaming)
    POST /v1/chat/completions, GET /v1/models     vLLM OpenAI-compatible (return_token_ids; current or
                                                  legacy shape: ``Scenario.vllm_legacy``)
    GET  /health

``serve_forever(opts, echo)`` blocks (``draftgen emulate``) and stops cleanly on SIGINT/SIGTERM.
``start_in_thread(opts)`` runs the server on its own event loop in a daemon thread and returns a
``RunningEmulator`` (context manager) with ``base_url``, ``root_url``, ``state`` and ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from draftgen.emulator import local_servers, metadata, openrouter
from draftgen.emulator.accounting import EmulatorState
from draftgen.emulator.core import CORE, EmulatorCore, EmulatorOptions

__all__ = ["EmulatorOptions", "EmulatorState", "RunningEmulator", "build_app", "serve_forever", "start_in_thread"]


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(core: EmulatorCore) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[CORE] = core
    r = app.router
    r.add_post("/api/v1/chat/completions", openrouter.chat_completions)
    r.add_get("/api/v1/key", metadata.key)
    r.add_get("/api/v1/auth/key", metadata.key)
    r.add_get("/api/v1/credits", metadata.credits)
    r.add_get("/api/v1/generation", metadata.generation)
    r.add_get("/api/v1/models", metadata.models)
    r.add_get("/api/v1/models/{author}/{slug}/endpoints", metadata.endpoints)
    r.add_post("/generate", local_servers.sglang_generate)
    r.add_post("/v1/chat/completions", local_servers.vllm_chat)
    r.add_get("/v1/models", local_servers.vllm_models)
    r.add_get("/health", _health)
    return app


async def _start(core: EmulatorCore) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(core), access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, core.opts.host, core.opts.port, reuse_address=True)
    await site.start()
    port = int(runner.addresses[0][1]) if runner.addresses else core.opts.port
    return runner, port


def _urls(host: str, port: int) -> tuple[str, str]:
    h = f"[{host}]" if ":" in host else host
    root = f"http://{h}:{port}"
    return f"{root}/api/v1", root


class RunningEmulator:
    """A server running in a background thread. ``with start_in_thread(opts) as emu: …``"""

    def __init__(self, core: EmulatorCore, loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 stop_event: asyncio.Event, port: int) -> None:
        self.core = core
        self._loop = loop
        self._thread = thread
        self._stop_event = stop_event
        self.port = port
        self.base_url, self.root_url = _urls(core.opts.host, port)

    @property
    def state(self) -> EmulatorState:
        return self.core.state

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(timeout=30)

    def __enter__(self) -> RunningEmulator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_in_thread(opts: EmulatorOptions) -> RunningEmulator:
    """Start a server on its own event loop in a daemon thread; returns once it is listening."""
    core = EmulatorCore(opts)
    ready = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop_event = asyncio.Event()

        async def main() -> None:
            try:
                runner, port = await _start(core)
            except OSError as exc:
                box["error"] = exc
                ready.set()
                return
            box["loop"], box["stop"], box["port"] = loop, stop_event, port
            ready.set()
            try:
                await stop_event.wait()
            finally:
                await runner.cleanup()
                core.close()

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="draftgen-emulator", daemon=True)
    thread.start()
    ready.wait()
    if "error" in box:
        core.close()
        err = box["error"]
        assert isinstance(err, OSError)
        from draftgen.errors import ConfigError

        raise ConfigError(f"emulator: cannot listen on {opts.host}:{opts.port} ({err.strerror or err}); "
                          "choose another --port (0 picks a free one)")
    loop = box["loop"]
    stop_event = box["stop"]
    port = box["port"]
    assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop_event, asyncio.Event)
    assert isinstance(port, int)
    return RunningEmulator(core, loop, thread, stop_event, port)


def serve_forever(opts: EmulatorOptions, echo: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM (``draftgen emulate``)."""
    core = EmulatorCore(opts)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop_event = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # platforms without loop signal handlers
                loop.add_signal_handler(sig, stop_event.set)
        try:
            runner, port = await _start(core)
        except OSError as exc:
            from draftgen.errors import ConfigError

            raise ConfigError(f"emulator: cannot listen on {opts.host}:{opts.port} ({exc.strerror or exc}); "
                              "choose another --port (0 picks a free one)") from None
        base, root = _urls(opts.host, port)
        sc = core.scenario
        echo(f"OpenRouter emulator: {base}  (scenario {sc.name}, seed {opts.seed}, profile {opts.profile}, "
             f"credits ${opts.credits:g})")
        sglang = "incremental" if sc.sglang_incremental else "cumulative"
        vllm = "legacy reasoning_content" if sc.vllm_legacy else "current"
        echo(f"SGLang: {root}/generate ({sglang} streaming)   vLLM: {root}/v1/chat/completions ({vllm} shape)"
             "   Ctrl-C stops")
        try:
            await stop_event.wait()
        finally:
            await runner.cleanup()
            core.close()
        echo(f"emulator stopped: {core.state.requests} requests, ${core.state.spend_usd:.4f} spent")

    asyncio.run(main())
