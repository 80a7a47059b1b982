"""Engine parts in isolation: AIMD limiter, retry policy, budgets, writer, prompt cursors."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from _generate_helpers import write_prompts
from draftgen.config import RetryConfig
from draftgen.engine import (
    AdaptiveLimiter,
    Admission,
    BudgetGovernor,
    Prices,
    PromptCursor,
    RecordSink,
    RetryPolicy,
    TokenBudget,
    count_pending,
    usage_cost,
)
from draftgen.errors import PermanentAPIError, RateLimited, RetryableAPIError
from draftgen.records import ResponseRecord, Usage
from draftgen.store import iter_jsonl


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_limiter_shrinks_once_per_storm_and_recovers_gradually() -> None:
    clock = Clock()
    lim = AdaptiveLimiter(1000, clock=clock, cooldown_s=2.0)
    for _ in range(200):  # a healthy run: no change
        lim.on_success()
    assert lim.current == 1000
    # a burst of 429s at one instant shrinks the limit once
    for _ in range(100):
        lim.on_rate_limited()
    assert lim.current == 700 and lim.decreases == 1
    clock.t += 2.5
    for _ in range(20):
        lim.on_rate_limited()
    assert lim.current == 490 and lim.decreases == 2
    # recovery: about 2 % of the ceiling per round of `limit` successes, never above the ceiling
    before = lim.limit
    for _ in range(int(lim.limit)):
        lim.on_success()
    assert 15 <= lim.limit - before <= 25
    for _ in range(100_000):
        lim.on_success()
    assert lim.current == 1000


def test_limiter_recovers_with_time_when_no_response_comes_back() -> None:
    clock = Clock()
    lim = AdaptiveLimiter(100, clock=clock, recover_after_s=5.0)
    for _ in range(100):
        lim.on_rate_limited()
    assert lim.current == 70
    clock.t += 4.0
    lim.tick()
    assert lim.current == 70  # a 429 was seen less than 5 s ago
    for _ in range(20):
        clock.t += 5.0
        lim.tick()
    assert lim.current == 100


def test_limiter_ignores_sparse_429s_and_respects_floor() -> None:
    clock = Clock()
    lim = AdaptiveLimiter(100, clock=clock)
    for i in range(2000):  # 1 % 429s: not a storm
        if i % 100 == 0:
            lim.on_rate_limited()
        else:
            lim.on_success()
    assert lim.current == 100
    for _ in range(200):
        clock.t += 10
        lim.on_rate_limited()
    assert lim.current == lim.floor == 5
    off = AdaptiveLimiter(100, adaptive=False)
    for _ in range(100):
        off.on_rate_limited()
    assert off.current == 100


def test_limiter_slots() -> None:
    async def go() -> None:
        lim = AdaptiveLimiter(2)
        await lim.acquire()
        await lim.acquire()
        waiter = asyncio.ensure_future(lim.acquire())
        await asyncio.sleep(0)
        assert not waiter.done() and lim.in_use == 2
        lim.release()
        await asyncio.sleep(0)
        assert waiter.done() and lim.in_use == 2
        cancelled = asyncio.ensure_future(lim.acquire())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        lim.release()
        lim.release()
        assert lim.in_use == 0

    asyncio.run(go())


def test_retry_policy_full_jitter_and_retry_after() -> None:
    pol = RetryPolicy(RetryConfig(max_attempts=4, base_delay_s=0.5, multiplier=2.0, max_delay_s=3.0),
                      rng=random.Random(1))
    delays = [pol.delay(3) for _ in range(500)]
    assert 0 <= min(delays) < 0.3 and 1.7 < max(delays) <= 2.0  # uniform(0, 0.5·2²)
    assert max(pol.delay(10) for _ in range(200)) <= 3.0  # capped
    # a batch polled through a long outage fails thousands of times in a row: still a delay, never an error
    assert 0.0 <= pol.delay(5000) <= 3.0
    assert all(2.0 <= pol.delay(1, retry_after=2.0) <= 2.2 for _ in range(50))  # Retry-After is a floor
    # ... under retry.max_delay_s: a longer Retry-After (header or body) is capped, still jittered
    capped = [pol.delay(1, retry_after=10.0) for _ in range(50)]
    assert all(2.7 <= d <= 3.0 for d in capped) and len(set(capped)) > 1
    assert all(2.7 <= pol.delay(2, retry_after=86400.0) <= 3.0 for _ in range(50))
    assert pol.should_retry(RateLimited("x"), 3)
    assert not pol.should_retry(RetryableAPIError("x"), 4)
    assert not pol.should_retry(PermanentAPIError("x"), 1)


def test_retry_policy_decides_retry_keep_or_give_up() -> None:
    from draftgen.engine.assemble import UnusableResponse
    from draftgen.engine.retry import GiveUp, Keep, Retry

    pol = RetryPolicy(RetryConfig(max_attempts=2, base_delay_s=0.5, multiplier=2.0, max_delay_s=3.0),
                      rng=random.Random(1))
    first = pol.decide(RateLimited("x", retry_after=2.0), 1, keepable=True)  # attempts left: retry, never keep
    assert isinstance(first, Retry) and 2.0 <= first.delay <= 2.2
    assert pol.decide(RetryableAPIError("x", kind="server_error"), 2) == GiveUp("retries_exhausted:server_error",
                                                                                 permanent=False)
    unusable = UnusableResponse("no reasoning", kind="reasoning_dropped")
    assert pol.decide(unusable, 2) == GiveUp("reasoning_dropped", permanent=False)  # says what was wrong
    assert pol.decide(unusable, 2, keepable=True) == Keep()
    # a permanent error is final at once, and a kept response never stands in for it
    assert pol.decide(PermanentAPIError("x", kind="bad_request"), 1, keepable=True) == GiveUp("bad_request",
                                                                                               permanent=True)


def test_token_budget_admission() -> None:
    tb = TokenBudget(budget=10_000, done=2_000)
    assert tb.check(4_000) is Admission.OK
    tb.reserved = 8_000
    assert tb.check(4_000) is Admission.WAIT  # may fit when in-flight requests come back short
    tb.reserved = 0
    tb.done = 7_000
    assert tb.check(4_000) is Admission.NEVER
    assert TokenBudget(None).check(10**9) is Admission.OK


def test_dollar_governor_reserves_and_settles() -> None:
    async def go() -> None:
        gov = BudgetGovernor(prices=Prices(prompt=1e-6, completion=2e-6), max_spend=1.0, prior=0.5)
        worst = gov.prices.worst_case(1000, 100_000)
        assert worst == pytest.approx(0.201)
        assert gov.check_dollars(worst) is Admission.OK
        gov.reserve("d", 100_000, worst)
        gov.reserve("d", 100_000, worst)
        assert gov.check_dollars(worst) is Admission.WAIT
        waiter = asyncio.ensure_future(gov.changed())
        await asyncio.sleep(0)
        cost = gov.settle("d", 100_000, worst, Usage(completion_tokens=500, cost=0.01, is_byok=True, upstream_cost=0.02))
        await asyncio.sleep(0)
        assert waiter.done() and cost == pytest.approx(0.03)
        assert gov.token_budget("d").done == 500 and gov.token_budget("d").reserved == 100_000
        gov.release("d", 100_000, worst)
        assert gov.reserved == pytest.approx(0.0) and gov.spent == pytest.approx(0.53)
        assert gov.check_dollars(0.5) is Admission.NEVER
        capped = BudgetGovernor(prices=Prices(completion=1e-6), session_cap=0.05)
        assert capped.check_dollars(0.06) is Admission.NEVER and capped.remaining == pytest.approx(0.05)

    asyncio.run(go())


def test_usage_cost_counts_upstream_only_for_byok() -> None:
    assert usage_cost(Usage(cost=0.2, upstream_cost=0.2)) == pytest.approx(0.2)
    assert usage_cost(Usage(cost=0.0, is_byok=True, upstream_cost=0.3)) == pytest.approx(0.3)
    assert usage_cost(None) == 0.0


def test_record_sink_group_commits_and_drains(tmp_path: Path) -> None:
    path = tmp_path / "raw.jsonl"
    written: list[int] = []

    async def go() -> RecordSink[ResponseRecord]:
        sink: RecordSink[ResponseRecord] = RecordSink(path, on_written=lambda b: written.append(len(b)))
        sink.start()
        for i in range(500):
            sink.put(ResponseRecord(sample_id=f"s{i}", output_ids=[i]))
        await sink.close()
        return sink

    sink = asyncio.run(go())
    rows = [r.sample_id for _, r in iter_jsonl(path, ResponseRecord)]
    assert rows == [f"s{i}" for i in range(500)]
    assert sum(written) == 500 and sink.batches < 50  # batched, not one fsync per record


def test_prompt_cursor_streams_pending_prompts_once(tmp_path: Path) -> None:
    ids = write_prompts(tmp_path, "d", 30, long_every=3)
    path = tmp_path / "prepared" / "d" / "prompts.jsonl"
    # a duplicated line: taken once
    path.write_bytes(path.read_bytes() + path.read_bytes().splitlines(keepends=True)[1])
    done = {ids[1], ids[2]}
    assert count_pending(path, done) == {"long": 10, "short": 18}
    taken: set[str] = set()
    cur = PromptCursor("d", path, "short", done, taken)
    got = []
    while cur.peek() is not None:
        got.append(cur.take().sample_id)
    assert len(got) == 18 and len(set(got)) == 18 and not (set(got) & done)
    assert cur.exhausted


def test_tokenizer_is_safe_to_share_across_cpu_pool_threads(qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    # The engine builds records in a thread pool: encode() of a rendered prompt must not see the
    # special-token setting of a concurrent encode_ordinary() of tool markup.
    import threading

    tok = qwen3_profile.tokenizer
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n" * 10
    want = tok.encode(prompt)
    markup = "text <tool_call> markup <|im_end|> more " * 20
    want_ord = tok.encode_ordinary(markup)
    stop = threading.Event()
    bad: list[int] = []

    def other() -> None:
        while not stop.is_set():
            if tok.encode_ordinary(markup) != want_ord:
                bad.append(1)

    t = threading.Thread(target=other)
    t.start()
    try:
        mismatches = sum(tok.encode(prompt) != want for _ in range(3000))
    finally:
        stop.set()
        t.join()
    assert mismatches == 0 and not bad


def test_display_lines_and_rich_panel(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from draftgen.engine import RunLog, RunStats, make_display, status_line, summary_lines

    clock = Clock()
    stats = RunStats(clock=clock, started=0.0)
    d = stats.dataset("chat")
    d.to_do, d.done, d.failed, d.completion_tokens, d.cost = 100, 40, 2, 50_000, 0.25
    pc = stats.partition("short")  # the rows (and the total, their sum) are per partition
    pc.planned, pc.done, pc.failed = 100, 40, 2
    stats.in_flight, stats.limit = {"short": 12, "long": 3}, {"short": 16, "long": 4}
    stats.retries["rate_limited"] += 5
    stats.providers["Chutes"] += 30
    stats.spend_session, stats.remaining = 0.25, 4.75
    stats.sample()
    clock.t = 10.0
    stats.sample()
    line = status_line(stats)
    for part in ("done 40/100 (40%)", "failed 2", "short: ", "in flight 12/16", "in flight 3/4",
                 "$0.25 spent · $4.75 left ($0.00 reserved)", "retries: rate_limited 5", "providers: Chutes 30",
                 "tok/s", "ETA"):
        assert part in line, part
    assert any("chat: 40 done now" in s for s in summary_lines(stats))
    log = RunLog(tmp_path / "logs" / "generate.log")
    disp = make_display("rich", stats, log)
    buf = io.StringIO()
    Console(file=buf, width=160).print(disp._render())  # type: ignore[attr-defined]
    out = buf.getvalue()
    assert "total" in out and "in flight" in out and "Chutes" in out
    log.write(line)
    log.close()
    assert "done 40/100" in (tmp_path / "logs" / "generate.log").read_text()


# -- bounds: token counts, prices for a missing usage.cost --------------------------------------------------


def test_check_tokens_refuses_more_ids_or_billed_tokens_than_max_tokens() -> None:
    from draftgen.backends.base import Completion
    from draftgen.engine.assemble import check_tokens

    check_tokens(Completion(backend="vllm", output_ids=[1] * 272, usage=Usage(completion_tokens=272)), 256)
    for comp in (Completion(backend="vllm", output_ids=[1] * 273),  # 6.5M ids, as seen, is just more of this
                 Completion(backend="openrouter", content="x", usage=Usage(completion_tokens=5000))):
        with pytest.raises(RetryableAPIError) as ei:
            check_tokens(comp, 256)
        assert ei.value.kind == "too_many_tokens" and "max_tokens 256" in str(ei.value)


def test_governor_prices_a_missing_cost() -> None:
    gov = BudgetGovernor(prices=Prices(prompt=1e-6, completion=2e-6, request=1e-3), priced=True, max_spend=0.01)
    u = gov.priced_usage(Usage(prompt_tokens=100, completion_tokens=50), prompt_tokens=7, completion_tokens=9)
    assert u is not None and u.cost_computed and u.cost == pytest.approx(100e-6 + 100e-6 + 1e-3)
    alone = gov.priced_usage(None, prompt_tokens=10, completion_tokens=20)  # no usage at all: from the ids
    assert alone is not None and alone.cost_computed and alone.cost == pytest.approx(10e-6 + 40e-6 + 1e-3)
    assert alone.completion_tokens == 0  # nothing billed to compare with
    assert gov.settle("d", 64, 0.002, u) == pytest.approx(0.0012) and gov.spent == pytest.approx(0.0012)
    unpriced = BudgetGovernor()
    raw = Usage(prompt_tokens=1, completion_tokens=1)
    assert unpriced.priced_usage(raw, prompt_tokens=1, completion_tokens=1) is raw


class _ScriptedBackend:
    """Per sample: a reply rebuilt to far more ids than max_tokens (billed $0.001), then more exact ids
    than max_tokens (no usage), then a good reply without usage.cost."""

    name = "openai"
    reports_cost = False

    def __init__(self) -> None:
        from collections import Counter

        self.calls: Counter[str] = Counter()

    async def complete(self, req):  # type: ignore[no-untyped-def]
        from draftgen.backends.base import Completion

        n = self.calls[req.sample_id]
        self.calls[req.sample_id] += 1
        if n == 0:
            return Completion(backend=self.name, content="many words " * 500, finish_reason="stop",
                              usage=Usage(prompt_tokens=10, completion_tokens=5, cost=0.001))
        if n == 1:
            return Completion(backend=self.name, content="x", finish_reason="stop", output_ids=[42] * 100)
        return Completion(backend=self.name, reasoning="Let me see.", content="Hello there.", finish_reason="stop",
                          usage=Usage(prompt_tokens=10, completion_tokens=8), cost_missing=True)

    async def get_key_info(self) -> None:
        return None

    async def get_credits(self, management_key: str | None = None) -> None:
        return None

    async def get_model_endpoints(self, model: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_engine_retries_oversized_responses_and_prices_missing_costs(tmp_path: Path, qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    from draftgen.engine import (
        Assembler,
        DatasetPlan,
        Engine,
        EngineOptions,
        PartitionPlan,
        RunLog,
        RunStats,
        make_display,
    )

    ids = write_prompts(tmp_path, "d", 6)
    stats, log = RunStats(), RunLog(None)
    gov = BudgetGovernor(prices=Prices(prompt=1e-6, completion=2e-6), priced=True)
    backend = _ScriptedBackend()
    engine = Engine(
        backend=backend, assembler=Assembler(qwen3_profile),  # type: ignore[arg-type]
        datasets=[DatasetPlan("d", tmp_path / "prepared" / "d" / "prompts.jsonl",
                              tmp_path / "raw" / "d" / "raw_responses.jsonl", tmp_path / "raw" / "d" / "failures.jsonl",
                              pending={"short": 6})],
        partitions=[PartitionPlan("short", 2, 64)], governor=gov,
        policy=RetryPolicy(RetryConfig(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01)), stats=stats,
        log=log, display=make_display("off", stats, log), options=EngineOptions(fsync=False, ramp_s=0.0),
    )
    result = asyncio.run(engine.run())
    assert result.exit_code == 0
    recs = [r for _, r in iter_jsonl(tmp_path / "raw" / "d" / "raw_responses.jsonl", ResponseRecord)]
    assert sorted(r.sample_id for r in recs) == sorted(ids) and all(backend.calls[i] == 3 for i in ids)
    assert all(r.output_ids and len(r.output_ids) <= 64 + 16 and r.attempts == 3 for r in recs)
    assert stats.retries["too_many_tokens"] == 12
    for r in recs:
        assert r.usage is not None and r.usage.cost_computed and r.usage.cost == pytest.approx(10e-6 + 16e-6)
    # spend: the computed costs of the records, plus what each rejected-but-billed reply cost
    assert gov.session == pytest.approx(6 * (0.001 + 26e-6)) and gov.reserved == pytest.approx(0.0)
    assert engine.limiters["short"].in_use == 0 and gov.token_budget("d").reserved == 0


# -- quality and provider health ---------------------------------------------------------------------------


def _endpoints() -> list:  # type: ignore[type-arg]
    from draftgen.backends.base import EndpointInfo

    return [EndpointInfo(provider_name="DeepInfra", tag="deepinfra/fp4", quantization="fp4"),
            EndpointInfo(provider_name="DeepInfra", tag="deepinfra/fp8", quantization="fp8"),
            EndpointInfo(provider_name="Chutes", tag="chutes/int4", quantization="int4"),
            EndpointInfo(provider_name="Moonshot AI", tag="moonshotai/int4", quantization="int4")]


def test_routing_guard_names_slugs_quantizations_and_exclusions() -> None:
    from draftgen.engine import RoutingGuard

    eps = _endpoints()
    g = RoutingGuard(eps, allowed=[e for e in eps if e.quantization != "int4"], quantizations=["fp4", "fp8"])
    assert g.slug("Moonshot AI") == "moonshotai" and g.slug("DeepInfra") == "deepinfra" and g.slug("Odd Co") == "odd co"
    assert g.quantization("Chutes") == "int4" and g.quantization("DeepInfra") is None  # two variants: unknown
    assert g.excluded("Chutes") == "quantization int4 not in routing.quantizations"
    assert g.excluded("DeepInfra") is None and g.excluded("Odd Co") is None and g.excluded(None) is None
    assert g.excluded("DeepInfra", ["deepinfra"]) == "in this request's provider.ignore"
    assert g.leaves_none(["deepinfra"]) and not g.leaves_none(["deepinfra/fp4"]) and not g.leaves_none([])
    only = RoutingGuard(eps, only=["chutes"], ignore=["odd co"])
    assert only.excluded("Moonshot AI") == "not in routing.only" and only.excluded("Chutes") is None
    assert only.excluded("Odd Co") == "in routing.ignore"  # not listed: judged by its name
    assert only.quantization("DeepInfra") is None
    unknown = RoutingGuard(None)  # no endpoint list: the providers seen so far stand in for it
    unknown.note("A")
    assert unknown.leaves_none(["a"]) and unknown.quantization("A") is None
    unknown.note("B")
    assert not unknown.leaves_none(["a"])


def test_provider_health_cools_down_restores_and_keeps_the_least_bad() -> None:
    from draftgen.backends.base import EndpointInfo
    from draftgen.engine import HealthPolicy, ProviderHealth, RoutingGuard

    clock = Clock()
    events: list[tuple[str, str, str]] = []
    notes: list[str] = []
    eps = [EndpointInfo(provider_name=n, tag=n.lower()) for n in ("A", "B", "C")]
    h = ProviderHealth(HealthPolicy(window=4, min_outcomes=3, max_failure_rate=0.5, cooldown_s=10.0),
                       RoutingGuard(eps), on_event=lambda ev, line: events.append((ev.provider, ev.event, ev.reason)),
                       on_note=notes.append, clock=clock)
    for bad in (None, "server_error"):
        h.outcome("A", bad)
    assert not h.cooling  # 2 outcomes: not judged yet
    h.outcome("A", "reasoning_dropped")
    assert h.ignore() == ["a"] and events[-1][:2] == ("A", "cooldown")
    assert events[-1][2] == "2 of 3 recent outcomes bad: server_error 1, reasoning_dropped 1"
    h.outcome("A", "server_error")  # sent before the cool-down: not counted
    assert not h.windows["A"]
    clock.t = 9.9
    h.tick()
    assert h.ignore() == ["a"]
    clock.t = 10.0
    h.tick()
    assert h.ignore() == [] and events[-1][:2] == ("A", "restored")
    # A and B cooled down (all bad); C failing half the time: the least bad of the three, it stays.
    for p, outcomes in (("A", ["x", "x", "x"]), ("B", ["x", "x", "x"]), ("C", [None, "x", None, "x"])):
        for o in outcomes:
            h.outcome(p, o)
    assert sorted(h.cooling) == ["A", "B"] and "C" not in h.cooling
    assert notes and "provider C" in notes[-1] and "least bad" in notes[-1]
    # ... but when the last one is worse than one cooled down (A, 2 of 3 bad), A comes back early.
    h.cooling.clear()
    h.windows.clear()
    for p, outcomes in (("A", ["x", None, "x"]), ("B", ["x", "x", "x"]), ("C", ["x", "x", "x"])):
        for o in outcomes:
            h.outcome(p, o)
    assert sorted(h.cooling) == ["B", "C"]
    assert events[-2][:2] == ("A", "restored") and "least bad" in events[-2][2]
    assert events[-1][:2] == ("C", "cooldown")
    assert HealthPolicy(billing_tolerance=0.05).billing_off(110, 100) and not HealthPolicy().billing_off(103, 100)


def test_check_reasoning_refuses_billed_reasoning_without_text() -> None:
    from draftgen.backends.base import Completion
    from draftgen.engine.assemble import UnusableResponse, check_reasoning

    u = Usage(prompt_tokens=5, completion_tokens=50, reasoning_tokens=40)
    with pytest.raises(UnusableResponse) as err:
        check_reasoning(Completion(backend="openrouter", content="Hi", usage=u, provider="Novita"))
    assert err.value.kind == "reasoning_dropped" and "Novita" in str(err.value)
    for ok in (Completion(backend="openrouter", reasoning="Hmm.", content="Hi", usage=u),
               Completion(backend="openrouter", content="Hi", usage=Usage(completion_tokens=2)),
               Completion(backend="vllm", content="Hi", usage=u, output_ids=[1, 2])):  # exact ids hold it all
        check_reasoning(ok)


def test_request_routing_adds_its_own_ignores_to_the_configured_ones() -> None:
    import aiohttp
    import msgspec

    from draftgen.backends.base import CompletionRequest
    from draftgen.backends.openrouter import OpenAIChatBackend
    from draftgen.records import Message

    async def bodies() -> list[dict]:  # type: ignore[type-arg]
        async with aiohttp.ClientSession() as session:
            b = OpenAIChatBackend(session, "http://127.0.0.1:9/api/v1", model="m", openrouter=True,
                                  routing={"order": ["chutes"], "ignore": ["novita"], "allow_fallbacks": False,
                                           "sort": None})
            req = CompletionRequest(sample_id="s", messages=[Message(role="user", content="hi")], max_tokens=9)
            plain = b.encode_body(req)
            req.provider_ignore = ["deepinfra", "Novita"]
            own = b.encode_body(req)
            bare = OpenAIChatBackend(session, "http://127.0.0.1:9/api/v1", model="m", openrouter=True)
            return [msgspec.json.decode(x) for x in (plain, own, bare.encode_body(req))]

    plain, own, bare = asyncio.run(bodies())
    assert plain["provider"] == {"order": ["chutes"], "ignore": ["novita"], "allow_fallbacks": False}
    assert own["provider"] == {"order": ["chutes"], "ignore": ["novita", "deepinfra"], "allow_fallbacks": False}
    assert bare["provider"] == {"ignore": ["deepinfra", "Novita"]}
    assert own["messages"] == plain["messages"] and own["max_tokens"] == 9 and own["model"] == "m"
