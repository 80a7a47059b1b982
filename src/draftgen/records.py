"""Typed records: every JSONL row draftgen reads or writes, with its schema version.

Files and the record each line holds:

    prepared/<dataset>/prompts.jsonl      PromptRecord
    prepared/<dataset>/stats.json         DatasetStats
    raw/<dataset>/raw_responses.jsonl     ResponseRecord (also legacy SGLang rows: sample_id + output_ids)
    raw/<dataset>/failures.jsonl          FailureRecord
    emulator ground truth (--ground-truth) GroundTruthRecord
    audit/audit.json                      AuditReport
    run.json                              RunManifest

Encoding and decoding happen only in ``store``. Records are msgspec Structs: unknown keys in input are
ignored (forward compatibility), missing optional fields take their defaults, and a wrong type is an
InputError naming the file, line and field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from .columns import SpeculatorsMetadata
from .errors import InputError

__all__ = [
    "MANIFEST_LAYOUT",
    "SCHEMA_VERSION",
    "VIEWS",
    "AcceptReport",
    "AcceptanceFigures",
    "AttemptRecord",
    "AuditReport",
    "BillingExample",
    "DatasetAudit",
    "DatasetStats",
    "ExcludedSample",
    "FailureRecord",
    "FunctionCall",
    "GroundTruthRecord",
    "HealthEvent",
    "HiddenChecksSummary",
    "HiddenCounts",
    "HiddenDatasetLine",
    "HiddenExportReport",
    "HiddenExportSample",
    "HiddenIndexRecord",
    "HiddenLayerIds",
    "HiddenManifest",
    "HiddenSampleEntry",
    "HiddenStatesReport",
    "HiddenTarget",
    "IdsSource",
    "LockHolder",
    "MergeManifest",
    "MergeStats",
    "MergedDatasetStats",
    "MergedFile",
    "Message",
    "MismatchExample",
    "PromptIdView",
    "PromptRecord",
    "Provenance",
    "ReferenceRow",
    "ResponseFields",
    "ResponseIdsView",
    "ResponseMergeView",
    "ResponseMetricsView",
    "ResponseRecord",
    "ResponseScanView",
    "RunManifest",
    "SpecForgeConversationRow",
    "SpecForgeMessage",
    "SpecForgePromptRow",
    "SpeculatorsMetadata",
    "SpeculatorsRow",
    "StructuralExample",
    "TeacherResult",
    "ThroughputFigures",
    "Tool",
    "ToolCall",
    "ToolFunction",
    "TrainLogRecord",
    "TrainReport",
    "Usage",
    "check_ids",
    "spend_usd",
    "view_mismatches",
]

from .schema import SCHEMA_VERSION

# How a record's output_ids were obtained.
#   exact          the server returned token ids (vLLM return_token_ids, SGLang output_ids)
#   logprobs       mapped back from per-token logprob strings/bytes: exact
#   reconstructed  re-encoded from text with the target's profile
IdsSource = Literal["exact", "logprobs", "reconstructed"]


class FunctionCall(msgspec.Struct, omit_defaults=True):
    name: str
    arguments: str = ""


class ToolCall(msgspec.Struct, omit_defaults=True):
    id: str = ""
    type: str = "function"
    function: FunctionCall | None = None


class ToolFunction(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    # A JSON schema object; its shape is the tool author's, so it stays a mapping.
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct, omit_defaults=True):
    type: str = "function"
    function: ToolFunction | None = None


class Message(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class PromptRecord(msgspec.Struct, omit_defaults=True):
    sample_id: str
    dataset: str
    messages: list[Message]
    tools: list[Tool] | None = None
    partition: str = "short"
    prompt_tokens: int | None = None
    content_hash: str = ""
    source: str | None = None  # "file:line" or "hf:name[split]#row"
    turn_index: int | None = None
    schema_version: int = SCHEMA_VERSION


def check_ids(ids: list[int] | None, vocab_size: int, where: str, name: str) -> None:
    """Refuse token ids outside ``[0, vocab_size)``; ``where`` is ``file:line``."""
    if not ids:
        return
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise InputError(f"{where}: {name} holds id {bad}, outside the tokenizer's vocabulary [0, {vocab_size}); "
                         "the record is corrupt or from another model: remove that line or regenerate it")


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


class DatasetStats(msgspec.Struct, omit_defaults=True):
    dataset: str
    samples: int = 0
    duplicates_removed: int = 0
    bad_lines_skipped: int = 0
    prompt_tokens: int = 0
    short: int = 0
    long: int = 0
    source: str = ""
    rows_read: int = 0  # source rows read (before multi-turn cuts, dedupe and sampling)
    not_selected: int = 0  # unique prompts left out by max_samples
    max_prompt_tokens: int = 0
    multi_turn: str = ""  # "last" | "all"
    fingerprint: str = ""  # hash of the inputs that decide prompts.jsonl; equal → prepare is a no-op
    schema_version: int = SCHEMA_VERSION


class MismatchExample(msgspec.Struct, omit_defaults=True):
    sample_id: str
    kind: str  # "tokenization" | "semantic"
    position: int
    ours: list[str]
    reference: list[str]
    cause: str = ""  # semantic: the record flag that explains it (junction_restored, reasoning_dropped, ...)


class StructuralExample(msgspec.Struct, omit_defaults=True):
    """One structural finding of the audit (the first few per dataset)."""

    sample_id: str
    kind: str  # missing_end_of_turn, stray_special, decode_mismatch, prompt_mismatch, ...
    detail: str = ""


class BillingExample(msgspec.Struct, omit_defaults=True):
    """A sample whose rebuilt completion length differs from the billed one, and why."""

    sample_id: str
    billed: int
    rebuilt: int
    cause: str


class ExcludedSample(msgspec.Struct, omit_defaults=True):
    """A sample the audit keeps out of the merge, and why (``audit.verdict.EXCLUSION_REASONS``)."""

    sample_id: str
    reason: str
    detail: str = ""


class DatasetAudit(msgspec.Struct, omit_defaults=True):
    dataset: str
    records: int = 0
    excluded: list[ExcludedSample] = msgspec.field(default_factory=list)
    excluded_by_reason: dict[str, int] = msgspec.field(default_factory=dict)
    kept: int = 0  # records merge may use (records − excluded)
    kept_billed_completion_tokens: int = 0
    kept_rebuilt_completion_tokens: int = 0
    kept_reference_compared: int = 0
    kept_semantic_mismatch: int = 0
    truncated: int = 0  # finish_reason length: the model's real tokens, kept
    structural_failures: dict[str, int] = msgspec.field(default_factory=dict)
    failed_sample_ids: list[str] = msgspec.field(default_factory=list)
    flags: dict[str, int] = msgspec.field(default_factory=dict)
    ids_source: dict[str, int] = msgspec.field(default_factory=dict)
    billed_completion_tokens: int = 0
    rebuilt_completion_tokens: int = 0
    billing_mismatched_samples: int = 0
    billing_explanations: dict[str, int] = msgspec.field(default_factory=dict)
    reference_compared: int = 0
    exact_match: int = 0
    tokenization_mismatch: int = 0
    semantic_mismatch: int = 0
    examples: list[MismatchExample] = msgspec.field(default_factory=list)
    duplicates: int = 0
    structural_failed_samples: int = 0  # samples with at least one structural failure
    structural_examples: list[StructuralExample] = msgspec.field(default_factory=list)
    prompt_checked: int = 0
    billing_checked: int = 0
    billing_examples: list[BillingExample] = msgspec.field(default_factory=list)
    reference_missing: int = 0  # records without a reference entry (when a reference was given)
    prompt_reference_mismatch: int = 0  # prompt_ids differing from the reference's
    tokenization_mismatch_ids: list[str] = msgspec.field(default_factory=list)
    semantic_mismatch_ids: list[str] = msgspec.field(default_factory=list)


class AuditReport(msgspec.Struct, omit_defaults=True):
    profile: str
    datasets: list[DatasetAudit]
    overall: DatasetAudit
    thresholds_broken: list[str] = msgspec.field(default_factory=list)
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION
    reference: str | None = None  # the reference-ids file used for the BPE audit
    assumptions: list[str] = msgspec.field(default_factory=list)  # the profile's documented guesses
    forced: list[str] = msgspec.field(default_factory=list)  # provenance differences accepted with --force
    verdict: str = ""  # the one-line verdict: "PASS: …" or "FAIL: …"


class LockHolder(msgspec.Struct, kw_only=True):
    """The text of a run directory's ``.draftgen.lock`` while a writer holds it."""

    pid: int
    command: str
    since: float


class RunManifest(msgspec.Struct, omit_defaults=True):
    """run.json: what produced this run directory. Written atomically; secrets removed from argv."""

    config_hash: str
    config: dict[str, Any]
    argv: list[str]
    versions: dict[str, str]
    git_sha: str | None = None
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION


# -- partial views: the fields a fast scan decodes, kept beside their record ---------------------------------
# A view decodes a record's lines reading only some fields; the rest are skipped (``msgspec.Raw``: left
# undecoded). msgspec fills a missing field with its default, so a view whose field no longer matches its
# record (renamed, retyped) would silently mislabel rows: every view is registered in ``VIEWS`` and
# ``view_mismatches`` (run by tests/test_records.py) checks each against its record.


class ResponseScanView(msgspec.Struct):
    """``ResponseRecord`` for resume (``store.scan_responses``) and the planner's observed lengths."""

    sample_id: str
    usage: Usage | None = None
    output_ids: msgspec.Raw = msgspec.Raw(b"")
    provenance: Provenance | None = None
    schema_version: int = SCHEMA_VERSION


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


class ResponseIdsView(msgspec.Struct):
    """``ResponseRecord``: a sample's output ids (the report's mismatch examples)."""

    sample_id: str
    output_ids: list[int] | None = None


class PromptIdView(msgspec.Struct):
    """``PromptRecord``: the id and content hash of a prepared prompt (indexes of prompts.jsonl)."""

    sample_id: str
    content_hash: str = ""


VIEWS: dict[type[msgspec.Struct], type[msgspec.Struct]] = {
    ResponseScanView: ResponseRecord,
    ResponseMergeView: ResponseRecord,
    ResponseMetricsView: ResponseRecord,
    ResponseIdsView: ResponseRecord,
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


# -- merge outputs: merged/stats.json, merged/manifest.json and the export rows -------------------------


class HiddenDatasetLine(msgspec.Struct):
    dataset: str
    samples: int
    tokens: int
    bytes: int
    drop_saves: int  # bytes saved by dropping this dataset
    cap_saved: int  # bytes the length cap saved on this dataset


class HiddenStatesReport(msgspec.Struct):
    """Hidden-state disk estimate (``draftgen.hidden``): tokens × hidden_size × slots × dtype bytes."""

    hidden_size: int
    slots: int
    dtype: str
    tokens: int
    bytes: int
    tokens_uncapped: int
    bytes_uncapped: int
    cap_saved: int
    max_seq_len: int | None
    datasets: list[HiddenDatasetLine]
    by_dtype: dict[str, int]


class MergedDatasetStats(msgspec.Struct, omit_defaults=True):
    """One dataset's share of merged/ (``dataset`` is "all" for the total)."""

    dataset: str
    records: int = 0  # response records read (distinct sample ids of the prepared set)
    orphans: int = 0  # records whose sample id is not in the current prepared set: never merged
    samples: int = 0  # rows written (weight > 1 repeats count)
    unique_samples: int = 0
    train: int = 0
    validation: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_share: float = 0.0  # reasoning_tokens / completion_tokens
    supervised_tokens: int = 0  # ones in loss_mask
    capped: int = 0  # rows truncated to max_seq_len
    truncated: int = 0  # rows whose generation hit max_tokens (the model's real tokens, kept unless drop_truncated)
    tokens_uncapped: int = 0  # prompt + completion tokens before the cap
    dropped: dict[str, int] = msgspec.field(default_factory=dict)  # reason -> samples


class MergeStats(msgspec.Struct, omit_defaults=True):
    datasets: list[MergedDatasetStats]
    total: MergedDatasetStats
    notes: list[str] = msgspec.field(default_factory=list)
    hidden_states: HiddenStatesReport | None = None
    schema_version: int = SCHEMA_VERSION


MANIFEST_LAYOUT = 2
"""``MergeManifest.layout`` that merge writes. 2: file paths relative to the run directory (``merged/…`` and
``exports/…``). 1 (manifests without the field): paths relative to merged/, exports inside merged/."""


class MergedFile(msgspec.Struct):
    path: str  # relative to the run directory (layout 2; relative to merged/ in a layout-1 manifest)
    split: str  # "train" | "validation" | "all" (the dataset card, stats.json)
    kind: str  # "parquet" | "card" | "stats" | an export format (``export.EXPORTERS``)
    rows: int
    bytes: int
    sha256: str


class MergeManifest(msgspec.Struct, omit_defaults=True):
    """merged/manifest.json, written last: the merge output is complete iff it exists. It lists every file
    the merge wrote (merged/ and exports/), and the next merge removes exactly those before writing."""

    files: list[MergedFile]
    seed: int
    merge: dict[str, Any]  # the merge config section used
    datasets: list[str]
    profile: str
    forced: list[str] = msgspec.field(default_factory=list)  # provenance differences accepted with --force
    layout: int = 1  # how ``files[].path`` is rooted (MANIFEST_LAYOUT); absent in older manifests
    schema_version: int = SCHEMA_VERSION


# Export rows are read by Arrow's JSON reader (``datasets.load_dataset("json")``), which infers a schema
# per 10 MB chunk and fails when a later chunk disagrees: so every key is always written, with one type
# (no omit_defaults, "" rather than null, nested lists as JSON text).


# SpeculatorsMetadata is generated from the merged columns (``columns.MERGED_COLUMNS``); the type checker
# sees a plain Struct, msgspec (which resolves the annotation at runtime) the generated one.
if TYPE_CHECKING:
    _SpeculatorsMetadata = msgspec.Struct
else:
    _SpeculatorsMetadata = SpeculatorsMetadata


class SpeculatorsRow(msgspec.Struct):
    """vllm-project/speculators row, as its ``regenerate-responses`` writes it and ``prepare-data`` reads it:
    pre-tokenized ``input_ids`` + ``loss_mask`` (prepare-data keeps only these two), ``primary_id`` the
    conversation key (draftgen's sample_id; ``id`` adds ``#repN`` to weight repeats), ``text`` =
    decode(input_ids), for review only."""

    id: str
    primary_id: str
    input_ids: list[int]
    loss_mask: list[int]
    text: str
    metadata: _SpeculatorsMetadata


class SpecForgePromptRow(msgspec.Struct):
    """sgl-project/SpecForge pre-tokenized online prompt (``data.prompts_path``): exact ids, binary
    ``loss_mask`` of the same non-empty length (``specforge/data/prompt_builder.py``). ``id`` is ignored
    by SpecForge and kept for tracing."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]


class SpecForgeMessage(msgspec.Struct):
    role: str
    content: str
    reasoning_content: str = ""
    tool_calls: str = "[]"  # JSON text of the OpenAI tool calls (SpecForge's parser accepts a string)
    tool_call_id: str = ""


class SpecForgeConversationRow(msgspec.Struct):
    """sgl-project/SpecForge conversation row (``data.train_data_path``, the shape of its
    ``regenerate_train_data.py`` output). SpecForge re-renders and re-tokenizes it with its own chat
    template, so its ids are not draftgen's exact ids."""

    id: str
    conversations: list[SpecForgeMessage]
    tools: str = "[]"  # JSON text of the prompt's tool definitions (row-level, as SpecForge reads it)
    status: str = "success"


# The drafter chain's records (extract, train, accept) live in records_chain.py; re-exported here so
# every typed record is importable from this one module.
from .records_chain import (  # noqa: E402
    AcceptanceFigures,
    AcceptReport,
    HiddenChecksSummary,
    HiddenCounts,
    HiddenExportReport,
    HiddenExportSample,
    HiddenIndexRecord,
    HiddenLayerIds,
    HiddenManifest,
    HiddenSampleEntry,
    HiddenTarget,
    TeacherResult,
    ThroughputFigures,
    TrainLogRecord,
    TrainReport,
)
