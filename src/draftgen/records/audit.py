"""The audit's record: ``audit/audit.json`` (``AuditReport``) and its per-dataset parts."""

from __future__ import annotations

import msgspec

from draftgen.records.base import SCHEMA_VERSION


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
    provider: str | None = None  # who served the excluded record (the next generate avoids it when at fault)
    created_at: float = 0.0  # the excluded record's, to tell it from a later record of the same sample


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
    #: kept records billed for fewer completion tokens than their ids, which are exact on their own (clean
    #: rebuild, decoded text equal, reference exact or absent): the provider's count is wrong, not the ids
    underbilled: int = 0
    underbilled_billed_tokens: int = 0
    underbilled_rebuilt_tokens: int = 0
    underbilled_by_provider: dict[str, int] = msgspec.field(default_factory=dict)


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
