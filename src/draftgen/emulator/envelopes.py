"""OpenRouter error envelopes, exactly as the research file documents them.

    {"error": {"code": 429, "message": "...",
               "metadata": {"error_type": "rate_limit_exceeded", "provider_name": "Chutes", ...},
               "availability": {"code": "capacity_exhausted", "retryable": true, "retry_after": 2.0, ...}},
     "user_id": "user_emulator"}

``ApiError`` is what every layer of the emulator returns for a failure; ``error_response`` turns it
into an aiohttp response (JSON envelope, ``Retry-After`` header when set). Plain-text edge errors
(Cloudflare ``error code: 1015`` / ``524``) carry ``text``, which replaces the JSON body.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

__all__ = ["USER_ID", "ApiError", "availability", "error_json", "error_response", "format_retry_after"]

USER_ID = "user_emulator"


def format_retry_after(seconds: float) -> str:
    """Retry-After in whole seconds, except below one second (compressed clocks), where a decimal is sent."""
    if seconds >= 1.0:
        return str(math.ceil(seconds))
    return f"{max(seconds, 0.0):.3f}"


@dataclass
class ApiError:
    status: int
    message: str
    error_type: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    availability: dict[str, Any] | None = None
    retry_after_s: float | None = None
    text: str | None = None  # plain-text body instead of the JSON envelope
    code: int | str | None = None  # error.code when it differs from the HTTP status

    def error_obj(self) -> dict[str, Any]:
        meta = dict(self.metadata)
        if self.error_type is not None:
            meta.setdefault("error_type", self.error_type)
        obj: dict[str, Any] = {"code": self.code if self.code is not None else self.status,
                               "message": self.message, "metadata": meta}
        if self.availability is not None:
            obj["availability"] = self.availability
        return obj


def error_json(err: ApiError) -> bytes:
    return msgspec.json.encode({"error": err.error_obj(), "user_id": USER_ID})


def error_response(err: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    hdrs = dict(headers or {})
    if err.retry_after_s is not None:
        hdrs["Retry-After"] = format_retry_after(err.retry_after_s)
    if err.text is not None:
        return web.Response(status=err.status, body=err.text.encode(), content_type="text/plain", headers=hdrs)
    return web.Response(status=err.status, body=error_json(err), content_type="application/json", headers=hdrs)


def availability(code: str, retryable: bool, *, retry_after: float | None = None,
                 requested_models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"code": code, "retryable": retryable}
    if retry_after is not None:
        out["retry_after"] = round(retry_after, 3)
    out["requested_models"] = requested_models or []
    out.update(extra)
    out["docs_url"] = "https://openrouter.ai/docs/api-reference/errors"
    return out
