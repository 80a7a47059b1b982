"""The checking proxy of online training: speculators' online client on one side, the vLLM extract servers on
the other, and draftgen's per-sample checks between them.

speculators (``--on-missing generate --vllm-endpoint <proxy>/v1``) asks for each sample's hidden states as it
asks ``vllm serve`` (speculators ``data_generation/vllm_client.py``): ``GET /v1/models`` (the id must be its
``--verifier-name-or-path``), then ``POST /v1/completions`` ``{"model", "prompt": [ids], "max_tokens": 1,
"return_token_ids": true}``, and reads the file its response names in ``kv_transfer_params.hidden_states_path``
(hs_connectors' file transfer: it takes ``<path>.lock`` when there is one, loads the file), then deletes it.
The proxy answers each request with one outcome, passed or excluded, never an HTTP error:

1. the ids must be one of the rows it was given (the merged rows; anything else is a 400, not counted): that
   row's sample id and loss mask are the check's;
2. the vllm capture backend (``target.vllm``) sends the row to the least-loaded server, with its own checks
   (the server's ``prompt_token_ids`` and the file's ``token_ids`` equal the ids sent, its shape and layer
   count, which the preflight confirmed: ``confirm_layers``; the connector folder rules; retries by the one
   policy), reads the file's bytes once and removes the server's file at once (refused, unreadable or given
   up on after a timeout alike: every file a request was named is draftgen's to remove, claimed in
   ``claims`` until it is, so that a killed run's are swept by the next ``start``);
3. the bytes read are written to draftgen's own ``handover`` folder (a temp name), and
   ``target.checks.check_sample`` runs every per-sample check of offline extraction on the states decoded from
   those same bytes (``finite``, ``norm``, ``aux_distinct``, ``aux_embedding``, ``shape``, ``ids``), and the
   log-prob check on the samples the backend's ``target.checks.SpotCheck`` drew after the answer (every
   request asked the same question: nothing tells a server which are checked); checks run one at a time, off
   the loop;
4. a sample that passes: its copy gets its final name and the response names it for the trainer: what the
   trainer reads is exactly what was checked, and no server can write it. A sample that fails, or that the
   server answered wrongly (other ids, an unreadable file or one of the wrong shape or layer count: kind
   ``bad_hidden_states``, a timeout, ...): its copy is removed and the response has no ``kv_transfer_params``,
   which speculators treats as an unavailable sample (``InvalidResponseError``, not retried with
   ``--generation-validation-retries 0``): it is left out of its batch, never trained on, and counted here by
   check or kind.

A log-prob check that fails (``target.checks.STOPPING``: the states disagree with the same request's own
``prompt_logprobs``) is evidence against the server, not the sample: ``stats.fatal`` names the server, the
check and the sample, and from then on every sample is excluded (``stopped``), so that speculators' circuit
breaker stops the trainer; ``online`` turns it into the run's failure, and nothing is published. Failing to
write a copy (a full disk) stops it the same way.

The bounded cache (the window): the files on disk for the trainer (the copies handed and not yet deleted by
it, the captures in flight, and any connector file a server wrote again after it was given up on) are at most
``max_files`` and take at most ``window_bytes``. A capture in flight counts as its row's tokens times the most
bytes per token a file has taken so far (the first capture runs alone, before any is known); a request waits
for room. A sample larger than the whole window still runs, alone. ``start()`` sweeps a killed run's leftovers
(claimed connector files, copies in ``handover``); ``stop()`` removes the copies the trainer never took.
``stats`` counts requests, passes, exclusions by check, the teacher-checked ones and the peak files/bytes on
disk at once.
Writes only the copies in ``handover`` (and the claims); removes only those and connector files of the folder
the backend admits that a request was named. Serves on ``backends.serve``'s thread (the emulator's harness too).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.errors import APIError, DraftgenError, StorageError
from draftgen.hidden.format import is_temp, open_temp, storage_faults
from draftgen.target.staging import host_threads

if TYPE_CHECKING:
    from aiohttp import web

    from draftgen.config.hidden import HiddenStatesConfig
    from draftgen.hidden.codec import Captured
    from draftgen.target import ExtractRow
    from draftgen.target.checks import CheckResult
    from draftgen.target.vllm import ServerCapture, VllmExtractBackend

__all__ = ["HANDED_NAME", "CheckingProxy", "ProxyStats", "check_captured"]

_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
_COARSER = ("bf16", "fp16", "fp32")  # coarsest first
#: the name of a copy handed to the trainer (in ``handover``); nothing else there is the proxy's
HANDED_NAME = re.compile(r"hs-[0-9a-f]{32}\.safetensors")
_TEMP_OF = "hs.safetensors"  # a copy being written and checked: ``open_temp``'s name for it
_KEPT = 100  # sample ids kept per list in the stats (excluded, checked)


@dataclass
class ProxyStats:
    requests: int = 0
    passed: int = 0
    excluded: int = 0
    excluded_by_check: Counter[str] = field(default_factory=Counter)
    excluded_ids: list[str] = field(default_factory=list)
    teacher_checked: int = 0  # passed samples that were also log-prob checked
    checked_ids: list[str] = field(default_factory=list)  # the first ones drawn for the log-prob check
    examples: dict[str, str] = field(default_factory=dict)  # kind -> the first error message of that kind
    peak_files: int = 0
    peak_bytes: int = 0
    swept: int = 0  # files a killed run left (claimed connector files, handed copies), removed by ``start``
    fatal: str | None = None  # why no more samples are handed (a failed log-prob check; a copy not written)


class CheckingProxy:
    """See the module docstring. ``with CheckingProxy(...) as proxy: proxy.url ...`` (``start``/``stop``).
    Runs after the preflight confirmed every server's layer count (``backend.confirm_layers``)."""

    def __init__(self, backend: VllmExtractBackend, hs: HiddenStatesConfig, rows: Sequence[ExtractRow], *,
                 model_name: str, handover: str | os.PathLike[str], max_files: int = 16,
                 window_bytes: int = 2 * 10**9) -> None:
        self.backend, self.hs, self.model_name = backend, hs, model_name
        backend.confirm_layers()
        self.handover = Path(handover)
        self.rows: dict[tuple[int, ...], ExtractRow] = {}
        for r in rows:
            self.rows.setdefault(tuple(int(t) for t in r.input_ids.tolist()), r)
        self.max_files, self.window_bytes = max(1, max_files), max(1, window_bytes)
        self.stats = ProxyStats()
        self.url = ""
        self._handed: dict[str, int] = {}  # copy -> its size: handed to the trainer, not yet seen deleted
        self._flight: dict[int, int] = {}  # captures in flight -> the bytes reserved for each
        self._per_token = 0.0  # the most bytes per token a connector file has taken (0: none seen yet)
        self._tickets = itertools.count()
        # each request's copy + checks, several at once (``host_threads``: the machine's cores, not one lane)
        self._checker = ThreadPoolExecutor(max_workers=host_threads(), thread_name_prefix="draftgen-online-check")
        self._server: Any = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> str:
        """Sweep a killed run's leftovers, then serve on a free loopback port; returns the base URL
        speculators gets (``.../v1``)."""
        from draftgen.backends.serve import ThreadedServer, start_in_thread

        removed, _elsewhere = self.backend.folder.sweep()
        self.handover.mkdir(parents=True, exist_ok=True)
        self.stats.swept = removed + self._sweep_handover()
        serving = start_in_thread(self._app, "127.0.0.1", 0, close=lambda: None, what="train --online proxy",
                                  thread_name="draftgen-online-proxy")
        self._server = ThreadedServer(serving, "127.0.0.1")
        self.url = self._server.root_url + "/v1"
        return self.url

    def stop(self) -> None:
        """Stop serving; remove the copies the trainer never took and the connector files given up on; close
        the backend and the checker."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._checker.shutdown(wait=True)
        self._handed.clear()
        self._sweep_handover()
        self.backend.close()

    def __enter__(self) -> CheckingProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sweep_handover(self) -> int:
        """Remove the proxy's own files in ``handover`` (copies and their temps); returns how many."""
        n = 0
        if not self.handover.is_dir():
            return 0
        for entry in os.scandir(self.handover):
            if entry.is_file(follow_symlinks=False) and (HANDED_NAME.fullmatch(entry.name)
                                                         or is_temp(entry.name, of=_TEMP_OF)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    n += 1
        return n

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
            body = msgspec.json.decode(await request.read())
            prompt = body["prompt"]
        except (msgspec.DecodeError, KeyError, TypeError):
            return _error(400, "the body must be a JSON completion request with a prompt of token ids")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        row = self.rows.get(tuple(prompt)) if isinstance(prompt, list) else None
        if row is None:
            return _error(400, "the prompt ids are not those of a merged row this run trains on")
        self.stats.requests += 1
        if self.stats.fatal is not None:
            return self._excluded(row, ["stopped"], self.stats.fatal)
        ticket = await self._room(len(row.input_ids))
        try:
            return await self._serve(row, ticket)
        finally:  # no await since the copy was handed: the window never misses it
            del self._flight[ticket]

    async def _serve(self, row: ExtractRow, ticket: int) -> web.Response:
        """Capture ``row`` (its room reserved as ``ticket``), check it, and hand its copy over or exclude it."""
        n = self.stats.requests
        try:
            got = await self.backend.capture_one(row)
        except DraftgenError as exc:  # the server answered this sample wrongly, or not in time
            kind = "bad_hidden_states" if isinstance(exc, StorageError) else \
                (exc.kind if isinstance(exc, APIError) and exc.kind else "server")
            return self._excluded(row, [kind], str(exc))
        size = self._landed(ticket, len(got.data), len(row.input_ids))
        loop = asyncio.get_running_loop()
        try:
            res, tmp = await loop.run_in_executor(self._checker, self._check, row, got)
        except StorageError as exc:  # draftgen's own disk: nothing more can be handed
            self.stats.fatal = self.stats.fatal or f"train --online: {exc}"
            return self._excluded(row, ["stopped"], str(exc))
        if res.teacher is not None and len(self.stats.checked_ids) < _KEPT:
            self.stats.checked_ids.append(row.sample_id)
        if res.failed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            self._stop_on(row, got.server, n, res.failed)
            return self._excluded(row, res.failed, "")
        path = str(self.handover / f"hs-{uuid.uuid4().hex}.safetensors")
        os.replace(tmp, path)
        self._handed[path] = size
        self.stats.passed += 1
        self.stats.teacher_checked += res.teacher is not None
        return _json(self._completion(row, {"hidden_states_path": path}))

    def _check(self, row: ExtractRow, got: ServerCapture) -> tuple[CheckResult, str]:
        """Write the bytes read to a temp copy in ``handover`` (then let them go), and check the states decoded
        from them; returns the result and the copy's path."""
        from draftgen.target.checks import spot_checked

        with storage_faults(str(self.handover), "write"):
            fd, tmp = open_temp(str(self.handover), _TEMP_OF)
            with os.fdopen(fd, "wb") as fh:
                fh.write(got.data)
        got.data = b""
        teacher = spot_checked(self.backend, row.sample_id, self.hs.teacher_fraction)
        return check_captured(self.backend, self.hs, row, got.captured, teacher=teacher), tmp

    def _stop_on(self, row: ExtractRow, server: str, n: int, failed: list[str]) -> None:
        """A log-prob check failed (``target.checks.STOPPING``): the server, not the sample, is wrong; stop
        handing."""
        from draftgen.target.checks import STOPPING

        stopping = [c for c in failed if c in STOPPING]
        if stopping and self.stats.fatal is None:
            self.stats.fatal = (
                f"train --online: server {server} failed the log-prob spot check ({', '.join(stopping)}) on sample "
                f"{row.sample_id}, request {n} of this run: the hidden states it wrote disagree with its own "
                "prompt_logprobs of the same request (a server altering the states it believes unchecked, or a "
                "miswired one); no more samples were handed to the trainer and no drafter is published. Fix the "
                "server or take it out of hidden_states.base_urls, then rerun")

    def _excluded(self, row: ExtractRow, failed: list[str], message: str) -> web.Response:
        s = self.stats
        s.excluded += 1
        s.excluded_by_check.update(failed)
        for kind in failed:
            s.examples.setdefault(kind, message[:400])
        if len(s.excluded_ids) < _KEPT:
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
        """Files and bytes the window holds now: the copies the trainer has not deleted yet, the reservations
        of the captures in flight, and connector files a server wrote again after they were given up on."""
        self._handed = {p: n for p, n in self._handed.items() if os.path.exists(p)}
        folder = self.backend.folder
        folder.tidy()
        files, size = folder.watched()
        return (len(self._handed) + len(self._flight) + files,
                sum(self._handed.values()) + sum(self._flight.values()) + size)

    async def _room(self, tokens: int) -> int:
        """Wait until a capture of ``tokens`` fits the window; reserve it. Returns its ticket in ``_flight``."""
        while True:
            files, used = self._on_disk()
            need = math.ceil(tokens * self._per_token)
            alone = not self._handed and not self._flight  # a server's leftovers never block every request
            if alone or (self._per_token and files < self.max_files and used + need <= self.window_bytes):
                ticket = next(self._tickets)
                self._flight[ticket] = need
                return ticket
            await asyncio.sleep(0.02)

    def _landed(self, ticket: int, size: int, tokens: int) -> int:
        """A capture's bytes are in hand (its copy about to be written): its reservation becomes its size; learn
        its bytes per token, count the peak (the other captures in flight at their reservations). Returns it."""
        self._per_token = max(self._per_token, size / max(tokens, 1))
        self._flight[ticket] = size
        files, used = self._on_disk()
        self.stats.peak_files = max(self.stats.peak_files, files)
        self.stats.peak_bytes = max(self.stats.peak_bytes, used)
        return size


def check_captured(backend: VllmExtractBackend, hs: HiddenStatesConfig, row: ExtractRow, cap: Captured, *,
                   teacher: bool, fidelity: bool = False) -> CheckResult:
    """The per-sample checks of offline extraction (and with ``teacher`` the log-prob check) on the states as
    the server wrote them (its dtype), which is what the trainer reads; the log-prob tolerance takes the
    server's compute dtype to be at most as fine as its file's (vLLM writes states in the model dtype). With
    ``fidelity``, the provider fidelity of the row's completion too (``CheckResult.fidelity``)."""
    import torch

    from draftgen.hidden.codec import LoadedSample
    from draftgen.target.checks import check_fidelity, check_sample

    dtype = _DTYPES.get(str(cap.aux.dtype), "bf16")
    if _COARSER.index(dtype) < _COARSER.index(hs.compute_dtype):  # the server computed at its file's precision
        hs = msgspec.structs.replace(hs, compute_dtype=dtype)  # type: ignore[arg-type]
    sample = LoadedSample(sample_id=row.sample_id, input_ids=torch.from_numpy(row.input_ids).to(torch.int64),
                          loss_mask=torch.from_numpy(row.loss_mask).to(torch.uint8), aux=cap.aux.float(),
                          final=cap.final.float(), dtype=dtype)
    res = check_sample(sample, row, backend, hs, teacher=teacher)
    if fidelity:
        check_fidelity(sample, row, backend, hs, res)
    return res


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    from aiohttp import web

    return web.Response(body=msgspec.json.encode(payload), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"object": "error", "message": message, "type": "BadRequestError", "code": status}, status)
