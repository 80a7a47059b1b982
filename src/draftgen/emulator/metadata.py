"""Account and metadata endpoints of the OpenRouter API root.

    GET /api/v1/key                              data{label, limit, usage, limit_remaining, is_free_tier, …}
    GET /api/v1/auth/key                         legacy alias of /key
    GET /api/v1/credits                          data{total_credits, total_usage}; 403 unless management key
    GET /api/v1/generation?id=gen-…              404 until ``generation_lag_s`` after completion, then data{…};
                                                 a stream the client abandoned too (``cancelled: true``, billed
                                                 for the tokens sent)
    GET /api/v1/models                           data[], total_count; prices are USD per token, as strings
    GET /api/v1/models/{author}/{slug}/endpoints data{id, name, architecture, endpoints[]}

``/models`` and ``/endpoints`` need no key (as on OpenRouter); the others need a valid bearer key.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from draftgen.emulator.accounting import generation_data, key_data
from draftgen.emulator.core import CORE, EmulatorCore
from draftgen.emulator.envelopes import ApiError, availability, error_response
from draftgen.emulator.scenarios import ALL_PARAMETERS, ModelInfo, Provider

__all__ = ["architecture", "credits", "endpoint_entry", "endpoints", "generation", "key", "models", "per_token"]


def per_token(usd_per_million: float) -> str:
    """USD per million → OpenRouter's per-token price string (``0.45`` → ``"0.00000045"``)."""
    s = f"{usd_per_million / 1e6:.12f}".rstrip("0").rstrip(".")
    return s or "0"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(obj), content_type="application/json")


def _fail(core: EmulatorCore, err: ApiError) -> web.Response:
    core.state.by_status[err.status] += 1
    return error_response(err)


def _label(k: str) -> str:
    return f"{k[:9]}...{k[-3:]}" if len(k) > 14 else "sk-or-v1-..."


async def key(request: web.Request) -> web.Response:
    core = request.app[CORE]
    k = core.authorize(request)
    if isinstance(k, ApiError):
        return _fail(core, k)
    return _json({"data": key_data(core.state, _label(k), core.is_management(k))})


async def credits(request: web.Request) -> web.Response:
    core = request.app[CORE]
    k = core.authorize(request)
    if isinstance(k, ApiError):
        return _fail(core, k)
    if not core.is_management(k):
        return _fail(core, ApiError(403, "Only management keys can fetch credits", "permission_denied"))
    st = core.state
    return _json({"data": {"total_credits": st.credits_total, "total_usage": round(st.spend_usd, 9)}})


async def generation(request: web.Request) -> web.Response:
    core = request.app[CORE]
    k = core.authorize(request)
    if isinstance(k, ApiError):
        return _fail(core, k)
    gid = request.query.get("id", "")
    if not gid:
        return _fail(core, ApiError(400, "id is required", "invalid_request"))
    g = core.state.generations.get(gid)
    if g is None or time.monotonic() - g.completed_mono < core.generation_lag_s:
        return _fail(core, ApiError(404, f"Generation {gid} not found", "not_found"))
    return _json({"data": generation_data(g)})


def _cheapest(providers: list[Provider]) -> Provider:
    return min(providers, key=lambda p: p.price_prompt + p.price_completion)


def architecture(m: ModelInfo) -> dict[str, Any]:
    tokenizer = "Qwen3" if m.id.startswith("qwen/") else "Other"
    return {"modality": "text->text", "input_modalities": ["text"], "output_modalities": ["text"],
            "tokenizer": tokenizer, "instruct_type": None}


def _model_entry(core: EmulatorCore, m: ModelInfo) -> dict[str, Any]:
    providers = core.scenario.providers
    c = _cheapest(providers)
    supported = sorted({x for p in providers for x in p.supported_parameters}, key=ALL_PARAMETERS.index)
    return {
        "id": m.id,
        "canonical_slug": m.canonical_slug or m.id,
        "hugging_face_id": "",
        "name": m.name or m.id,
        "created": 1768528898,
        "description": "Served by the draftgen OpenRouter emulator.",
        "context_length": m.context_length,
        "architecture": architecture(m),
        "pricing": {"prompt": per_token(c.price_prompt), "completion": per_token(c.price_completion),
                    "request": "0", "image": "0", "web_search": "0", "internal_reasoning": "0",
                    "input_cache_read": per_token(c.price_prompt / 4), "input_cache_write": "0"},
        "top_provider": {"context_length": m.context_length, "max_completion_tokens": m.max_completion_tokens,
                         "is_moderated": False},
        "per_request_limits": None,
        "supported_parameters": supported,
        "default_parameters": {},
        "reasoning": {"supported_efforts": [], "default_effort": None, "default_enabled": True, "mandatory": False},
    }


async def models(request: web.Request) -> web.Response:
    core = request.app[CORE]
    data = [_model_entry(core, m) for m in core.scenario.models]
    return _json({"data": data, "total_count": len(data), "links": {"next": None}})


def _percentiles(lo: float, hi: float, scale: float = 1.0) -> dict[str, float]:
    span = hi - lo
    return {"p50": round((lo + span * 0.5) * scale, 3), "p75": round((lo + span * 0.75) * scale, 3),
            "p90": round((lo + span * 0.9) * scale, 3), "p99": round((lo + span * 0.99) * scale, 3)}


def endpoint_entry(m: ModelInfo, p: Provider) -> dict[str, Any]:
    """One provider endpoint of ``m`` as ``/endpoints`` lists it (prices per token, as strings)."""
    return {
        "name": f"{p.name} | {m.canonical_slug or m.id}",
        "model_id": m.id,
        "model_name": m.name or m.id,
        "context_length": p.context_length,
        "pricing": {"prompt": per_token(p.price_prompt), "completion": per_token(p.price_completion),
                    "request": "0", "image": "0", "discount": 0},
        "provider_name": p.name,
        "tag": p.tag,
        "quantization": p.quantization,
        "max_completion_tokens": p.max_completion_tokens,
        "max_prompt_tokens": None,
        "supported_parameters": list(p.supported_parameters),
        "status": 0,
        "uptime_last_5m": round(100 * (1 - p.fault_total), 2),
        "uptime_last_30m": round(100 * (1 - p.fault_total), 2),
        "uptime_last_1d": round(100 * (1 - p.fault_total), 2),
        "supports_implicit_caching": False,
        # latency in milliseconds (time to first token), throughput in tokens/s
        "latency_last_30m": _percentiles(p.ttft_s[0], p.ttft_s[1], 1000.0),
        "throughput_last_30m": _percentiles(p.tokens_per_s[1], p.tokens_per_s[0]),
    }


async def endpoints(request: web.Request) -> web.Response:
    core = request.app[CORE]
    mid = f"{request.match_info['author']}/{request.match_info['slug']}"
    info = next((m for m in core.scenario.models if m.id == mid or m.canonical_slug == mid), None)
    if info is None:
        if not core.scenario.accept_any_model:
            return _fail(core, ApiError(404, f"Model {mid} not found", "not_found",
                                        availability=availability("model_not_found", False, requested_models=[mid])))
        info = ModelInfo(mid)
    return _json({"data": {"id": info.id, "name": info.name or info.id, "created": 1768528898,
                           "description": "Served by the draftgen OpenRouter emulator.",
                           "architecture": architecture(info),
                           "endpoints": [endpoint_entry(info, p) for p in core.scenario.providers]}})
