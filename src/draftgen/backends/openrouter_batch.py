"""OpenRouter's Batch API (beta): the submission body, the calls, and results as ``Completion``s.

What it speaks, from OpenRouter's own documentation (``batch-quickstart.mdx`` in OpenRouterTeam/docs, commit
c26125a; the live ``guides/features/batch-api`` page) and its Python SDK's generated types (``openrouter``
1.3.84: ``components.batchsubmitbody``, ``batchproviderpreferences``, ``batchobject``, ``batchlistitem``,
``batchlistresponse``; ``operations`` paths ``/batches``, ``/batches/{id}`` under ``/api/v1``)::

    POST {batch_root}/batches        {"endpoint": "/v1/chat/completions", "model": M, "completion_window": "24h",
                                      "provider": {"only": [...]}, "requests": [{"custom_id", "body"}, ...]}
                                     → 202 Accepted, a batch object with status "validating"
    GET  {batch_root}/batches/{id}   the batch object: status, request_counts {total, completed, failed},
                                     usage {prompt_tokens, completion_tokens, total_tokens, cost, is_byok}
                                     (read leniently, as a chat body's: ``WireBatch.cost``),
                                     results (null until completed, then inline: {id, custom_id,
                                     response: {status_code, request_id, body} | null, error | null}), error
    GET  {batch_root}/batches        {data: [batch objects, results null], first_id, last_id, has_more}
    GET  {api_root}/models/{author}/{slug}:batch/endpoints
                                     the ``:batch`` catalog variant's endpoints with batch prices; an
                                     empty list when the model has no batch variant (``model-variants``)

Rules it keeps: ``endpoint`` and ``model`` are serialised before ``requests`` (the API stream-parses the
body and answers 400 otherwise); one model per batch (request bodies omit ``model`` and inherit it); at
most ``MAX_REQUESTS`` requests and ``MAX_BYTES`` bytes per batch; ``completion_window`` is ``24h`` only;
request bodies carry no ``stream``, no per-request ``provider`` and no ``service_tier``.

Routing (``batch_provider``): the Batch API takes ``provider.only`` (and ``allow_fallbacks``) and nothing
else, and runs a batch on one provider, by default the cheapest eligible one. So the run's routing is applied here, against the
batch variant's endpoints: ``ignore``, ``only``, ``quantizations`` and ``max_price`` (and ``order`` with
``allow_fallbacks: false``) become the ``only`` list of the endpoints they leave. A setting the Batch API
would ignore is refused (``ConfigError`` naming the key), never dropped: ``order`` with fallbacks,
``sort`` other than ``price``, ``require_parameters``, ``data_collection: deny`` and ``service_tier``.

Nothing here touches the run directory; ``engine.batch`` journals and schedules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from draftgen.backends.base import Completion, EndpointInfo, reasoning_body, sampling_body
from draftgen.backends.errors import classify_http, one_line
from draftgen.backends.http import (
    ACCOUNT_BODY_BYTES,
    Bounds,
    HttpBackend,
    drop_none,
    fetch_bytes,
    within_deadline,
)
from draftgen.backends.openrouter import chat_body_prefix, decode_endpoints
from draftgen.backends.pricing import Prices, eligible_endpoints, endpoint_matches
from draftgen.backends.wire import (
    WireUsage,
    check_completion,
    completion_from_body,
    decode_chat,
    usage_from_wire,
)
from draftgen.errors import APIError, ConfigError, PermanentAPIError, RetryableAPIError
from draftgen.records import Message, Tool, spend_usd

if TYPE_CHECKING:
    from draftgen.config import RunConfig

__all__ = [
    "CHAT_ENDPOINT",
    "COMPLETION_WINDOW",
    "MAX_BYTES",
    "MAX_REQUESTS",
    "TERMINAL",
    "BatchClient",
    "BatchRequests",
    "WireBatch",
    "WireBatchList",
    "WireResult",
    "batch_client",
    "batch_endpoints_at",
    "batch_prices",
    "batch_provider",
    "batch_root",
    "encode_submission",
    "result_completion",
]

#: OpenRouter's limits per batch (``guides/features/batch-api``: "Up to 5,000 requests and 200 MB per batch")
MAX_REQUESTS = 5000
MAX_BYTES = 200_000_000
COMPLETION_WINDOW = "24h"
CHAT_ENDPOINT = "/v1/chat/completions"
#: the statuses a batch ends in; ``validating``, ``in_progress``, ``finalizing``, ``cancelling`` come before
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
VARIANT = ":batch"

_enc = msgspec.json.Encoder()


# -- wire shapes (lenient: unknown keys ignored, every field optional) -----------------------------------


class WireCounts(msgspec.Struct):
    total: int = 0
    completed: int = 0
    failed: int = 0


class WireBatchError(msgspec.Struct):
    message: Any = None
    type: Any = None
    param: Any = None
    code: Any = None


class WireResultResponse(msgspec.Struct):
    status_code: int = 0
    request_id: str | None = None
    body: msgspec.Raw = msgspec.Raw(b"null")


class WireResult(msgspec.Struct):
    """One result. ``custom_id`` of any type (a non-string one matches no request: a stray)."""

    custom_id: Any = None
    id: str | None = None
    response: WireResultResponse | None = None
    error: WireBatchError | None = None


class WireBatch(msgspec.Struct):
    id: str
    status: str
    object: str | None = None
    endpoint: str | None = None
    model: str | None = None
    provider: str | None = None
    completion_window: str | None = None
    created_at: float | None = None
    finalized_at: float | None = None
    expires_at: float | None = None
    request_counts: WireCounts | None = None
    usage: Any = None  # read by ``cost`` alone, leniently: a batch whose usage is garbage is still ingested
    results: list[WireResult] | None = None
    error: WireBatchError | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def cost(self) -> float | None:
        """What OpenRouter says it billed for the batch: ``usage.cost`` (plus the upstream cost of a BYOK
        batch) read as a chat body's usage is (``wire.usage_from_wire``); None when it is absent, unreadable,
        negative or not finite (never a credit)."""
        if not isinstance(self.usage, dict):
            return None
        try:
            wire = msgspec.convert(self.usage, WireUsage)
        except msgspec.ValidationError:
            return None
        usage, known, _ = usage_from_wire(wire)
        if usage is None or not known:
            return None
        return spend_usd(usage.cost, usage.is_byok, usage.upstream_cost)

    @property
    def counts(self) -> WireCounts:
        return self.request_counts if self.request_counts is not None else WireCounts()


class WireBatchList(msgspec.Struct):
    data: list[WireBatch] = msgspec.field(default_factory=list)
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


_batch_decoder = msgspec.json.Decoder(WireBatch)
_list_decoder = msgspec.json.Decoder(WireBatchList)


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes, where: str) -> Any:
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RetryableAPIError(f"{where}: unexpected response ({one_line(exc, 160)})", kind="bad_response") from None


# -- the submission ------------------------------------------------------------------------------------


class BatchRequests:
    """The ``body`` of each request of a run's batches: the run's reasoning and sampling (encoded once),
    then a sample's ``max_tokens``, ``messages`` and ``tools``. No ``model`` (the batch's), no ``stream``."""

    def __init__(self, cfg: RunConfig) -> None:
        const: dict[str, Any] = {}
        reasoning = reasoning_body(cfg)
        if reasoning:
            const["reasoning"] = drop_none(reasoning)
        const.update(drop_none(sampling_body(cfg)))
        self._prefix = chat_body_prefix(const)

    def body(self, messages: list[Message], max_tokens: int, tools: list[Tool] | None) -> bytes:
        parts = [self._prefix, b'"max_tokens":', str(max_tokens).encode(), b',"messages":', _enc.encode(messages)]
        if tools:
            parts += [b',"tools":', _enc.encode(tools)]
        parts.append(b"}")
        return b"".join(parts)


def request_item(cid: str, body: bytes) -> bytes:
    """One entry of ``requests``: ``{"custom_id": …, "body": …}``."""
    return b'{"custom_id":' + _enc.encode(cid) + b',"body":' + body + b"}"


def encode_submission(model: str, provider: dict[str, Any] | None, items: Sequence[bytes]) -> tuple[bytes, str]:
    """The submission body and its fingerprint (sha256 hex). ``endpoint`` and ``model`` come first, then
    ``completion_window`` and ``provider``, ``requests`` last (the API stream-parses it)."""
    head: dict[str, Any] = {"endpoint": CHAT_ENDPOINT, "model": model, "completion_window": COMPLETION_WINDOW}
    if provider:
        head["provider"] = provider
    body = b"".join([_enc.encode(head)[:-1], b',"requests":[', b",".join(items), b"]}"])
    return body, hashlib.sha256(body).hexdigest()


def submission_overhead(model: str, provider: dict[str, Any] | None) -> int:
    """Bytes of a submission besides its requests (and the commas between them)."""
    return len(encode_submission(model, provider, [])[0])


# -- routing and prices --------------------------------------------------------------------------------


def batch_root(cfg: RunConfig, base_url: str) -> str:
    """``endpoint.batch.url``, else ``base_url`` (``…/api/v1/batches``, as the SDKs and the live docs call
    it; the quickstart's ``/api/beta`` is ``endpoint.batch.url: https://openrouter.ai/api/beta``)."""
    return (cfg.endpoint.batch.url or base_url).rstrip("/")


def _refuse(key: str, why: str) -> ConfigError:
    return ConfigError(f"{key} has no effect on OpenRouter's Batch API ({why}); remove it, or use "
                       "endpoint.mode: sync")


def check_batch_config(cfg: RunConfig) -> None:
    """Refuse the settings a batch would ignore (see the module docstring)."""
    r = cfg.routing
    if cfg.endpoint.service_tier not in (None, "default"):
        raise _refuse("endpoint.service_tier", "a batch is billed at batch prices, not by service tier")
    if r.order and r.allow_fallbacks is not False:
        raise _refuse("routing.order", "a batch runs on one provider, the cheapest eligible one; list the ones "
                      "allowed in routing.only, or set routing.allow_fallbacks: false to allow only the order's")
    if r.sort not in (None, "price"):
        raise _refuse(f"routing.sort: {r.sort}", "a batch runs on the cheapest eligible provider")
    if r.require_parameters:
        raise _refuse("routing.require_parameters", "the Batch API takes provider.only and nothing else")
    if r.data_collection == "deny":
        raise _refuse("routing.data_collection: deny", "the Batch API takes provider.only and nothing else")
    b = cfg.endpoint.batch
    if not 1 <= b.max_requests <= MAX_REQUESTS:
        raise ConfigError(f"endpoint.batch.max_requests {b.max_requests} must be in 1..{MAX_REQUESTS:,} "
                          "(OpenRouter's limit per batch)")
    if not 1024 <= b.max_bytes <= MAX_BYTES:
        raise ConfigError(f"endpoint.batch.max_bytes {b.max_bytes} must be in 1024..{MAX_BYTES:,} "
                          "(OpenRouter's limit: 200 MB per batch)")
    if b.max_open < 1 or b.poll_interval_s <= 0 or b.poll_max_interval_s < b.poll_interval_s:
        raise ConfigError("endpoint.batch: max_open must be >= 1 and 0 < poll_interval_s <= poll_max_interval_s")


def batch_provider(cfg: RunConfig, endpoints: list[EndpointInfo],
                   avoid: Sequence[str] = ()) -> tuple[dict[str, Any] | None, list[EndpointInfo]]:
    """The batch-level ``provider`` object and the endpoints it allows: the routing's filters applied to
    the batch variant's endpoints, as ``only`` (None when the routing filters nothing and nothing is
    avoided). ``avoid``: providers (slugs) that returned unusable results this run. Raises ConfigError when
    no endpoint is left."""
    check_batch_config(cfg)
    r = cfg.routing
    eligible = eligible_endpoints(list(endpoints), r)
    if r.order and r.allow_fallbacks is False:
        eligible = [e for e in eligible if any(endpoint_matches(o, e) for o in r.order)]
    eligible = [e for e in eligible if not any(endpoint_matches(a, e) for a in avoid)]
    if not eligible:
        have = ", ".join(e.tag or e.provider_name for e in endpoints) or "none"
        raise ConfigError(f"no batch endpoint of {cfg.model.id} is left by routing (ignore/only/quantizations/"
                          f"max_price/order) or avoided this run ({', '.join(avoid) or 'none'}); its batch "
                          f"endpoints: {have}")
    filtered = bool(r.ignore or r.only or r.quantizations or r.max_price or r.order or avoid)
    if not filtered:
        return None, eligible
    only: list[str] = []
    for e in eligible:
        slug = e.tag or e.provider_name
        if slug not in only:
            only.append(slug)
    return {"only": only}, eligible


def batch_prices(endpoints: list[EndpointInfo]) -> Prices:
    """The worst-case batch prices over ``endpoints`` (a batch runs on one of them)."""
    return Prices(
        prompt=max(e.pricing.prompt for e in endpoints),
        completion=max(max(e.pricing.completion, e.pricing.internal_reasoning) for e in endpoints),
        request=max(e.pricing.request for e in endpoints),
    )


# -- results -------------------------------------------------------------------------------------------


def result_completion(res: WireResult, *, backend: str, where: str) -> Completion | APIError:
    """One result → its ``Completion`` (``service_tier`` ``batch`` unless the body echoed one), or the
    error it carries: the classified error of a non-2xx ``response``, or a batch item ``error``
    (``batch_invalid_request``: permanent; ``batch_item_error``: retryable)."""
    resp = res.response
    if resp is not None and 200 <= resp.status_code < 300:
        try:
            comp = check_completion(completion_from_body(decode_chat(bytes(resp.body), where=where), backend=backend,
                                                         where=where))
        except APIError as exc:
            return exc
        if comp.service_tier is None:
            comp.service_tier = "batch"
        return comp
    if resp is not None:
        return classify_http(resp.status_code, bytes(resp.body), where=where)
    err = res.error or WireBatchError(message="the result has neither response nor error")
    text = one_line(str(err.message or err.type or "unknown error"), 200)
    if "invalid" in str(err.type or "").lower():
        return PermanentAPIError(f"batch_invalid_request ({text}; {where})", kind="batch_invalid_request")
    return RetryableAPIError(f"batch_item_error ({text}; {where})", kind="batch_item_error")


# -- the calls -----------------------------------------------------------------------------------------


class BatchClient:
    """The Batch API calls on one aiohttp session (the backend's, with its key). Every call is held to
    ``connect_timeout_s + idle_timeout_s`` (a completed batch's results come in one body)."""

    def __init__(self, session: aiohttp.ClientSession, root: str, api_root: str, bounds: Bounds) -> None:
        self.session = session
        self.root = root.rstrip("/")
        self.api_root = api_root.rstrip("/")
        self.deadline_s = bounds.connect_timeout_s + bounds.idle_timeout_s

    async def _call(self, method: str, url: str, *, data: bytes | None = None, cap: int = ACCOUNT_BODY_BYTES,
                    where: str) -> bytes:
        headers = {"Content-Type": "application/json"} if data is not None else None
        return await within_deadline(fetch_bytes(self.session, method, url, data=data, cap=cap, where=where,
                                                 headers=headers), self.deadline_s, where=where)

    async def submit(self, body: bytes) -> WireBatch:
        where = "POST /batches"
        got: WireBatch = _decode(_batch_decoder, await self._call("POST", self.root + "/batches", data=body,
                                                                 where=where), where)
        return got

    async def retrieve(self, batch_id: str, *, cap: int = ACCOUNT_BODY_BYTES) -> WireBatch:
        where = f"GET /batches/{batch_id}"
        got: WireBatch = _decode(_batch_decoder, await self._call("GET", f"{self.root}/batches/{batch_id}", cap=cap,
                                                                 where=where), where)
        return got

    async def list_page(self, *, after: str | None = None, limit: int = 100) -> WireBatchList:
        where = "GET /batches"
        query = f"?limit={limit}" + (f"&after={after}" if after else "")
        got: WireBatchList = _decode(_list_decoder, await self._call("GET", f"{self.root}/batches{query}",
                                                                    where=where), where)
        return got

    async def variant_endpoints(self, model: str) -> list[EndpointInfo]:
        """The endpoints of ``model``'s ``:batch`` variant with their batch prices (empty: no batch variant)."""
        slug = model.split(":", 1)[0] + VARIANT
        body = await self._call("GET", f"{self.api_root}/models/{slug}/endpoints", where=f"GET /models/{slug}/endpoints")
        return decode_endpoints(body)


def batch_client(cfg: RunConfig, backend: Any) -> BatchClient:
    """The Batch API client on an open OpenRouter backend's session and key (the first, when several URLs
    are balanced)."""
    inner = getattr(backend, "backends", None)
    http = inner[0] if inner else backend
    if not isinstance(http, HttpBackend):
        raise ConfigError("endpoint.mode: batch needs an HTTP backend (endpoint.kind openrouter or emulator)")
    return BatchClient(http.session, batch_root(cfg, http.base_url), http.base_url, http.bounds)


async def batch_endpoints_at(cfg: RunConfig, base_urls: list[str] | None = None) -> list[EndpointInfo]:
    """The model's ``:batch`` variant endpoints over a backend opened for the purpose (``plan``)."""
    from draftgen.backends import api_key_for, open_backend

    async with open_backend(cfg, api_key_for(cfg), base_urls=base_urls, connections=2) as backend:
        return await batch_client(cfg, backend).variant_endpoints(cfg.model.id)


def results_cap(max_tokens: Sequence[int]) -> int:
    """The largest body a completed batch with requests of these ``max_tokens`` may answer with: 16 MiB,
    plus per request 256 KiB and 64 bytes a token (whole JSON bodies, no streaming framing)."""
    return 16 * 1024 * 1024 + sum(256 * 1024 + 64 * max(0, m) for m in max_tokens)
