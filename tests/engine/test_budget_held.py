"""The dollar budget as the display reads it (issue 34, finding 2): spent + left never passes the budget while
requests are admitted (it showed "$0.00 spent · $108.73 left" against $100), and a request abandoned on the wire
is held at its worst case, named apart from what was billed, until its bill settles it."""

from __future__ import annotations

from draftgen.engine.budget import Abandoned, BudgetGovernor, Prices
from draftgen.engine.progress import footer_segments, snapshot
from draftgen.engine.stats import RunStats
from draftgen.records import AttemptRecord, SettlementRecord, attempt_spend


def _governor() -> BudgetGovernor:
    return BudgetGovernor(prices=Prices(prompt=1e-6, completion=1e-5), priced=True, max_spend=100.0,
                          token_policy="expected", slots_worst=5.0)


def test_spent_plus_left_never_passes_the_budget_while_requests_are_admitted() -> None:
    gov = _governor()
    stats = RunStats(governor=gov)
    stats.remaining = gov.remaining  # what generate sets before the first request
    for i in range(200):  # the producer admits requests, as the scheduler does: reserved grows, nothing settles
        res = gov.reservation("q", "short", 4096, 300)
        gov.hold(res)
        stats.reserved = gov.reserved
        snap = snapshot(stats)
        assert snap.left is not None and snap.spent + snap.left <= 100.0 + 1e-9, (i, snap.spent, snap.left)
        assert snap.reserved == gov.reserved <= snap.left + 1e-9
    assert gov.reserved > 8.0  # the reference case: $8.73 reserved


def test_an_abandoned_request_is_held_apart_until_its_bill_settles_it() -> None:
    gov = _governor()
    stats = RunStats(governor=gov)
    res = gov.reservation("q", "short", 4096, 300)
    gov.hold(res)
    gov.settle_res(res, None, completion_tokens=0)
    gov.charge(0.5)  # a rejected response's bill
    a = Abandoned("q-1", "q", res.worst_usd, "gen-1")
    gov.hold_abandoned(a)
    assert abs(gov.spent - 0.5 - res.worst_usd) < 1e-12 and abs(gov.billed - 0.5) < 1e-12 and gov.held == res.worst_usd
    line = " · ".join(footer_segments(snapshot(stats))[0])
    assert f"(billed $0.50 + ${res.worst_usd:.2f} held for 1 abandoned request, worst case)" in line
    gov.settle_abandoned(a, 0.01)
    assert gov.held == 0 and gov.abandoned == 0 and abs(gov.spent - 0.51) < 1e-12
    assert "held for" not in " · ".join(footer_segments(snapshot(stats))[0])


def test_attempt_spend_replaces_a_hold_by_its_settlement_only() -> None:
    def att(outcome: str, cost: float, gid: str | None = None) -> AttemptRecord:
        return AttemptRecord(sample_id="s", dataset="q", attempt=1, started_at=0, ended_at=1, outcome=outcome,
                             cost=cost, generation_id=gid)

    attempts = [att("ok", 9.0), att("reasoning_dropped", 0.2), att("abandoned", 1.0, "gen-a"),
                att("abandoned", 2.0, "gen-b"), att("abandoned", 4.0)]
    got = attempt_spend(attempts, [SettlementRecord(generation_id="gen-a", sample_id="s", dataset="q", held_usd=1.0,
                                                    billed_usd=0.05, at=1.0)])
    assert (round(got.billed, 9), got.held, got.abandoned, got.settled) == (0.25, 6.0, 2, 1)
