"""Records of the drafter: ``train/log.jsonl`` (``TrainLogRecord``), ``train/train.json`` (``TrainReport``, and
its sample floor read the same way by train and accept: ``below_floor``, ``trained_line``) and
``accept/<drafter key>/<pass>.json`` and the run's latest copy ``accept/acceptance.json`` (``AcceptReport``)."""

from __future__ import annotations

import msgspec

from draftgen.records.base import SCHEMA_VERSION
from draftgen.records.hidden import HiddenFidelity


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
    # every numeric metric speculators logged for the step or validation (``_epoch`` dropped): the DFlash
    # family's ``eal`` (expected accepted length per block), DSpark's ``accept_len``, per-position accuracies
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


class TrainOnlineReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``train.json``'s ``online`` part: online training (``draftgen train --online``) got its hidden states
    from these servers through draftgen's checking proxy; what it checked and what it kept out."""

    servers: list[str]  # base URLs of the vLLM extract servers
    server_models: list[str]  # the model id each serves (GET /v1/models)
    rows: int  # merged rows speculators' dataset holds
    rows_sha256: str  # sha256 over the rows' ids+mask digests, in dataset order
    preflight_rows: int  # rows run through the full capture check before training
    preflight_checks: list[str]  # the checks that ran on them (per-sample, log-prob)
    requests: int = 0  # samples the trainer asked for (each epoch asks again)
    passed: int = 0
    excluded: int = 0  # samples a check failed: answered as unavailable, never trained on
    excluded_by_check: dict[str, int] = msgspec.field(default_factory=dict)
    excluded_ids: list[str] = msgspec.field(default_factory=list)  # sample ids (first 100)
    teacher_checked: int = 0  # consumed samples that also passed the log-prob check
    peak_files: int = 0  # files on disk for the trainer at once (copies waiting for it, captures in flight)
    peak_bytes: int = 0  # their bytes (captures in flight at their reservations)
    window_bytes: int = 0  # the window they were bounded by (train.online_window_mb)
    fidelity: HiddenFidelity | None = None  # each provider's agreement with the target, measured before training
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
    partial: bool = False  # trained on an incomplete hidden set (--allow-partial)
    missing_samples: int | None = None  # with partial: samples the set lacked (-1: unknown)
    algorithm: str = "eagle3"  # train.algorithm
    speculator_type: str = "eagle3"  # speculators' --speculator-type
    speculative_tokens: int | None = None  # what the drafter proposes per step (its speculators config)
    offline_eal: float | None = None  # speculators' validation estimate for block drafters (DFlash family: eal)
    serve: str | None = None  # the vllm serve line that measures it on a GPU
    verifier_norm_sha256: str | None = None  # the final norm the trainer turned the final state post-norm with
    processes: int = 1  # trainer processes of the run (nproc_per_node × nnodes)
    online: TrainOnlineReport | None = None
    # what the drafter trained on from its first step (resumed runs included), counted by the trainer on all
    # ranks; None: not counted (a checkpoint of a draftgen before schema 3). samples_trained: rows with a
    # loss-mask token in a training batch; samples_asked: rows its training batches asked for; train_rows:
    # speculators' training split (the rest validate)
    samples_trained: int | None = None
    samples_asked: int | None = None
    train_rows: int | None = None
    min_trained_fraction: float | None = None  # the floor applied (train.min_trained_fraction)
    # samples of the hidden set left out of training, by reason: "fidelity: <provider>" (a provider the
    # extract's fidelity check flagged, with hidden_states.fidelity_action: exclude)
    excluded: dict[str, int] = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


def below_floor(trained: int, asked: int, fraction: float) -> bool:
    """A drafter that trained on ``trained`` of the ``asked`` samples is under the floor ``fraction``
    (``train.min_trained_fraction``): fewer than that share, or none at all; 0 is no floor."""
    return fraction > 0 and (trained == 0 or trained < fraction * asked)


def trained_line(trained: int, asked: int, train_rows: int, rows: int) -> str:
    """How much a drafter trained on, in words (train's refusal and summary, accept's warning)."""
    share = f"{trained / asked:.0%}" if asked else "none asked"
    return (f"it trained on {trained} of the {asked} samples its batches asked for ({share}; a training split of "
            f"{train_rows} of {rows} rows)")


# -- accept output: accept/<drafter key>/<pass>.json (draftgen.phases.accept.run) -------------------------------------


class AcceptanceFigures(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Acceptance of the served drafter over one accept run (or one prompt). ``source`` "vllm-metrics": deltas of
    vLLM's ``/metrics`` counters (AL = 1 + accepted/drafts, per position = accepted_per_pos[i]/drafts, rate =
    accepted/draft_tokens); "vllm-per-request": the same counts from each response's
    ``metrics.speculative_decoding`` (vLLM ``--per-request-spec-decode-metrics``), summed; "sglang-meta_info":
    sums over the requests (AL = completion_tokens/verify_calls)."""

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
    ci95: list[float] | None = None  # [low, high]: 95% bootstrap interval of acceptance_length over the prompts


class ThroughputFigures(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One server's pass over the held-out prompts: completion tokens over wall seconds (all in flight)."""

    base_url: str
    requests: int
    completion_tokens: int
    seconds: float
    tokens_per_s: float


class PromptAcceptance(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One held-out prompt's share of a pass: the drafter's counters on it (``source``: "vllm-per-request", its
    response's ``metrics.speculative_decoding``; "vllm-metrics", the ``/metrics`` deltas around its request,
    sent alone; "sglang-meta_info", its ``meta_info``; None: not known), joined to its dataset, its prompt's
    length and length bucket (``phases.accept.passes.length_bucket``) and its tags, and the target's greedy
    continuation (its ids, when the server returned them: the no-model figures can be replayed from the report
    alone). Also one line each of ``accept/<drafter key>/<pass>.prompts.jsonl``."""

    sample_id: str
    dataset: str
    drafts: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: list[float] = msgspec.field(default_factory=list)
    completion_tokens: int = 0
    verify_calls: int = 0
    ended: bool = False  # the continuation ended with an end token (not cut at max_tokens)
    output_ids: list[int] | None = None
    source: str | None = None
    prompt_tokens: int | None = None
    length_bucket: str | None = None
    tags: list[str] | None = None  # its prepared prompt's tags (``PromptRecord.tags``)
    schema_version: int = SCHEMA_VERSION

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts (None without a draft)."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None


class AlternativeFigures(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A drafter measured beside the served one on the same prompts: ``how`` "replay" (a no-model drafter,
    ``copy-last`` or ``lookup``, replayed on the target's greedy continuations from the drafter's own pass:
    ``drafter.baselines``) or "server" (``zero-aux``: the same drafter served with zeroed aux states)."""

    name: str
    how: str
    acceptance_length: float
    ci95: list[float] | None = None
    per_position: list[float] = msgspec.field(default_factory=list)
    drafts: float = 0.0
    accepted: float = 0.0
    prompts: int = 0
    base_url: str | None = None  # how "server": where it was measured


class Comparison(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The served drafter's acceptance length minus another's (``versus``: a name of ``alternatives``, or
    ``no-model``: the better of copy-last and lookup in each resample), paired over the same prompts, with its
    95% bootstrap interval."""

    versus: str
    difference: float
    ci95: list[float]


class DatasetAcceptance(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The acceptance on one dataset's held-out prompts: the drafter's, with its interval, and each
    alternative's acceptance length on the same prompts. With ``tag`` (``AcceptReport.tags``): on those of its
    held-out prompts that carry the tag (``records.prompts.UNTAGGED``: those that carry none)."""

    dataset: str
    tag: str | None = None
    prompts: int
    acceptance_length: float
    ci95: list[float] | None = None
    alternatives: dict[str, float] = msgspec.field(default_factory=dict)


class KFigures(msgspec.Struct, omit_defaults=True, kw_only=True):
    """The served drafter as if it proposed ``k`` tokens per step (``phases.accept.kchoice``): its acceptance
    length from the per-position counts (AL(k) = 1 + Σ_{i<k} per_position[i]), with its 95% bootstrap interval
    over the prompts, and the expected speedup at each concurrency (tokens/s with it over without, from the
    cost model)."""

    k: int
    acceptance_length: float
    ci95: list[float] | None = None
    speedup: dict[int, float] = msgspec.field(default_factory=dict)  # concurrency → expected speedup


class KChoice(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Which k to serve, from what accept measured (``phases.accept.kchoice``): the figures at every k up to the
    served one, the cost model's parameters (``calibrated``: ``draft_step_cost`` fitted to the measured speedup
    at ``measured_concurrency``), the k of the largest expected speedup per concurrency and the one recommended
    at ``recommended_at``, the concurrencies where that k is expected to slow serving down (speedup < 1), and
    the lines that say so."""

    served_k: int
    concurrencies: list[int]
    by_k: list[KFigures] = msgspec.field(default_factory=list)
    draft_step_cost: float = 0.0
    saturation_tokens: int = 0
    calibrated: bool = False
    measured_concurrency: int | None = None
    measured_speedup: float | None = None
    best_k: dict[int, int] = msgspec.field(default_factory=dict)  # concurrency → k of the largest speedup
    recommended_k: int | None = None
    recommended_at: int | None = None  # the concurrency the recommendation is for
    slower_at: list[int] = msgspec.field(default_factory=list)  # concurrencies where recommended_k is < 1×
    notes: list[str] = msgspec.field(default_factory=list)  # where the figures come from
    warnings: list[str] = msgspec.field(default_factory=list)  # the slow-down lines


class AcceptReport(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``accept/<drafter key>/<pass name>.json`` (one per drafter, server and prompt set; never replaced by
    another pass; ``accept/acceptance.json`` is the latest of the run's own drafter): the measured acceptance
    next to the offline estimate from that drafter's training."""

    drafter: str
    drafter_key: str = ""  # its folder under accept/ (phases.accept.run.drafter_key)
    pass_name: str = ""  # its file in that folder: "<server>-<prompts>p-<digest of the sample ids>" (schema 4)
    server: str  # "vllm" | "sglang"
    prompts: int
    sample_ids: list[str]
    max_tokens: int
    excluded_by_content: int = 0  # candidates left out: their content is in a merged row under another sample id
    acceptance: AcceptanceFigures
    speculative: ThroughputFigures
    baseline: ThroughputFigures | None = None
    speedup: float | None = None  # speculative tokens/s over baseline tokens/s
    k: int | None = None  # the drafter's speculative tokens, from its config
    offline_al: float | None = None  # 1 + Σ_k Π_{j≤k} cond_acc_j
    offline_cond_acc: list[float] = msgspec.field(default_factory=list)
    offline_source: str | None = None  # "<train log> (validation|train, step N)", "accept.offline_cond_acc" or None
    alternatives: list[AlternativeFigures] = msgspec.field(default_factory=list)
    comparisons: list[Comparison] = msgspec.field(default_factory=list)
    datasets: list[DatasetAcceptance] = msgspec.field(default_factory=list)
    # per (dataset, tag), for the datasets whose held-out prompts carry tags: by dataset, then by tag
    tags: list[DatasetAcceptance] = msgspec.field(default_factory=list)
    per_prompt: list[PromptAcceptance] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    created_at: float = 0.0
    # from the drafter's train.json (this run's train/drafter or eagle3, or train/previous/): what it trained on
    samples_trained: int | None = None
    samples_asked: int | None = None
    warnings: list[str] = msgspec.field(default_factory=list)  # e.g. it trained on fewer samples than the floor
    k_choice: KChoice | None = None  # the figures by k and the k to serve (phases.accept.kchoice)
    schema_version: int = SCHEMA_VERSION


class DraftLMInfo(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``train/draft-lm/draftgen-draft-lm.json``: how the independent draft LM (``drafter.draftlm``) was built and
    trained."""

    target: str
    layers: int
    intermediate_size: int
    trainable_params: int
    matched_to: int  # the EAGLE-3 drafter's trainable parameters
    vocab_ids: list[int]  # the draft vocabulary, as target ids
    steps: int
    batch_tokens: int
    lr: float
    seed: int
    rows: int
    loss_first: float
    loss_last: float
    seconds: float
    schema_version: int = SCHEMA_VERSION
