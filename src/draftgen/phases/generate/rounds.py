"""``generate --round N``: start a round ``plan --next-round`` proposed (``rounds/round-<n>.json``).

Starting a round writes its file once more with ``started_at`` set; from then on ``prepare`` draws the
round's prompts (``runview.rounds.started_adds``) and generate sends them, resuming by sample id as for any
prompt. A started round is fixed: a second ``--round N`` resumes it, and a new proposal gets the next number.
"""

from __future__ import annotations

import time

from draftgen.errors import InputError
from draftgen.phases import Echo
from draftgen.records import RoundPlan
from draftgen.rundir import RunDir
from draftgen.runview.rounds import read_rounds
from draftgen.store import atomic_write_json

__all__ = ["start_round"]


def start_round(rd: RunDir, n: int, echo: Echo = print) -> RoundPlan:
    """Mark round ``n`` started (idempotent). Refused, naming the fix: no such proposal, or an earlier
    round proposed but never started."""
    rounds = {r.round: r for r in read_rounds(rd.root)}
    plan = rounds.get(n)
    if plan is None:
        raise InputError(f"{rd.round_plan(n)}: not found; propose round {n} first with `draftgen plan CONFIG "
                         "--next-round`" + (f" (proposed: {', '.join(str(r) for r in sorted(rounds))})"
                                            if rounds else ""))
    earlier = [r for r in range(2, n) if r not in rounds or rounds[r].started_at is None]
    if earlier:
        raise InputError(f"--round {n}: round {earlier[0]} was never started; start it first "
                         f"(`draftgen generate CONFIG --round {earlier[0]}`) or propose again")
    if plan.started_at is not None:
        echo(f"round {n}: started before; resuming it")
        return plan
    plan.started_at = time.time()
    atomic_write_json(rd.round_plan(n), plan)
    adds = ", ".join(f"{d.dataset} +{d.add_samples}" for d in plan.datasets if d.add_samples)
    echo(f"round {n} started ({plan.spread}): {adds or 'no prompt added'}")
    return plan
