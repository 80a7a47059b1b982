"""The ``vllm`` capture backend: hidden states from one or many ``vllm serve`` processes in extract mode.

The servers run vLLM's ``extract_hidden_states`` speculative method with the ExampleHiddenStatesConnector
(flags in docs/extract.md, "The vllm backend"); ``draftgen emulate --model DIR --extract-dir D`` is the same
protocol on CPU. Per merged row this client:

1. posts ``{base}/v1/completions`` ``{"model": <id from GET /v1/models>, "prompt": [ids], "max_tokens": 1,
   "return_token_ids": true}`` to the least-loaded server (ties round-robin), at most
   ``hidden_states.concurrency`` requests in flight in all; with a ``teacher_fraction`` above 0 EVERY request
   also asks ``"prompt_logprobs": 0`` (so no request says whether it will be checked), and the engine's log-prob
   of each next prompt id is read from every answer (``answer.engine_logprobs``);
2. takes ``kv_transfer_params.hidden_states_path`` and refuses it unless it names a file of the connector's
   naming (``<request_id>.safetensors``) directly in ``hidden_states.connector_dir`` once symlinks are
   resolved (``os.path.realpath``): a ``PermanentAPIError`` (kind ``foreign_hidden_states_path``) naming the
   path, never retried, and that file and its ``.lock`` are never read nor removed. An admitted path is
   draftgen's from here on (claimed in ``claims`` when given: ``connector.ConnectorFolder``);
3. REJECTS a response whose ``prompt_token_ids`` differ from the ids sent (``answer.check_prompt_ids``:
   ``ids_mismatch``, never retried; the run stops before anything of that batch is published);
4. waits for the connector's write (a shared flock on ``<path>.lock``, polled), checks again that the path
   is a regular file in the folder, reads its bytes once and decodes them (``hidden_states [T, n_slots, H]``,
   ``token_ids int64 [T]``; a file that cannot be read is a ``StorageError`` naming it), checks ``token_ids``
   == the ids sent, T and H (``bad_hidden_states``) and ``n_slots`` == configured aux ids + the final id (a
   ``ConfigError`` naming the ids to serve, until a file of the right count came from that server or
   ``confirm_layers``; then ``bad_hidden_states``);
5. turns it into a ``Captured`` (aux = the aux slots concatenated in ascending id order, final = the last
   slot, layer id L, pre-norm). Every admitted file is removed with its lock once its request is answered:
   read (accepted or rejected), refused (other ids), given up on (not complete within the timeout: once its
   writer lets go, ``ConnectorFolder.discard``), or landed after its capture was cancelled (the batch
   stopped); nothing else is ever removed. Then, with the answer in hand, ``SpotCheck`` draws whether this
   capture gets the teacher check (``teacher_selected``; its engine log-probs are kept for ``reference``).

``connector_dir`` is the folder the servers' ``kv_transfer_config`` ``shared_storage_path`` names, as this
host sees it: shared between servers and client (same host or a shared filesystem), and apart from the
hidden-state destination (an overlap is refused). Without it the backend refuses to start.

HTTP goes through the backends' layer (``backends.http``: one session per server, ``fetch_bytes``' error
classification and transport translation, body caps, a total deadline per request) and retries follow the
one policy (``engine.retry``, ``retry.*``): connection errors, timeouts, 5xx/408/429 and a connector file
that never appears are retried; other 4xx are permanent.

``capture_one`` (train --online's proxy, ``phases.train.proxy``) also returns the very bytes the states were
decoded from, so that what is handed on is what was checked, and the server that answered.

For the checks the client needs the target's embedding, final norm and LM head: they are read from
``hidden_states.model`` (a local folder; single tensors through the safetensors index). ``reference`` is the
engine's own ``prompt_logprobs`` of the row (the log-prob check); its ``through`` (aux slots run on through the
target's remaining layers) loads the whole target from that folder on this host's CPU, once, when
``hidden_states.teacher_through_layers`` allows it (default: weights up to 4 GiB).

Entry points: ``capture(rows)`` (sync, what extract's worker calls; one asyncio loop in a thread),
``capture_stream(rows)`` (async iterator, completion order) and ``capture_all(rows)`` (sync iterator).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from draftgen.backends import capabilities
from draftgen.errors import APIError, ConfigError, PermanentAPIError, RetryableAPIError
from draftgen.hidden.codec import Captured
from draftgen.hidden.format import require
from draftgen.target import (
    ExtractBackendKind,
    ExtractCapabilities,
    ExtractRow,
    Reference,
    TargetInfo,
    config_digest,
)
from draftgen.target.answer import check_prompt_ids, completion_of, engine_logprobs
from draftgen.target.checks import SpotCheck
from draftgen.target.connector import (
    ConnectorFolder,
    ServerFile,
    read_connector_file,
    wait_for_lock,
)
from draftgen.target.layers import resolve_layer_ids
from draftgen.target.weights import TargetWeights, head_agreement

if TYPE_CHECKING:
    import aiohttp
    import numpy as np
    import torch

    from draftgen.config import RunConfig
    from draftgen.engine.retry import RetryPolicy

__all__ = ["ServerCapture", "ServerFile", "VllmClientOptions", "VllmExtractBackend", "read_connector_file",
           "wait_for_lock"]

T = TypeVar("T")


@dataclass(frozen=True)
class VllmClientOptions:
    base_urls: tuple[str, ...]
    #: the servers' shared_storage_path as seen here (``hidden_states.connector_dir``); required
    connector_dir: str | None = None
    concurrency: int = 16
    connect_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    file_timeout_s: float = 120.0
    max_attempts: int = 6
    base_delay_s: float = 0.5
    multiplier: float = 2.0
    max_delay_s: float = 60.0
    #: the local hidden-state destination, kept apart from ``connector_dir``
    destination: str | None = None
    #: share of captures drawn, after their answer, for the teacher check (``checks.SpotCheck``); above 0 every
    #: request asks for the engine's prompt_logprobs
    teacher_fraction: float = 0.0
    #: load the target here to run aux slots on through its layers (None: when its weights are <= 4 GiB)
    through_layers: bool | None = None
    #: draftgen's folder of claims on the connector files its requests were named (``ConnectorFolder.claim``);
    #: None: none kept
    claims: str | None = None


@dataclass
class ServerCapture:
    """One row's capture: its states, the bytes of the connector file they were decoded from (empty unless
    asked for) and the server (its ``/v1`` root) that answered."""

    captured: Captured
    data: bytes
    server: str

#: ``through_layers`` None loads the target on the client only up to this many bytes of safetensors
THROUGH_LAYERS_MAX_BYTES = 4 << 30


def _v1(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"hidden_states.base_urls: {url!r} must start with http:// or https://")
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _destination(cfg: RunConfig) -> str | None:
    """The local hidden-state destination (``hidden.stream.hidden_url``), or None for a URL."""
    from draftgen.hidden.stream import hidden_url

    url = hidden_url(cfg)
    return None if "://" in url else url


class VllmExtractBackend:
    """See the module docstring. ``VllmExtractBackend(cfg)`` (the registry's factory) or
    ``VllmExtractBackend.from_parts(target_folder, options, layer_ids)``."""

    def __init__(self, cfg: RunConfig, *, base_urls: Sequence[str] | None = None,
                 teacher_fraction: float | None = None, claims: str | None = None) -> None:
        """The configured servers (``base_urls`` overrides them: one server of the set, say) and teacher
        fraction (``teacher_fraction`` overrides ``hidden_states.teacher_fraction``); ``claims``:
        ``VllmClientOptions.claims``."""
        hs = cfg.hidden_states
        ep = cfg.endpoint
        urls = [str(u) for u in (base_urls or hs.base_urls)]
        if not urls and capabilities(ep.kind).hidden_states:
            urls = [u for u in [ep.base_url, *ep.base_urls] if u]
        if not urls:
            raise ConfigError("hidden_states.base_urls: empty; give the vLLM servers running extract_hidden_states "
                              "(e.g. [http://gpu1:8000]), or use hidden_states.backend: hf")
        if not hs.model:
            raise ConfigError("hidden_states.model: not set; the vllm backend needs the target's local folder (the "
                              "model the servers serve) for its layer count and the checks' embedding/norm/lm_head")
        conc = hs.concurrency
        opts = VllmClientOptions(
            base_urls=tuple(urls), connector_dir=str(cfg.path(hs.connector_dir)) if hs.connector_dir else None,
            concurrency=int(conc) if conc else 8 * len(urls),
            connect_timeout_s=ep.connect_timeout_s, request_timeout_s=ep.request_timeout_s or ep.idle_timeout_s,
            file_timeout_s=ep.idle_timeout_s, max_attempts=cfg.retry.max_attempts,
            base_delay_s=cfg.retry.base_delay_s, multiplier=cfg.retry.multiplier, max_delay_s=cfg.retry.max_delay_s,
            destination=_destination(cfg),
            teacher_fraction=hs.teacher_fraction if teacher_fraction is None else teacher_fraction,
            through_layers=hs.teacher_through_layers, claims=claims)
        self._setup(cfg.path(hs.model), opts, hs.layer_ids, name=hs.model, revision=hs.revision)

    @classmethod
    def from_parts(cls, target: Path, opts: VllmClientOptions, layer_ids: Sequence[int] | None = None,
                   *, name: str | None = None) -> VllmExtractBackend:
        self = cls.__new__(cls)
        self._setup(target, opts, layer_ids, name=name or target.name, revision=None)
        return self

    def _setup(self, target: Path, opts: VllmClientOptions, layer_ids: Sequence[int] | None, *, name: str,
               revision: str | None) -> None:
        from draftgen.config import RetryConfig
        from draftgen.engine.retry import RetryPolicy

        require("torch")
        if not opts.connector_dir:
            raise ConfigError("hidden_states.connector_dir: not set; the vllm backend reads and removes connector "
                              "files only in that folder: set it to the servers' kv_transfer_config "
                              "shared_storage_path, shared between servers and client")
        self.folder = ConnectorFolder(opts.connector_dir, destination=opts.destination, claims=opts.claims)
        self.spot = SpotCheck(opts.teacher_fraction)
        self.opts = VllmClientOptions(**{**opts.__dict__, "base_urls": tuple(_v1(u) for u in opts.base_urls)})
        self.policy: RetryPolicy = RetryPolicy(RetryConfig(
            max_attempts=opts.max_attempts, base_delay_s=opts.base_delay_s, multiplier=opts.multiplier,
            max_delay_s=opts.max_delay_s))
        self.weights = TargetWeights(Path(target))
        c = self.weights.config
        n_layers = int(c["num_hidden_layers"])
        layers = resolve_layer_ids(n_layers, layer_ids)
        norm_w = self.weights.tensor("model.norm.weight").float()
        self._loading = threading.Lock()  # the target's lazy load (``_load_target``): checks run on several threads
        self.info = TargetInfo(name=name, revision=revision, num_layers=n_layers, hidden_size=int(c["hidden_size"]),
                               vocab_size=int(c["vocab_size"]), norm_eps=float(c.get("rms_norm_eps", 1e-6)),
                               norm_weight=norm_w, layers=layers, config_sha256=config_digest(target))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sessions: list[aiohttp.ClientSession] = []
        self._sem: asyncio.Semaphore | None = None
        self._inflight = [0] * len(self.opts.base_urls)
        self._models: list[str | None] = [None] * len(self.opts.base_urls)
        self._layout_ok = [False] * len(self.opts.base_urls)  # a file of the right layer count came from server i
        # sample_id -> the engine's log p(ids[t+1]) [T-1], for the captures drawn for the teacher check until
        # ``reference`` takes them (a drawn sample whose states fail ``shape``/``finite`` keeps its entry)
        self._engine_lp: dict[str, torch.Tensor] = {}
        self._posting: set[asyncio.Future[tuple[dict[str, Any], dict[str, Any]]]] = set()  # requests on the wire
        self._target: Any = None  # the whole target, loaded on first use by ``through``
        self._rr = 0
        self.requests = 0
        self.retries = 0

    # -- the event loop thread -------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            t = threading.Thread(target=loop.run_forever, name="draftgen-vllm-extract", daemon=True)
            t.start()
            self._loop, self._thread = loop, t
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _ensure_session(self) -> list[aiohttp.ClientSession]:
        """One session (the backends' ``make_session``) per server, made on the loop that uses them."""
        if not self._sessions:
            from draftgen.backends.http import make_session

            o = self.opts
            self._sessions = [make_session(api_key=None, connections=0, connect_timeout_s=o.connect_timeout_s,
                                           idle_timeout_s=o.request_timeout_s) for _ in o.base_urls]
            self._sem = asyncio.Semaphore(max(1, o.concurrency))
        return self._sessions

    # -- one request --------------------------------------------------------------------------------------

    def _pick(self) -> int:
        n = len(self._inflight)
        low = min(self._inflight)
        for step in range(n):
            i = (self._rr + step) % n
            if self._inflight[i] == low:
                self._rr = (i + 1) % n
                return i
        return 0

    async def _model_id(self, i: int) -> str:
        from draftgen.backends.http import get_bytes, within_deadline

        mid = self._models[i]
        if mid is None:
            url = self.opts.base_urls[i] + "/models"
            body = await within_deadline(get_bytes(self._sessions[i], url), self.opts.request_timeout_s, where=url)
            try:
                data = msgspec.json.decode(body).get("data") or []
            except (msgspec.DecodeError, AttributeError):
                raise RetryableAPIError(f"bad_response: not a model list (GET {url})", kind="bad_response") from None
            if not data:
                raise PermanentAPIError(f"GET {url}: the server lists no model", kind="no_model")
            mid = str(data[0]["id"])
            self._models[i] = mid
        return mid

    async def _post(self, i: int, sent: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The completion for ``sent`` from server ``i`` and its first choice (see the module docstring): every
        request asks the same question (``prompt_logprobs`` whenever a teacher check may be drawn)."""
        from draftgen.backends.http import Bounds, post_json, within_deadline

        base = self.opts.base_urls[i]
        request: dict[str, Any] = {"model": await self._model_id(i), "prompt": sent, "max_tokens": 1,
                                   "return_token_ids": True}
        if self.spot.per_block:
            request["prompt_logprobs"] = 0
        body = msgspec.json.encode(request)
        where = f"POST {base}/completions"
        # the body lists the prompt ids: its cap grows with them as a generated body's does with max_tokens
        raw = await within_deadline(post_json(self._sessions[i], base + "/completions", body,
                                              cap=Bounds().body_cap(len(sent)), where=where),
                                    self.opts.request_timeout_s, where=where)
        return completion_of(raw, where)

    def _taken(self, row: ExtractRow, out: dict[str, Any], where: str) -> str:
        """The connector file the response names, admitted and claimed: draftgen's to remove from here on."""
        params = out.get("kv_transfer_params")
        named = params.get("hidden_states_path") if isinstance(params, dict) else None
        if not named:
            raise PermanentAPIError(
                f"sample {row.sample_id}: no kv_transfer_params.hidden_states_path in the response ({where}); serve "
                "with --speculative-config method extract_hidden_states and --kv-transfer-config "
                "ExampleHiddenStatesConnector (docs/extract.md#the-vllm-backend)", kind="not_extract_mode")
        # invariant: nothing outside the connector folder is opened, read or removed
        path = self.folder.admit(named, sample_id=row.sample_id, where=where)
        self.folder.claim(path)
        return path

    async def _attempt(self, row: ExtractRow, i: int, keep: bool) -> ServerCapture:
        await self._ensure_session()
        sent = [int(t) for t in row.input_ids.tolist()]
        where = f"POST {self.opts.base_urls[i]}/completions"
        post = asyncio.ensure_future(self._post(i, sent))
        self._posting.add(post)
        post.add_done_callback(self._posting.discard)
        try:
            out, choice = await asyncio.shield(post)
        except asyncio.CancelledError:  # the request runs on: the file it names is removed when it lands
            post.add_done_callback(partial(self._orphan, row, where))
            raise
        path = self._taken(row, out, where)
        try:
            check_prompt_ids(row.sample_id, sent, out, choice, where)
            lp = engine_logprobs(row.sample_id, choice.get("prompt_logprobs"), sent, where) \
                if self.spot.per_block else None
            await wait_for_lock(path, self.opts.file_timeout_s)
            self.folder.check_file(path, sample_id=row.sample_id, where=where)
            f, captured = await asyncio.to_thread(self._read, row, sent, path, i, keep)
        except BaseException:  # answered: the file is draftgen's to remove, whatever went wrong
            self.folder.discard(path)
            raise
        self.folder.remove(path)
        self._engine_lp.pop(row.sample_id, None)
        if lp is not None and self.spot.next():  # chosen after the answer: nothing the server saw tells
            self._engine_lp[row.sample_id] = lp
        return ServerCapture(captured=captured, data=f.data, server=self.opts.base_urls[i])

    def _orphan(self, row: ExtractRow, where: str, post: asyncio.Future[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """A request whose capture was cancelled (the batch stopped) landed: the file it names is draftgen's."""
        if post.cancelled() or post.exception() is not None:
            return
        try:
            path = self._taken(row, post.result()[0], where)
        except PermanentAPIError:  # named nothing, or nothing of the folder's: nothing to remove
            return
        self.folder.discard(path)

    async def _settle(self) -> None:
        """Wait for the requests still running after their captures were cancelled (their files are removed)."""
        if self._posting:
            await asyncio.wait(set(self._posting), timeout=self.opts.request_timeout_s)

    def _read(self, row: ExtractRow, sent: list[int], path: str, i: int, keep: bool) -> tuple[ServerFile, Captured]:
        """A connector file read and turned into a ``Captured``, in a thread (the loop's default pool: the
        machine's cores), so the loop and the other requests do not wait on the copy."""
        f = read_connector_file(path, keep_bytes=keep)
        return f, self._to_captured(row, sent, f, path, i)

    def _to_captured(self, row: ExtractRow, sent: list[int], f: ServerFile, path: str, i: int) -> Captured:
        hs = f.hidden_states
        info = self.info
        n_aux = len(info.layers.aux)
        want = n_aux + 1
        if f.token_ids.tolist() != sent:
            raise PermanentAPIError(f"sample {row.sample_id}: {path} holds token_ids other than the ids sent",
                                    kind="ids_mismatch")
        if hs.dim() != 3 or hs.shape[0] != len(sent) or hs.shape[2] != info.hidden_size:
            raise PermanentAPIError(
                f"sample {row.sample_id}: {path} hidden_states has shape {list(hs.shape)}, expected "
                f"[{len(sent)}, {want}, {info.hidden_size}] (prefix caching on? serve with --no-enable-prefix-caching)",
                kind="bad_hidden_states")
        if hs.shape[1] != want:
            ids = [*info.layers.aux, info.layers.final]
            what = (f"{hs.shape[1]} layers per token but draftgen expects {want} (aux {list(info.layers.aux)} + final "
                    f"{info.layers.final}); serve with eagle_aux_hidden_state_layer_ids = {ids}")
            if self._layout_ok[i]:  # this server's files had the right count: this one is the server's fault
                raise PermanentAPIError(f"sample {row.sample_id}: {path} holds {what}", kind="bad_hidden_states")
            raise ConfigError(f"hidden_states.layer_ids: the server captures {what}")
        self._layout_ok[i] = True
        T = hs.shape[0]
        return Captured(sample_id=row.sample_id, input_ids=row.input_ids, loss_mask=row.loss_mask,
                        aux=hs[:, :n_aux].reshape(T, n_aux * info.hidden_size).clone(), final=hs[:, n_aux].clone())

    async def _one(self, row: ExtractRow, keep: bool = False) -> ServerCapture:
        """One row through the one retry policy (``engine.retry.retrying``), within ``concurrency``."""
        from draftgen.engine.retry import retrying

        await self._ensure_session()
        assert self._sem is not None

        async def routed() -> ServerCapture:
            i = self._pick()
            self._inflight[i] += 1
            self.requests += 1
            try:
                return await self._attempt(row, i, keep)
            finally:
                self._inflight[i] -= 1

        def counted(_exc: APIError, _attempts: int, _wait: float) -> None:
            self.retries += 1

        async with self._sem:
            try:
                return await retrying(routed, self.policy, on_retry=counted)
            except RetryableAPIError as err:  # the policy's attempts are spent
                raise RetryableAPIError(f"sample {row.sample_id}: gave up after {self.policy.max_attempts} "
                                        f"attempts: {err}", kind=err.kind) from None

    # -- the ExtractBackend protocol and the streaming forms ---------------------------------------------------

    async def capture_one(self, row: ExtractRow) -> ServerCapture:
        """One row, run on the caller's loop (as ``capture_stream``): its states, the very bytes of the connector
        file they were decoded from (the file itself is removed) and the server that answered."""
        return await self._one(row, True)

    def confirm_layers(self) -> None:
        """Every server's layer count is known to be right (the online preflight checked each): from here on a
        file with another count is that file's fault (``bad_hidden_states``), not a configuration error."""
        self._layout_ok = [True] * len(self._layout_ok)

    def teacher_selected(self, sample_id: str) -> bool:
        """Whether ``sample_id``'s last capture was drawn for the teacher check (``checks.SpotChecking``): its
        engine log-probs are kept until ``reference`` takes them."""
        return sample_id in self._engine_lp

    async def aclose(self) -> None:
        """Wait for the requests still running after their captures were cancelled (a caller's loop stopping
        mid-request: the files they name are written all the same, and removed as they land), then close the
        HTTP sessions from the loop that made them (a caller that ran ``capture_one`` on its own loop:
        ``close`` reaches only the backend's own)."""
        await self._settle()
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.close()

    def served_models(self) -> list[str]:
        """The model id each server lists (``GET /v1/models``), in ``base_urls`` order."""
        async def ids() -> list[str]:
            await self._ensure_session()
            return [await self._model_id(i) for i in range(len(self.opts.base_urls))]

        return self._run(ids())

    def capture(self, rows: Sequence[ExtractRow]) -> list[Captured]:
        """All rows concurrently; the results in row order. The first permanent error stops the batch."""
        async def all_rows() -> list[Captured]:
            tasks = [asyncio.ensure_future(self._one(r)) for r in rows]
            try:
                return [c.captured for c in await asyncio.gather(*tasks)]
            finally:  # the first error ends the batch: nothing of it goes on being sent or retried
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self._settle()

        return self._run(all_rows()) if rows else []

    async def capture_stream(self, rows: Iterable[ExtractRow] | AsyncIterable[ExtractRow]) -> AsyncIterator[Captured]:
        """Captured samples in completion order, at most ``concurrency`` requests in flight. Run on any loop."""
        await self._ensure_session()
        pending: set[asyncio.Task[ServerCapture]] = set()
        limit = max(1, self.opts.concurrency) * 2

        async def rows_iter() -> AsyncIterator[ExtractRow]:
            if isinstance(rows, AsyncIterable):
                async for r in rows:
                    yield r
            else:
                for r in rows:
                    yield r

        try:
            async for row in rows_iter():
                pending.add(asyncio.ensure_future(self._one(row)))
                if len(pending) >= limit:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for d in done:
                        yield d.result().captured
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for d in done:
                    yield d.result().captured
        finally:
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self._settle()

    def capture_all(self, rows: Iterable[ExtractRow]) -> Iterator[Captured]:
        """``capture_stream`` from sync code (the backend's own loop thread)."""
        agen = self.capture_stream(rows)
        while True:
            try:
                yield self._run(_next(agen))
            except StopAsyncIteration:
                return

    def embed(self, ids: np.ndarray) -> torch.Tensor:
        import torch

        out: torch.Tensor = self.weights.embedding()[torch.from_numpy(ids).long()].float()
        return out

    def head_logprobs(self, final_pre: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.head_agreement(final_pre, targets)[0]

    def head_agreement(self, final_pre: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(targets) under the target's head read from ``hidden_states.model`` (on this host's CPU) and
        whether each target is its top-1 (a tie counts)."""
        return head_agreement(self.weights.head(), self.info.norm_weight, self.info.norm_eps, final_pre, targets)

    def reference(self, row: ExtractRow, positions: torch.Tensor) -> Reference | None:
        """The engine's own log-probs of the row (kept by its capture), and ``through`` where allowed."""
        import torch

        lp = self._engine_lp.pop(row.sample_id, None)
        if lp is None:
            return None
        through: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        if self._through_allowed():
            from functools import partial

            from draftgen.drafter.hf import logprobs_through

            through = partial(logprobs_through, self._load_target(), torch.from_numpy(row.input_ids),
                              positions=positions)

        return Reference(logprobs=lp[positions], source="engine", through=through)

    def _through_allowed(self) -> bool:
        allowed = self.opts.through_layers
        if allowed is None:
            size = sum(p.stat().st_size for p in self.weights.folder.glob("*.safetensors"))
            allowed = 0 < size <= THROUGH_LAYERS_MAX_BYTES
        return allowed

    def _load_target(self) -> Any:
        with self._loading:
            if self._target is None:
                transformers = require("transformers")
                self._target = transformers.AutoModelForCausalLM.from_pretrained(
                    str(self.weights.folder), dtype="auto", local_files_only=True).eval()
            return self._target

    def close(self) -> None:
        """Remove the connector files given up on a last time (``ConnectorFolder.close``); stop the loop."""
        self.folder.close()
        loop = self._loop
        if loop is None:
            return
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(session.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = None


async def _next(agen: AsyncIterator[Captured]) -> Captured:
    return await agen.__anext__()


#: ``hidden_states.backend`` kind, registered in ``target.EXTRACT_BACKENDS`` by this path.
VLLM_KIND = ExtractBackendKind(VllmExtractBackend, ExtractCapabilities(reference=False, needs_gpu=False, overlap=True))
