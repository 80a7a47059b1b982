"""OpenRouter's Batch API, emulated: submission, polling, listing, and the ``:batch`` model variant.

Routes (the API root's ``/api/beta``, as ``batch-quickstart.mdx`` spells it, and ``/api/v1``, as the newer
``guides/features/batch-api`` page does)::

    POST /api/{beta,v1}/batches        202 with the batch object, status "validating"
    GET  /api/{beta,v1}/batches/{id}   the batch object; ``results`` inline once "completed", else null
    GET  /api/{beta,v1}/batches        {data, first_id, last_id, has_more, object: "list"} (newest first;
                                       ``limit``, ``after``); ``results`` always null there
    GET  /api/v1/models/{author}/{slug}:batch/endpoints
                                       the batch variant's endpoints at batch prices; an empty list for a
                                       model without one (as OpenRouter answers for a catalog suffix)

Submission checks (400 ``invalid_request`` unless said): JSON object; ``endpoint`` and ``model`` before
``requests`` (the stream-parsing rule); ``endpoint`` ``/v1/chat/completions``; a model with a batch
variant (``BatchBehaviour.models``); ``completion_window`` ``24h``; ``provider`` with ``only`` (and
``allow_fallbacks``) and nothing else, leaving a batch endpoint; 1 to 5,000 requests, unique ``custom_id``
strings, object bodies without ``stream: true`` and with no ``model`` other than the batch's; at most 200 MB
(413). A request body the chat
endpoint would refuse fails the batch at validation (status "failed", ``error.message`` naming it).

Lifecycle (``BatchBehaviour``, times × ``time_scale``): ``validating`` for ``validating_s``, then
``failed`` (a ``fail_rate`` draw or an invalid request), or ``in_progress`` for ``in_progress_s +
per_request_s × requests`` (results are made one by one, ``request_counts`` growing), ``finalizing`` for
``finalizing_s``, then ``completed``. A batch drawn by ``expire_rate``, or one that would run past
``window_s``, stays ``in_progress`` until ``window_s`` and ends ``expired`` with no results. A batch runs on
one provider: the cheapest batch-capable one its ``provider.only`` allows, at its prices × ``discount``;
``item_fail_rate`` makes some results an ``error`` instead of a ``response``.

Money and truth: only a completed batch is billed, once, when it completes: credits go down by its
``usage.cost`` (the sum of its results' costs; each result's body carries its own ``usage.cost`` unless
``item_cost`` is false), each result is a ``/generation`` entry and its true ids go to the ground truth.
Failed, expired and failed-item requests cost nothing. The samples are the synchronous endpoint's
(``openrouter.sample_key``): the same prompt and sampling give the same text in both modes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from draftgen.emulator.accounting import GenerationInfo, cost_of
from draftgen.emulator.core import CORE, EmulatorCore
from draftgen.emulator.envelopes import ApiError, error_response
from draftgen.emulator.metadata import architecture, endpoint_entry
from draftgen.emulator.openrouter import ChatRequest, parse_chat, sample_key
from draftgen.emulator.responses import completion_body, usage_obj, view_of
from draftgen.emulator.routing import matches
from draftgen.emulator.scenarios import BatchBehaviour, ModelInfo, Provider, Scenario
from draftgen.emulator.scripted import Output, stable_hash

__all__ = ["BATCHES", "BATCH_PRESETS", "BatchStore", "EmuBatch", "register", "with_batch"]

MAX_REQUESTS = 5000
MAX_BYTES = 200_000_000
TERMINAL = ("completed", "failed", "expired", "cancelled")

#: the batch behaviours the tests and benchmarks name: slow, failing, expiring, partially failing batches
BATCH_PRESETS: dict[str, dict[str, Any]] = {
    "fast": {"validating_s": 0.0, "in_progress_s": 0.0, "per_request_s": 0.0, "finalizing_s": 0.0},
    "slow": {"validating_s": 5.0, "in_progress_s": 3600.0, "per_request_s": 1.0, "finalizing_s": 60.0},
    "failed": {"fail_rate": 1.0},
    "expired": {"expire_rate": 1.0},
    "partial": {"item_fail_rate": 0.25},
}


def with_batch(sc: Scenario, preset: str | None = None, **changes: Any) -> Scenario:
    """A copy of ``sc`` whose Batch API behaves as ``preset`` (``BATCH_PRESETS``), then ``changes``."""
    merged = {**(BATCH_PRESETS[preset] if preset else {}), **changes}
    return sc.replace(batch=dataclasses.replace(sc.batch, **merged))


@dataclass
class _Made:
    """A result made while the batch is in progress, billed and recorded only if it completes."""

    custom_id: str
    gen_id: str = ""
    body: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    cost: float = 0.0
    prompt_ids: list[int] = field(default_factory=list)
    out: Output | None = None


@dataclass
class EmuBatch:
    id: str
    model: str
    provider: Provider  # the batch's provider at batch prices
    requests: list[tuple[str, dict[str, Any]]]
    created_at: int
    seq: int = 0  # its number on this server: the fault draws depend on (seed, seq), so a seed reproduces them
    invalid: str | None = None  # why validation fails it
    status: str = "validating"
    error: dict[str, Any] | None = None
    made: list[_Made] = field(default_factory=list)
    finalized_at: int | None = None
    expires_at: int | None = None
    usage: dict[str, Any] | None = None

    def obj(self, *, with_results: bool) -> dict[str, Any]:
        failed = sum(1 for m in self.made if m.error is not None)
        done = self.status == "completed"
        return {
            "id": self.id, "object": "batch", "endpoint": "/v1/chat/completions", "model": self.model,
            "provider": self.provider.name, "completion_window": "24h", "status": self.status,
            "created_at": self.created_at, "finalized_at": self.finalized_at, "expires_at": self.expires_at,
            "request_counts": {"total": len(self.requests), "completed": len(self.made) - failed, "failed": failed},
            "usage": self.usage if done else None,
            "results": [_result_obj(self.id, m) for m in self.made] if done and with_results else None,
            "error": self.error,
        }


def _result_obj(batch_id: str, m: _Made) -> dict[str, Any]:
    rid = f"batch_req_{stable_hash(batch_id, m.custom_id):016x}"
    if m.error is not None:
        return {"id": rid, "custom_id": m.custom_id, "response": None, "error": m.error}
    return {"id": rid, "custom_id": m.custom_id, "error": None,
            "response": {"status_code": 200, "request_id": f"req-{rid[10:]}", "body": m.body}}


@dataclass
class BatchStore:
    batches: dict[str, EmuBatch] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    submitted: int = 0


BATCHES = web.AppKey("batches", BatchStore)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json")


def _fail(core: EmulatorCore, err: ApiError) -> web.Response:
    core.state.by_status[err.status] += 1
    return error_response(err)


def _bad(msg: str) -> ApiError:
    return ApiError(400, msg, "invalid_request")


def _has_variant(sc: Scenario, model: str) -> bool:
    b = sc.batch
    if b.models is not None:
        return model in b.models
    return sc.accept_any_model or any(m.id == model for m in sc.models)


def _batch_providers(sc: Scenario) -> list[Provider]:
    return [p for p in sc.providers if p.batch and p.tier == "default"]


def _at_batch_prices(p: Provider, b: BatchBehaviour) -> Provider:
    return dataclasses.replace(p, price_prompt=p.price_prompt * b.discount, price_completion=p.price_completion * b.discount,
                               faults={}, echo_tier=None, omit_cost=p.omit_cost or not b.item_cost)


def _provider(sc: Scenario, obj: Any) -> Provider | ApiError:
    """The batch's provider: the cheapest batch-capable one ``provider.only`` allows."""
    cands = _batch_providers(sc)
    if obj is not None:
        if not isinstance(obj, dict) or set(obj) - {"only", "allow_fallbacks"}:
            return _bad("Batch provider routing preferences: only provider.only and provider.allow_fallbacks "
                        "are supported")
        only = obj.get("only")
        if only is not None:
            if not isinstance(only, list) or not all(isinstance(x, str) for x in only):
                return _bad("provider.only must be a list of strings")
            cands = [p for p in cands if any(matches(x.lower(), p) for x in only)]
    if not cands:
        return _bad("No batch endpoint is allowed for this model by provider.only")
    return _at_batch_prices(min(cands, key=lambda p: p.price_prompt + p.price_completion), sc.batch)


def _requests(obj: Any, model: str) -> list[tuple[str, dict[str, Any]]] | ApiError:
    if not isinstance(obj, list) or not obj:
        return _bad("requests must be a non-empty array")
    if len(obj) > MAX_REQUESTS:
        return _bad(f"requests: at most {MAX_REQUESTS} per batch, got {len(obj)}")
    seen: set[str] = set()
    out: list[tuple[str, dict[str, Any]]] = []
    for i, r in enumerate(obj):
        cid = r.get("custom_id") if isinstance(r, dict) else None
        body = r.get("body") if isinstance(r, dict) else None
        if not isinstance(cid, str) or not cid or not isinstance(body, dict):
            return _bad(f"requests[{i}] must be {{custom_id: string, body: object}}")
        if cid in seen:
            return _bad(f"requests[{i}].custom_id {cid!r} is not unique within the batch")
        if body.get("stream") is True:
            return _bad(f"requests[{i}].body.stream: batch requests are not streamed")
        if body.get("model") not in (None, model):
            return _bad(f"requests[{i}].body.model must match the batch-level model {model!r}")
        seen.add(cid)
        out.append((cid, body))
    return out


def _parse_submission(core: EmulatorCore, raw: bytes) -> EmuBatch | ApiError:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        return _bad(f"request body is not valid JSON ({exc})")
    if not isinstance(body, dict):
        return _bad("request body must be a JSON object")
    keys = list(body)  # the decoder keeps the body's key order
    if "requests" in keys and any(k in keys and keys.index(k) > keys.index("requests") for k in ("endpoint", "model")):
        return _bad("endpoint and model must appear before requests in the request body")
    if body.get("endpoint") != "/v1/chat/completions":
        return _bad(f"endpoint {body.get('endpoint')!r}: this emulator batches /v1/chat/completions only")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _bad("model is required")
    sc = core.scenario
    if not _has_variant(sc, model.partition(":")[0]):
        return _bad(f"{model} has no batch variant; only models with a :batch variant can be batched")
    if body.get("completion_window", "24h") != "24h":
        return _bad("completion_window: the only supported value is 24h")
    provider = _provider(sc, body.get("provider"))
    if isinstance(provider, ApiError):
        return provider
    reqs = _requests(body.get("requests"), model)
    if isinstance(reqs, ApiError):
        return reqs
    bid = f"batch_{stable_hash('batch', core.seed, time.time_ns(), len(reqs)):016x}"
    return EmuBatch(bid, model, provider, reqs, int(time.time()), invalid=_invalid(core, reqs, model))


def _invalid(core: EmulatorCore, reqs: list[tuple[str, dict[str, Any]]], model: str) -> str | None:
    """Why validation fails the batch (a request the chat endpoint would refuse), or None."""
    for cid, body in reqs:
        req = parse_chat({**body, "model": model}, core.opts.thinking)
        if isinstance(req, ApiError):
            return f"request {cid}: {req.message}"
        prompt = core.prompt(req.messages, req.tools, req.thinking)
        if isinstance(prompt, ApiError):
            return f"request {cid}: {prompt.message}"
    return None


async def submit(request: web.Request) -> web.Response:
    core = request.app[CORE]
    store = request.app[BATCHES]
    key = core.authorize(request)
    if isinstance(key, ApiError):
        return _fail(core, key)
    if request.content_length is not None and request.content_length > MAX_BYTES:
        return _fail(core, ApiError(413, f"a batch may be at most {MAX_BYTES:,} bytes", "invalid_request"))
    if core.state.credits_remaining <= 0:
        return _fail(core, ApiError(402, "Insufficient credits", "payment_required",
                                    metadata={"limit_source": "openrouter_credits"}))
    b = _parse_submission(core, await request.read())
    if isinstance(b, ApiError):
        return _fail(core, b)
    store.submitted += 1
    b.seq = store.submitted
    store.batches[b.id] = b
    task = asyncio.get_running_loop().create_task(_lifecycle(core, b), name=f"emulator-batch:{b.id}")
    store.tasks.add(task)
    task.add_done_callback(store.tasks.discard)
    delay = core.scenario.scaled(core.scenario.batch.accept_delay_s)
    if delay > 0:  # recorded, not yet answered: a client killed now never learns the id
        await asyncio.sleep(delay)
    core.state.by_status[202] += 1
    return _json(b.obj(with_results=False), status=202)


async def _lifecycle(core: EmulatorCore, b: EmuBatch) -> None:
    sc, bb = core.scenario, core.scenario.batch
    started = time.monotonic()
    await asyncio.sleep(sc.scaled(bb.validating_s))
    u = core.uniform("batch-outcome", b.seq)
    if b.invalid is not None or u < bb.fail_rate:
        b.status, b.finalized_at = "failed", int(time.time())
        b.error = {"message": b.invalid or "Validation failed: the provider rejected the batch input"}
        return
    b.status = "in_progress"
    n = len(b.requests)
    run_s = sc.scaled(bb.in_progress_s + bb.per_request_s * n)
    window = sc.scaled(bb.window_s)
    b.expires_at = b.created_at + max(1, int(window))
    if u < bb.fail_rate + bb.expire_rate or sc.scaled(bb.validating_s) + run_s + sc.scaled(bb.finalizing_s) > window:
        await asyncio.sleep(max(0.0, started + window - time.monotonic()))
        b.status, b.finalized_at = "expired", int(time.time())
        b.made = []
        return
    t0 = time.monotonic()
    for i, (cid, body) in enumerate(b.requests):
        b.made.append(await _make(core, b, cid, body))
        due = t0 + run_s * (i + 1) / n - time.monotonic()
        if due > 0.001:
            await asyncio.sleep(due)
    b.status = "finalizing"
    await asyncio.sleep(sc.scaled(bb.finalizing_s))
    _complete(core, b)


async def _make(core: EmulatorCore, b: EmuBatch, cid: str, body: dict[str, Any]) -> _Made:
    if core.uniform("batch-item", b.seq, cid) < core.scenario.batch.item_fail_rate:
        return _Made(cid, error={"message": "Provider returned error", "type": "server_error", "param": None})
    req = parse_chat({**body, "model": b.model}, core.opts.thinking)
    assert isinstance(req, ChatRequest)  # validated by _invalid
    prompt = core.prompt(req.messages, req.tools, req.thinking)
    assert not isinstance(prompt, ApiError)
    prompt_hash, prompt_ids = prompt
    p = b.provider
    cap = min(req.max_tokens or p.max_completion_tokens, p.max_completion_tokens)
    out = await core.output(sample_key(req, p, prompt_hash), thinking=req.thinking, max_tokens=cap)
    if req.stop:
        out = core.model.cut_at_stop(out, req.stop, thinking=req.thinking)
    view = view_of(out, p, chunk_tokens=core.scenario.stream_chunk_tokens, exclude_reasoning=req.exclude_reasoning,
                   logprobs=req.logprobs, pieces=False)
    gen_id = core.new_generation_id().replace("gen-", "gen-batch-", 1)
    usage = usage_obj(len(prompt_ids), len(out.ids), out.reasoning_tokens, p)
    resp = completion_body(gen_id, b.created_at, p, req.model, view, out.finish_reason, usage)
    return _Made(cid, gen_id, resp, None, cost_of(len(prompt_ids), len(out.ids), p.price_prompt, p.price_completion),
                 prompt_ids, out)


def _complete(core: EmulatorCore, b: EmuBatch) -> None:
    """Bill the batch once, record each result's generation and ground truth, and mark it completed."""
    st = core.state
    now = time.time()
    prompt = completion = 0
    cost = 0.0
    for m in b.made:
        if m.out is None:
            continue
        st.record_generation(GenerationInfo(
            id=m.gen_id, model=b.model, provider_name=b.provider.name, total_cost=m.cost,
            tokens_prompt=len(m.prompt_ids), tokens_completion=len(m.out.ids), tokens_reasoning=m.out.reasoning_tokens,
            finish_reason=m.out.finish_reason, streamed=False, latency_ms=0, generation_time_ms=0, created_at=now,
            completed_mono=time.monotonic()))
        core.write_ground_truth(m.gen_id, m.out.ids, m.prompt_ids, m.out.non_canonical)
        prompt, completion, cost = prompt + len(m.prompt_ids), completion + len(m.out.ids), cost + m.cost
    b.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
               "cost": cost, "is_byok": False}
    b.status, b.finalized_at = "completed", int(now)


async def retrieve(request: web.Request) -> web.Response:
    core = request.app[CORE]
    key = core.authorize(request)
    if isinstance(key, ApiError):
        return _fail(core, key)
    b = request.app[BATCHES].batches.get(request.match_info["batch_id"])
    if b is None:
        return _fail(core, ApiError(404, f"Batch {request.match_info['batch_id']} not found", "not_found"))
    core.state.by_status[200] += 1
    return _json(b.obj(with_results=True))


async def list_batches(request: web.Request) -> web.Response:
    core = request.app[CORE]
    key = core.authorize(request)
    if isinstance(key, ApiError):
        return _fail(core, key)
    try:
        limit = max(1, min(100, int(request.query.get("limit", "20"))))
    except ValueError:
        return _fail(core, _bad("limit must be an integer"))
    newest = list(reversed(request.app[BATCHES].batches.values()))
    after = request.query.get("after")
    if after:
        ids = [b.id for b in newest]
        newest = newest[ids.index(after) + 1:] if after in ids else []
    page = newest[:limit]
    return _json({"object": "list", "data": [b.obj(with_results=False) for b in page],
                  "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
                  "has_more": len(newest) > limit})


async def variant_endpoints(request: web.Request) -> web.Response:
    """``/models/{author}/{slug}:batch/endpoints``: the batch providers at batch prices, or none."""
    core = request.app[CORE]
    mid = f"{request.match_info['author']}/{request.match_info['slug']}"
    sc = core.scenario
    info = next((m for m in sc.models if m.id == mid or m.canonical_slug == mid), None) or ModelInfo(mid)
    eps = ([endpoint_entry(info, _at_batch_prices(p, sc.batch)) for p in _batch_providers(sc)]
           if _has_variant(sc, mid) else [])
    return _json({"data": {"id": f"{info.id}:batch", "name": f"{info.name or info.id} (batch)", "created": 1768528898,
                           "description": "Batch variant served by the draftgen OpenRouter emulator.",
                           "architecture": architecture(info), "endpoints": eps}})


async def _cleanup(app: web.Application) -> None:
    tasks = list(app[BATCHES].tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def register(app: web.Application) -> None:
    """Add the Batch API routes (before the generic ``/endpoints`` route) and its store to ``app``."""
    app[BATCHES] = BatchStore()
    r = app.router
    r.add_get("/api/v1/models/{author}/{slug:[^/:]+}:batch/endpoints", variant_endpoints)
    for root in ("/api/beta", "/api/v1"):
        r.add_post(f"{root}/batches", submit)
        r.add_get(f"{root}/batches", list_batches)
        r.add_get(f"{root}/batches/{{batch_id}}", retrieve)
    app.on_cleanup.append(_cleanup)
