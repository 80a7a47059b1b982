"""Budget policies (``budget.token_policy``): the governor's p90 estimate, admission, the switch to worst
cases near the dollar cap, overshoot accounting, and end-to-end runs on the embedded emulator showing the
bounds: ``expected`` passes a token budget by at most what was in flight and the dollar budget by at most
the in-flight worst case; ``strict`` never passes either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests._generate_helpers import claim, emulator, fast, make_config, responses, write_prompts

from draftgen.engine.budget import (
    MIN_SAMPLES,
    RAISE_BUDGET,
    Admission,
    BudgetGovernor,
    LengthEstimate,
    Prices,
    TokenBudget,
)
from draftgen.phases.generate.run import run_generate

quiet: dict[str, Any] = {"echo": lambda s: None}


# -- the governor ----------------------------------------------------------------------------------------

def test_estimate_warms_up_then_takes_the_p90() -> None:
    est = LengthEstimate(max_tokens=1000)
    for n in range(MIN_SAMPLES - 1):
        est.add(100 + n)
        assert est.value == 1000  # max_tokens until MIN_SAMPLES lengths are in
    for n in range(81):
        est.add(100 + n)
    assert len(est.lengths) == 100
    lengths = sorted(est.lengths)
    assert est.value == lengths[90]  # 90 of the 100 lengths lie below it
    est.add(5000)  # never more than max_tokens
    big = LengthEstimate(max_tokens=10)
    for _ in range(MIN_SAMPLES):
        big.add(50)
    assert big.value == 10


def test_strict_reserves_max_tokens_and_expected_the_estimate() -> None:
    strict = BudgetGovernor(token_policy="strict")
    expected = BudgetGovernor(token_policy="expected")
    for gov in (strict, expected):
        for _ in range(MIN_SAMPLES):
            gov.observe("d", "short", 1000, 200)
    assert strict.estimate("d", "short", 1000) == 1000
    assert expected.estimate("d", "short", 1000) == 200
    assert expected.estimate("d", "long", 4000) == 4000  # its own partition: still warming up
    assert expected.estimate("e", "short", 1000) == 1000  # and its own dataset


def test_expected_admission_stops_when_done_plus_reserved_reaches_the_budget() -> None:
    gov = BudgetGovernor(token_policy="expected")
    gov.tokens["d"] = TokenBudget(budget=10_000)
    for _ in range(MIN_SAMPLES):
        gov.observe("d", "short", 4000, 500)
    admitted = []
    while True:
        res = gov.reservation("d", "short", 4000, 10)
        if gov.token_budget("d").check(res.tokens) is not Admission.OK:
            break
        gov.hold(res)
        admitted.append(res)
    tb = gov.token_budget("d")
    assert len(admitted) == 20 and tb.reserved == 10_000  # 20 × 500, where strict would hold 2 × 4000
    assert tb.check(500) is Admission.WAIT
    # Every one of them runs to max_tokens: the overshoot is what was in flight beyond its reservation.
    for res in admitted:
        gov.settle_res(res, None, completion_tokens=4000)
    assert tb.done == 80_000 and tb.overshoot == 70_000 == 20 * (4000 - 500)
    assert tb.check(1) is Admission.NEVER
    assert TokenBudget(budget=None, done=10**9).overshoot == 0


def test_dollars_reserve_the_estimate_far_from_the_cap_and_worst_cases_near_it() -> None:
    prices = Prices(prompt=1e-6, completion=1e-5)
    gov = BudgetGovernor(prices=prices, max_spend=10.0, token_policy="expected", slots_worst=5.0)
    res0 = gov.reservation("d", "short", 1000, 100)
    assert res0.usd == pytest.approx(res0.worst_usd) == pytest.approx(0.0101)  # warming up: worst case
    for i in range(MIN_SAMPLES):
        gov.observe("d", "short", 1000, 100 if i % 2 else 300)
    far = gov.reservation("d", "short", 1000, 100)  # tokens at the p90, dollars at the mean (one pool)
    assert far.tokens == 300 and far.usd == pytest.approx(0.0021) and far.worst_usd == pytest.approx(0.0101)
    # Near the cap (money left after reservations < (1 - p90) × slots_worst = $0.50): worst cases again.
    gov.session = 9.6
    near = gov.reservation("d", "short", 1000, 100)
    assert gov.near_cap() and near.tokens == 300 and near.usd == pytest.approx(0.0101)
    # The strict policy always reserves worst cases.
    strict = BudgetGovernor(prices=prices, max_spend=10.0, token_policy="strict", slots_worst=5.0)
    for _ in range(MIN_SAMPLES):
        strict.observe("d", "short", 1000, 200)
    assert strict.reservation("d", "short", 1000, 100).usd == pytest.approx(0.0101)


def test_account_caps_stay_on_worst_cases() -> None:
    gov = BudgetGovernor(prices=Prices(completion=1e-5), session_cap=0.05, token_policy="expected")
    gov.reserve("d", 100, 0.001, worst_usd=0.04)
    assert gov.remaining == pytest.approx(0.01)
    assert gov.check_dollars(0.001, 0.02) is Admission.WAIT  # the cheap reservation does not matter here
    assert gov.check_dollars(0.001, 0.06) is Admission.NEVER
    assert gov.check_dollars(0.001, 0.009) is Admission.OK
    gov.release("d", 100, 0.001, worst_usd=0.04)
    assert gov.reserved == 0 and gov.reserved_worst == 0


def test_dollar_overshoot_is_bounded_by_the_in_flight_worst_case() -> None:
    """Drive the governor as the engine does, every response running to max_tokens (the worst case for the
    estimate): spend never passes the cap by more than what was in flight beyond its reservations."""
    prices = Prices(completion=1e-5)
    conc, mt = 8, 1000
    gov = BudgetGovernor(prices=prices, max_spend=1.0, token_policy="expected",
                         slots_worst=conc * prices.worst_case(0, mt))
    for _ in range(MIN_SAMPLES):
        gov.observe("d", "short", mt, 100)  # a warm-up that badly underestimates the lengths
    in_flight: list[Any] = []
    worst_excess = 0.0
    for _ in range(10_000):
        while len(in_flight) < conc:
            res = gov.reservation("d", "short", mt, 0)
            if gov.check_dollars(res.usd, res.worst_usd) is not Admission.OK:
                break
            gov.hold(res)
            in_flight.append(res)
        worst_excess = max(worst_excess, sum(r.worst_usd - r.usd for r in in_flight))
        if not in_flight:
            break
        res = in_flight.pop(0)
        gov.settle_res(res, None, completion_tokens=mt)
        gov.session += prices.cost(0, mt)
    assert not in_flight and gov.spent > 0.9
    assert gov.spent <= 1.0 + worst_excess + 1e-9
    assert gov.spent <= 1.0 + conc * prices.worst_case(0, mt) + 1e-9


# -- end to end on the emulator --------------------------------------------------------------------------

def _run(tmp_path: Path, budget: dict[str, Any], n: int = 160, **scenario: Any) -> Any:
    run_dir = claim(make_config(tmp_path, ["a", "b"]))
    write_prompts(run_dir, "a", n)
    write_prompts(run_dir, "b", n)
    sc = fast(reasoning_tokens_median=300, content_tokens_median=80, length_sigma=0.9, runaway_rate=0.05,
              **scenario)
    with emulator(sc) as emu:
        cfg = make_config(tmp_path, ["a", "b"], base_url=emu.base_url, budget=budget,
                          partitions={"short": {"concurrency": 16, "max_tokens": 2048}})
        rep = run_generate(cfg, **quiet)
        billed = emu.state.spend_usd
    return rep, run_dir, billed


def test_expected_token_overshoot_is_bounded_and_reported(tmp_path: Path) -> None:
    rep, run_dir, _ = _run(tmp_path, {"token_budget": 20_000, "token_policy": "expected"})
    assert rep.exit_code == 0
    for d in rep.datasets:
        used = sum(r.usage.completion_tokens for r in responses(run_dir, d.name) if r.usage)
        assert used == d.completion_tokens and d.token_budget == 20_000
        assert d.skipped and "token budget reached" in d.skipped
        assert d.tokens_over_budget == max(0, used - 20_000)
        assert used <= 20_000 + 16 * 2048  # at most what was in flight (concurrency × max_tokens)


def test_strict_never_passes_a_budget(tmp_path: Path) -> None:
    rep, _, billed = _run(tmp_path, {"token_budget": 20_000, "max_spend_usd": 0.15, "token_policy": "strict"})
    for d in rep.datasets:
        assert d.completion_tokens <= 20_000 and d.tokens_over_budget == 0
    assert billed <= 0.15 + 1e-9 and rep.spend_over_budget == 0.0


def test_expected_dollar_overshoot_is_bounded(tmp_path: Path) -> None:
    rep, run_dir, billed = _run(tmp_path, {"max_spend_usd": 0.15, "token_policy": "expected"}, n=400)
    assert rep.exit_code != 0 and rep.message is not None and "dollar budget" in rep.message
    assert RAISE_BUDGET in rep.message  # the fix: a key and a flag that exist (test_the_stop_names_a_real_key_and_flag)
    # Routed prices: the worst over the fast roster's endpoints ($3/M completion); prompts are ~30 tokens.
    worst_in_flight = 16 * (2048 * 3.0e-6 + 64 * 0.6e-6)
    cost = sum(r.usage.cost for r in responses(run_dir, "a") + responses(run_dir, "b") if r.usage)
    assert cost == pytest.approx(billed)
    assert billed > 0.1
    assert billed <= 0.15 + worst_in_flight + 1e-9
    assert rep.spend_over_budget == pytest.approx(max(0.0, billed - 0.15), abs=1e-6)


def test_the_stop_names_a_real_key_and_flag() -> None:
    """The dollar-budget stop names the config key and the flag of the commands that spend; both exist."""
    import click

    from draftgen.cli import cli
    from draftgen.config.generate import BudgetConfig

    gov = BudgetGovernor(prices=Prices(completion=1e-5), max_spend=1.0)
    msg = gov.stop_message(0.5, 0.5)
    assert RAISE_BUDGET in msg and "budget.max_spend_usd" in msg and "--max-spend" in msg
    assert "max_spend_usd" in BudgetConfig.__struct_fields__
    for name in ("generate", "run"):
        cmd = cli.commands[name]
        assert isinstance(cmd, click.Command) and any("--max-spend" in p.opts for p in cmd.params), name


def test_plan_states_the_dollar_bound(tmp_path: Path) -> None:
    from draftgen.backends.pricing import PriceEstimate
    from draftgen.phases.plan.run import PlanReport, _budget_bound
    from draftgen.phases.plan.timing import PartitionTime

    cfg = make_config(tmp_path, ["a"], budget={"max_spend_usd": 100.0},
                      partitions={"short": {"concurrency": 2000, "max_tokens": 10240},
                                  "long": {"concurrency": 500, "max_tokens": 16384}})
    left = [PartitionTime(partition=p, requests=n, concurrency=c, max_tokens=m, waves=n / c, mean_latency_s=1.0,
                          slowest_s=1.0, time_s=1.0) for p, n, c, m in (("short", 5000, 2000, 10240),
                                                                        ("long", 900, 500, 16384))]
    rep = PlanReport(datasets=[], budget_usd=100.0, partitions=left)
    line = _budget_bound(cfg, rep)
    assert "2,000 × 10,240 + 500 × 16,384" in line and "in flight" in line
    rep.prices = PriceEstimate(prompt=0.44e-6, completion=2e-6, basis="price", max_completion=3e-6)
    assert "= $86" in _budget_bound(cfg, rep) and "86% of the budget" in _budget_bound(cfg, rep)
    strict = make_config(tmp_path, ["a"], budget={"max_spend_usd": 100.0, "token_policy": "strict"})
    assert "never passes" in _budget_bound(strict, rep)
