"""The ``audit`` section: the audit's thresholds. Pure data."""

from __future__ import annotations

from draftgen.config.base import Section


class AuditConfig(Section):
    """The audit's reference ids and the thresholds that make ``draftgen audit`` exit non-zero."""

    reference: str | None = None
    """Reference ids (emulator ground truth or exact-id records) for the BPE audit."""
    max_structural_failure_rate: float | None = 0.0
    """Largest share of records allowed to fail a structural check (null: no limit)."""
    max_billing_disagreement: float | None = 0.005
    """Aggregate |rebuilt - billed| / billed completion tokens allowed over the rows merge keeps, after the exclusions (the reference run: 0.0004; null: no limit)."""
    max_semantic_mismatch_rate: float | None = 0.0
    """Largest share of the compared rows merge keeps whose decoded text differs from the reference (null: no limit)."""
    max_tokenization_mismatch_rate: float | None = None
    """Largest share of compared records with the same text but other ids (BPE drift)."""
    max_excluded_share: float | None = 0.25
    """Largest share of a dataset's (or the run's) samples whose record merge must leave out (billing far off, a structural failure, dropped reasoning, ...); past it the verdict fails (exit 3). A run whose merge would keep nothing always fails, whatever this says (null: no share limit)."""
