"""Completion → ResponseRecord, with the token ids of the target model. Plain functions (no I/O).

``output_ids``, in order of preference:

1. ``exact``: the server returned them (vLLM ``return_token_ids``, SGLang ``output_ids``). For SGLang,
   whose ``/generate`` returns raw text, reasoning and content are split from the ids by the profile.
2. ``logprobs``: the provider returned content logprobs and ``tokens.logprobs.output_ids_from_logprobs``
   maps them back to exact content ids (the rest rebuilt by the profile); when its conditions do not
   hold it declines and the ids are reconstructed.
3. ``reconstructed``: ``profile.build_output(reasoning, content, finish_reason, reasoning_tokens=…)``;
   its flags go to ``recon_flags``. Model text is never edited.

``prompt_ids`` are the server's when it returned them, else ``profile.prompt_ids(messages, tools)``.
This runs in a small thread pool: ``tokenizers`` releases the GIL while encoding.

Size: a response may not hold more tokens than it was allowed (``backends.base.token_limit``: max_tokens
plus ``max(16, 1 %)``). ``check_tokens`` looks at the returned ids and the billed completion tokens before
anything is built; ``check_record_tokens`` at the ids the record ended up with (rebuilt ones included).
Either raises a retryable ``too_many_tokens``: such a response is never written as a record.

Usable: a response billed for reasoning (``reasoning_tokens > 0``) that returned no reasoning text in any
field (``reasoning``, ``reasoning_content``, ``reasoning_details``) cannot give the ids the model
generated; ``check_reasoning`` raises ``UnusableResponse`` (retryable, kind ``reasoning_dropped``) for it,
unless the server returned the ids themselves. The engine retries it elsewhere (the provider goes to that
sample's ``provider.ignore``) and, after ``retry.max_attempts``, records a failure, or with
``quality.keep_unusable`` the last such response flagged ``unusable:<kind>``.
"""

from __future__ import annotations

import hashlib
import time

import msgspec

from draftgen.backends.base import Completion, token_limit
from draftgen.errors import RetryableAPIError
from draftgen.records import GenerationSettings, PromptRecord, Provenance, ResponseRecord
from draftgen.tokens import Profile
from draftgen.tokens.logprobs import output_ids_from_logprobs

__all__ = ["Assembler", "UnusableResponse", "check_reasoning", "check_record_tokens", "check_tokens", "request_hash"]

_enc = msgspec.json.Encoder()


def request_hash(prompt: PromptRecord, max_tokens: int) -> str:
    """A stable hash of what was asked: messages, tools and max_tokens (sampling is in run.json)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(_enc.encode(prompt.messages))
    if prompt.tools:
        h.update(_enc.encode(prompt.tools))
    h.update(str(max_tokens).encode())
    return h.hexdigest()


def _too_many(what: str, n: int, max_tokens: int, provider: str | None) -> RetryableAPIError:
    prov = f", {provider}" if provider else ""
    return RetryableAPIError(
        f"too_many_tokens ({n:,} {what} for max_tokens {max_tokens:,}, limit {token_limit(max_tokens):,}{prov}): "
        "an invalid response", kind="too_many_tokens",
    )


def check_tokens(comp: Completion, max_tokens: int) -> None:
    """Refuse a response with more output ids or more billed completion tokens than it was allowed."""
    limit = token_limit(max_tokens)
    if comp.output_ids is not None and len(comp.output_ids) > limit:
        raise _too_many("output ids", len(comp.output_ids), max_tokens, comp.provider)
    if comp.usage is not None and comp.usage.completion_tokens > limit:
        raise _too_many("billed completion tokens", comp.usage.completion_tokens, max_tokens, comp.provider)


def check_record_tokens(rec: ResponseRecord, max_tokens: int) -> None:
    """Refuse a record whose ids (returned, mapped from logprobs or rebuilt from text) are too many."""
    n = len(rec.output_ids) if rec.output_ids is not None else 0
    if n > token_limit(max_tokens):
        raise _too_many(f"{rec.ids_source} output ids", n, max_tokens, rec.provider)


class UnusableResponse(RetryableAPIError):
    """A complete, billed response whose text cannot be used (``reasoning_dropped``, ``provider_excluded``)."""


def check_reasoning(comp: Completion) -> None:
    """Refuse a response billed for reasoning tokens whose reasoning text is missing from every field."""
    u = comp.usage
    if comp.output_ids is None and u is not None and u.reasoning_tokens > 0 and not comp.reasoning:
        prov = f", {comp.provider}" if comp.provider else ""
        raise UnusableResponse(
            f"reasoning_dropped ({u.reasoning_tokens:,} reasoning tokens billed, no text in reasoning, "
            f"reasoning_content or reasoning_details{prov})", kind="reasoning_dropped",
        )


class Assembler:
    """Builds records for one run: one profile, one backend kind.

    ``parse_ids``: the backend's text is not to be trusted, its exact output ids are
    (``Capabilities.output_is_raw_ids``); reasoning and content are parsed from the ids by the profile.
    """

    def __init__(self, profile: Profile, *, use_logprobs: bool = True, provenance: Provenance | None = None,
                 parse_ids: bool = False, settings: GenerationSettings | None = None) -> None:
        self.profile = profile
        self.parse_ids = parse_ids
        self.use_logprobs = use_logprobs
        self.provenance = provenance
        self.settings = settings  # stamped on every record: what a rerun compares its own settings with

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
        quantization: str | None = None,
        extra_flags: list[str] | None = None,
    ) -> ResponseRecord:
        """The record of ``comp``; ``extra_flags`` (``unusable:<kind>``) follow the rebuild's flags."""
        reasoning, content, field = comp.reasoning, comp.content, comp.reasoning_field
        flags: list[str] = []
        if comp.output_ids is not None:
            ids = comp.output_ids
            source = "exact"
            if self.parse_ids:
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
        return ResponseRecord.from_completion(
            comp,
            sample_id=prompt.sample_id,
            dataset=prompt.dataset,
            partition=partition,
            reasoning=reasoning,
            content=content,
            reasoning_field=field,
            output_ids=ids,
            prompt_ids=p_ids,
            ids_source=source,
            recon_flags=flags + extra_flags if extra_flags else flags,
            request_hash=request_hash(prompt, max_tokens),
            max_tokens=max_tokens,
            backend=comp.backend,
            attempts=attempts,
            latency_s=round(latency_s, 4),
            quantization=quantization,
            created_at=round(time.time(), 3),
            provenance=self.provenance,
            settings=self.settings,
        )

    def _map_logprobs(self, comp: Completion) -> tuple[list[int], list[str]] | None:
        if not self.use_logprobs:
            return None
        u = comp.usage
        rec = output_ids_from_logprobs(
            self.profile, comp.logprobs, reasoning=comp.reasoning, finish_reason=comp.finish_reason,
            content=comp.content, reasoning_tokens=u.reasoning_tokens if u is not None else 0,
            tool_calls=comp.tool_calls,
        )
        return None if rec is None else (rec.ids, list(rec.flags))

    def _reconstruct(self, comp: Completion) -> tuple[list[int], list[str]]:
        u = comp.usage
        rec = self.profile.build_output(
            comp.reasoning, comp.content, comp.finish_reason,
            reasoning_tokens=u.reasoning_tokens if u is not None else 0, tool_calls=comp.tool_calls,
        )
        return rec.ids, list(rec.flags)
