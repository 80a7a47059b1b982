"""Completion → ResponseRecord, with the token ids of the target model. Plain functions (no I/O).

``output_ids``, in order of preference:

1. ``exact``: the server returned them (vLLM ``return_token_ids``, SGLang ``output_ids``). For SGLang,
   whose ``/generate`` returns raw text, reasoning and content are split from the ids by the profile.
2. ``logprobs``: the provider returned per-token logprobs covering the whole output, and
   ``draftgen.tokens.logprobs`` maps them back to ids (used only where that module exists and maps them).
3. ``reconstructed``: ``profile.build_output(reasoning, content, finish_reason, reasoning_tokens=…)``;
   its flags go to ``recon_flags``. Model text is never edited.

``prompt_ids`` are the server's when it returned them, else ``profile.prompt_ids(messages, tools)``.
This runs in a small thread pool: ``tokenizers`` releases the GIL while encoding.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ..backends.base import Completion
from ..records import PromptRecord, ResponseRecord
from ..tokens import Profile

__all__ = ["Assembler", "request_hash"]

_enc = msgspec.json.Encoder()


def request_hash(prompt: PromptRecord, max_tokens: int) -> str:
    """A stable hash of what was asked: messages, tools and max_tokens (sampling is in run.json)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(_enc.encode(prompt.messages))
    if prompt.tools:
        h.update(_enc.encode(prompt.tools))
    h.update(str(max_tokens).encode())
    return h.hexdigest()


def _logprob_mapper(profile: Profile) -> Callable[[Completion], tuple[list[int], list[str]] | None] | None:
    """The tokens engineer's logprob → ids mapper, adapted, if the module exists."""
    try:
        lp_mod = importlib.import_module("draftgen.tokens.logprobs")
    except ImportError:
        return None
    fn: Any = getattr(lp_mod, "output_ids_from_logprobs", None)
    if fn is None:
        return None

    def mapper(comp: Completion) -> tuple[list[int], list[str]] | None:
        result = fn(profile, comp.logprobs, reasoning=comp.reasoning, finish_reason=comp.finish_reason)
        if result is None:
            return None
        ids = getattr(result, "ids", result)
        flags = list(getattr(result, "flags", []))
        return list(ids), flags

    return mapper


class Assembler:
    """Builds records for one run: one profile, one backend kind."""

    def __init__(self, profile: Profile, *, use_logprobs: bool = True) -> None:
        self.profile = profile
        self._logprobs = _logprob_mapper(profile) if use_logprobs else None
        params = inspect.signature(profile.build_output).parameters
        self._tool_kw = "tool_calls" in params

    def prompt_ids(self, prompt: PromptRecord) -> list[int]:
        return self.profile.prompt_ids(prompt.messages, prompt.tools)

    def build(
        self,
        prompt: PromptRecord,
        comp: Completion,
        *,
        partition: str,
        max_tokens: int,
        attempts: int,
        latency_s: float,
        prompt_ids: list[int] | None = None,
    ) -> ResponseRecord:
        reasoning, content, field = comp.reasoning, comp.content, comp.reasoning_field
        flags: list[str] = []
        if comp.output_ids is not None:
            ids = comp.output_ids
            source = "exact"
            if comp.backend == "sglang":
                parsed = self.profile.parse_output(ids)
                reasoning, content = parsed.reasoning, parsed.content
                field = None
        else:
            mapped = self._map_logprobs(comp) if comp.logprobs else None
            if mapped is not None:
                ids, flags = mapped
                source = "logprobs"
            else:
                ids, flags = self._reconstruct(comp)
                source = "reconstructed"
        if comp.prompt_ids is not None:
            p_ids = comp.prompt_ids
        elif prompt_ids is not None:
            p_ids = prompt_ids
        else:
            p_ids = self.prompt_ids(prompt)
        return ResponseRecord(
            sample_id=prompt.sample_id,
            dataset=prompt.dataset,
            partition=partition,
            reasoning=reasoning,
            content=content,
            tool_calls=comp.tool_calls,
            reasoning_field=field,
            finish_reason=comp.finish_reason,
            native_finish_reason=comp.native_finish_reason,
            provider=comp.provider,
            model=comp.model,
            generation_id=comp.generation_id,
            usage=comp.usage,
            output_ids=ids,
            prompt_ids=p_ids,
            ids_source=source,  # type: ignore[arg-type]
            recon_flags=flags,
            request_hash=request_hash(prompt, max_tokens),
            max_tokens=max_tokens,
            backend=comp.backend,
            attempts=attempts,
            latency_s=round(latency_s, 4),
            created_at=round(time.time(), 3),
        )

    def _map_logprobs(self, comp: Completion) -> tuple[list[int], list[str]] | None:
        if self._logprobs is None:
            return None
        return self._logprobs(comp)

    def _reconstruct(self, comp: Completion) -> tuple[list[int], list[str]]:
        reasoning_tokens = comp.usage.reasoning_tokens if comp.usage is not None else 0
        if self._tool_kw:
            rec = self.profile.build_output(  # type: ignore[call-arg]
                comp.reasoning, comp.content, comp.finish_reason, reasoning_tokens=reasoning_tokens,
                tool_calls=comp.tool_calls,
            )
            return rec.ids, list(rec.flags)
        rec = self.profile.build_output(comp.reasoning, comp.content, comp.finish_reason, reasoning_tokens=reasoning_tokens)
        flags = list(rec.flags)
        if comp.tool_calls:
            flags.append("tool_calls_not_in_ids")
        return rec.ids, flags
