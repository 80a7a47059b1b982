"""The ``train`` section of the run configuration: how ``draftgen train`` trains an EAGLE-3 drafter with
speculators on the extracted hidden states (``draftgen.phases.train``). Imported by ``draftgen.config`` (the
``RunConfig.train`` field); ``docs/config.md`` is generated from these docstrings."""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

__all__ = ["ALGORITHM_NAMES", "DRAFT_ATTN_IMPLS", "HIDDEN_STATES_DTYPES", "LOSS_IMPLEMENTATIONS", "OPTIMIZERS",
           "TrainConfig"]

#: ``train.algorithm``'s choices: the keys of ``draftgen.hidden.algorithms.ALGORITHMS`` (a test keeps them equal)
AlgorithmName = Literal["eagle3", "eagle3.1", "peagle", "dflash", "dflash2", "dspark", "xpress"]
ALGORITHM_NAMES: tuple[str, ...] = get_args(AlgorithmName)

# speculators 0.9's own choices (speculators.train.config.schema): its --optimizer Literal, the dtypes its
# hidden_states_dtype validator accepts (float16 is refused there: no gradient scaling), and its Literals.
OPTIMIZERS = ("muon", "adamw")
HIDDEN_STATES_DTYPES = ("bfloat16", "float32")
DRAFT_ATTN_IMPLS = ("simple_flex_attention", "sdpa", "eager")
LOSS_IMPLEMENTATIONS = ("fused", "eager")


class TrainConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """How ``draftgen train`` trains the drafter (speculators, in its own environment)."""

    enabled: bool = False
    """Run ``train`` as a phase of ``draftgen run``, after ``extract`` (which it needs:
    ``hidden_states.extract: true``, or a hidden set made before); ``draftgen train`` runs it either way."""
    speculators: str | None = None
    """The ``speculators`` executable, or the Python of the environment speculators is installed in
    (default: the ``DRAFTGEN_SPECULATORS`` environment variable, else ``speculators`` on PATH)."""
    verifier: str | None = None
    """The target model's local folder (config, weights, tokenizer); default: the hidden-state manifest's
    target name when it is a local folder."""
    hidden: str | None = None
    """The hidden-state set to train on (a path or fsspec URL); default: the run directory's ``hidden/``."""
    algorithm: AlgorithmName = "eagle3"
    """The drafter speculators trains (docs/algorithms.md): ``eagle3``, ``eagle3.1`` (per-layer fc norm), ``peagle`` (P-EAGLE), or the DFlash family ``dflash``, ``dflash2``, ``dspark``, ``xpress``. Each takes its own layers from the hidden set (EAGLE-3's three, DFlash's five)."""
    layer_ids: list[int] | None = None
    """Aux layer ids (vLLM convention) to train on, from those the hidden set stores; default: the algorithm's own (``[2, L//2, L-3]`` for the EAGLE-3 family, DFlash's five evenly spaced ones for the DFlash family)."""
    online: bool = False
    """Train on hidden states generated on demand by the vLLM extract servers (``hidden_states.base_urls``, ``connector_dir``) instead of a stored set: nothing is stored beyond the files in flight; every sample is checked on its way to the trainer (``draftgen train --online``)."""
    online_check_rows: int = 8
    """Online: merged rows run through the full capture check (per-sample checks and the log-prob check against the engine's ``prompt_logprobs``) on every server before training starts."""
    online_window_mb: float = 2000.0
    """Online: the most disk (MB, 10^6 bytes) the servers' connector files may take at once, those waiting for the trainer and those being captured; a request waits for room, and a sample larger than the window runs alone. Full speed needs about two batches' worth: 2 × ``total_seq_len`` × the bytes per token of a file (layers × hidden size × the model dtype's bytes)."""
    nproc_per_node: int = 1
    """Trainer processes per node; above 1 (or with ``nnodes`` above 1) speculators runs under ``torchrun`` (one process per GPU; gloo on a CPU)."""
    nnodes: int = 1
    """Nodes of a multi-node run: start ``draftgen train`` on each with the same config and its own ``node_rank``; every node must see the hidden set (or reach the servers) and the run directory's ``train/`` folder."""
    node_rank: int = 0
    """This node's rank (0 .. nnodes-1); node 0 publishes the drafter."""
    master_addr: str = "127.0.0.1"
    """torchrun's rendezvous host (node 0's address when ``nnodes`` is above 1)."""
    master_port: int = 29500
    """torchrun's rendezvous port."""
    draft_vocab_size: int = 32000
    """Draft vocabulary size: the most frequent target tokens under the loss mask (speculators' rule)."""
    ttt_steps: int = 3
    """Training-time-test steps (the drafter is unrolled this many steps; also the served k)."""
    epochs: int = 3
    """Training epochs; a rerun with more epochs resumes from the last checkpoint."""
    max_steps: int | None = None
    """Stop after this many optimizer steps in all (counted across epochs and resumes)."""
    lr: float = 1e-3
    """Learning rate (speculators' default)."""
    optimizer: str = "muon"
    """``muon`` (speculators' default: Muon on 2-D weights, AdamW on the rest) or ``adamw``."""
    total_seq_len: int = 8192
    """Tokens per packed training batch (longer samples are cut)."""
    train_data_ratio: float = 0.9
    """Share of the samples (in extraction order) trained on; the rest validates."""
    checkpoint_freq: float = 1.0
    """Checkpoint every N epochs (values below 1: several times per epoch)."""
    hidden_states_dtype: str = "bfloat16"
    """Compute (autocast) dtype of the trainer: bfloat16 or float32."""
    draft_attn_impl: str | None = None
    """Draft attention: ``simple_flex_attention`` | ``sdpa`` | ``eager``; default eager without a GPU
    (FlexAttention has no CPU backward), else speculators' default."""
    loss_implementation: str | None = None
    """``fused`` | ``eager``; default eager without a GPU (the fused losses need Triton)."""
    seed: int = 0
    """Seed of speculators' batch packing and init."""
    num_workers: int = 0
    """DataLoader worker processes."""
    allow_partial: bool = False
    """Train on an incomplete hidden set (``extract --limit``/``--pilot``, or an interrupted extract); by
    default such a set is refused, naming how many samples it lacks (``draftgen train --allow-partial``)."""
    min_trained_fraction: float = 0.5
    """The least share of the samples the trainer's batches asked for that the drafter must have trained on
    (a sample counts once one of its loss-mask tokens was in a training batch; one left out, unavailable online,
    dropped by speculators' NaN guard or cut before its first loss token, does not); a drafter below it, or
    one that trained on no sample, is not published and ``train`` exits 3 (docs/train.md). 0 turns it off."""
    extra_args: list[str] = msgspec.field(default_factory=list)
    """Further ``speculators train`` flags, passed as given (``["--no-norm-before-residual"]``)."""

    def __post_init__(self) -> None:
        # Invariant: every value that reaches speculators is one it accepts. A ValueError here becomes the
        # loader's ConfigError naming the file and the 'train' section (msgspec reports the path).
        problem = _problem(self)
        if problem:
            raise ValueError(problem)


def _choice(key: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is None or value in allowed:
        return None
    return f"train.{key} {value!r} is not one of {', '.join(allowed)}"


def _problem(tc: TrainConfig) -> str | None:
    """What is wrong with the section (the first thing found), or None."""
    freq = tc.checkpoint_freq
    checks: list[tuple[bool, str]] = [
        (tc.lr < 0 or tc.lr != tc.lr, f"train.lr {tc.lr} must be >= 0 (0 trains nothing, for a dry chain)"),
        (tc.max_steps is not None and tc.max_steps < 1, f"train.max_steps {tc.max_steps} must be >= 1 (or left out)"),
        (tc.total_seq_len < 1, f"train.total_seq_len {tc.total_seq_len} must be >= 1 (tokens per batch)"),
        (not freq > 0 or (freq > 1 and not float(freq).is_integer()),
         f"train.checkpoint_freq {freq} must be > 0, and a whole number of epochs when above 1"),
        (tc.ttt_steps < 1, f"train.ttt_steps {tc.ttt_steps} must be >= 1"),
        (tc.epochs < 1, f"train.epochs {tc.epochs} must be >= 1"),
        (not 0.0 < tc.train_data_ratio < 1.0, f"train.train_data_ratio {tc.train_data_ratio} must be in (0, 1)"),
        (tc.draft_vocab_size < 1, f"train.draft_vocab_size {tc.draft_vocab_size} must be >= 1"),
        (tc.num_workers < 0, f"train.num_workers {tc.num_workers} must be >= 0"),
        (not 0.0 <= tc.min_trained_fraction <= 1.0,
         f"train.min_trained_fraction {tc.min_trained_fraction} must be in [0, 1] (0: no floor)"),
        (tc.online_check_rows < 1, f"train.online_check_rows {tc.online_check_rows} must be >= 1"),
        (not tc.online_window_mb > 0, f"train.online_window_mb {tc.online_window_mb} must be > 0 (MB of connector "
                                      "files on disk at once)"),
        (tc.nproc_per_node < 1, f"train.nproc_per_node {tc.nproc_per_node} must be >= 1"),
        (tc.nnodes < 1, f"train.nnodes {tc.nnodes} must be >= 1"),
        (not 0 <= tc.node_rank < tc.nnodes, f"train.node_rank {tc.node_rank} must be in 0..nnodes-1 ({tc.nnodes - 1})"),
        (not 0 < tc.master_port < 65536, f"train.master_port {tc.master_port} must be a TCP port"),
    ]
    bad = next((msg for failed, msg in checks if failed), None)
    return bad or (_choice("optimizer", tc.optimizer, OPTIMIZERS)
                   or _choice("hidden_states_dtype", tc.hidden_states_dtype, HIDDEN_STATES_DTYPES)
                   or _choice("draft_attn_impl", tc.draft_attn_impl, DRAFT_ATTN_IMPLS)
                   or _choice("loss_implementation", tc.loss_implementation, LOSS_IMPLEMENTATIONS))
