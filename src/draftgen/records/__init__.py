"""Typed records: every row draftgen reads or writes, one module per phase output, and this face.

Files and the record each line holds:

    prepared/<dataset>/prompts.jsonl      PromptRecord                 (records.prompts)
    prepared/<dataset>/stats.json         DatasetStats                 (records.prompts)
    raw/<dataset>/raw_responses.jsonl     ResponseRecord (also legacy SGLang rows: sample_id + output_ids)
    raw/<dataset>/failures.jsonl          FailureRecord                (records.responses)
    openrouter-batches/journal.jsonl      BatchEvent                   (records.batches)
    emulator ground truth (--ground-truth) GroundTruthRecord           (records.responses)
    audit/audit.json                      AuditReport                  (records.audit)
    run.json                              RunManifest                  (records.run)
    merged/*.parquet, manifest.json       MERGED_COLUMNS, MergedParquetRow + views, MergeManifest (records.merged)
    exports/<format>/*.jsonl              SpeculatorsRow, SpecForge*   (records.exports)
    <hidden>/index, manifest.json         HiddenIndexRecord, HiddenManifest (records.hidden)
    <hidden>/.draftgen-hidden.json        HiddenOwnerMarker (also <export>/.draftgen-export.json)
    logs/progress.json                    ProgressRecord               (records.progress)
    rounds/round-<n>.json                 RoundPlan                    (records.rounds)
    train/, accept/                       TrainLogRecord, TrainReport (+ TrainOnlineReport), AcceptReport (records.drafter)

Every record carries ``SCHEMA_VERSION`` (``records.base``). Encoding and decoding happen only in
``store``. Records are msgspec Structs: unknown keys in input are ignored (forward compatibility), missing
optional fields take their defaults, and a wrong type is an InputError naming the file, line and field.
"""

from __future__ import annotations

from draftgen.records.audit import (
    AuditReport,
    BillingExample,
    DatasetAudit,
    ExcludedSample,
    MismatchExample,
    StructuralExample,
)
from draftgen.records.base import SCHEMA_VERSION
from draftgen.records.batches import BatchEvent, BatchItem, BatchView, fold_batches
from draftgen.records.drafter import (
    AcceptanceFigures,
    AcceptReport,
    AlternativeFigures,
    Comparison,
    DatasetAcceptance,
    DraftLMInfo,
    KChoice,
    KFigures,
    PromptAcceptance,
    ThroughputFigures,
    TrainLogRecord,
    TrainOnlineReport,
    TrainReport,
    below_floor,
    trained_line,
)
from draftgen.records.exports import (
    SpecForgeConversationRow,
    SpecForgeMessage,
    SpecForgePromptRow,
    SpeculatorsRow,
)
from draftgen.records.hidden import (
    FidelityResult,
    HiddenChecksSummary,
    HiddenCounts,
    HiddenDatasetLine,
    HiddenExportReport,
    HiddenExportSample,
    HiddenFidelity,
    HiddenIdentity,
    HiddenIndexRecord,
    HiddenLayerIds,
    HiddenLockHolder,
    HiddenManifest,
    HiddenOwnerMarker,
    HiddenSampleEntry,
    HiddenStatesReport,
    HiddenTarget,
    ProviderFidelity,
    TeacherResult,
)
from draftgen.records.merged import (
    MANIFEST_LAYOUT,
    MERGED_COLUMNS,
    MERGED_VIEWS,
    REPEAT_MARK,
    Column,
    MergedDatasetStats,
    MergedFile,
    MergedLengths,
    MergedParquetRow,
    MergedProvider,
    MergedRowId,
    MergedTokens,
    MergeManifest,
    MergeStats,
    SpeculatorsMetadata,
    parquet_columns,
    parse_row_id,
    row_id,
)
from draftgen.records.progress import ProgressRecord
from draftgen.records.prompts import (
    DatasetStats,
    FunctionCall,
    Message,
    PromptIdView,
    PromptRecord,
    Tool,
    ToolCall,
    ToolFunction,
    check_ids,
)
from draftgen.records.responses import (
    VIEWS,
    AttemptRecord,
    AttemptSpend,
    FailureRecord,
    GenerationSettings,
    GroundTruthRecord,
    HealthEvent,
    IdsSource,
    ProbeMeasurement,
    Provenance,
    ReferenceRow,
    ResponseFields,
    ResponseIdsView,
    ResponseKeyView,
    ResponseMergeView,
    ResponseMetricsView,
    ResponseRecord,
    ResponseScanView,
    ResponseSettingsView,
    SettlementRecord,
    Usage,
    attempt_spend,
    spend_usd,
    view_mismatches,
)
from draftgen.records.rounds import RoundDataset, RoundPlan
from draftgen.records.run import LockHolder, RunManifest

__all__ = [
    "MANIFEST_LAYOUT",
    "MERGED_COLUMNS",
    "MERGED_VIEWS",
    "REPEAT_MARK",
    "SCHEMA_VERSION",
    "VIEWS",
    "AcceptReport",
    "AcceptanceFigures",
    "AlternativeFigures",
    "AttemptRecord",
    "AttemptSpend",
    "AuditReport",
    "BatchEvent",
    "BatchItem",
    "BatchView",
    "BillingExample",
    "Column",
    "Comparison",
    "DatasetAcceptance",
    "DatasetAudit",
    "DatasetStats",
    "DraftLMInfo",
    "ExcludedSample",
    "FailureRecord",
    "FidelityResult",
    "FunctionCall",
    "GenerationSettings",
    "GroundTruthRecord",
    "HealthEvent",
    "HiddenChecksSummary",
    "HiddenCounts",
    "HiddenDatasetLine",
    "HiddenExportReport",
    "HiddenExportSample",
    "HiddenFidelity",
    "HiddenIdentity",
    "HiddenIndexRecord",
    "HiddenLayerIds",
    "HiddenLockHolder",
    "HiddenManifest",
    "HiddenOwnerMarker",
    "HiddenSampleEntry",
    "HiddenStatesReport",
    "HiddenTarget",
    "IdsSource",
    "KChoice",
    "KFigures",
    "LockHolder",
    "MergeManifest",
    "MergeStats",
    "MergedDatasetStats",
    "MergedFile",
    "MergedLengths",
    "MergedParquetRow",
    "MergedProvider",
    "MergedRowId",
    "MergedTokens",
    "Message",
    "MismatchExample",
    "ProbeMeasurement",
    "ProgressRecord",
    "PromptAcceptance",
    "PromptIdView",
    "PromptRecord",
    "Provenance",
    "ProviderFidelity",
    "ReferenceRow",
    "ResponseFields",
    "ResponseIdsView",
    "ResponseKeyView",
    "ResponseMergeView",
    "ResponseMetricsView",
    "ResponseRecord",
    "ResponseScanView",
    "ResponseSettingsView",
    "RoundDataset",
    "RoundPlan",
    "RunManifest",
    "SettlementRecord",
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
    "TrainOnlineReport",
    "TrainReport",
    "Usage",
    "attempt_spend",
    "below_floor",
    "check_ids",
    "fold_batches",
    "parquet_columns",
    "parse_row_id",
    "row_id",
    "spend_usd",
    "trained_line",
    "view_mismatches",
]
