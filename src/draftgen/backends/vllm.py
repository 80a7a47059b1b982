"""vLLM's OpenAI-compatible server with ``return_token_ids``: exact prompt and output token ids.

Same protocol as ``openrouter.OpenAIChatBackend`` plus ``"return_token_ids": true`` in the body. vLLM then
returns ``prompt_token_ids`` (top level, or in the first stream chunk) and ``choices[0].token_ids`` (whole,
or per delta when streaming); both land in ``Completion.prompt_ids``/``output_ids`` and the record's
``ids_source`` is ``exact``. A server too old to know the flag ignores it (the fields are missing, or
``null`` as current vLLM sends them when not asked); the engine then rebuilds the ids from text.

Both shapes of the reasoning parser's output are read (``wire.pick_reasoning``, ``sse.ChatStream``):
current vLLM's ``message.reasoning`` / ``delta.reasoning`` (``reasoning_content`` was removed, vLLM PR
#33402) and older servers' ``reasoning_content``; the record's ``reasoning_field`` says which came.
Errors, by ``backends.errors.classify_http`` / ``error_from_wire``: current vLLM nests them as
``{"error": {"message", "type", "param", "code"}}`` (in a non-2xx body, or as a chunk of a 200 stream where ``code``
is the status), older vLLM sends them flat as ``{"object": "error", "message", "type", "param",
"code"}``. Either way 5xx and 408/429 are retryable; other 4xx are permanent (a context-length message
is ``context_length_exceeded``).

The ids are checked against the usage vLLM reports for them: output ids that do not number
``usage.completion_tokens``, or prompt ids that do not number ``usage.prompt_tokens``, mean ids were lost
on the way (a chunk without its ``token_ids``, say) and the response is retried (``bad_response``)
rather than recorded as exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from draftgen.backends.base import Capabilities, Completion, CompletionRequest, sampling_body
from draftgen.backends.http import Bounds
from draftgen.backends.openrouter import OpenAIChatBackend
from draftgen.errors import RetryableAPIError
from draftgen.tokens import profile_class

if TYPE_CHECKING:
    from draftgen.config import RunConfig

__all__ = ["VLLM_CAPABILITIES", "VLLMBackend", "build_vllm"]

#: A server of one's own returning exact prompt and output ids.
VLLM_CAPABILITIES = Capabilities(exact_ids=True, logprobs=True, self_hosted=True, hidden_states=True,
                                 acceptance="metrics")


class VLLMBackend(OpenAIChatBackend):
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        model: str,
        stream: bool = True,
        reasoning: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        super().__init__(
            session, base_url, model=model, stream=stream, openrouter=False, reasoning=reasoning,
            sampling=sampling, extra={"return_token_ids": True, **(extra or {})}, name="vllm", bounds=bounds,
        )
        self.capabilities = VLLM_CAPABILITIES

    async def send(self, req: CompletionRequest) -> Completion:
        comp = await super().send(req)
        u = comp.usage
        if u is not None:
            if comp.output_ids is not None and u.completion_tokens and len(comp.output_ids) != u.completion_tokens:
                raise RetryableAPIError(
                    f"bad_response ({len(comp.output_ids)} token_ids but usage.completion_tokens "
                    f"{u.completion_tokens}, {self._where})", kind="bad_response")
            if comp.prompt_ids is not None and u.prompt_tokens and len(comp.prompt_ids) != u.prompt_tokens:
                raise RetryableAPIError(
                    f"bad_response ({len(comp.prompt_ids)} prompt_token_ids but usage.prompt_tokens "
                    f"{u.prompt_tokens}, {self._where})", kind="bad_response")
        return comp


def build_vllm(cfg: RunConfig, session: aiohttp.ClientSession, url: str, bounds: Bounds) -> VLLMBackend:
    """``endpoint.kind`` ``vllm``: the profile's thinking switch goes in ``chat_template_kwargs``."""
    kwarg = profile_class(cfg.model.profile).thinking_kwarg
    extra = {"chat_template_kwargs": {kwarg: cfg.model.thinking}} if kwarg else None
    return VLLMBackend(session, url, model=cfg.model.id, stream=cfg.endpoint.stream, sampling=sampling_body(cfg),
                       extra=extra, bounds=bounds)
