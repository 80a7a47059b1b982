"""The ``merge`` section: caps, weights, shuffling, splits and export formats. Pure data."""

from __future__ import annotations

from typing import Literal

import msgspec

from draftgen.config.base import Section


class MergeConfig(Section):
    """How ``merge`` builds merged/ from the raw responses."""

    max_seq_len: int = 8192
    """Cap on prompt + completion tokens per sample; longer samples are cut (``overflow``)."""
    overflow: Literal["truncate", "drop"] = "truncate"
    """Over ``max_seq_len``: keep the first ``max_seq_len`` tokens, or drop the sample."""
    drop_truncated: bool = False
    """Drop samples whose generation hit max_tokens (finish_reason ``length``)."""
    drop_audit_failed: bool = True
    """Drop samples listed in audit/audit.json ``failed_sample_ids`` (skipped when there is no audit)."""
    min_tokens: int = 0
    """Drop samples with fewer completion tokens than this."""
    max_tokens: int | None = None
    """Drop samples with more completion tokens than this (before the ``max_seq_len`` cap)."""
    dedupe: bool = True
    """Keep one sample per ``dedupe_key`` across all datasets (the first dataset in config order wins)."""
    dedupe_key: Literal["prompt", "sequence"] = "prompt"
    """What counts as a duplicate: the same prompt (content hash), or the same prompt + completion ids."""
    seed: int = 0
    """Seed of the weight/cap draw, the shuffle and the train/validation split."""
    val_fraction: float = 0.0
    """Share of distinct samples put in the validation split."""
    mask_reasoning: bool = False
    """loss_mask 0 over the reasoning tokens (through the end-of-think marker) as well as the prompt."""
    exports: list[str] = msgspec.field(default_factory=lambda: ["speculators", "specforge"])
    """Peer formats written to exports/<format>/ beside merged/, each one of those registered in ``draftgen.exporters.EXPORTERS``."""
