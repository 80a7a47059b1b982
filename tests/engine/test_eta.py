"""The live ETA (``engine.timemodel``, drawn by ``engine.progress``): the time model plan uses, fed with what
each stream in flight still has to produce, held against the time a run really took to its end.

- the model's parts: lengths with the streams in flight counted as censored samples, and plan's last wave;
- a recorded schedule (a deterministic sequence of streams: lengths, speeds, first-token waits, in the shape
  of the emulator's realistic roster) fed through ``RunStats`` and ``snapshot`` on a simulated clock;
- the emulator's realistic scenario, scaled down in time, through the real engine and HTTP backend.

At 25%, 50%, 75% and 95% done the ETA shown must be within 2x of the time the run then still took."""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from _generate_helpers import make_config, write_prompts
from draftgen.engine import RunStats
from draftgen.engine.flight import Flight
from draftgen.engine.progress import snapshot
from draftgen.engine.timemodel import Lengths, Stream, last_wave_s, wave_time

MARKS = (0.25, 0.5, 0.75, 0.95)


def test_lengths_count_streams_in_flight_as_at_least_what_they_received() -> None:
    # finished 100, 200, 300; two streams on the wire at 250 and 1,000 tokens; plan's worst case one more
    km = Lengths.observed([100, 200, 300], [250.0, 1000.0], 2000)
    assert km.survival(50) == 1.0
    assert km.survival(150) == pytest.approx(5 / 6)
    assert km.survival(250) == pytest.approx(5 / 6 * 4 / 5)
    # at 300 only 3 are at risk (300 itself, the stream at 1,000, the worst case): the 250 one left the count
    assert km.survival(300) == pytest.approx(5 / 6 * 4 / 5 * 2 / 3)
    assert km.survival(1999) == km.survival(300) and km.survival(2000) == 0.0  # the rest ends at max_tokens
    # the finished lengths alone would say nothing is longer than 300: the tail on the wire would vanish
    assert Lengths.observed([100, 200, 300], [], 2000).survival(300) > 0.0


def test_plan_last_wave_is_one_request_at_max_tokens_at_the_slowest_rate() -> None:
    """Before a run nothing is known of the lengths: the same function gives plan's slowest request."""
    assert last_wave_s([Stream(0.0, (20.0,), 3.0)], Lengths.unknown(10_240)) == pytest.approx(3.0 + 512.0)
    assert wave_time(500, 200, 40.0, 515.0) == (2.5, pytest.approx(1.5 * 40 + 515))


# -- a recorded schedule --------------------------------------------------------------------------------------

#: The emulator's realistic roster (``emulator.scenarios._roster``): (first-token wait, tokens/s) ranges.
ROSTER = (((1, 8), (20, 70)), ((2, 8), (40, 65)), ((0.3, 1), (150, 250)), ((0.3, 0.5), (200, 350)),
          ((0.3, 1), (150, 250)), ((1, 3), (23, 33)), ((1, 4), (30, 60)), ((1, 2), (35, 45)))


@dataclass(frozen=True)
class Planned:
    ttft_s: float
    rate: float
    tokens: int


def schedule(n: int, max_tokens: int, seed: int) -> list[Planned]:
    """Streams as the realistic scenario draws them: reasoning (median 1,500) plus content (median 400),
    log-normal with sigma 0.9, 2% runaways to max_tokens, on a provider drawn from the roster."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        (t0, t1), (r0, r1) = rng.choice(ROSTER)
        length = int(1500 * math.exp(rng.gauss(0, 0.9))) + int(400 * math.exp(rng.gauss(0, 0.9)))
        if rng.random() < 0.02:
            length = max_tokens
        out.append(Planned(rng.uniform(t0, t1), rng.uniform(r0, r1), min(length, max_tokens)))
    return out


def replay(plan: list[Planned], concurrency: int, max_tokens: int, step: float = 1.0) -> list[tuple[float, float]]:
    """Run ``plan`` through ``RunStats`` on a simulated clock, ``concurrency`` at a time, as the engine feeds
    it (a flight per request, its meter fed as text arrives, ``attempt_ended`` and ``response_in`` as it
    ends); returns (ETA shown, time the run then still took) at each of ``MARKS``."""
    t = [0.0]
    stats = RunStats(clock=lambda: t[0], started=0.0)
    pc = stats.partition("short")
    pc.planned, pc.max_tokens = len(plan), max_tokens
    stats.limit, stats.in_flight = {"short": concurrency}, {"short": 0}
    queue = list(enumerate(plan))
    wire: dict[int, tuple[Flight, Planned]] = {}
    seen: list[tuple[float, float | None]] = []
    marks = list(MARKS)
    while queue or wire:
        while queue and len(wire) < concurrency:
            i, p = queue.pop(0)
            fl = Flight(("chat", f"chat-{i:04d}"), "short", t[0])
            pc.flight[fl.key] = fl
            wire[i] = (fl, p)
        t[0] += step
        for i, (fl, p) in list(wire.items()):
            streaming = t[0] - fl.started - p.ttft_s
            if streaming <= 0:
                continue
            got = min(p.tokens, int(streaming * p.rate))
            fl.meter.data(4 * got, 0, t[0])
            if got >= p.tokens:
                del wire[i], pc.flight[fl.key]
                stats.attempt_ended(fl, p.tokens)
                stats.response_in("short", p.tokens, 4 * p.tokens, p.ttft_s)
                pc.done += 1
        stats.in_flight["short"] = len(wire)
        stats.sample()
        snap = snapshot(stats)
        while marks and pc.done >= marks[0] * len(plan):
            seen.append((t[0], snap.rows[0].eta_s))
            marks.pop(0)
    return [(eta if eta is not None else math.nan, t[0] - at) for at, eta in seen]


@pytest.mark.parametrize(("n", "concurrency", "seed"), [(284, 2000, 1), (284, 2000, 2), (600, 150, 3)])
def test_recorded_schedule_eta_within_2x_through_the_tail(n: int, concurrency: int, seed: int) -> None:
    """The issue's run (284 prompts, max_tokens 10,240, 2,000 in flight: one wave whose tail is a few slow
    streams running to max_tokens), and one of several waves (600 at 150 in flight)."""
    got = replay(schedule(n, 10_240, seed), concurrency, 10_240)
    assert len(got) == len(MARKS)
    for mark, (eta, left) in zip(MARKS, got, strict=True):
        assert 0.5 <= eta / left <= 2.0, f"at {mark:.0%} done: ETA {eta:.0f}s, the run took {left:.0f}s more ({got})"


# -- the emulator's realistic scenario, scaled down -----------------------------------------------------------


def test_realistic_emulator_long_tail_eta_within_2x(tmp_path: Path, qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    """The realistic scenario on a clock 10x fast (its 20-70 tok/s providers beside 150-350 tok/s ones, its
    long tail of samples running to max_tokens), all samples in flight at once as in the issue's run,
    through the real engine, OpenRouter backend and display. The display's ETA is read at each mark."""
    from _generate_helpers import emulator
    from draftgen.backends import open_backend
    from draftgen.config import RetryConfig
    from draftgen.emulator import builtin_scenario
    from draftgen.engine import (
        Assembler,
        BudgetGovernor,
        DatasetPlan,
        Engine,
        EngineOptions,
        PartitionPlan,
        Prices,
        RetryPolicy,
        RunLog,
        make_display,
    )

    scale, n, max_tokens = 0.1, 60, 4096  # 10x fast: at 20x a loaded 2-core machine's scheduling jitter showed
    sc = builtin_scenario("realistic").replace(time_scale=scale, pool_size=64, stream_chunk_tokens=32,
                                               keepalive_comments=1)
    sc = sc.replace(providers=[p.__class__(**{**p.__dict__, "faults": {}}) for p in sc.providers])  # no faults
    write_prompts(tmp_path, "d", n)
    with emulator(sc) as emu:
        cfg = make_config(tmp_path, ["d"], base_url=emu.base_url,
                          partitions={"short": {"concurrency": 200, "max_tokens": max_tokens}})
        stats, log = RunStats(), RunLog(None)
        stats.eta_every_s = 2.0 * scale * 5  # the display's cadence, scaled down with the clock

        async def main() -> tuple[list[tuple[float, float | None, str | None]], float, float]:
            async with open_backend(cfg, "sk-or-test") as backend:
                display = make_display("off", stats, log, interval=0.05)
                engine = Engine(
                    backend=backend, assembler=Assembler(qwen3_profile),
                    datasets=[DatasetPlan("d", tmp_path / "prepared" / "d" / "prompts.jsonl",
                                          tmp_path / "raw" / "d" / "raw_responses.jsonl",
                                          tmp_path / "raw" / "d" / "failures.jsonl", pending={"short": n})],
                    partitions=[PartitionPlan("short", 200, max_tokens)],
                    governor=BudgetGovernor(prices=Prices(prompt=1e-6, completion=2e-6), priced=True),
                    policy=RetryPolicy(RetryConfig(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)),
                    stats=stats, log=log, display=display, options=EngineOptions(fsync=False, ramp_s=0.0),
                )
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                display.start()  # as generate does
                run = asyncio.create_task(engine.run())
                seen: list[tuple[float, float | None, str | None]] = []
                marks = list(MARKS)
                while not run.done():
                    await asyncio.sleep(0.02)
                    snap = display.snap
                    if snap is None:
                        continue
                    row = snap.rows[0]
                    while marks and row.done >= marks[0] * n:
                        seen.append((loop.time(), row.eta_s, row.eta_basis))
                        marks.pop(0)
                result = await run
                await display.stop()
                assert result.exit_code == 0
                return seen, t0, loop.time()

        seen, start, end = asyncio.run(main())
    assert stats.partition("short").done == n and len(seen) == len(MARKS)
    lefts = [end - at for at, _, _ in seen]
    assert lefts[1] > seen[1][0] - start  # a long tail: the second half of the samples took longer than the first
    shown = [(round(e or 0.0, 2), round(lf, 2)) for (_, e, _), lf in zip(seen, lefts, strict=True)]
    for mark, (_, eta, basis), left in zip(MARKS, seen, lefts, strict=True):
        assert eta is not None and basis is not None, (mark, seen)
        assert 0.5 <= eta / left <= 2.0, (f"at {mark:.0%} done: ETA {eta:.2f}s ({basis}), the run took {left:.2f}s "
                                          f"more; (ETA, left) at each mark: {shown}")
