"""Whether a well-formed response is the one that was asked for: the model, the providers, complete.

Plain functions over a ``backends.base.Completion`` (no I/O), applied to every response before its record
is built by ``engine.intake.check_response``, the one intake of every path (sync, hedge, batch, import).
Each refusal is an ``assemble.UnusableResponse`` (retryable): the engine books what the response was
billed, retries the sample elsewhere (every provider the response named goes to that sample's
``provider.ignore``, or for a batch result to later batches' ``provider.only``) and, with
``quality.keep_unusable``, may keep the last one flagged ``unusable:<kind>`` (sync only). Kinds:

    model_mismatch      the response names another model than the one requested (``model_matches``:
                        the requested id, its versions with a date suffix such as ``moonshotai/kimi-k2.5-0127``
                        for ``moonshotai/kimi-k2.5``, and ``quality.model_aliases`` are the same model)
    provider_changed    a stream whose chunks named more than one provider: no one provider's text
    provider_excluded   a provider the request's routing excluded served it, or one chunk of it
    incomplete          no finish reason at all, or ``finish_reason: length`` at fewer completion tokens
                        than ``quality.min_length_fraction`` of ``max_tokens`` (a provider cut it short)

``record_flags`` lists what the record of a usable response must carry besides its rebuild's flags: the
wire's (``usage_coerced``, ``cost_invalid``, ``reasoning_fields_*``, ``extra_choices``) and
``tool_calls_without_tools`` (structured tool calls came back although the request sent no tools).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from draftgen.backends.base import Completion
from draftgen.engine.assemble import UnusableResponse
from draftgen.engine.health import RoutingGuard
from draftgen.records import Tool

__all__ = ["check_complete", "check_identity", "model_matches", "record_flags"]

#: a version suffix OpenRouter appends to a model's slug in its answers: ``-0127``, ``-04-28``, ``-20250514``
_DATE_SUFFIX = re.compile(r"(-\d{2,8})+")


def _base(model: str) -> str:
    """A model id without its ``:variant`` (``:nitro``, ``:floor``, ``:free``), lower case."""
    return model.split(":", 1)[0].strip().lower()


def model_matches(requested: str, got: str, aliases: Sequence[str] = ()) -> bool:
    """Whether a response naming ``got`` came from the model ``requested``: the same id (case and
    ``:variant`` aside), one of ``aliases``, or either one the other with a date suffix."""
    want, have = _base(requested), _base(got)
    if have == want or have in {_base(a) for a in aliases}:
        return True
    for long, short in ((have, want), (want, have)):
        if long.startswith(short) and _DATE_SUFFIX.fullmatch(long[len(short):]):
            return True
    return False


def check_identity(comp: Completion, *, model: str | None, aliases: Sequence[str] = (),
                   guard: RoutingGuard | None = None, sent_ignore: Sequence[str] | None = None) -> None:
    """Raise ``UnusableResponse`` for a response of another model, a stream that changed provider, or a
    provider (any one the response named) the request's routing excluded."""
    if model is not None:
        for got in comp.models or ([comp.model] if comp.model else []):
            if not model_matches(model, got, aliases):
                raise UnusableResponse(f"model_mismatch ({got} answered for {model}"
                                       f"{', ' + comp.provider if comp.provider else ''})", kind="model_mismatch")
    providers = comp.providers or ([comp.provider] if comp.provider else [])
    if len(providers) > 1:
        raise UnusableResponse(f"provider_changed (one stream named {', then '.join(providers)})",
                               kind="provider_changed")
    if guard is not None:
        for prov in providers:
            why = guard.excluded(prov, sent_ignore)
            if why is not None:
                raise UnusableResponse(f"provider_excluded ({prov}: {why}; it was served all the same)",
                                       kind="provider_excluded")


def check_complete(comp: Completion, max_tokens: int, min_fraction: float, *, require_finish: bool = True) -> None:
    """Raise ``UnusableResponse`` (``incomplete``) for a response with no finish reason (unless not
    ``require_finish``), or cut by the length limit far below ``max_tokens`` (billed tokens, or returned
    ids, under ``min_fraction`` of it)."""
    prov = f", {comp.provider}" if comp.provider else ""
    if comp.finish_reason is None and require_finish:
        raise UnusableResponse(f"incomplete (no finish_reason{prov})", kind="incomplete")
    if comp.finish_reason == "length" and min_fraction > 0:
        billed = comp.usage.completion_tokens if comp.usage is not None else 0
        got = max(billed, len(comp.output_ids or ()))
        if got < min_fraction * max_tokens:
            raise UnusableResponse(f"incomplete (finish_reason length at {got:,} of max_tokens {max_tokens:,} "
                                   f"completion tokens{prov})", kind="incomplete")


def record_flags(comp: Completion, tools: Sequence[Tool] | None) -> list[str]:
    """The flags the record of ``comp`` carries besides its rebuild's (see the module docstring); ``tools``:
    the tools its request sent. Every path's records carry them (``engine.sample``, ``engine.batch_ingest``)."""
    flags = list(comp.flags)
    if comp.tool_calls and not tools:
        flags.append("tool_calls_without_tools")
    return flags
