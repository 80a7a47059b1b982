"""Round records: ``rounds/round-<n>.json`` (``RoundPlan``), a later round of generation that ``plan
--next-round`` proposed from a measured acceptance and ``generate --round N`` started.

Round 1 is the run as configured; it has no file. A round's file is written by ``plan`` while the round is
proposed (a new proposal replaces it) and rewritten once by ``generate --round N`` with ``started_at`` set;
from then on it is fixed, and ``prepare`` draws each dataset's ``add_samples`` more prompts for it (the
seeded bottom-k sample grows, so every earlier prompt stays and keeps its id and its round), or, for a
dataset whose line has tags, each tag's ``add_samples`` more prompts carrying that tag.
"""

from __future__ import annotations

import msgspec

from draftgen.records.base import SCHEMA_VERSION


class RoundArm(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What a dataset's line and a tag's line of a proposal share: each is an arm of the model, with what was
    measured, what the model expects and what to add."""

    traffic: float = 0.0
    """Its share of the served traffic (``datasets[].traffic``, normalised; equal shares when unset; a tag's:
    its dataset's split over its tags by their share of its drawn prompts)."""
    acceptance_length: float | None = None
    ci95: list[float] | None = None
    prompts_measured: int = 0
    training_tokens: int = 0
    """Supervised (loss-masked) tokens in merged/ when the acceptance was measured (a tag's: the dataset's × the
    tag's share of its drawn prompts, an estimate: merged/ keeps no tags)."""
    tokens_per_sample: float = 0.0
    """Mean supervised tokens a new sample adds (the dataset's merged rows)."""
    available: int = 0
    """Prompts of the source not drawn yet (prepare's ``not_selected``, a tag's ``tags_not_selected``): the most
    this round can add."""
    add_samples: int = 0
    add_tokens: int = 0
    add_usd: float = 0.0
    expected_acceptance_length: float | None = None
    note: str | None = None


class RoundTag(RoundArm, kw_only=True):
    """One tag's line under its dataset (``datasets[].tags_field``): the tag is an arm of the same model as a
    dataset, with its own measured acceptance, training tokens, traffic and room."""

    tag: str
    """The tag (``records.prompts.UNTAGGED``, "": the dataset's prompts that carry none)."""


class RoundDataset(RoundArm, kw_only=True):
    """One dataset's line of a proposal."""

    dataset: str
    training_share: float = 0.0
    usd_per_sample: float = 0.0
    """Mean cost of one of its responses so far (0: free, or not known)."""
    tags: list[RoundTag] = msgspec.field(default_factory=list)
    """Its tags' lines where its measured prompts carry tags; ``add_samples`` is then their sum, and prepare
    draws each tag's own (``RoundPlan.tag_adds``)."""


class RoundPlan(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``rounds/round-<n>.json``: a round's proposal (see the module docstring) and, once started, the
    round ``prepare`` draws."""

    round: int
    spread: str
    """``guided``: the budget where the model expects the largest traffic-weighted gain per unit spent;
    ``uniform``: the same extra tokens for every dataset (the comparison)."""
    budget_unit: str
    """``usd`` or ``tokens`` (supervised tokens): what ``budget`` counts."""
    budget: float
    k: int
    """The served speculative tokens of the measurement: the model's ceiling is k + 1."""
    alpha: float
    """The exponent of the assumed law AL(n) = (k + 1) - c * n**-alpha per dataset (``plan.round_alpha``)."""
    basis: str
    """The acceptance report the proposal reads (relative to the run directory)."""
    drafter: str = ""
    datasets: list[RoundDataset] = msgspec.field(default_factory=list)
    weighted_now: float | None = None
    weighted_expected: float | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    proposed_at: float = 0.0
    started_at: float | None = None
    schema_version: int = SCHEMA_VERSION

    def adds(self, dataset: str) -> int:
        """The prompts this round adds to ``dataset`` (0 when it names none)."""
        return next((d.add_samples for d in self.datasets if d.dataset == dataset), 0)

    def tag_adds(self, dataset: str) -> dict[str, int]:
        """The prompts this round adds to ``dataset`` per tag ({}: none by tag, ``adds`` by sample key)."""
        line = next((d for d in self.datasets if d.dataset == dataset), None)
        return {t.tag: t.add_samples for t in line.tags} if line is not None and line.tags else {}
