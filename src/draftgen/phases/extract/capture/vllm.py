"""The ``vllm`` capture backend: hidden states from one or many ``vllm serve`` processes in extract mode.

The servers run vLLM's ``extract_hidden_states`` speculative method with the ExampleHiddenStatesConnector
(flags in docs/extract.md, "The vllm backend"); ``draftgen emulate --model DIR --extract-dir D`` is the same
protocol on CPU. Per merged row this client:

1. posts ``{base}/v1/completions`` ``{"model": <id from GET /v1/models>, "prompt": [ids], "max_tokens": 1,
   "return_token_ids": true}`` to the least-loaded server (ties round-robin), at most
   ``hidden_states.concurrency`` requests in flight in all;
2. REJECTS a response whose ``prompt_token_ids`` (``choices[0]``, or top level) differ from the ids sent:
   a ``PermanentAPIError`` (kind ``ids_mismatch``) naming the sample id and the first differing position,
   never retried, and the run stops before anything of that batch is published;
3. takes ``kv_transfer_params.hidden_states_path``, waits for the connector's write (a shared flock on
   ``<path>.lock``, polled), reads the file (``hidden_states [T, n_slots, H]``, ``token_ids int64 [T]``),
   checks ``token_ids`` == the ids sent, T, H and ``n_slots`` == configured aux ids + the final id;
4. turns it into a ``Captured`` (aux = the aux slots concatenated in ascending id order, final = the last
   slot, layer id L, pre-norm) and removes the server's file and lock (draftgen publishes its own copy).

Connection errors, timeouts, 5xx/408/429 and a connector file that never appears are retried with full-jitter
backoff (``retry.*``); other 4xx are permanent. The path in ``hidden_states_path`` is the server's: the
connector's ``shared_storage_path`` must be readable here (same host or a shared filesystem).

For the checks the client needs the target's embedding, final norm and LM head only: they are read from
``hidden_states.model`` (a local folder; single tensors through the safetensors index), never the whole
model. ``reference`` (a plain forward pass) is not available here.

Entry points: ``capture(rows)`` (sync, what ``extract.run`` calls; one asyncio loop in a thread),
``capture_stream(rows)`` (async iterator, completion order) and ``capture_all(rows)`` (sync iterator).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from draftgen.backends import capabilities
from draftgen.errors import ConfigError, InputError, PermanentAPIError, RetryableAPIError, StorageError
from draftgen.hidden.format import Captured, read_safetensors, require
from draftgen.phases.extract.capture import (
    ExtractBackendKind,
    ExtractCapabilities,
    ExtractRow,
    Reference,
    TargetInfo,
)
from draftgen.phases.extract.layers import resolve_layer_ids
from draftgen.store import read_json_object

if TYPE_CHECKING:
    import aiohttp
    import numpy as np
    import torch

    from draftgen.config import RunConfig

__all__ = ["ServerFile", "VllmClientOptions", "VllmExtractBackend", "read_connector_file", "wait_for_lock"]

T = TypeVar("T")


@dataclass(frozen=True)
class VllmClientOptions:
    base_urls: tuple[str, ...]
    concurrency: int = 16
    connect_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    file_timeout_s: float = 120.0
    max_attempts: int = 6
    base_delay_s: float = 0.5
    multiplier: float = 2.0
    max_delay_s: float = 60.0
    remove_server_files: bool = True


@dataclass
class ServerFile:
    """What one connector file held: ``hidden_states`` [T, n_slots, H] and ``token_ids`` int64 [T]."""

    hidden_states: torch.Tensor
    token_ids: torch.Tensor


def _v1(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"hidden_states.base_urls: {url!r} must start with http:// or https://")
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def wait_for_lock(path: str, timeout_s: float, poll_s: float = 0.005) -> None:
    """Wait until the connector has finished writing ``path``: a shared flock on ``<path>.lock`` (held
    LOCK_EX by the writer), or, with no lock file (``use_synchronization_lock: false``), until the file is
    there. RetryableAPIError (kind ``hidden_states_timeout``) when neither happens within ``timeout_s``."""
    lock = path + ".lock"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            if os.path.exists(path) and not os.path.exists(lock):
                return
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return  # the writer released LOCK_EX: the file is complete
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
        if time.monotonic() > deadline:
            raise RetryableAPIError(
                f"hidden_states_timeout: the connector file {path} was not complete within {timeout_s:g}s; the "
                "server's shared_storage_path must be readable here (same host or a shared filesystem)",
                kind="hidden_states_timeout")
        await asyncio.sleep(poll_s)


def read_connector_file(path: str) -> ServerFile:
    """The two tensors of one connector file (StorageError naming ``path`` when it is missing, truncated or
    unreadable, or its keys are missing)."""
    try:
        data = read_safetensors(path)
    except InputError as exc:  # the storage boundary's one-line reason, with the connector's fix
        reason = str(exc).removeprefix(f"{path}: ").split(";")[0]
        raise StorageError(f"{path}: cannot read the connector's safetensors file ({reason}); keep "
                           "use_synchronization_lock on in the server's kv_transfer_config and its "
                           "shared_storage_path on a filesystem this host reads whole, then rerun") from None
    missing = [k for k in ("hidden_states", "token_ids") if k not in data]
    if missing:
        raise StorageError(f"{path}: no {', '.join(missing)} tensor; not an ExampleHiddenStatesConnector file")
    return ServerFile(hidden_states=data["hidden_states"], token_ids=data["token_ids"])


def _remove(path: str) -> None:
    for p in (path + ".lock", path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)


class _TargetWeights:
    """The target's config, embedding, final norm and LM head, read tensor by tensor from its folder."""

    def __init__(self, folder: Path) -> None:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"hidden_states.model {str(folder)!r}: no config.json there; the vllm backend needs "
                              "the target's local folder (for its layer count, embedding, final norm and lm_head)")
        raw = read_json_object(cfg_path)
        self.config: dict[str, Any] = raw.get("text_config") or raw
        self.tie = bool(raw.get("tie_word_embeddings", self.config.get("tie_word_embeddings", False)))
        self.folder = folder
        index = folder / "model.safetensors.index.json"
        self.where: dict[str, str] = {}
        if index.is_file():
            self.where = dict(read_json_object(index)["weight_map"])

    def tensor(self, *names: str) -> torch.Tensor:
        st = require("safetensors")
        for name in names:
            shard = self.where.get(name, "model.safetensors" if not self.where else None)
            if shard is None:
                continue
            with st.safe_open(str(self.folder / shard), framework="pt") as f:
                if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    t: torch.Tensor = f.get_tensor(name)
                    return t
        raise ConfigError(f"hidden_states.model {str(self.folder)!r}: no tensor {' or '.join(names)} in its safetensors")


class VllmExtractBackend:
    """See the module docstring. ``VllmExtractBackend(cfg)`` (the registry's factory) or
    ``VllmExtractBackend.from_parts(target_folder, options, layer_ids)``."""

    def __init__(self, cfg: RunConfig) -> None:
        hs = cfg.hidden_states
        ep = cfg.endpoint
        urls = [str(u) for u in (hs.base_urls)]
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
            base_urls=tuple(urls), concurrency=int(conc) if conc else 8 * len(urls),
            connect_timeout_s=ep.connect_timeout_s, request_timeout_s=ep.request_timeout_s or ep.idle_timeout_s,
            file_timeout_s=ep.idle_timeout_s, max_attempts=cfg.retry.max_attempts,
            base_delay_s=cfg.retry.base_delay_s, multiplier=cfg.retry.multiplier, max_delay_s=cfg.retry.max_delay_s)
        self._setup(cfg.path(hs.model), opts, hs.layer_ids, name=hs.model, revision=hs.revision)

    @classmethod
    def from_parts(cls, target: Path, opts: VllmClientOptions, layer_ids: Sequence[int] | None = None,
                   *, name: str | None = None) -> VllmExtractBackend:
        self = cls.__new__(cls)
        self._setup(target, opts, layer_ids, name=name or target.name, revision=None)
        return self

    def _setup(self, target: Path, opts: VllmClientOptions, layer_ids: Sequence[int] | None, *, name: str,
               revision: str | None) -> None:
        require("torch")
        self.opts = VllmClientOptions(**{**opts.__dict__, "base_urls": tuple(_v1(u) for u in opts.base_urls)})
        self.weights = _TargetWeights(Path(target))
        c = self.weights.config
        n_layers = int(c["num_hidden_layers"])
        layers = resolve_layer_ids(n_layers, layer_ids)
        norm_w = self.weights.tensor("model.norm.weight").float()
        self._embed: torch.Tensor | None = None
        self._head: torch.Tensor | None = None
        self.info = TargetInfo(name=name, revision=revision, num_layers=n_layers, hidden_size=int(c["hidden_size"]),
                               vocab_size=int(c["vocab_size"]), norm_eps=float(c.get("rms_norm_eps", 1e-6)),
                               norm_weight=norm_w, layers=layers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None
        self._inflight = [0] * len(self.opts.base_urls)
        self._models: list[str | None] = [None] * len(self.opts.base_urls)
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

    async def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            import aiohttp

            o = self.opts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=o.request_timeout_s, sock_connect=o.connect_timeout_s),
                headers={"Content-Type": "application/json"})
            self._sem = asyncio.Semaphore(max(1, o.concurrency))
        return self._session

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

    async def _model_id(self, session: aiohttp.ClientSession, i: int) -> str:
        mid = self._models[i]
        if mid is None:
            url = self.opts.base_urls[i] + "/models"
            async with session.get(url) as resp:
                body = await resp.read()
                if resp.status != 200:
                    from draftgen.backends.errors import classify_http

                    raise classify_http(resp.status, body, headers=resp.headers, where=f"GET {url}")
            data = orjson.loads(body).get("data") or []
            if not data:
                raise PermanentAPIError(f"GET {url}: the server lists no model", kind="no_model")
            mid = str(data[0]["id"])
            self._models[i] = mid
        return mid

    async def _attempt(self, row: ExtractRow, i: int) -> Captured:
        from draftgen.backends.errors import classify_http

        session = await self._ensure_session()
        base = self.opts.base_urls[i]
        sent = [int(t) for t in row.input_ids.tolist()]
        body = orjson.dumps({"model": await self._model_id(session, i), "prompt": sent, "max_tokens": 1,
                             "return_token_ids": True})
        where = f"POST {base}/completions"
        async with session.post(base + "/completions", data=body) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise classify_http(resp.status, raw, headers=resp.headers, where=where)
        try:
            out = orjson.loads(raw)
            choice = out["choices"][0]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise RetryableAPIError(f"bad_response: not a completion ({where})", kind="bad_response") from None
        got = choice.get("prompt_token_ids")
        if got is None:
            got = out.get("prompt_token_ids")
        if got is None:
            raise PermanentAPIError(f"sample {row.sample_id}: the server returned no prompt_token_ids ({where}); "
                                    "the vllm backend needs vLLM >= 0.22 (return_token_ids)", kind="no_prompt_ids")
        if got != sent:
            at = next((k for k, (a, b) in enumerate(zip(got, sent, strict=False)) if a != b), min(len(got), len(sent)))
            raise PermanentAPIError(
                f"sample {row.sample_id}: the server's prompt_token_ids differ from the ids sent (first at position "
                f"{at} of {len(sent)}; {len(got)} ids came back) ({where}); its hidden states would belong to other "
                "tokens, so nothing is stored for it", kind="ids_mismatch")
        path = (out.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise PermanentAPIError(
                f"sample {row.sample_id}: no kv_transfer_params.hidden_states_path in the response ({where}); serve "
                "with --speculative-config method extract_hidden_states and --kv-transfer-config "
                "ExampleHiddenStatesConnector (docs/extract.md)", kind="not_extract_mode")
        await wait_for_lock(str(path), self.opts.file_timeout_s)
        f = await asyncio.to_thread(read_connector_file, str(path))
        try:
            return self._to_captured(row, sent, f, str(path))
        finally:
            if self.opts.remove_server_files:
                _remove(str(path))

    def _to_captured(self, row: ExtractRow, sent: list[int], f: ServerFile, path: str) -> Captured:
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
            raise ConfigError(
                f"hidden_states.layer_ids: the server captures {hs.shape[1]} layers per token but draftgen expects "
                f"{want} (aux {list(info.layers.aux)} + final {info.layers.final}); serve with "
                f"eagle_aux_hidden_state_layer_ids = {ids}")
        T = hs.shape[0]
        return Captured(sample_id=row.sample_id, input_ids=row.input_ids, loss_mask=row.loss_mask,
                        aux=hs[:, :n_aux].reshape(T, n_aux * info.hidden_size).clone(), final=hs[:, n_aux].clone())

    async def _one(self, row: ExtractRow) -> Captured:
        await self._ensure_session()
        assert self._sem is not None
        o = self.opts
        attempt = 0
        async with self._sem:
            while True:
                attempt += 1
                i = self._pick()
                self._inflight[i] += 1
                self.requests += 1
                try:
                    return await self._attempt(row, i)
                except PermanentAPIError:
                    raise
                except Exception as exc:
                    err = _retryable(exc, where=o.base_urls[i])
                    if err is None:
                        raise
                    if attempt >= o.max_attempts:
                        raise RetryableAPIError(f"sample {row.sample_id}: gave up after {attempt} attempts: {err}",
                                                kind=err.kind) from None
                    self.retries += 1
                    delay = min(o.max_delay_s, o.base_delay_s * o.multiplier ** (attempt - 1))
                    await asyncio.sleep(err.retry_after if err.retry_after else random.uniform(0, delay))
                finally:
                    self._inflight[i] -= 1

    # -- the ExtractBackend protocol and the streaming forms ---------------------------------------------------

    def capture(self, rows: Sequence[ExtractRow]) -> list[Captured]:
        """All rows concurrently; the results in row order. The first permanent error stops the batch."""
        async def all_rows() -> list[Captured]:
            tasks = [asyncio.ensure_future(self._one(r)) for r in rows]
            try:
                return list(await asyncio.gather(*tasks))
            finally:  # the first error ends the batch: nothing of it goes on being sent or retried
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        return self._run(all_rows()) if rows else []

    async def capture_stream(self, rows: Iterable[ExtractRow] | AsyncIterable[ExtractRow]) -> AsyncIterator[Captured]:
        """Captured samples in completion order, at most ``concurrency`` requests in flight. Run on any loop."""
        await self._ensure_session()
        pending: set[asyncio.Task[Captured]] = set()
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
                        yield d.result()
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for d in done:
                    yield d.result()
        finally:
            for p in pending:
                p.cancel()

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

        if self._embed is None:
            self._embed = self.weights.tensor("model.embed_tokens.weight")
        out: torch.Tensor = self._embed[torch.from_numpy(ids).long()].float()
        return out

    def head_logprobs(self, final_pre: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        import torch

        from draftgen.drafter.hf import rms_norm

        if self._head is None:
            names = ("lm_head.weight", "model.embed_tokens.weight") if self.weights.tie else ("lm_head.weight",)
            self._head = self.weights.tensor(*names)
        post = rms_norm(final_pre, self.info.norm_weight, self.info.norm_eps)
        out = []
        for s in range(0, post.shape[0], 256):
            logp = torch.log_softmax(post[s:s + 256] @ self._head.float().T, dim=-1)
            out.append(logp.gather(-1, targets[s:s + 256].long()[:, None])[:, 0])
        res: torch.Tensor = torch.cat(out) if out else torch.zeros(0)
        return res

    def reference(self, row: ExtractRow, positions: torch.Tensor) -> Reference | None:
        return None

    def close(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._session is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._session.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = None


async def _next(agen: AsyncIterator[Captured]) -> Captured:
    return await agen.__anext__()


def _retryable(exc: BaseException, *, where: str) -> RetryableAPIError | None:
    """The retryable form of ``exc`` (transport errors, timeouts, retryable API errors), or None."""
    import aiohttp

    from draftgen.backends.errors import translate_exception

    if isinstance(exc, RetryableAPIError):
        return exc
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        err = translate_exception(exc, where=where)
        return err if isinstance(err, RetryableAPIError) else None
    return None


#: ``hidden_states.backend`` kind, registered in ``capture.EXTRACT_BACKENDS`` by this path.
VLLM_KIND = ExtractBackendKind(VllmExtractBackend, ExtractCapabilities(reference=False, needs_gpu=False))
