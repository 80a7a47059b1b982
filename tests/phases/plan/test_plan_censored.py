"""plan's re-plan after an interrupt counts the samples cut off mid-stream as censored lengths: on the
realistic emulator (scaled down) it is within ±30% of the tokens the resume then uses; the finished-only
mean (the old estimate) undercounts them by far."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from _common_helpers import FAKE_KEY, config_dict, write_config
from _generate_helpers import emulator
from draftgen.config import load_config
from draftgen.emulator import builtin_scenario
from draftgen.phases.generate.run import run_generate
from draftgen.phases.plan.lengths import lognormal_fit, mean_beyond
from draftgen.phases.plan.run import estimate_plan
from draftgen.records import AttemptRecord, ResponseRecord
from draftgen.store import iter_jsonl

PROMPTS = 240


def _records(run: Path) -> list[ResponseRecord]:
    return [r for _, r in iter_jsonl(run / "raw" / "a" / "raw_responses.jsonl", ResponseRecord)]


def _interrupt_midway(cfg_path: Path, raw: Path, at: int) -> None:
    env = {**os.environ, "OPENROUTER_API_KEY": FAKE_KEY}
    proc = subprocess.Popen([sys.executable, "-m", "draftgen.cli", "generate", str(cfg_path)], cwd=cfg_path.parent,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not raw.is_file() or raw.read_bytes().count(b"\n") < at:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()


def test_replan_after_an_interrupt_counts_the_cut_off_tail(tmp_path: Path) -> None:
    # The realistic roster (int4 hosts at 20-70 tok/s, fp4 at 150-350, its faults), lengths a tenth of Kimi's
    # and the clock at 1/50: the whole run takes seconds.
    sc = builtin_scenario("realistic").replace(time_scale=0.05, reasoning_tokens_median=150, content_tokens_median=40)
    with emulator(sc) as emu:
        data = config_dict(tmp_path, ["a"], endpoint={"kind": "emulator", "base_url": emu.base_url, "idle_timeout_s": 3},
                           partitions={"short": {"concurrency": 2000, "max_tokens": 2048},
                                       "long": {"concurrency": 500, "max_tokens": 2048}},
                           retry={"base_delay_s": 0.01, "max_delay_s": 0.1, "shutdown_grace_s": 0},
                           progress="plain")
        cfg_path = write_config(tmp_path, data)
        cfg = load_config(cfg_path)
        rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Tell me about topic {i}."}]})
                for i in range(PROMPTS)]
        (tmp_path / "a.jsonl").write_bytes(b"\n".join(rows) + b"\n")
        run = tmp_path / "run"
        _interrupt_midway(cfg_path, run / "raw" / "a" / "raw_responses.jsonl", PROMPTS * 8 // 10)

        before = _records(run)
        cut = [a for _, a in iter_jsonl(run / "logs" / "attempts.jsonl", AttemptRecord) if a.outcome == "abandoned"]
        assert cut and all(a.streamed_tokens >= 0 for a in cut) and any(a.streamed_tokens > 0 for a in cut)
        said: list[str] = []
        plan = estimate_plan(cfg, echo=said.append)
        (line,) = plan.datasets
        finished_mean = sum(r.usage.completion_tokens for r in before if r.usage) / len(before)

        os.environ.setdefault("OPENROUTER_API_KEY", FAKE_KEY)
        rep = run_generate(cfg, echo=lambda _: None)
        assert rep.exit_code == 0
    done_before = {r.sample_id for r in before}
    used = sum(r.usage.completion_tokens for r in _records(run) if r.sample_id not in done_before and r.usage)
    left = PROMPTS - len(done_before)
    assert line.remaining == left
    # The finished samples are the short ones: their mean misses the tail by far (the old re-plan).
    assert finished_mean * left < 0.7 * used
    assert abs(line.expected_output_tokens / used - 1) <= 0.30, (line.expected_output_tokens, used)
    assert "cut off, censored fit" in line.output_basis
    assert any("cut off mid-stream" in s and "between" in s for s in said)


def test_censored_fit_recovers_a_known_lognormal() -> None:
    # Lengths drawn from a known log-normal, each cut at a time a stream of random speed reached by then:
    # the fit counting the cut ones as censored finds the true parameters; dropping them does not.
    rng = random.Random(7)
    mu, sigma = math.log(1900), 0.9
    finished: list[float] = []
    cut: list[float] = []
    for _ in range(2000):
        length = math.exp(rng.gauss(mu, sigma))
        reached = rng.uniform(20, 350) * 30.0  # tokens a stream had produced when the run was interrupted
        (finished if length <= reached else cut).append(min(length, reached))
    got_mu, got_sigma = lognormal_fit(finished, cut)
    assert abs(got_mu - mu) < 0.08 and abs(got_sigma - sigma) < 0.08
    naive_mu, _ = lognormal_fit(finished, [])
    assert naive_mu < mu - 0.15
    # E[min(L, M) | L > N] lies between N and M, and equals the plain capped mean at N = 0.
    cap = 10240.0
    for n in (0.0, 500.0, 5000.0, 9000.0):
        e = mean_beyond(mu, sigma, n, cap)
        assert max(n, 1.0) <= e <= cap
    draws = [min(math.exp(rng.gauss(mu, sigma)), cap) for _ in range(200_000)]
    assert abs(mean_beyond(mu, sigma, 0.0, cap) / (sum(draws) / len(draws)) - 1) < 0.01
    beyond = [d for d in draws if d > 3000]
    assert abs(mean_beyond(mu, sigma, 3000.0, cap) / (sum(beyond) / len(beyond)) - 1) < 0.01
