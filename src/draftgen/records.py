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

from typing import Any, Literal

import msgspec

__all__ = [
    "SCHEMA_VERSION",
    "AuditReport",
    "DatasetAudit",
    "DatasetStats",
    "FailureRecord",
    "FunctionCall",
    "GroundTruthRecord",
    "IdsSource",
    "Message",
    "MismatchExample",
    "PromptRecord",
    "ResponseRecord",
    "RunManifest",
    "Sampling",
    "Tool",
    "ToolCall",
    "ToolFunction",
    "Usage",
]

SCHEMA_VERSION = 1

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


class Sampling(msgspec.Struct, omit_defaults=True):
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


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


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0
    is_byok: bool = False
    upstream_cost: float | None = None


class ResponseRecord(msgspec.Struct, omit_defaults=True):
    """One finished sample. A sample is done iff a ResponseRecord with its id is in raw_responses.jsonl.

    Legacy local-SGLang rows carry only ``sample_id`` and ``output_ids``; every other field is optional.
    """

    sample_id: str
    dataset: str = ""
    partition: str = "short"
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
    ids_source: IdsSource = "exact"
    recon_flags: list[str] = msgspec.field(default_factory=list)
    request_hash: str | None = None
    max_tokens: int | None = None
    backend: str | None = None
    attempts: int = 1
    latency_s: float | None = None
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION


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
    schema_version: int = SCHEMA_VERSION


class MismatchExample(msgspec.Struct, omit_defaults=True):
    sample_id: str
    kind: str  # "tokenization" | "semantic"
    position: int
    ours: list[str]
    reference: list[str]


class DatasetAudit(msgspec.Struct, omit_defaults=True):
    dataset: str
    records: int = 0
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


class AuditReport(msgspec.Struct, omit_defaults=True):
    profile: str
    datasets: list[DatasetAudit]
    overall: DatasetAudit
    thresholds_broken: list[str] = msgspec.field(default_factory=list)
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION


class RunManifest(msgspec.Struct, omit_defaults=True):
    """run.json: what produced this run directory. Written atomically; secrets removed from argv."""

    config_hash: str
    config: dict[str, Any]
    argv: list[str]
    versions: dict[str, str]
    git_sha: str | None = None
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION
