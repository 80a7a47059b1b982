"""The tail guard (engine/tail.py): stalled requests, the rate floor that retries slow streams elsewhere, and
hedges of stalled requests once nothing is left to start: the first usable response is the record, the other
request is cancelled and its cost booked as extra spend, and a sample never gets two records."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from _generate_helpers import write_prompts
from draftgen.backends.base import Completion, CompletionRequest
from draftgen.config import RetryConfig
from draftgen.engine import (
    AdaptiveLimiter,
    Assembler,
    BudgetGovernor,
    DatasetPlan,
    Engine,
    EngineOptions,
    HealthPolicy,
    PartitionPlan,
    Prices,
    ProviderHealth,
    RetryPolicy,
    RoutingGuard,
    RunLog,
    RunStats,
    TailPolicy,
    make_display,
)
from draftgen.engine.flight import Flight
from draftgen.engine.sinks import Sinks
from draftgen.engine.tail import TailGuard
from draftgen.records import Usage


def _completion(provider: str) -> Completion:
    return Completion(backend="openai", reasoning="Let me see.", content="Hello there.", finish_reason="stop",
                      provider=provider, usage=Usage(prompt_tokens=10, completion_tokens=8, cost=0.001))


class _Scripted:
    """A backend whose first request per sample does what ``first`` says (``hang``: silent until cancelled;
    ``trickle``: a few characters, then silent; ``stubborn``: silent, and answers even when cancelled, as a
    server that ignores the cancel would); every later request answers at once from Fastco."""

    name = "openai"
    reports_cost = False

    def __init__(self, first: dict[str, str]) -> None:
        self.first = first
        self.calls: list[CompletionRequest] = []
        self.seen: set[str] = set()

    async def complete(self, req: CompletionRequest) -> Completion:
        self.calls.append(req)
        how = self.first.get(req.sample_id) if req.sample_id not in self.seen else None
        self.seen.add(req.sample_id)
        if how == "trickle":
            assert req.meter is not None
            req.meter.data(8, 0, time.monotonic(), "Slowco")  # two tokens, then nothing
            await asyncio.sleep(3600)
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "stubborn":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                return _completion("Stubbornco")
        await asyncio.sleep(0)
        return _completion("Fastco")

    async def get_key_info(self) -> None:
        return None

    async def get_credits(self, management_key: str | None = None) -> None:
        return None

    async def get_model_endpoints(self, model: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _engine(tmp_path: Path, profile: Any, backend: _Scripted, n: int, tail: TailPolicy,
            concurrency: int = 8) -> tuple[Engine, RunStats, list[str]]:
    ids = write_prompts(tmp_path, "d", n)
    stats, log = RunStats(), RunLog(None)
    health = ProviderHealth(HealthPolicy(min_outcomes=1000), RoutingGuard(None))
    engine = Engine(
        backend=backend, assembler=Assembler(profile),  # type: ignore[arg-type]
        datasets=[DatasetPlan("d", tmp_path / "prepared" / "d" / "prompts.jsonl",
                              tmp_path / "raw" / "d" / "raw_responses.jsonl", tmp_path / "raw" / "d" / "failures.jsonl",
                              pending={"short": n})],
        partitions=[PartitionPlan("short", concurrency, 64)],
        governor=BudgetGovernor(prices=Prices(prompt=1e-6, completion=2e-6), priced=True),
        policy=RetryPolicy(RetryConfig(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01)), stats=stats,
        log=log, display=make_display("off", stats, log), health=health,
        options=EngineOptions(fsync=False, ramp_s=0.0, attempts_path=tmp_path / "logs" / "attempts.jsonl", tail=tail),
    )
    return engine, stats, ids


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


FAST_TAIL = TailPolicy(stall_s=0.05, warmup_stall_s=0.05, hedge_max_extra_spend=1.0, slow_window_s=0.0)


def test_stalled_requests_are_hedged_once_nothing_is_left_to_start(tmp_path: Path, qwen3_profile: Any) -> None:
    backend = _Scripted({})
    engine, stats, ids = _engine(tmp_path, qwen3_profile, backend, 6, FAST_TAIL)
    backend.first = {ids[1]: "hang", ids[4]: "stubborn"}
    result = asyncio.run(asyncio.wait_for(engine.run(), 30))
    assert result.exit_code == 0
    records = _lines(tmp_path / "raw" / "d" / "raw_responses.jsonl")
    assert sorted(r["sample_id"] for r in records) == sorted(ids)  # exactly one record per sample
    atts = _lines(tmp_path / "logs" / "attempts.jsonl")
    for sid in (ids[1], ids[4]):
        mine = [a for a in atts if a["sample_id"] == sid]
        assert {(a["outcome"], a.get("hedge", False)) for a in mine} == {("hedge_lost", False), ("ok", True)}, mine
    # the stubborn server answered the cancelled request all the same: that response was billed, never written
    stubborn = next(a for a in atts if a["sample_id"] == ids[4] and a["outcome"] == "hedge_lost")
    assert stubborn["provider"] == "Stubbornco" and stubborn["cost"] == pytest.approx(0.001)
    by_sid = {r["sample_id"]: r for r in records}
    assert by_sid[ids[4]]["provider"] == by_sid[ids[1]]["provider"] == "Fastco"
    assert (stats.hedges, stats.hedges_won) == (2, 2)
    lost = sum(a["cost"] for a in atts if a["outcome"] == "hedge_lost")
    assert stats.hedge_extra_usd == pytest.approx(lost) and lost > 0.001  # the hung one's prompt is booked too
    assert engine.governor.hedge_spent == pytest.approx(lost) and engine.governor.hedge_reserved == 0
    assert engine.governor.reserved == pytest.approx(0.0, abs=1e-12)  # every hedge's reservation released
    assert stats.spend_session == pytest.approx(6 * 0.001 + lost)  # the extra spend is in the run's spend
    assert engine.limiters["short"].in_use == 0


def test_no_hedge_beyond_the_cap_on_extra_spend(tmp_path: Path, qwen3_profile: Any) -> None:
    backend = _Scripted({})
    tail = TailPolicy(stall_s=0.05, warmup_stall_s=0.05, hedge_max_extra_spend=0.0, slow_window_s=0.3,
                      min_tokens_per_s=1.0)
    engine, stats, ids = _engine(tmp_path, qwen3_profile, backend, 3, tail)
    backend.first = {ids[0]: "trickle"}
    asyncio.run(asyncio.wait_for(engine.run(), 30))
    assert stats.hedges == 0 and stats.slow_streams == 1  # no hedging: the rate floor ended it


def test_a_slow_stream_is_cancelled_and_retried_on_another_provider(tmp_path: Path, qwen3_profile: Any) -> None:
    backend = _Scripted({})
    tail = TailPolicy(slow_window_s=0.3, min_tokens_per_s=50.0, hedge_max_extra_spend=0.0)
    engine, stats, ids = _engine(tmp_path, qwen3_profile, backend, 2, tail)
    backend.first = {ids[0]: "trickle"}
    t0 = time.monotonic()
    asyncio.run(asyncio.wait_for(engine.run(), 30))
    assert time.monotonic() - t0 < 5  # long before any idle timeout or deadline
    atts = [a for a in _lines(tmp_path / "logs" / "attempts.jsonl") if a["sample_id"] == ids[0]]
    assert [a["outcome"] for a in atts] == ["slow_stream", "ok"] and atts[0]["provider"] == "Slowco"
    retry = [c for c in backend.calls if c.sample_id == ids[0]][-1]
    assert retry.provider_ignore == ["slowco"]  # the retry avoids the slow provider
    assert stats.slow_streams == 1 and stats.retries["slow_stream"] == 1
    assert len(_lines(tmp_path / "raw" / "d" / "raw_responses.jsonl")) == 2


def test_the_guard_marks_stalls_and_the_rate_floor_needs_a_whole_window() -> None:
    stats = RunStats()
    pc = stats.partition("short")
    now = 1000.0
    quiet = Flight(("d", "a"), "short", now - 10.0)  # no data for 10 s
    busy = Flight(("d", "b"), "short", now - 10.0)
    busy.meter.data(4000, 0, now - 0.1)
    pc.flight = {quiet.key: quiet, busy.key: busy}
    stalled: list[tuple[str, int]] = []
    guard = TailGuard(TailPolicy(stall_s=2.0, warmup_stall_s=5.0), stats, hedge=lambda fl: False,
                      drained=lambda part: False, stalled=lambda part, n: stalled.append((part, n)))
    guard.tick(now)
    assert (pc.stalled, pc.stalled_s) == (1, pytest.approx(10.0)) and stalled == [("short", 1)]
    # the rate floor: a stream that got 2 tokens and then nothing, judged only after a whole window
    g = TailGuard(TailPolicy(min_tokens_per_s=1.0, slow_window_s=10.0), stats, hedge=lambda f: False,
                  drained=lambda part: False)

    async def judged() -> list[bool]:
        fl = Flight(("d", "c"), "short", 0.0)
        fl.meter.data(8, 0, 0.0)
        async with fl.scope():  # on the wire
            return [g.slow(fl, t, 4.0) for t in (1.0, 5.0, 9.0, 10.5)]

    assert asyncio.run(judged()) == [False, False, False, True]

    # no first byte: the same floor, its window counted from when the request went out; never without streaming
    async def silent(streamed: bool) -> list[bool]:
        guard = TailGuard(TailPolicy(min_tokens_per_s=1.0, slow_window_s=10.0, streamed=streamed), stats,
                          hedge=lambda f: False, drained=lambda part: False)
        fl = Flight(("d", "e"), "short", 0.0)
        async with fl.scope():
            return [guard.slow(fl, t, 4.0) for t in (5.0, 9.9, 10.0)]

    assert asyncio.run(silent(True)) == [False, False, True]
    assert asyncio.run(silent(False)) == [False, False, False]


def test_a_request_with_no_first_byte_is_retried_by_the_rate_floor(tmp_path: Path, qwen3_profile: Any) -> None:
    backend = _Scripted({})
    tail = TailPolicy(slow_window_s=0.3, min_tokens_per_s=1.0, hedge_max_extra_spend=0.0)
    engine, stats, ids = _engine(tmp_path, qwen3_profile, backend, 2, tail)
    backend.first = {ids[0]: "hang"}  # silent until cancelled: not a byte
    t0 = time.monotonic()
    asyncio.run(asyncio.wait_for(engine.run(), 30))
    assert time.monotonic() - t0 < 5
    atts = [a for a in _lines(tmp_path / "logs" / "attempts.jsonl") if a["sample_id"] == ids[0]]
    assert [a["outcome"] for a in atts] == ["slow_stream", "ok"]
    assert stats.slow_streams == 1 and stats.retries["slow_stream"] == 1
    assert len(_lines(tmp_path / "raw" / "d" / "raw_responses.jsonl")) == 2


def test_stalled_slots_do_not_count_against_the_adaptive_limit() -> None:
    lim = AdaptiveLimiter(4, floor=1)
    lim.limit = 2.0  # lowered in a 429 storm
    assert lim.try_acquire() and lim.try_acquire() and not lim.try_acquire()
    lim.set_stalled(2)  # both hang: new work may go out, up to the configured concurrency
    assert lim.try_acquire() and lim.try_acquire() and not lim.try_acquire()  # 4 = the ceiling
    assert lim.in_use == 4


def test_the_sink_writes_one_record_per_sample() -> None:
    sinks = Sinks([], RunStats(), fsync=False, attempts_path=None, health_path=None)
    assert sinks.claim("d", "d-1") and not sinks.claim("d", "d-1") and sinks.claim("e", "d-1")
