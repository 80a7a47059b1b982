"""The emulator's HTTP server: routes, lifecycle, and the two ways to run it.

Routes (API root ``http://HOST:PORT/api/v1``; local-server protocols at the server root)::

    POST /api/v1/chat/completions                 OpenRouter chat completions (streamed or not)
    GET  /api/v1/key | /api/v1/auth/key | /api/v1/credits | /api/v1/generation?id=
    GET  /api/v1/models | /api/v1/models/{author}/{slug}/endpoints
    POST /api/{beta,v1}/batches, GET …/batches[/{id}], GET /api/v1/models/{author}/{slug}:batch/endpoints
                                                  OpenRouter's Batch API (``emulator.batch``)
    POST /generate                                SGLang native (cumulative or incremental streaming)
    POST /v1/chat/completions, GET /v1/models     vLLM OpenAI-compatible (return_token_ids; current or
                                                  legacy shape: ``Scenario.vllm_legacy``)
    GET  /health

``serve_forever(opts, echo)`` blocks (``draftgen emulate``) and stops cleanly on SIGINT/SIGTERM.
``start_in_thread(opts)`` runs the server on its own event loop in a daemon thread and returns a
``RunningEmulator`` (context manager) with ``base_url``, ``root_url``, ``state`` and ``stop()``. Both run
on the harness of ``backends.serve``.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from draftgen.backends import serve
from draftgen.backends.serve import Serving, ThreadedServer
from draftgen.emulator import batch, local_servers, metadata, openrouter
from draftgen.emulator.accounting import EmulatorState
from draftgen.emulator.core import CORE, EmulatorCore, EmulatorOptions

__all__ = ["EmulatorOptions", "EmulatorState", "RunningEmulator", "build_app", "serve_forever", "start_in_thread"]


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(core: EmulatorCore) -> web.Application:
    app = web.Application(client_max_size=batch.MAX_BYTES + 1024 * 1024)  # a batch of 200 MB
    app[CORE] = core
    batch.register(app)  # its :batch variant route comes before the generic /endpoints one
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


class RunningEmulator(ThreadedServer):
    """A server running in a background thread. ``with start_in_thread(opts) as emu: …``"""

    def __init__(self, core: EmulatorCore, serving: Serving) -> None:
        super().__init__(serving, core.opts.host)
        self.core = core
        self.base_url = f"{self.root_url}/api/v1"

    @property
    def state(self) -> EmulatorState:
        return self.core.state


def start_in_thread(opts: EmulatorOptions) -> RunningEmulator:
    """Start a server on its own event loop in a daemon thread; returns once it is listening."""
    core = EmulatorCore(opts)
    serving = serve.start_in_thread(lambda: build_app(core), opts.host, opts.port, close=core.close,
                                       what="emulator", thread_name="draftgen-emulator")
    return RunningEmulator(core, serving)


def serve_forever(opts: EmulatorOptions, echo: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM (``draftgen emulate``)."""
    core = EmulatorCore(opts)

    def listening(port: int) -> None:
        root = serve.root_url(opts.host, port)
        sc = core.scenario
        echo(f"OpenRouter emulator: {root}/api/v1  (scenario {sc.name}, seed {opts.seed}, profile {opts.profile}, "
             f"credits ${opts.credits:g})")
        sglang = "incremental" if sc.sglang_incremental else "cumulative"
        vllm = "legacy reasoning_content" if sc.vllm_legacy else "current"
        echo(f"SGLang: {root}/generate ({sglang} streaming)   vLLM: {root}/v1/chat/completions ({vllm} shape)"
             "   Ctrl-C stops")

    serve.serve_until_signal(lambda: build_app(core), opts.host, opts.port, close=core.close, what="emulator",
                                on_listening=listening)
    echo(f"emulator stopped: {core.state.requests} requests, ${core.state.spend_usd:.4f} spent")
