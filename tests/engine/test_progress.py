"""The live display: a snapshot of the run's figures, drawn on a recorded terminal and as plain lines, and the
scheduler's tracking of the requests in flight that feeds it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rich.console import Console

from _generate_helpers import write_prompts
from draftgen.config import RetryConfig
from draftgen.engine import BudgetGovernor, Prices, RetryPolicy, RunStats
from draftgen.engine.flight import Flight
from draftgen.engine.progress import (
    RowFigures,
    Snapshot,
    footer_lines,
    footer_segments,
    main_cells,
    plain_line,
    render,
    row_cells,
    snapshot,
    wire_cells,
)
from draftgen.errors import RetryableAPIError
from draftgen.records import Usage

SHORT_ID = "chat-0123456789abcdef"
LONG_ID = "code-fedcba9876543210"


def _snapshot(**over: object) -> Snapshot:
    """A $100 run well under way: large counts, long sample ids (the widest figures a run shows)."""
    rows = (
        RowFigures("short", 25_000, 12_345, 3, 12_300.0, 4.5, 1990, 2000, 8.20, 800.0, 12, SHORT_ID, 52.0, 3, 41.0),
        RowFigures("long", 10_314, 2_000, 1, 5_300.0, 1.0, 500, 500, 4.10, 9000.0, 3, LONG_ID, 310.0),
        RowFigures("total", 35_314, 14_345, 4, 17_600.0, 5.5, 2490, 2500, 12.30, 3800.0, 15, LONG_ID, 310.0, 3, 41.0),
    )
    base: dict[str, object] = dict(
        rows=rows, spent=12.30, left=87.70, reserved=7.60, retries=(("rate_limited", 10), ("timeout", 5)),
        failures=(("retries_exhausted:timeout", 4),), providers=(("Chutes", 3000),), elapsed_s=1200.0,
        token_budgets=(("chat", 1_234_567, 10_000_000), ("code", 400_000, 10_000_000)), hedges=(3, 2, 0.0123),
    )
    base.update(over)
    return Snapshot(**base)  # type: ignore[arg-type]


def _terminal(snap: Snapshot, width: int = 160) -> list[str]:
    console = Console(record=True, width=width, force_terminal=True)
    console.print(render(snap))
    return console.export_text().rstrip("\n").split("\n")


def test_recorded_terminal_one_line_per_partition_and_total_when_wide() -> None:
    snap = _snapshot()
    lines = _terminal(snap, 240)
    # one line per partition and the total, then the run-wide lines: nothing wrapped onto a line of its own
    assert len(lines) == len(snap.rows) + len(footer_lines(snap)), lines
    assert all(len(line) <= 240 for line in lines)
    for i, name in enumerate(("short", "long", "total")):
        assert lines[i].startswith(name + " "), lines[i]
        assert "━" in lines[i]  # the bar of done out of planned
    short, long_, total = lines[:3]
    assert "done 12,345/25,000 (49%)" in short and "12,652 remaining" in short and "in flight 1990/2000" in short
    assert "done 14,345/35,314 (41%)" in total and "20,965 remaining" in total and "retries 15" in total
    assert "tok/s" in long_ and "resp/s" in long_ and "ETA 2h 30m" in long_ and "oldest 5m 10s" in long_
    assert "stalled 3 (41s)" in short and "stalled 0" in long_
    text = "\n".join(lines)
    assert "$12.30 spent · $87.70 left ($7.60 reserved)" in text
    assert "retries: rate_limited 10, timeout 5" in text and "failures: retries_exhausted:timeout 4" in text
    assert f"short {SHORT_ID} 52s" in text and f"long {LONG_ID} 5m 10s" in text  # which request, how long
    assert "token budget chat: 1.2M/10.0M (12%)" in text and "hedged 3 (2 won, $0.0123 extra)" in text
    assert "errors:" not in text  # one name for retries everywhere
    # every figure is there whole (no cell was cut to fit)
    for r in snap.rows:
        for cell in row_cells(r):
            assert cell in text, cell
    assert "…" not in text


def test_recorded_80_column_terminal_cuts_nothing_that_matters() -> None:
    """At 80 columns a row keeps progress, ETA, spend and failures beside its bar, the rest on the lines below;
    the run-wide segments are packed onto as many lines as they need. Nothing is cut with an ellipsis."""
    snap = _snapshot()
    lines = _terminal(snap, 80)
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    text = "\n".join(lines)
    assert "…" not in text
    for r in snap.rows:
        bar_line = next(line for line in lines if line.startswith(r.name + " "))
        assert "━" in bar_line
        for cell in main_cells(r):  # what matters is on the bar's own line
            assert cell in bar_line, (cell, bar_line)
        for cell in wire_cells(r):
            assert cell in text, cell
    for segs in footer_segments(snap):
        for seg in segs:
            assert seg in text, seg
    assert "$87.70 left" in lines[next(i for i, ln in enumerate(lines) if ln.startswith("budget:"))]
    assert "ETA 13m 20s" in text and "failed 3" in text and "failures: retries_exhausted:timeout 4" in text
    # the rows come first, in order, and their extra lines are indented under them
    names = [ln.split(" ")[0] for ln in lines if ln and not ln.startswith(" ")][:3]
    assert names == ["short", "long", "total"]


def test_the_bar_grows_with_the_room_the_terminal_gives() -> None:
    snap = _snapshot()
    for narrow_w, wide_w in ((100, 160), (240, 300)):  # with the rows on two lines, and on one
        narrow = _terminal(snap, narrow_w)[0].count("━") + _terminal(snap, narrow_w)[0].count("╺")
        wide = _terminal(snap, wide_w)[0].count("━") + _terminal(snap, wide_w)[0].count("╺")
        assert wide >= narrow + 50  # the whole width is used, no fixed-width footer


def test_plain_line_carries_the_same_figures_under_the_same_names() -> None:
    snap = _snapshot()
    line = plain_line(snap)
    text = "\n".join(_terminal(snap, 240))
    assert "\n" not in line
    for r in snap.rows:
        assert f"{r.name}: " in line
        for cell in row_cells(r):
            assert cell in line and cell in text, cell
    for footer in footer_lines(snap):
        assert footer in line and footer in text
    for name in ("remaining", "reserved", "retries", SHORT_ID, "5m 10s", "stalled 3 (41s)", "token budget code"):
        assert name in line
    assert "errors:" not in line


def test_a_grace_period_says_a_second_ctrl_c_aborts() -> None:
    snap = _snapshot(stopping="interrupted (SIGINT); the next run resumes", interrupt="SIGINT", grace_left_s=18.0)
    for text in ("\n".join(_terminal(snap)), plain_line(snap)):
        assert "SIGINT: grace period, finishing 2,490 requests in flight (18s left" in text
        assert "press Ctrl-C again to abort now" in text
    aborting = _snapshot(stopping="interrupted (SIGINT)", interrupt="SIGINT", grace_left_s=10.0, aborting=True)
    assert "aborting: cancelling 2,490 requests in flight" in plain_line(aborting)
    assert "Ctrl-C" not in plain_line(_snapshot())


def test_snapshot_of_run_stats_oldest_request_budget_left_and_grace() -> None:
    t = [100.0]
    stats = RunStats(clock=lambda: t[0], started=0.0)
    d = stats.dataset("chat")
    d.to_do, d.done, d.failed, d.completion_tokens = 10, 4, 1, 4000
    short = stats.partition("short")
    short.planned, short.done, short.failed, short.completion_tokens, short.retries = 10, 4, 1, 4000, 2
    short.max_tokens = 1000
    stats.in_flight, stats.limit = {"short": 3}, {"short": 8}
    short.flight[("chat", "chat-aaaa")] = Flight(("chat", "chat-aaaa"), "short", 40.0)  # the first is the oldest
    short.flight[("chat", "chat-bbbb")] = Flight(("chat", "chat-bbbb"), "short", 90.0)
    short.flight.pop(("chat", "chat-aaaa"))  # its attempt ended, and the retry went out again later
    short.flight[("chat", "chat-aaaa")] = Flight(("chat", "chat-aaaa"), "short", 95.0)
    stats.spend_prior, stats.spend_session, stats.reserved, stats.remaining = 2.0, 1.0, 0.5, 6.5
    stats.sample()
    t[0] = 110.0
    short.done, short.completion_tokens, d.done, d.completion_tokens = 6, 6000, 6, 6000
    short.wire_done += 1900.0  # two responses came in: their tokens arrived in the last 10 s
    short.flight[("chat", "chat-bbbb")].meter.data(400, 0, 105.0)  # a stream on the wire: 100 tokens so far
    stats.sample()
    snap = snapshot(stats)
    s, total = snap.rows
    assert (s.name, total.name) == ("short", "total")
    assert s.oldest == "chat-bbbb" and s.oldest_age_s == pytest.approx(20.0)
    assert total.oldest == "chat-bbbb" and total.in_flight == 3 and total.concurrency == 8
    assert s.remaining == 3 and s.resp_s == pytest.approx(0.2) and s.tok_s == pytest.approx(200.0)
    # the stream on the wire at 20 tok/s (100 tokens in 5 s) may run to max_tokens: 900 more tokens, 45 s; the
    # one with no first token yet and the sample not sent yet stream at the rates seen: 1,000 tokens, 50 s
    assert s.eta_s == pytest.approx(50.0, rel=0.02) and s.eta_basis == "in flight" and s.retries == 2
    assert "ETA 50s (in flight)" in plain_line(snapshot(stats)) and total.eta_basis == "in flight"
    # what is left of the budget includes the reservations, and names them
    assert snap.spent == pytest.approx(3.0) and snap.left == pytest.approx(7.0) and snap.reserved == 0.5
    assert "$3.00 spent · $7.00 left ($0.50 reserved)" in plain_line(snap)
    stats.grace_until, stats.interrupt, stats.stopping = 130.0, "SIGINT", "interrupted (SIGINT)"
    assert snapshot(stats).grace_left_s == pytest.approx(20.0)


class _HoldFirst:
    """Replies at once, except: the first sample's request hangs until ``release`` is set, and one other sample
    gets a retryable error on its first attempt."""

    name = "openai"
    reports_cost = False

    def __init__(self, held: str, flaky: str) -> None:
        self.held, self.flaky = held, flaky
        self.release = asyncio.Event()
        self.seen: set[str] = set()

    async def complete(self, req):  # type: ignore[no-untyped-def]
        from draftgen.backends.base import Completion

        if req.sample_id == self.held:
            await self.release.wait()
        if req.sample_id == self.flaky and req.sample_id not in self.seen:
            self.seen.add(req.sample_id)
            raise RetryableAPIError("upstream 502", kind="http_502", status=502)
        await asyncio.sleep(0)
        return Completion(backend=self.name, reasoning="Let me see.", content="Hello there.", finish_reason="stop",
                          usage=Usage(prompt_tokens=10, completion_tokens=8, cost=0.001))

    async def get_key_info(self) -> None:
        return None

    async def get_credits(self, management_key: str | None = None) -> None:
        return None

    async def get_model_endpoints(self, model: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_scheduler_tracks_requests_in_flight_per_sample_and_feeds_partition_figures(
        tmp_path: Path, qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    from draftgen.engine import (
        Assembler,
        DatasetPlan,
        Engine,
        EngineOptions,
        PartitionPlan,
        RunLog,
        make_display,
    )

    ids = write_prompts(tmp_path, "d", 6)
    stats, log = RunStats(), RunLog(None)
    backend = _HoldFirst(held=ids[0], flaky=ids[1])
    engine = Engine(
        backend=backend, assembler=Assembler(qwen3_profile),  # type: ignore[arg-type]
        datasets=[DatasetPlan("d", tmp_path / "prepared" / "d" / "prompts.jsonl",
                              tmp_path / "raw" / "d" / "raw_responses.jsonl", tmp_path / "raw" / "d" / "failures.jsonl",
                              pending={"short": 6})],
        partitions=[PartitionPlan("short", 3, 64)],
        governor=BudgetGovernor(prices=Prices(prompt=1e-6, completion=2e-6), priced=True),
        policy=RetryPolicy(RetryConfig(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01)), stats=stats,
        log=log, display=make_display("off", stats, log), options=EngineOptions(fsync=False, ramp_s=0.0),
    )

    async def main() -> tuple[list[tuple[str, str]], str | None, float | None]:
        run = asyncio.create_task(engine.run())
        flight = stats.partition("short").flight
        for _ in range(2000):  # until every other sample is written: only the held one is left on the wire
            await asyncio.sleep(0.005)
            if stats.partition("short").done == 5:
                break
        await asyncio.sleep(0.05)
        keys = list(flight)
        snap = snapshot(stats)
        backend.release.set()
        await run
        return keys, snap.rows[0].oldest, snap.rows[0].oldest_age_s

    keys, oldest, age = asyncio.run(main())
    assert keys == [("d", ids[0])] and oldest == ids[0] and age is not None and age >= 0.05
    pc = stats.partition("short")
    assert pc.flight == {}  # every attempt popped its entry when it ended
    assert (pc.planned, pc.done, pc.failed, pc.retries) == (6, 6, 0, 1)
    assert pc.completion_tokens == stats.completion_tokens > 0 and pc.cost == pytest.approx(stats.spend_session)


def test_a_stream_in_flight_moves_tok_s_and_the_eta_before_any_response_is_done() -> None:
    t = [0.0]
    stats = RunStats(clock=lambda: t[0], started=0.0)
    stats.eta_every_s = 0.0  # a fresh ETA at every look
    pc = stats.partition("short")
    pc.planned, pc.lengths, pc.max_tokens = 2, [], 400
    stats.in_flight, stats.limit = {"short": 1}, {"short": 4}
    fl = Flight(("chat", "chat-aaaa"), "short", 0.0)
    pc.flight[fl.key] = fl
    stats.sample()
    assert snapshot(stats).rows[0].eta_s is None  # no rate seen yet, no response: nothing to go on
    for step in range(1, 11):  # 40 characters (10 tokens) a second on the wire, nothing finished
        t[0] = float(step)
        fl.meter.data(40 * step, 0, t[0])
        stats.sample()
    row = snapshot(stats).rows[0]
    assert row.done == 0 and row.tok_s == pytest.approx(10.0)
    # 100 tokens in the 9 s since its first data: 11.1 tok/s. It may run to max_tokens (300 more, 27 s); the
    # sample not sent yet, at the same rate, 400 tokens: 36 s
    assert row.eta_s == pytest.approx(36.0, rel=0.02) and row.eta_basis == "waves"
