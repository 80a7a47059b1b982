"""Response records: ``raw/<dataset>/raw_responses.jsonl`` (``ResponseRecord``), ``failures.jsonl``, attempts,
provider health events, the emulator's ground truth, and the partial views used for fast scans."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from draftgen.records.base import SCHEMA_VERSION
from draftgen.records.prompts import PromptIdView, PromptRecord, ToolCall

# How a record's output_ids were obtained.
#   exact          the server returned token ids (vLLM return_token_ids, SGLang output_ids)
#   logprobs       mapped back from per-token logprob strings/bytes: exact
#   reconstructed  re-encoded from text with the target's profile
IdsSource = Literal["exact", "logprobs", "reconstructed"]


def spend_usd(cost: float, is_byok: bool, upstream_cost: float | None) -> float:
    """What one response cost the account: ``cost``, plus the upstream cost only on BYOK responses
    (where ``cost`` is 0; on other responses ``upstream_inference_cost`` repeats ``cost``)."""
    return cost + (upstream_cost or 0.0) if is_byok else cost


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0
    is_byok: bool = False
    upstream_cost: float | None = None
    #: the upstream gave no ``usage.cost``; ``cost`` was computed from the token counts and the routed prices
    cost_computed: bool = False


class Provenance(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What produced a record: checked against the config by every phase that reads it.

    ``tokenizer_sha256`` is the sha256 of the tokenizer's vocabulary file (``tokens.loader``).
    ``imported_from`` is set by ``draftgen import`` (the source file), never by generate.
    """

    model_id: str
    profile: str
    tokenizer_sha256: str
    imported_from: str | None = None


class GenerationSettings(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """The generation settings a record was made with, besides its ``max_tokens``: the config's ``sampling``,
    ``reasoning`` and ``routing`` sections as plain data, unset fields left out. A rerun compares them with
    its own (``phases.generate.rerun``): what differs is reported, and ``generate --redo changed`` regenerates it."""

    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    reasoning: dict[str, Any] = msgspec.field(default_factory=dict)
    routing: dict[str, Any] = msgspec.field(default_factory=dict)


class ResponseFields(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What came back for one request: the fields a ``backends.base.Completion`` (as the server sent them)
    and a ``ResponseRecord`` (as written) share. Both derive from this one Struct, and
    ``ResponseRecord.from_completion`` is the one place a record is built from a completion.

    ``reasoning`` is the first non-empty of the ``reasoning``, ``reasoning_content`` and joined
    ``reasoning_details[].text`` fields; ``reasoning_field`` names which one carried it.
    """

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_field: str | None = None  # "reasoning" | "reasoning_content" | "reasoning_details" | None
    finish_reason: str | None = None
    native_finish_reason: str | None = None
    provider: str | None = None
    model: str | None = None
    generation_id: str | None = None
    usage: Usage | None = None
    output_ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    ttft_s: float | None = None  # time to the first byte of the answer (streams only)
    #: the service tier that served it, as the response echoed it (``default``, ``flex``, ``priority``);
    #: ``batch`` for a result of OpenRouter's Batch API that echoed none
    service_tier: str | None = None


class ResponseRecord(ResponseFields, omit_defaults=True):
    """One finished sample. A sample is done iff a ResponseRecord with its id is in raw_responses.jsonl.

    Legacy local-SGLang rows carry only ``sample_id`` and ``output_ids``; every other field is optional.
    The fields of ``ResponseFields`` are keyword-only and come after the record's own in the encoded line
    (key order carries no meaning: every reader decodes by name).
    """

    sample_id: str
    dataset: str = ""
    partition: str = "short"
    ids_source: IdsSource = "exact"
    recon_flags: list[str] = msgspec.field(default_factory=list)
    request_hash: str | None = None
    max_tokens: int | None = None
    backend: str | None = None
    attempts: int = 1
    latency_s: float | None = None
    quantization: str | None = None  # of the provider that served it, when the run knows it (routing metadata)
    created_at: float = 0.0
    provenance: Provenance | None = None
    schema_version: int = SCHEMA_VERSION
    #: the sampling, reasoning and routing settings that made it (None: a record from before they were kept,
    #: or one imported from elsewhere)
    settings: GenerationSettings | None = None
    batch_id: str | None = None  # the OpenRouter batch it came from (``endpoint.mode: batch``)

    @classmethod
    def from_completion(cls, comp: ResponseFields, **record: Any) -> ResponseRecord:
        """The record of ``comp``: every ``ResponseFields`` field taken from it, then ``record`` (the
        record's own fields, and any shared field rebuilt from the completion, e.g. ``output_ids``)."""
        shared = {name: getattr(comp, name) for name in ResponseFields.__struct_fields__}
        return cls(**{**shared, **record})


class FailureRecord(msgspec.Struct, omit_defaults=True):
    """Why a sample is not done. Failures are retried on the next run; the latest one per id counts."""

    sample_id: str
    dataset: str
    kind: str  # stable label: "rate_limited", "context_length_exceeded", "retries_exhausted:server", ...
    reason: str
    partition: str = "short"
    status: int | None = None
    permanent: bool = False
    attempts: int = 0
    provider: str | None = None
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION


class AttemptRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One request attempt, in ``logs/attempts.jsonl``: provider health, per-provider figures and the
    report's timelines (retries and failures by kind, requests in flight) are computed from these."""

    sample_id: str
    dataset: str
    attempt: int  # 1 for the first try of the sample in this session
    started_at: float
    ended_at: float
    outcome: str  # "ok", or the failure kind: rate_limited, reasoning_dropped, provider_excluded, idle_timeout, ...
    provider: str | None = None
    quantization: str | None = None
    ttft_s: float | None = None
    completion_tokens: int = 0
    cost: float = 0.0
    schema_version: int = SCHEMA_VERSION
    #: a hedge: a second request for a sample already on the wire (``tail``); its loser's outcome is
    #: ``hedge_lost``, with what it cost (extra spend)
    hedge: bool = False
    #: tokens received before an attempt ended without a response (``abandoned``: an interrupt), counted
    #: from the text at the run's characters per token where the server sends no ids; the sample is at
    #: least this long (``plan`` counts it as a censored length)
    streamed_tokens: int = 0
    #: the server's generation id (``X-Generation-Id``), where it was known: what a later ``GET /generation``
    #: settles an ``abandoned`` attempt's worst case by (``SettlementRecord``)
    generation_id: str | None = None


class SettlementRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What a request abandoned on the wire was really billed, looked up after the fact (``GET /generation``),
    in ``logs/settlements.jsonl``: it replaces the worst case its ``abandoned`` attempt held (``attempt_spend``)."""

    generation_id: str
    sample_id: str
    dataset: str
    held_usd: float  # the worst case the abandoned attempt booked
    billed_usd: float  # what the server says it billed
    at: float
    source: str = "generation"  # how it was learnt: GET /generation
    schema_version: int = SCHEMA_VERSION


class AttemptSpend(msgspec.Struct, kw_only=True):
    """The spend ``logs/attempts.jsonl`` books beyond the raw logs' records (``attempt_spend``): ``billed``
    (responses rejected or unusable, hedges' losers, abandoned requests whose bill was looked up) and
    ``held`` (the worst cases of the ``abandoned`` requests not settled yet, ``abandoned`` of them)."""

    billed: float = 0.0
    held: float = 0.0
    abandoned: int = 0
    settled: int = 0  # abandoned requests whose bill replaced their worst case


def attempt_spend(attempts: Iterable[AttemptRecord], settlements: Iterable[SettlementRecord]) -> AttemptSpend:
    """The attempts' spend, the one rule every reader uses (the budget at resume, ``status``, the report): each
    attempt that left no record is booked at its ``cost``, except an ``abandoned`` one with a settlement for its
    generation id, booked at what that settlement says was billed (never negative)."""
    bills = {s.generation_id: max(0.0, s.billed_usd) for s in settlements}
    out = AttemptSpend()
    for a in attempts:
        if a.outcome == "ok" or not a.cost > 0:
            continue
        if a.outcome != "abandoned":
            out.billed += a.cost
        elif a.generation_id is not None and a.generation_id in bills:
            out.billed += bills[a.generation_id]
            out.settled += 1
        else:
            out.held += a.cost
            out.abandoned += 1
    return out


class ProbeMeasurement(msgspec.Struct, kw_only=True):
    """What ``draftgen probe``'s one request measured of a stream, in ``logs/probe.json``: ``plan`` takes its
    rate and first-token time while the run has no response of its own."""

    model: str
    provider: str | None = None
    completion_tokens: int
    latency_s: float
    ttft_s: float | None = None
    tokens_per_s: float
    """Completion tokens per second after the first token (over the whole latency when unstreamed)."""
    at: float
    schema_version: int = SCHEMA_VERSION


class HealthEvent(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A provider sent to, or back from, the run's cool-down (``logs/health.jsonl``)."""

    at: float
    provider: str
    event: Literal["cooldown", "restored"]
    reason: str = ""  # e.g. "7 of 10 recent outcomes bad: reasoning_dropped 5, server_error 2"
    until: float | None = None
    schema_version: int = SCHEMA_VERSION


class GroundTruthRecord(msgspec.Struct, omit_defaults=True):
    """What the emulated model really sampled, for the BPE audit. Never part of an API response."""

    generation_id: str
    output_ids: list[int]
    prompt_ids: list[int]
    non_canonical: bool = False
    schema_version: int = SCHEMA_VERSION


# -- partial views: the fields a fast scan decodes, kept beside their record ---------------------------------
# A view decodes a record's lines reading only some fields; the rest are skipped (``msgspec.Raw``: left
# undecoded). msgspec fills a missing field with its default, so a view whose field no longer matches its
# record (renamed, retyped) would silently mislabel rows: every view is registered in ``VIEWS`` and
# ``view_mismatches`` (run by tests/records/test_records.py) checks each against its record.


class ResponseScanView(msgspec.Struct):
    """``ResponseRecord`` for resume (``store.scan_responses``) and the planner's observed lengths."""

    sample_id: str
    usage: Usage | None = None
    output_ids: msgspec.Raw = msgspec.Raw(b"")
    provenance: Provenance | None = None
    schema_version: int = SCHEMA_VERSION
    recon_flags: list[str] = msgspec.field(default_factory=list)
    created_at: float = 0.0


class ResponseMergeView(msgspec.Struct):
    """``ResponseRecord`` for merge's scan: ids and flags; the text stays on disk (read back by offset)."""

    sample_id: str
    finish_reason: str | None = None
    provider: str | None = None
    ids_source: IdsSource = "exact"
    recon_flags: list[str] = msgspec.field(default_factory=list)
    output_ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    content: msgspec.Raw = msgspec.Raw()
    tool_calls: msgspec.Raw = msgspec.Raw()
    provenance: Provenance | None = None
    schema_version: int = SCHEMA_VERSION


class ResponseMetricsView(msgspec.Struct):
    """``ResponseRecord`` for the report's metrics; text and id arrays are skipped."""

    sample_id: str
    reasoning_field: str | None = None
    finish_reason: str | None = None
    provider: str | None = None
    usage: Usage | None = None
    output_ids: msgspec.Raw = msgspec.Raw(b"")
    prompt_ids: msgspec.Raw = msgspec.Raw(b"")
    reasoning: msgspec.Raw = msgspec.Raw(b"")
    ids_source: IdsSource = "exact"
    recon_flags: list[str] = msgspec.field(default_factory=list)
    latency_s: float | None = None
    ttft_s: float | None = None
    quantization: str | None = None
    created_at: float = 0.0
    service_tier: str | None = None
    backend: str | None = None  # the server's kind (a self-hosted server names no provider)


class ResponseSettingsView(msgspec.Struct):
    """``ResponseRecord``: what a rerun compares with its own settings (``phases.generate.rerun``)."""

    sample_id: str
    partition: str = "short"
    finish_reason: str | None = None
    max_tokens: int | None = None
    provider: str | None = None
    quantization: str | None = None
    settings: GenerationSettings | None = None


class ResponseIdsView(msgspec.Struct):
    """``ResponseRecord``: a sample's output ids (the report's mismatch examples)."""

    sample_id: str
    output_ids: list[int] | None = None


class ResponseKeyView(msgspec.Struct):
    """``ResponseRecord``: its sample id only (which record of a sample is its last, ``store.last_records``)."""

    sample_id: str


VIEWS: dict[type[msgspec.Struct], type[msgspec.Struct]] = {
    ResponseScanView: ResponseRecord,
    ResponseMergeView: ResponseRecord,
    ResponseMetricsView: ResponseRecord,
    ResponseIdsView: ResponseRecord,
    ResponseSettingsView: ResponseRecord,
    ResponseKeyView: ResponseRecord,
    PromptIdView: PromptRecord,
}


"""Every partial view → the record it reads. A new view is registered here."""


def view_mismatches(view: type[msgspec.Struct], record: type[msgspec.Struct]) -> list[str]:
    """How ``view`` disagrees with ``record`` (empty: it is a faithful view): a field the record lacks, a
    different type, or a different default. A ``msgspec.Raw`` field stands for any type (left undecoded)."""
    rec = {f.name: f for f in msgspec.structs.fields(record)}
    out: list[str] = []
    for f in msgspec.structs.fields(view):
        r = rec.get(f.name)
        if r is None:
            out.append(f"{view.__name__}.{f.name}: not a field of {record.__name__}")
            continue
        if f.type is msgspec.Raw:
            continue
        if f.type != r.type:
            out.append(f"{view.__name__}.{f.name}: type {f.type!r}, {record.__name__} has {r.type!r}")
        if f.required != r.required or (
                not f.required and (f.default, _factory_value(f)) != (r.default, _factory_value(r))):
            out.append(f"{view.__name__}.{f.name}: default differs from {record.__name__}'s")
    return out


def _factory_value(f: msgspec.structs.FieldInfo) -> Any:
    return f.default_factory() if f.default_factory is not msgspec.NODEFAULT else msgspec.NODEFAULT


class ReferenceRow(msgspec.Struct):
    """A line of a reference-ids file for the BPE audit (``audit.reference``): either a
    ``GroundTruthRecord`` (keyed by ``generation_id``) or a record with exact ids keyed by ``sample_id``
    (a ``ResponseRecord`` of a vLLM/SGLang run). Not a view of one record: it reads both."""

    output_ids: list[int] | None = None
    generation_id: str | None = None
    sample_id: str | None = None
    prompt_ids: list[int] | None = None
    non_canonical: bool = False
