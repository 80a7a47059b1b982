"""Chat-completion bodies and SSE chunks in OpenRouter's wire shape, with provider quirks applied.

Non-streamed (``completion_body``)::

    {"id": "gen-…", "provider": "DeepInfra", "model": "…", "object": "chat.completion", "created": …,
     "system_fingerprint": null,
     "choices": [{"index": 0, "logprobs": null|{"content": […]}, "finish_reason": "stop",
                  "native_finish_reason": "stop",
                  "message": {"role": "assistant", "content": "…", "refusal": null, "reasoning": "…",
                              "reasoning_details": [{"type": "reasoning.text", "text": "…",
                                                     "format": "unknown", "index": 0}]}}],
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
               "completion_tokens_details": {"reasoning_tokens"}, "cost", "is_byok", "cost_details"}}

Streamed: ``data: {chunk}`` events whose deltas carry ``reasoning`` + ``reasoning_details`` or
``content``; a finish chunk; a usage chunk with ``choices: []`` (quirk ``repeat_finish_chunk``: the
finish chunk again, with usage and non-empty choices); ``data: [DONE]``.

Quirks (``Provider`` fields): ``reasoning_field="reasoning_content"`` (no ``reasoning``/details),
``drop_reasoning`` (no text, reasoning_tokens still counted), ``trim_whitespace`` (field edges trimmed),
``omit_cost`` (usage without ``cost``/``cost_details``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from draftgen.emulator.scenarios import Provider
from draftgen.emulator.scripted import Output

__all__ = [
    "DONE",
    "KEEPALIVE",
    "PADDING",
    "Piece",
    "View",
    "chunk",
    "chunk_prefix",
    "completion_body",
    "delta_choice",
    "delta_frags",
    "finish_choice",
    "message_obj",
    "sse",
    "usage_obj",
    "view_of",
]

KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
DONE = b"data: [DONE]\n\n"
PADDING = b"\n         \n\n"


@dataclass
class Piece:
    field: str  # "reasoning" | "content"
    text: str
    tok0: int
    tok1: int


@dataclass
class View:
    """The fields as this provider returns them (after quirks), and the pieces to stream."""

    reasoning: str | None
    content: str | None
    pieces: list[Piece]
    logprobs: list[dict[str, Any]] | None  # content logprob entries, or None when not returned
    content_tok0: int
    frags: dict[str, list[bytes]] = field(default_factory=dict)  # encoded delta choices per reasoning_field


def _trim_lengths(text: str) -> tuple[int, int]:
    # Quirk emulation: what a provider that trims field edges removes (never applied to draftgen's data).
    lead = len(text) - len(text.lstrip())
    trail = len(text) - len(text.rstrip()) if lead < len(text) else 0
    return lead, trail


def _trim_pieces(pieces: list[Piece], lead: int, trail: int) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        cut = min(lead, len(p.text))
        lead -= cut
        out.append(Piece(p.field, p.text[cut:], p.tok0, p.tok1))
    for p in reversed(out):
        if trail <= 0:
            break
        cut = min(trail, len(p.text))
        trail -= cut
        p.text = p.text[: len(p.text) - cut]
    return out


def view_of(out: Output, provider: Provider, *, chunk_tokens: int, exclude_reasoning: bool,
            logprobs: bool, partial_tokens: int | None = None, pieces: bool = True) -> View:
    """Apply the provider's quirks to ``out`` (cached on ``out``). ``partial_tokens``: keep only the pieces
    that end before that id index. ``pieces=False``: the text fields only (non-streamed bodies)."""
    hide = exclude_reasoning or provider.drop_reasoning
    want_lp = logprobs and provider.supports_logprobs
    ck = (chunk_tokens if pieces or partial_tokens is not None else 0, provider.trim_whitespace, hide, want_lp,
          partial_tokens, pieces)
    v = out.views.get(ck)
    if v is None:
        v = _view(out, provider.trim_whitespace, hide, want_lp, chunk_tokens, partial_tokens, pieces)
        out.views[ck] = v
    return v


def _view(out: Output, trim: bool, hide: bool, want_lp: bool, chunk_tokens: int, partial_tokens: int | None,
          want_pieces: bool) -> View:
    reasoning = out.reasoning
    content: str | None = out.content
    reasoning_pieces: list[Piece] = []
    content_pieces: list[Piece] = []
    if want_pieces or partial_tokens is not None:
        segs = out.segments(chunk_tokens)
        if partial_tokens is not None:
            segs = [s for s in segs if s.tok1 <= partial_tokens]
        reasoning_pieces = [Piece(s.field, s.text, s.tok0, s.tok1) for s in segs if s.field == "reasoning"]
        content_pieces = [Piece(s.field, s.text, s.tok0, s.tok1) for s in segs if s.field == "content"]
        if partial_tokens is not None:
            reasoning = "".join(s.text for s in reasoning_pieces) if out.reasoning is not None else None
            content = "".join(s.text for s in content_pieces)
    if trim:
        if reasoning is not None:
            lead, trail = _trim_lengths(reasoning)
            reasoning = reasoning[lead: len(reasoning) - trail]
            reasoning_pieces = _trim_pieces(reasoning_pieces, lead, trail)
        if content is not None:
            lead, trail = _trim_lengths(content)
            content = content[lead: len(content) - trail]
            content_pieces = _trim_pieces(content_pieces, lead, trail)
    if hide:
        reasoning = None
        reasoning_pieces = []
    pieces = [p for p in reasoning_pieces + content_pieces if p.text] if want_pieces else []
    lp = out.content_logprobs() if want_lp else None
    if lp is not None and partial_tokens is not None:
        lp = lp[: max(0, partial_tokens - out.content_range[0])]
    return View(reasoning, content, pieces, lp, out.content_range[0])


def usage_obj(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int, provider: Provider) -> dict[str, Any]:
    pc = prompt_tokens * provider.price_prompt / 1e6
    cc = completion_tokens * provider.price_completion / 1e6
    cost = pc + cc
    if provider.omit_cost:  # quirk: the client must price the usage itself
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens, "image_tokens": 0},
        "cost": cost,
        "is_byok": False,
        # Non-BYOK: upstream_inference_cost equals cost (adding both double-counts).
        "cost_details": {"upstream_inference_cost": cost, "upstream_inference_prompt_cost": pc,
                         "upstream_inference_completions_cost": cc},
    }


def message_obj(view: View, provider: Provider) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": view.content, "refusal": None}
    if provider.reasoning_field == "reasoning_content":
        msg["reasoning_content"] = view.reasoning
    else:
        msg["reasoning"] = view.reasoning
        msg["reasoning_details"] = (
            [{"type": "reasoning.text", "text": view.reasoning, "format": "unknown", "index": 0}]
            if view.reasoning else []
        )
    return msg


def completion_body(gen_id: str, created: int, provider: Provider, model: str, view: View, finish_reason: str,
                    usage: dict[str, Any] | None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": {"content": view.logprobs, "refusal": None} if view.logprobs is not None else None,
        "finish_reason": finish_reason,
        "native_finish_reason": finish_reason,
        "message": message_obj(view, provider),
    }
    if error is not None:
        choice["error"] = error
    body: dict[str, Any] = {
        "id": gen_id, "provider": provider.name, "model": model, "object": "chat.completion",
        "created": created, "system_fingerprint": None, "choices": [choice],
    }
    if provider.echo_tier is not None:
        body["service_tier"] = provider.echo_tier
    if usage is not None:
        body["usage"] = usage
    return body


def sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def chunk(gen_id: str, created: int, provider: Provider, model: str, choices: list[dict[str, Any]],
          **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": gen_id, "provider": provider.name, "model": model,
                           "object": "chat.completion.chunk", "created": created, "choices": choices}
    if provider.echo_tier is not None:
        out["service_tier"] = provider.echo_tier
    out.update(extra)
    return out


def delta_choice(piece: Piece, provider: Provider, logprobs: list[dict[str, Any]] | None,
                 content_tok0: int) -> dict[str, Any]:
    delta: dict[str, Any]
    if piece.field == "reasoning":
        if provider.reasoning_field == "reasoning_content":
            delta = {"role": "assistant", "content": "", "reasoning_content": piece.text}
        else:
            delta = {"role": "assistant", "content": "", "reasoning": piece.text,
                     "reasoning_details": [{"type": "reasoning.text", "text": piece.text, "format": "unknown",
                                            "index": 0}]}
        lp = None
    else:
        delta = {"role": "assistant", "content": piece.text, "reasoning": None}
        lp = ({"content": logprobs[piece.tok0 - content_tok0: piece.tok1 - content_tok0], "refusal": None}
              if logprobs is not None else None)
    return {"index": 0, "delta": delta, "finish_reason": None, "native_finish_reason": None, "logprobs": lp}


def delta_frags(view: View, provider: Provider) -> list[bytes]:
    """The JSON of each piece's choice object, encoded once per view and reasoning field."""
    frags = view.frags.get(provider.reasoning_field)
    if frags is None:
        frags = [msgspec.json.encode(delta_choice(p, provider, view.logprobs, view.content_tok0)) for p in view.pieces]
        view.frags[provider.reasoning_field] = frags
    return frags


def chunk_prefix(gen_id: str, created: int, provider: Provider, model: str) -> bytes:
    """``data: {…,"choices":[`` of a chunk; append a choice's JSON and ``]}\n\n``."""
    fields: dict[str, Any] = {"id": gen_id, "provider": provider.name, "model": model,
                              "object": "chat.completion.chunk", "created": created}
    if provider.echo_tier is not None:
        fields["service_tier"] = provider.echo_tier
    head = msgspec.json.encode(fields)
    return b"data: " + head[:-1] + b',"choices":['


def finish_choice(finish_reason: str) -> dict[str, Any]:
    return {"index": 0, "delta": {"content": "", "reasoning": None}, "finish_reason": finish_reason,
            "native_finish_reason": finish_reason, "logprobs": None}
