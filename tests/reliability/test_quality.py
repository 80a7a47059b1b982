"""A response is done only if it is usable, and a failing provider is cooled down: each case runs
``run_generate`` against a real emulator (in a thread) whose scenario has the bad provider.

- a provider that drops reasoning (reasoning tokens billed, no text): its responses are retried on other
  providers (the sample's own ``provider.ignore``), never written; with the retries spent they are
  failures of kind ``reasoning_dropped``, or with ``quality.keep_unusable`` records flagged
  ``unusable:reasoning_dropped``, booked once;
- a provider that ignores routing: its responses are retried (``provider_excluded``), never written, and
  every record carries the quantization the routing asked for;
- a provider failing most requests: cooled down (``logs/health.jsonl``, the log), avoided by the
  requests sent during its cool-down, and restored after it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from _generate_helpers import claim, emulator, failures, make_config, responses, write_prompts
from draftgen.emulator import Provider, builtin_scenario
from draftgen.emulator.scenarios import Scenario
from draftgen.phases.generate.run import GenerateReport, run_generate
from draftgen.records import AttemptRecord, HealthEvent
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl

quiet: dict[str, Any] = {"echo": lambda s: None}


def _attempts(run_dir: Path) -> list[AttemptRecord]:
    return [a for _, a in iter_jsonl(RunDir(run_dir).attempts, AttemptRecord)]


def _health(run_dir: Path) -> list[HealthEvent]:
    path = RunDir(run_dir).health
    return [e for _, e in iter_jsonl(path, HealthEvent)] if path.exists() else []


def _by_sample(attempts: list[AttemptRecord]) -> dict[str, list[AttemptRecord]]:
    out: dict[str, list[AttemptRecord]] = defaultdict(list)
    for a in sorted(attempts, key=lambda a: (a.sample_id, a.attempt)):
        out[a.sample_id].append(a)
    return out


def _scenario(bad: Provider, **changes: Any) -> Scenario:
    good = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 1.0, 4.0, supports_logprobs=True),
            Provider("Baseten", "baseten/fp4", "fp4", 1.2, 4.5)]
    return builtin_scenario("fast").replace(providers=[bad, *good], **changes)


def _run(tmp: Path, sc: Scenario, n: int, **sections: Any) -> tuple[Path, GenerateReport]:
    run_dir = claim(make_config(tmp, ["q"]))
    write_prompts(run_dir, "q", n)
    with emulator(sc) as emu:
        cfg = make_config(tmp, ["q"], base_url=emu.base_url, **sections)
        rep = run_generate(cfg, **quiet)
    return run_dir, rep


DROPPER = Provider("Dropper", "dropper/int4", "int4", 0.3, 1.5, drop_reasoning=True)
# Every first attempt goes to the dropper (``order``; fallbacks stay on). No cool-downs here: every
# sample must meet it first.
FIRST_TO_DROPPER = {"routing": {"order": ["dropper"]}, "quality": {"provider_min_outcomes": 1000}}


def test_dropped_reasoning_is_retried_elsewhere_never_recorded(tmp_path: Path) -> None:
    run_dir, rep = _run(tmp_path, _scenario(DROPPER), 30, **FIRST_TO_DROPPER)
    assert rep.exit_code == 0 and rep.done == 30 and rep.failed == 0
    recs = responses(run_dir, "q")
    assert len(recs) == 30
    for r in recs:
        assert r.usage is not None
        assert r.reasoning or not r.usage.reasoning_tokens, f"{r.sample_id}: reasoning billed, no text"
        assert "reasoning_dropped" not in r.recon_flags and not any(f.startswith("unusable:") for f in r.recon_flags)
    dropped = 0
    for sid, tries in _by_sample(_attempts(run_dir)).items():
        assert [a.attempt for a in tries] == list(range(1, len(tries) + 1))
        assert tries[-1].outcome == "ok" and tries[-1].provider != "Dropper", sid
        for i, a in enumerate(tries):
            if a.outcome == "reasoning_dropped":
                dropped += 1
                assert a.provider == "Dropper" and a.completion_tokens > 0 and a.cost > 0
                assert all(b.provider != "Dropper" for b in tries[i + 1:]), f"{sid}: retried on the dropper"
    assert dropped >= 25  # qwen3 thinks on (almost) every prompt
    assert sum(1 for r in recs if r.attempts == 2) == dropped
    # What the dropped responses were billed is spend all the same.
    assert rep.spend_session == pytest.approx(sum(r.usage.cost for r in recs if r.usage)
                                              + sum(a.cost for a in _attempts(run_dir) if a.outcome != "ok"))


@pytest.mark.parametrize("keep", [False, True])
def test_dropped_reasoning_after_the_last_attempt(tmp_path: Path, keep: bool) -> None:
    run_dir, rep = _run(tmp_path, _scenario(DROPPER), 20, retry={"max_attempts": 1},
                        quality={"keep_unusable": keep, "provider_min_outcomes": 1000}, routing={"order": ["dropper"]})
    attempts = _attempts(run_dir)
    dropped = {a.sample_id for a in attempts if a.outcome == "reasoning_dropped"}
    assert len(attempts) == 20 and len(dropped) >= 15
    recs = {r.sample_id: r for r in responses(run_dir, "q")}
    if not keep:
        fails = {f.sample_id: f for f in failures(run_dir, "q")}
        assert set(fails) == dropped and not dropped & set(recs)
        assert all(f.kind == "reasoning_dropped" and not f.permanent and f.provider == "Dropper"
                   for f in fails.values())
        assert rep.exit_code != 0 and rep.failed == len(dropped)
        return
    assert rep.exit_code == 0 and rep.failed == 0 and len(recs) == 20 and not failures(run_dir, "q")
    for sid in dropped:
        r = recs[sid]
        assert r.provider == "Dropper" and r.reasoning is None
        assert "unusable:reasoning_dropped" in r.recon_flags and "reasoning_dropped" in r.recon_flags
    assert not any(f.startswith("unusable:") for sid, r in recs.items() if sid not in dropped for f in r.recon_flags)
    # A kept response is booked once: what the records cost is what the run spent.
    assert rep.spend_session == pytest.approx(sum(r.usage.cost for r in recs.values() if r.usage))


def test_provider_ignoring_routing_is_retried_never_recorded(tmp_path: Path) -> None:
    rogue = Provider("Rogue", "rogue/int4", "int4", 0.3, 1.5, ignores_routing=0.5)
    run_dir, rep = _run(tmp_path / "a", _scenario(rogue), 30, routing={"quantizations": ["fp4"]})
    recs = responses(run_dir, "q")
    fails = failures(run_dir, "q")
    assert len(recs) + len(fails) == 30 and len(recs) >= 28
    assert all(f.kind == "provider_excluded" for f in fails)
    assert all(r.provider != "Rogue" and r.quantization == "fp4" for r in recs)
    attempts = _attempts(run_dir)
    excluded = [a for a in attempts if a.outcome == "provider_excluded"]
    assert len(excluded) >= 5 and all(a.provider == "Rogue" and a.quantization == "int4" for a in excluded)
    assert all(a.provider != "Rogue" for a in attempts if a.outcome == "ok")

    # A provider that takes every request: no attempt is usable, every sample fails with that kind.
    always = Provider("Rogue", "rogue/int4", "int4", 0.3, 1.5, ignores_routing=1.0)
    run_dir, rep = _run(tmp_path / "b", _scenario(always), 10, routing={"ignore": ["rogue"]}, retry={"max_attempts": 3})
    assert not responses(run_dir, "q") and rep.failed == 10
    assert {f.kind for f in failures(run_dir, "q")} == {"provider_excluded"}
    assert {a.outcome for a in _attempts(run_dir)} == {"provider_excluded"}


def test_failing_provider_is_cooled_down_avoided_and_restored(tmp_path: Path) -> None:
    # The flaky provider is by far the cheapest (load balancing sends it most first attempts) and fails 90 %
    # of them mid-stream, an error OpenRouter does not fall back from.
    flaky = Provider("Flaky", "flaky/int4", "int4", 0.1, 0.4, ttft_s=(0.02, 0.04), faults={"finish_error": 0.9})
    good = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 1.0, 4.0, ttft_s=(0.02, 0.04)),
            Provider("Baseten", "baseten/fp4", "fp4", 1.2, 4.5, ttft_s=(0.02, 0.04))]
    sc = builtin_scenario("fast").replace(providers=[flaky, *good])
    quality = {"provider_window": 10, "provider_min_outcomes": 4, "provider_max_failure_rate": 0.5,
               "provider_cooldown_s": 0.4}
    run_dir, rep = _run(tmp_path, sc, 100, quality=quality, partitions={"short": {"concurrency": 4}},
                        endpoint={"stream": True})
    assert rep.done == 100 and rep.failed == 0
    events = _health(run_dir)
    assert events and events[0].event == "cooldown" and events[0].provider == "Flaky"
    assert "recent outcomes bad" in events[0].reason and events[0].until == pytest.approx(events[0].at + 0.4, abs=1e-3)
    assert {e.provider for e in events} == {"Flaky"}  # the good ones never reach the threshold
    restored = [e for e in events if e.event == "restored"]
    assert restored and restored[0].at >= events[0].until - 1e-3
    log = (run_dir / "logs" / "generate.log").read_text()
    assert "provider Flaky cooled down for 0.4s" in log and "provider Flaky restored" in log
    # Requests sent during a cool-down avoid the provider; after it they reach it again.
    attempts = _attempts(run_dir)
    cooling = [(c.at, r.at) for c, r in zip(events[::2], events[1::2], strict=False)
               if c.event == "cooldown" and r.event == "restored"]
    assert cooling
    for a in attempts:
        if any(start + 1e-3 < a.started_at < end - 1e-3 for start, end in cooling):
            assert a.provider != "Flaky", f"{a.sample_id} attempt {a.attempt} sent during the cool-down"
    assert any(a.provider == "Flaky" and a.started_at > restored[0].at for a in attempts)
    # Streams carry a time to the first event, on the attempts and on the records.
    assert all(a.ttft_s is not None and a.ttft_s >= 0.015 for a in attempts if a.outcome == "ok")
    assert all(r.ttft_s is not None for r in responses(run_dir, "q"))
