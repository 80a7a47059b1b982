"""The checking proxy of online training: speculators' online client on one side, the vLLM extract servers on
the other, and draftgen's per-sample checks between them.

speculators (``--on-missing generate --vllm-endpoint <proxy>/v1``) asks for each sample's hidden states as it
asks ``vllm serve`` (speculators ``data_generation/vllm_client.py``): ``GET /v1/models`` (the id must be its
``--verifier-name-or-path``), then ``POST /v1/completions`` ``{"model", "prompt": [ids], "max_tokens": 1,
"return_token_ids": true}``, and reads the file its response names in ``kv_transfer_params.hidden_states_path``
(the ``.lock`` protocol of hs_connectors' file transfer), then deletes it. The proxy answers each request:

1. the ids must be one of the rows it was given (the merged rows; anything else is a 400): that row's
   sample id and loss mask are the check's;
2. the vllm capture backend (``capture.vllm``) sends the row to the least-loaded server, with its own
   checks (the server's ``prompt_token_ids`` and the file's ``token_ids`` equal the ids sent, its shape and
   layer count; the connector folder rules; retries by the one policy) and keeps the file;
3. ``checks.check_sample`` runs every per-sample check of offline extraction on those states (``finite``,
   ``norm``, ``aux_distinct``, ``aux_embedding``, ``shape``, ``ids``), and the log-prob check on the
   ``teacher_fraction`` of samples (the engine's ``prompt_logprobs``); checks run one at a time, off the loop;
4. a sample that passes: the response names the server's file for the trainer (nothing is copied);
   a sample that fails (or that the server answered with other ids): its file is removed and the response has
   no ``kv_transfer_params``, which speculators treats as an unavailable sample (``InvalidResponseError``, not
   retried with ``--generation-validation-retries 0``): it is left out of its batch, never trained on, and
   counted here by check.

The bounded cache (the window): the connector files on disk (those handed to the trainer and not yet deleted by
it, and those of captures in flight) are at most ``max_files`` and take at most ``window_bytes``. A capture in
flight counts as its row's tokens times the most bytes per token a file has taken so far (the first capture
runs alone, before any is known); a request waits for room. A sample larger than the whole window still runs,
alone. ``stop()`` removes any file the trainer never took (a crash). ``stats`` counts requests, passes,
exclusions by check, the teacher-checked ones and the peak files/bytes on disk at once.
Writes nothing itself; removes only connector files of the folder the backend admits.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from draftgen.errors import APIError, ConfigError, PermanentAPIError

if TYPE_CHECKING:
    from aiohttp import web

    from draftgen.config.hidden import HiddenStatesConfig
    from draftgen.hidden.format import Captured
    from draftgen.phases.extract.capture import ExtractRow
    from draftgen.phases.extract.capture.vllm import VllmExtractBackend
    from draftgen.phases.extract.checks import CheckResult

__all__ = ["CheckingProxy", "ProxyStats", "check_captured"]

_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
_COARSER = ("bf16", "fp16", "fp32")  # coarsest first


@dataclass
class ProxyStats:
    requests: int = 0
    passed: int = 0
    excluded: int = 0
    excluded_by_check: Counter[str] = field(default_factory=Counter)
    excluded_ids: list[str] = field(default_factory=list)
    teacher_checked: int = 0
    peak_files: int = 0
    peak_bytes: int = 0


class CheckingProxy:
    """See the module docstring. ``with CheckingProxy(...) as proxy: proxy.url ...`` (``start``/``stop``)."""

    def __init__(self, backend: VllmExtractBackend, hs: HiddenStatesConfig, rows: Sequence[ExtractRow], *,
                 model_name: str, max_files: int = 16, window_bytes: int = 2 * 10**9) -> None:
        self.backend, self.hs, self.model_name = backend, hs, model_name
        self.rows: dict[tuple[int, ...], ExtractRow] = {}
        for r in rows:
            self.rows.setdefault(tuple(int(t) for t in r.input_ids.tolist()), r)
        self.max_files, self.window_bytes = max(1, max_files), max(1, window_bytes)
        self.stats = ProxyStats()
        self.url = ""
        self._handed: dict[str, int] = {}  # path -> its size: handed to the trainer, not yet seen deleted
        self._flight: dict[int, int] = {}  # captures in flight -> the bytes reserved for each
        self._per_token = 0.0  # the most bytes per token a connector file has taken (0: none seen yet)
        self._tickets = itertools.count()
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftgen-online-check")
        self._server: Any = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> str:
        """Serve on a free loopback port; returns the base URL speculators gets (``.../v1``)."""
        from draftgen.emulator.threaded import ThreadedServer, start_in_thread

        serving = start_in_thread(self._app, "127.0.0.1", 0, close=lambda: None, what="train --online proxy",
                                  thread_name="draftgen-online-proxy")
        self._server = ThreadedServer(serving, "127.0.0.1")
        self.url = self._server.root_url + "/v1"
        return self.url

    def stop(self) -> None:
        """Stop serving; remove the files the trainer never took; close the backend and the checker."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        for path in sorted(self._handed):
            self.backend.folder.remove(path)
        self._handed.clear()
        self._checker.shutdown(wait=True)
        self.backend.close()

    def __enter__(self) -> CheckingProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -----------------------------------------------------------------------------------------

    def _app(self) -> web.Application:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)

        async def cleanup(_app: web.Application) -> None:  # the backend's sessions live on this loop
            await self.backend.aclose()

        app.on_cleanup.append(cleanup)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _models(self, _request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                  "owned_by": "draftgen", "created": int(time.time())}]})

    async def _completions(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            prompt = body["prompt"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "the body must be a JSON completion request with a prompt of token ids")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        row = self.rows.get(tuple(prompt)) if isinstance(prompt, list) else None
        if row is None:
            return _error(400, "the prompt ids are not those of a merged row this run trains on")
        self.stats.requests += 1
        ticket = await self._room(len(row.input_ids))
        try:
            return await self._serve(row, ticket)
        finally:  # no await since the file was handed: the window never misses it
            del self._flight[ticket]

    async def _serve(self, row: ExtractRow, ticket: int) -> web.Response:
        """Capture ``row`` (its room reserved as ``ticket``), check it, and hand its file over or exclude it."""
        try:
            cap, path = await self.backend.capture_one(row, keep_file=True)
        except PermanentAPIError as exc:  # the server answered this sample wrongly (other ids, a bad file)
            return self._excluded(row, [exc.kind or "server"])
        except (APIError, ConfigError) as exc:
            return _error(502, f"draftgen proxy: {exc}")
        size = self._landed(ticket, path, len(row.input_ids))
        loop = asyncio.get_running_loop()
        res: CheckResult = await loop.run_in_executor(self._checker, self._check, row, cap)
        if res.failed:
            self.backend.folder.remove(path)
            return self._excluded(row, res.failed)
        self._handed[path] = size
        self.stats.passed += 1
        self.stats.teacher_checked += res.teacher is not None
        return _json(self._completion(row, {"hidden_states_path": path}))

    def _check(self, row: ExtractRow, cap: Captured) -> CheckResult:
        from draftgen.phases.extract.checks import teacher_selected

        return check_captured(self.backend, self.hs, row, cap,
                              teacher=teacher_selected(row.sample_id, self.hs.teacher_fraction))

    def _excluded(self, row: ExtractRow, failed: list[str]) -> web.Response:
        s = self.stats
        s.excluded += 1
        s.excluded_by_check.update(failed)
        if len(s.excluded_ids) < 100:
            s.excluded_ids.append(row.sample_id)
        out = self._completion(row, None)
        out["draftgen_excluded"] = failed
        return _json(out)

    def _completion(self, row: ExtractRow, params: dict[str, Any] | None) -> dict[str, Any]:
        ids = [int(t) for t in row.input_ids.tolist()]
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                  "token_ids": [], "prompt_logprobs": None, "prompt_token_ids": ids}
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)},
                "kv_transfer_params": params}

    # -- the bounded cache --------------------------------------------------------------------------------

    def _on_disk(self) -> tuple[int, int]:
        """Files and bytes the window holds now: the handed files the trainer has not deleted yet, and the
        reservations of the captures in flight."""
        self._handed = {p: n for p, n in self._handed.items() if os.path.exists(p)}
        return len(self._handed) + len(self._flight), sum(self._handed.values()) + sum(self._flight.values())

    async def _room(self, tokens: int) -> int:
        """Wait until a capture of ``tokens`` fits the window; reserve it. Returns its ticket in ``_flight``."""
        while True:
            files, used = self._on_disk()
            need = math.ceil(tokens * self._per_token)
            alone = files == 0
            if alone or (self._per_token and files < self.max_files and used + need <= self.window_bytes):
                ticket = next(self._tickets)
                self._flight[ticket] = need
                return ticket
            await asyncio.sleep(0.02)

    def _landed(self, ticket: int, path: str, tokens: int) -> int:
        """A capture's file is on disk: its reservation becomes its size; learn its bytes per token, count the
        peak (the other captures in flight at their reservations). Returns its size."""
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:  # the folder's rules admitted it; a vanished file is the trainer's to report
            size = 0
        self._per_token = max(self._per_token, size / max(tokens, 1))
        self._flight[ticket] = size
        files, used = self._on_disk()
        self.stats.peak_files = max(self.stats.peak_files, files)
        self.stats.peak_bytes = max(self.stats.peak_bytes, used)
        return size


def check_captured(backend: VllmExtractBackend, hs: HiddenStatesConfig, row: ExtractRow, cap: Captured, *,
                   teacher: bool) -> CheckResult:
    """The per-sample checks of offline extraction (and with ``teacher`` the log-prob check) on the states as
    the server wrote them (its dtype), which is what the trainer reads; the log-prob tolerance takes the
    server's compute dtype to be at most as fine as its file's (vLLM writes states in the model dtype)."""
    import torch

    from draftgen.hidden.format import LoadedSample
    from draftgen.phases.extract.checks import check_sample

    dtype = _DTYPES.get(str(cap.aux.dtype), "bf16")
    if _COARSER.index(dtype) < _COARSER.index(hs.compute_dtype):  # the server computed at its file's precision
        hs = msgspec.structs.replace(hs, compute_dtype=dtype)  # type: ignore[arg-type]
    sample = LoadedSample(sample_id=row.sample_id, input_ids=torch.from_numpy(row.input_ids).to(torch.int64),
                          loss_mask=torch.from_numpy(row.loss_mask).to(torch.uint8), aux=cap.aux.float(),
                          final=cap.final.float(), dtype=dtype)
    return check_sample(sample, row, backend, hs, teacher=teacher)


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    from aiohttp import web

    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"object": "error", "message": message, "type": "BadRequestError", "code": status}, status)
