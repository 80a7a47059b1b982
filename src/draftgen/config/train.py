"""The ``train`` section of the run configuration: how ``draftgen train`` trains an EAGLE-3 drafter with
speculators on the extracted hidden states (``draftgen.phases.train``). Imported by ``draftgen.config`` (the
``RunConfig.train`` field); ``docs/config.md`` is generated from these docstrings."""

from __future__ import annotations

import msgspec

__all__ = ["TrainConfig"]


class TrainConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """How ``draftgen train`` trains the drafter (speculators, in its own environment)."""

    speculators: str | None = None
    """The ``speculators`` executable, or the Python of the environment speculators is installed in
    (default: the ``DRAFTGEN_SPECULATORS`` environment variable, else ``speculators`` on PATH)."""
    verifier: str | None = None
    """The target model's local folder (config, weights, tokenizer); default: the hidden-state manifest's
    target name when it is a local folder."""
    hidden: str | None = None
    """The hidden-state set to train on (a path or fsspec URL); default: the run directory's ``hidden/``."""
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
    extra_args: list[str] = msgspec.field(default_factory=list)
    """Further ``speculators train`` flags, passed as given (``["--no-norm-before-residual"]``)."""
