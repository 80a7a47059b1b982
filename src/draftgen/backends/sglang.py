"""SGLang's native ``POST {root}/generate``: token ids in, exact ``output_ids`` out.

Request: ``{"input_ids": [...], "sampling_params": {"max_new_tokens", "temperature", "top_p", "stop"},
"stream": bool}``; the prompt ids are rendered by the target's profile (``CompletionRequest.prompt_ids``),
so the prompt the server saw is exactly the one recorded. Response (whole, or one SSE event per update
ending in ``data: [DONE]``): ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type":
"stop"|"length"|"abort", ...}, "prompt_tokens", "completion_tokens", "cached_tokens"}}``.

Streaming comes in two shapes, told apart without configuration: by default each event repeats the text
and ids so far (cumulative); a server started with ``--incremental-streaming-output`` sends only the new
text and ids. ``meta_info.completion_tokens`` is the running total in both, so the second event that
brings ids decides: ``len(ids so far) + len(new) == completion_tokens`` is incremental, ``len(new) ==
completion_tokens`` with the ids so far as its prefix is cumulative (the two cannot both hold once ids
were seen). Every later event is checked against the mode and the total; an event that fits neither is
a retryable ``bad_stream``, never silently mis-joined ids. Events without ``completion_tokens`` (not
SGLang as released) fall back to the prefix test alone. Incremental texts are joined; the whole text is
kept as content, and the engine splits reasoning/content from the ids with the profile. A response whose
``output_ids`` do not number ``completion_tokens`` is refused (retryable ``bad_response``).

``root`` is the base URL with a trailing ``/v1`` or ``/api/v1`` removed. A streamed body may resend
everything in each event, so it is bounded per event (``Bounds.body_cap``), by its id count and by the
deadline rather than by its total size.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec

from draftgen.backends.base import (
    Capabilities,
    Completion,
    CompletionRequest,
    WireMeter,
    sampling_body,
    token_limit,
)
from draftgen.backends.errors import (
    TRANSPORT_ERRORS,
    WireError,
    classify_http,
    error_from_wire,
    translate_exception,
)
from draftgen.backends.http import (
    Bounds,
    HttpBackend,
    drop_none,
    post_json,
    read_body,
    read_error_body,
    read_events,
    within_deadline,
)
from draftgen.backends.wire import check_completion
from draftgen.errors import ConfigError, RetryableAPIError
from draftgen.records import Usage

if TYPE_CHECKING:
    from draftgen.config import RunConfig

__all__ = ["SGLANG_CAPABILITIES", "SGLangBackend", "build_sglang", "sglang_root"]

#: Token ids in (rendered by the target's profile), exact ids out; reasoning/content parsed from the ids.
SGLANG_CAPABILITIES = Capabilities(exact_ids=True, needs_prompt_ids=True, output_is_raw_ids=True, self_hosted=True,
                                   acceptance="meta_info")

_enc = msgspec.json.Encoder()


class _Finish(msgspec.Struct):
    type: str | None = None
    message: Any = None


class _Meta(msgspec.Struct):
    id: str | None = None
    finish_reason: _Finish | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


class _GenOut(msgspec.Struct):
    text: str | None = None
    output_ids: list[int] | None = None
    meta_info: _Meta | None = None
    error: Any = None


_dec = msgspec.json.Decoder(_GenOut)


def sglang_root(base_url: str) -> str:
    url = base_url.rstrip("/")
    for suffix in ("/api/v1", "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


def _decode(data: bytes, where: str) -> _GenOut:
    try:
        out = _dec.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise RetryableAPIError(f"bad_json (not a /generate response, {where})", kind="bad_json") from None
    if out.error is not None:
        # the same envelope shapes as the chat servers, or a bare string
        err = out.error
        try:
            wire_err = msgspec.convert(err, WireError) if isinstance(err, dict) else WireError(message=str(err))
        except msgspec.ValidationError:
            wire_err = WireError(message=str(err))
        raise error_from_wire(wire_err, 200, where=where)
    return out


class SGLangBackend(HttpBackend):
    name = "sglang"
    capabilities = SGLANG_CAPABILITIES

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        stream: bool = False,
        sampling: Mapping[str, Any] | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        super().__init__(session, sglang_root(base_url), bounds=bounds)
        self.stream = stream
        s = dict(sampling or {})
        self._sampling = drop_none({"temperature": s.get("temperature"), "top_p": s.get("top_p"), "stop": s.get("stop")})
        self._url = self.base_url + "/generate"
        self._where = f"POST {self._url}"

    async def send(self, req: CompletionRequest) -> Completion:
        if req.prompt_ids is None:
            raise ConfigError("the sglang backend needs prompt token ids; set model.profile and model.tokenizer")
        body = _enc.encode({
            "input_ids": req.prompt_ids,
            "sampling_params": {**self._sampling, "max_new_tokens": req.max_tokens},
            "stream": self.stream,
        })
        cap = self.bounds.body_cap(req.max_tokens)
        try:
            async with self.session.post(self._url, data=body) as resp:
                if resp.status != 200:
                    raise classify_http(resp.status, await read_error_body(resp), headers=resp.headers,
                                        where=self._where)
                if self.stream and resp.content_type == "text/event-stream":
                    out = await self._read_stream(resp, req.max_tokens, cap, req.meter)
                else:
                    out = _decode(await read_body(resp, cap, where=self._where), self._where)
        except TRANSPORT_ERRORS as exc:
            raise translate_exception(exc, where=self._where) from None
        return check_completion(self._completion(out, req))

    async def generate_raw(self, body: Mapping[str, Any], *, max_tokens: int) -> bytes:
        """``body`` posted to ``/generate`` as given, unstreamed (accept reads the reply's ``meta_info``,
        which ``Completion`` does not carry): the reply's bytes, within the bounds of ``max_tokens``
        (deadline, body cap), errors classified and translated as ``send``'s."""
        data = _enc.encode(body)
        return await within_deadline(
            post_json(self.session, self._url, data, cap=self.bounds.body_cap(max_tokens), where=self._where),
            self.bounds.deadline_s(max_tokens), where=self._where)

    async def _read_stream(self, resp: aiohttp.ClientResponse, max_tokens: int, cap: int,
                           meter: WireMeter | None = None) -> _GenOut:
        # Cumulative events repeat everything so far, so the body as a whole is not bounded by ``cap``:
        # each event is, the ids are (``token_limit``), and so is the time.
        acc = _StreamIds(max_tokens, self._where)
        done = False

        def take(payload: bytes) -> None:
            nonlocal done
            if payload[:6] == b"[DONE]":
                done = True
                return
            acc.feed(_decode(payload, self._where))
            if meter is not None:
                meter.data(0, len(acc.ids), time.monotonic())

        await read_events(resp, take, idle_timeout_s=self.bounds.idle_timeout_s, max_bytes=None,
                          max_event_bytes=cap, where=self._where)
        last = acc.last
        if last is None or (not done and (last.meta_info is None or last.meta_info.finish_reason is None)):
            raise RetryableAPIError("stream_truncated (the /generate stream ended early)", kind="stream_truncated")
        return _GenOut(text=acc.text(), output_ids=acc.ids, meta_info=last.meta_info)

    def _completion(self, out: _GenOut, req: CompletionRequest) -> Completion:
        meta = out.meta_info or _Meta()
        ftype = meta.finish_reason.type if meta.finish_reason is not None else None
        if ftype == "abort":
            msg = meta.finish_reason.message if meta.finish_reason is not None else None
            raise RetryableAPIError(f"aborted (the server aborted the request: {msg})", kind="aborted")
        ids = out.output_ids if out.output_ids is not None else []
        if meta.completion_tokens is not None and meta.completion_tokens != len(ids):
            raise RetryableAPIError(f"bad_response ({len(ids)} output ids but completion_tokens "
                                    f"{meta.completion_tokens}, {self._where})", kind="bad_response")
        return Completion(
            backend=self.name,
            content=out.text,
            finish_reason=ftype,
            native_finish_reason=ftype,
            generation_id=meta.id,
            usage=Usage(
                prompt_tokens=meta.prompt_tokens or len(req.prompt_ids or ()),
                completion_tokens=meta.completion_tokens if meta.completion_tokens is not None else len(ids),
                cached_tokens=meta.cached_tokens or 0,
            ),
            output_ids=ids,
            prompt_ids=req.prompt_ids,
            cost_missing=True,
        )


class _StreamIds:
    """The ids and text of a streamed ``/generate`` response, cumulative or incremental (see the module
    docstring): the mode is decided by the first event that can tell, then every event is checked."""

    __slots__ = ("_parts", "_text", "ids", "last", "limit", "max_tokens", "mode", "where")

    def __init__(self, max_tokens: int, where: str) -> None:
        self.max_tokens = max_tokens
        self.limit = token_limit(max_tokens)
        self.where = where
        self.mode: str | None = None  # "cumulative" | "incremental" once known
        self.ids: list[int] = []
        self._text: str | None = None  # the latest text (cumulative, or the only event so far)
        self._parts: list[str] = []  # incremental texts
        self.last: _GenOut | None = None

    def _bad(self, why: str) -> RetryableAPIError:
        return RetryableAPIError(f"bad_stream (/generate stream: {why}, {self.where})", kind="bad_stream")

    def feed(self, out: _GenOut) -> None:
        new = out.output_ids or []
        total = out.meta_info.completion_tokens if out.meta_info is not None else None
        if self.mode is None and self.ids:
            self.mode = self._decide(new, total)
            if self.mode == "incremental" and self._text:
                self._parts.append(self._text)
        if self.mode == "incremental":
            if total is not None and total != len(self.ids) + len(new):
                raise self._bad(f"{len(self.ids)} ids so far and {len(new)} new, but completion_tokens {total}")
            self.ids.extend(new)
            if out.text:
                self._parts.append(out.text)
        else:  # cumulative, or no ids yet (both readings agree)
            if total is not None and total != len(new):
                raise self._bad(f"{len(new)} ids in a cumulative event, but completion_tokens {total}")
            if len(new) < len(self.ids) or new[: len(self.ids)] != self.ids:
                raise self._bad("a cumulative event does not extend the ids so far")
            self.ids = list(new)
            if out.text is not None:
                self._text = out.text
        if len(self.ids) > self.limit:
            raise RetryableAPIError(f"too_many_tokens ({len(self.ids)} output ids for max_new_tokens "
                                    f"{self.max_tokens}, {self.where})", kind="too_many_tokens")
        self.last = out

    def _decide(self, new: list[int], total: int | None) -> str:
        seen = len(self.ids)
        if total is not None:
            if total == seen + len(new):
                return "incremental"
            if total == len(new) and new[:seen] == self.ids:
                return "cumulative"
            raise self._bad(f"{seen} ids so far and {len(new)} in this event fit neither cumulative nor "
                            f"incremental output for completion_tokens {total}")
        # no running total: a cumulative event repeats the ids so far
        return "cumulative" if len(new) >= seen and new[:seen] == self.ids else "incremental"

    def text(self) -> str | None:
        return "".join(self._parts) if self.mode == "incremental" else self._text


def build_sglang(cfg: RunConfig, session: aiohttp.ClientSession, url: str, bounds: Bounds) -> SGLangBackend:
    """``endpoint.kind`` ``sglang``."""
    return SGLangBackend(session, url, stream=cfg.endpoint.stream, sampling=sampling_body(cfg), bounds=bounds)
