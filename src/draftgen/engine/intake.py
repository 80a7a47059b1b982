"""The one intake of a response: whether a ``backends.base.Completion`` may become a record, and what a batch
was billed beyond its results. Plain functions (no I/O).

Every way a response arrives goes through ``check_response``, so a new path cannot skip a check:

- a synchronous response, streamed or not (``engine.sample.SampleRunner.call``); a hedge is a request of its
  own sent through that same ``call`` (``engine.hedge``);
- a result of an OpenRouter batch (``engine.batch_ingest``), its duplicates included;
- a record brought in by ``draftgen import`` (``phases.importer.run``), on the fields the record carries.

The checks, in this order (the first that fails raises):

    tokens        more output ids or billed completion tokens than ``max_tokens`` allows
                  (``assemble.check_tokens``): ``too_many_tokens``, a ``RetryableAPIError`` (an invalid
                  response, not an unusable one: nothing of it is ever kept)
    identity      another model, a stream that changed provider, a provider the routing excluded
                  (``usable.check_identity``): ``model_mismatch``, ``provider_changed``, ``provider_excluded``
    completeness  no finish reason, or ``length`` under ``quality.min_length_fraction`` of ``max_tokens``
                  (``usable.check_complete``): ``incomplete``
    reasoning     reasoning tokens billed and no reasoning text, when the run asks for reasoning
                  (``assemble.check_reasoning``): ``reasoning_dropped``

All but ``tokens`` raise ``assemble.UnusableResponse``: whatever the path, the response is no record, what
it was billed is booked as spend, its provider is avoided by the sample's next attempt, and the sample is
retried (not done). The rules are the run's (``IntakeRules.from_config``), the routing guard the run's
(``health.RoutingGuard``, None where the endpoints are unknown).

Billing (``unattributed``): a batch's own ``usage.cost`` is what the server billed for it. When it exceeds
the sum of the costs booked for its results (duplicates, custom_ids it was not submitted with, prices
above the batch prices), the remainder is spend with no record, booked as sync books a billed response it
rejected (``BudgetGovernor.charge``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftgen.backends.base import Completion
from draftgen.engine.assemble import check_reasoning, check_tokens
from draftgen.engine.health import RoutingGuard
from draftgen.engine.usable import check_complete, check_identity

if TYPE_CHECKING:
    from draftgen.config import RunConfig

__all__ = ["SAME_USD", "IntakeRules", "check_response", "unattributed"]


@dataclass(frozen=True)
class IntakeRules:
    """What a run holds every response to. ``model``: the model requested (None: not checked);
    ``aliases``: ``quality.model_aliases``; ``min_length_fraction``: ``quality.min_length_fraction``;
    ``require_reasoning``: the run asks for reasoning (``reasoning.exclude`` is false); ``finish_required``:
    a response without a finish reason is incomplete (false only for what cannot carry one: an imported
    bare ``{sample_id, output_ids}`` row)."""

    model: str | None = None
    aliases: tuple[str, ...] = ()
    min_length_fraction: float = 0.5
    require_reasoning: bool = True
    finish_required: bool = True

    @classmethod
    def from_config(cls, cfg: RunConfig) -> IntakeRules:
        """The rules of a run of ``cfg``: the one mapping from the config, for every path."""
        q = cfg.quality
        return cls(model=cfg.model.id, aliases=tuple(q.model_aliases), min_length_fraction=q.min_length_fraction,
                   require_reasoning=not cfg.reasoning.exclude)


def check_response(comp: Completion, max_tokens: int, rules: IntakeRules, *, guard: RoutingGuard | None = None,
                   sent_ignore: Sequence[str] | None = None) -> None:
    """Raise for a response that cannot be a record (module docstring): ``too_many_tokens`` (a
    ``RetryableAPIError``) or an ``UnusableResponse`` with its kind. ``sent_ignore``: the providers the
    request itself asked to avoid (``provider.ignore``)."""
    check_tokens(comp, max_tokens)
    check_identity(comp, model=rules.model, aliases=rules.aliases, guard=guard, sent_ignore=sent_ignore)
    check_complete(comp, max_tokens, rules.min_length_fraction, require_finish=rules.finish_required)
    if rules.require_reasoning:
        check_reasoning(comp)


#: dollars below which a batch's bill and the sum of its results' costs are the same (float sums of the same
#: costs in another order differ in their last bits)
SAME_USD = 1e-9


def unattributed(billed: float | None, booked: float) -> float:
    """What a batch was billed (``billed``: its ``usage.cost``; None when it said none) beyond the costs
    ``booked`` for its results: the spend to book with no record; 0 when it billed no more."""
    if billed is None or not math.isfinite(billed) or billed - booked <= SAME_USD:
        return 0.0
    return billed - booked
