"""Typed records of the drafter chain: the extract phase's index lines and manifest, the hidden-state
exports' report, the train phase's log lines and report, and the accept report.

Files (all encoded and decoded by ``store`` only):

- ``<hidden>/index/part-*.jsonl``: ``HiddenIndexRecord`` per line; ``<hidden>/manifest.json``: ``HiddenManifest``
  (written last; see ``draftgen.extract.format``);
- ``hidden-exports/<format>/export.json``: ``HiddenExportReport``;
- ``train/log.jsonl``: ``TrainLogRecord`` per line; ``train/train.json``: ``TrainReport``;
- ``accept/acceptance.json``: ``AcceptReport``.

``records`` re-exports every name here; the schema version is ``schema.SCHEMA_VERSION``.
"""

from __future__ import annotations

import msgspec

from .schema import SCHEMA_VERSION

__all__ = [
    "AcceptReport",
    "AcceptanceFigures",
    "HiddenChecksSummary",
    "HiddenCounts",
    "HiddenExportReport",
    "HiddenExportSample",
    "HiddenIndexRecord",
    "HiddenLayerIds",
    "HiddenManifest",
    "HiddenSampleEntry",
    "HiddenTarget",
    "TeacherResult",
    "ThroughputFigures",
    "TrainLogRecord",
    "TrainReport",
]


# -- extract outputs: <hidden>/index/part-*.jsonl and <hidden>/manifest.json (draftgen.extract.format) ------


class TeacherResult(msgspec.Struct, omit_defaults=True):
    """The teacher check of one sample: mean log-prob of the completion ids under the target's own head
    applied to the stored final state, the same from a plain forward pass (None when not computed), and
    chance (log 1/V), over ``positions`` completion positions."""

    logprob_mean: float
    chance_logprob: float
    positions: int
    reference_logprob_mean: float | None = None
    aux_max_rel_err: float | None = None  # stored aux vs the reference hidden_states[id], worst layer
    final_max_rel_err: float | None = None  # stored final vs the reference pre-norm state


class HiddenIndexRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of an index part: the sample is done (its file is published and listed here)."""

    sample_id: str
    file: str  # relative to the hidden-state destination root
    length: int
    n_loss: int
    failed: list[str] = msgspec.field(default_factory=list)
    teacher: TeacherResult | None = None
    schema_version: int = SCHEMA_VERSION


class HiddenTarget(msgspec.Struct, omit_defaults=True):
    name: str
    revision: str | None = None


class HiddenLayerIds(msgspec.Struct):
    """Stored layer ids in the vLLM convention (id k = input of decoder layer k; id L = pre-norm final),
    with their SGLang (id - 1) and HF ``output_hidden_states`` index equivalents."""

    aux: list[int]
    final: int
    convention: str
    sglang_aux: list[int]
    hf_hidden_states_index: list[int]


class HiddenCounts(msgspec.Struct):
    samples: int
    tokens: int
    flagged: int


class HiddenChecksSummary(msgspec.Struct, omit_defaults=True):
    """Flagged samples per failed check, and the teacher log-prob distribution of the checked fraction."""

    failed_by_check: dict[str, int] = msgspec.field(default_factory=dict)
    flagged_sample_ids: list[str] = msgspec.field(default_factory=list)
    teacher_checked: int = 0
    teacher_fraction: float = 0.0
    teacher_logprob_quantiles: dict[str, float] = msgspec.field(default_factory=dict)
    teacher_logprob_histogram: list[tuple[float, int]] = msgspec.field(default_factory=list)
    chance_logprob: float | None = None


class HiddenSampleEntry(msgspec.Struct):
    sample_id: str
    file: str
    length: int


class HiddenManifest(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``<hidden>/manifest.json``, written last: what was extracted, how, and every sample in merged order."""

    schema: str
    target: HiddenTarget
    layer_ids: HiddenLayerIds
    hidden_size: int
    num_layers: int
    vocab_size: int
    dtype: str
    norm_weight_sha256: str
    norm_eps: float
    counts: HiddenCounts
    samples: list[HiddenSampleEntry]
    checks: HiddenChecksSummary = msgspec.field(default_factory=HiddenChecksSummary)
    throughput_tokens_per_s: float | None = None
    complete: bool = True  # false after --limit/--pilot: samples lists what is done so far
    backend: str = "hf"
    draftgen_version: str = ""
    schema_version: int = SCHEMA_VERSION


# -- hidden-state exports (draftgen.extract.exports) and draftgen train (draftgen.train) --------------------


class HiddenExportSample(msgspec.Struct):
    """One line of an export folder's ``sample_ids.jsonl``: export index i, its sample, its file there."""

    index: int
    sample_id: str
    file: str


class HiddenExportReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    """An export folder's ``export.json``, written last: which hidden set, which format, how many samples."""

    format: str
    out: str
    hidden: str
    manifest_fingerprint: str
    samples: int
    tokens: int
    skipped_flagged: int = 0
    include_flagged: bool = False
    layer_ids: list[int] = msgspec.field(default_factory=list)  # aux, vLLM convention
    final_layer_id: int = 0
    dtype: str = ""
    seconds: float = 0.0
    schema_version: int = SCHEMA_VERSION


class TrainLogRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of ``train/log.jsonl``: a training step's (``kind`` "train") or an epoch's validation
    (``kind`` "val") metrics from speculators: total loss, and per TTT step k the loss, the full accuracy
    (all steps up to k right) and the conditional accuracy (step k right given steps < k right)."""

    kind: str
    global_step: int
    epoch: int
    loss: float
    loss_k: list[float] = msgspec.field(default_factory=list)
    full_acc_k: list[float] = msgspec.field(default_factory=list)
    cond_acc_k: list[float] = msgspec.field(default_factory=list)
    lr: float | None = None
    tokens_per_s: float | None = None
    step_ms: float | None = None
    time: float = 0.0
    schema_version: int = SCHEMA_VERSION


class TrainReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``train/train.json``: what ``draftgen train`` did and where the drafter is."""

    exit_code: int
    message: str
    verifier: str
    hidden: str
    samples: int
    layer_ids: list[int]
    draft_vocab_size: int
    ttt_steps: int
    first_step: int = 0  # global step the run started at (> 0: resumed)
    last_step: int = 0  # global steps done in all
    steps_this_run: int = 0
    seconds: float = 0.0
    steps_per_s: float | None = None
    checkpoint: str | None = None  # speculators-format checkpoint (vllm serve <checkpoint>)
    eagle_checkpoint: str | None = None  # flat EAGLE-3 / SGLang format
    final_train: TrainLogRecord | None = None
    final_val: TrainLogRecord | None = None
    offline_al: float | None = None  # 1 + sum_k prod_{j<=k} cond_acc_j (last validation, else last step)
    schema_version: int = SCHEMA_VERSION


# -- accept output: accept/acceptance.json (draftgen.accept) --------------------------------------------------


class AcceptanceFigures(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Acceptance of the served drafter over one accept run. ``source`` "vllm-metrics": deltas of vLLM's
    ``/metrics`` counters (AL = 1 + accepted/drafts, per position = accepted_per_pos[i]/drafts, rate =
    accepted/draft_tokens); "sglang-meta_info": sums over the requests (AL = completion_tokens/verify_calls)."""

    source: str
    acceptance_length: float
    per_position: list[float] = msgspec.field(default_factory=list)
    acceptance_rate: float | None = None
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: list[float] = msgspec.field(default_factory=list)
    verify_calls: int = 0
    completion_tokens: int = 0


class ThroughputFigures(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One server's pass over the held-out prompts: completion tokens over wall seconds (all in flight)."""

    base_url: str
    requests: int
    completion_tokens: int
    seconds: float
    tokens_per_s: float


class AcceptReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``accept/acceptance.json``: the measured acceptance next to the offline estimate from training."""

    drafter: str
    server: str  # "vllm" | "sglang"
    prompts: int
    sample_ids: list[str]
    max_tokens: int
    acceptance: AcceptanceFigures
    speculative: ThroughputFigures
    baseline: ThroughputFigures | None = None
    speedup: float | None = None  # speculative tokens/s over baseline tokens/s
    k: int | None = None  # the drafter's speculative tokens, from its config
    offline_al: float | None = None  # 1 + Σ_k Π_{j≤k} cond_acc_j
    offline_cond_acc: list[float] = msgspec.field(default_factory=list)
    offline_source: str | None = None  # "train log <path> (val|train step N)" or "accept.offline_cond_acc"
    notes: list[str] = msgspec.field(default_factory=list)
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION
