"""Records of the hidden-state set: ``<hidden>/index/part-*.jsonl`` (``HiddenIndexRecord``), ``manifest.json``
(``HiddenManifest``, written last), the owner markers of hidden sets and export folders (``HiddenOwnerMarker``,
written first), the exports' ``export.json`` and the disk estimate (``HiddenStatesReport``)."""

from __future__ import annotations

import msgspec

from draftgen.records.base import SCHEMA_VERSION

# -- merge outputs: merged/stats.json, merged/manifest.json and the export rows -------------------------


class HiddenDatasetLine(msgspec.Struct):
    dataset: str
    samples: int
    tokens: int
    bytes: int
    drop_saves: int  # bytes saved by dropping this dataset
    cap_saved: int  # bytes the length cap saved on this dataset


class HiddenStatesReport(msgspec.Struct):
    """Hidden-state disk estimate (``draftgen.hidden.estimate``): tokens × hidden_size × slots × dtype bytes."""

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


# -- extract outputs: <hidden>/index/part-*.jsonl and <hidden>/manifest.json (draftgen.hidden.format) ------


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
    # the log-prob check: mean |log p| difference (nats) from the reference's (the engine's prompt_logprobs
    # or a plain forward's), its dtype-calibrated tolerance, the worst aux slot run on through the target's
    # remaining layers, and where the reference came from ("engine" | "forward")
    logprob_err: float | None = None
    logprob_tol: float | None = None
    aux_logprob_err: float | None = None
    reference_source: str | None = None
    # the state comparison (hf): each aux slot's relative difference from the plain forward's state and its
    # tolerance (layer order), the final's tolerance, and the noise that calibrated them: the relative
    # difference between the plain forward and a second one of another shape (aux slots, then the final);
    # schema version 4, None in an index written before
    aux_rel_err: list[float] | None = None
    aux_rel_tol: list[float] | None = None
    final_rel_tol: float | None = None
    state_noise: list[float] | None = None


class FidelityResult(msgspec.Struct, omit_defaults=True):
    """How well the target agrees with one sample's completion (the provider's text), from the stored final
    state through the target's own final norm and head (``target.checks.check_fidelity``) at ``positions``
    completion positions: the mean log p(completion id) and the share of those positions where the id the
    provider emitted is the target's top-1."""

    logprob_mean: float
    top1: float
    positions: int


class HiddenIndexRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of an index part: the sample is done (its file is published and listed here)."""

    sample_id: str
    file: str  # relative to the hidden-state destination root
    length: int
    n_loss: int
    failed: list[str] = msgspec.field(default_factory=list)
    teacher: TeacherResult | None = None
    fidelity: FidelityResult | None = None  # measured samples only (hidden_states.fidelity_samples)
    # sha256 of the row's input_ids (int64) + loss_mask (uint8) bytes (codec.row_digest) and of the published
    # file's bytes; "" on records written before they were recorded (extract redoes those samples)
    row_sha256: str = ""
    file_sha256: str = ""
    schema_version: int = SCHEMA_VERSION


#: ``HiddenOwnerMarker.kind`` of a hidden-state destination and of an ``export-hidden`` folder
OWNER_HIDDEN_SET = "hidden-set"
OWNER_HIDDEN_EXPORT = "hidden-export"
OWNER_SCHEMA = "draftgen.owner/1"


class HiddenOwnerMarker(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The owner marker of a destination draftgen writes besides the run directory (``<hidden>/.draftgen-hidden.json``,
    ``<export>/.draftgen-export.json``), written FIRST, before any other file there: a folder is draftgen's
    once it holds one. ``adopted``: written into a set/export made before markers existed (it held a valid
    manifest.json / export.json / index part)."""

    kind: str  # OWNER_HIDDEN_SET | OWNER_HIDDEN_EXPORT
    schema: str  # the marker's own format: draftgen.owner/1
    created_at: float
    draftgen_version: str
    adopted: bool = False
    schema_version: int = SCHEMA_VERSION


class HiddenTarget(msgspec.Struct, omit_defaults=True):
    """The target a set was extracted from; ``config_sha256`` = sha256 of its config.json bytes;
    ``weights_sha256`` and ``files_sha256`` (schema version 3; None in a set made before) the digest of its
    weights (``hidden.norm.weights_digest``: every tensor's name, dtype, shape and sampled bytes; a Hugging
    Face cache snapshot's blob names). Extract's resume, ``train.guards.check_verifier`` and ``train
    --online`` compare them."""

    name: str
    revision: str | None = None
    config_sha256: str | None = None
    weights_sha256: str | None = None
    files_sha256: str | None = None


class HiddenIdentity(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``<hidden>/identity.json``, written before the first sample: the target every sample of the set comes
    from (a resume with another target is refused, naming both)."""

    target: HiddenTarget
    norm_weight_sha256: str
    forced: list[str] = msgspec.field(default_factory=list)  # differences accepted with --force (e.g. "weights")
    schema_version: int = SCHEMA_VERSION


class HiddenLockHolder(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``<hidden>/.lock.json``: who writes the destination now (one writer per destination)."""

    host: str
    pid: int
    run_dir: str
    since: float
    refreshed: float  # the holder rewrites it as it works; older than the stale timeout: a dead holder
    token: str


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


class ProviderFidelity(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One provider's agreement with the target (``target.fidelity``): over its ``samples`` measured
    samples (``positions`` completion positions in all; ``rows`` of the set are its), the mean log p of the
    completion ids under the target and the target's top-1 agreement (both pooled over the positions), each
    with its 95% bootstrap interval over the samples; the best provider's top-1 minus this one's (``top1_gap``,
    and ``logprob_gap`` likewise) with its interval; ``flagged``: the gap's interval lies wholly above
    ``hidden_states.fidelity_margin``; ``excluded_sample_ids``: its rows left out of training
    (``hidden_states.fidelity_action: exclude``, flagged only)."""

    provider: str
    rows: int
    samples: int
    positions: int
    logprob_mean: float
    top1: float
    logprob_ci95: list[float] | None = None
    top1_ci95: list[float] | None = None
    top1_gap: float = 0.0
    top1_gap_ci95: list[float] | None = None
    logprob_gap: float = 0.0
    logprob_gap_ci95: list[float] | None = None
    flagged: bool = False
    excluded_sample_ids: list[str] = msgspec.field(default_factory=list)


class HiddenFidelity(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Provider fidelity of a set (``target.fidelity``): each provider's figures (best top-1 first),
    the best one, and the rule's settings (``hidden_states.fidelity_margin``, ``fidelity_action``)."""

    providers: list[ProviderFidelity]
    best: str | None = None
    margin: float = 0.0
    action: str = "warn"


class HiddenChecksSummary(msgspec.Struct, omit_defaults=True):
    """Flagged samples per failed check, and the teacher log-prob distribution of the checked fraction."""

    failed_by_check: dict[str, int] = msgspec.field(default_factory=dict)
    flagged_sample_ids: list[str] = msgspec.field(default_factory=list)
    teacher_checked: int = 0
    teacher_fraction: float = 0.0
    teacher_logprob_quantiles: dict[str, float] = msgspec.field(default_factory=dict)
    teacher_logprob_histogram: list[tuple[float, int]] = msgspec.field(default_factory=list)
    chance_logprob: float | None = None
    fidelity: HiddenFidelity | None = None  # None: no sample measured (a set made before, or no provider known)


class HiddenSampleEntry(msgspec.Struct):
    sample_id: str
    file: str  # a weight repeat (``x#rep1``) names the file of ``x``
    length: int
    file_sha256: str = ""  # verified by every read through HiddenSet ("" on older manifests: not verified)


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
    forced: list[str] = msgspec.field(default_factory=list)  # identity.json's: differences accepted with --force
    schema_version: int = SCHEMA_VERSION


# -- hidden-state exports (draftgen.hidden.exports) and draftgen train (draftgen.phases.train) --------------------


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
    # provider -> samples left out because fidelity flagged it (hidden_states.fidelity_action: exclude)
    excluded_fidelity: dict[str, int] = msgspec.field(default_factory=dict)
    layer_ids: list[int] = msgspec.field(default_factory=list)  # aux, vLLM convention
    final_layer_id: int = 0
    dtype: str = ""
    seconds: float = 0.0
    # every file this export wrote, relative to the folder (export.json itself included): the next export
    # into the folder removes exactly these, and nothing else (empty in an export made before the listing)
    files: list[str] = msgspec.field(default_factory=list)
    # the size and sha256 of each of them (export.json itself excepted), which a rerun verifies (schema
    # version 3; empty in an export made before: a rerun then checks only that each listed file exists)
    sizes: dict[str, int] = msgspec.field(default_factory=dict)
    sha256: dict[str, str] = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
