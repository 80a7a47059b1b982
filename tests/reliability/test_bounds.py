"""Every request is bounded in time and size, every retry wait is capped, and a dollar budget holds
without ``usage.cost``: each case drives the real CLI (``draftgen generate`` in a subprocess) against a
real emulator process whose scenario injects the fault.

- keep-alive-only streams: the idle timeout counts data events only (comments do not extend it);
- streams that trickle data for ever: the total deadline, derived from ``max_tokens``;
- ``Retry-After: 86400``: the wait is capped at ``retry.max_delay_s``;
- 50 MB bodies of token ids for ``max_tokens`` 256: refused as soon as the body cap is passed, never a
  record, and the process stays small (its peak RSS, from ``wait4``);
- responses with more ids (returned, or rebuilt from text) than ``max_tokens``: retried, never written;
- no ``usage.cost``: the cost is computed from the routed prices, so the dollar budget holds, the run
  directory's spend matches what the emulator billed, and a resume adds it up; with neither cost nor
  prices a dollar budget is refused at start unless ``budget.allow_unpriced``.

Each run is a few seconds; on the code before these bounds, the hang cases would wait ``hang_s`` (600 s)
or an hour per attempt and are cut by the subprocess timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftgen.backends.base import token_limit

from ._helpers import (
    SECRETS,
    EmulatorProcess,
    base_config,
    cli_cmd,
    cli_env,
    error_lines,
    read_failures,
    read_raw,
    start_emulator,
    write_config,
    write_prompts,
)

PRICE_PROMPT, PRICE_COMPLETION = 0.5, 2.5  # USD per million tokens

# One provider per behaviour; each test routes to its own with ``routing.only``. Every faulty provider
# fails the first attempt of each prompt only (``max_faulty_attempts: 1``), so a bounded client finishes.
PROVIDERS: dict[str, dict[str, Any]] = {
    "nocost": {"omit_cost": True},
    "keepalive": {"faults": {"keepalive_only": 1.0}},
    "trickle": {"faults": {"trickle": 1.0}},
    "dayretry": {"faults": {"rate_limit": 1.0}, "retry_after_s": 86400.0},
    "huge": {"faults": {"huge_body": 1.0}, "huge_body_bytes": 50_000_000},
    "manyids": {"faults": {"huge_body": 1.0}, "huge_body_bytes": 100_000},
    "manytext": {"faults": {"huge_body": 1.0}, "huge_body_bytes": 300_000, "huge_body_ids": False},
}
SCENARIO: dict[str, Any] = {
    "base": "fast", "name": "bounds", "time_scale": 1.0, "reasoning_tokens_median": 60, "content_tokens_median": 30,
    "length_sigma": 0.3, "runaway_rate": 0.0, "max_faulty_attempts": 1, "keepalive_s": 0.05, "hang_s": 600.0,
    "providers": [{"name": name, "tag": f"{name}/fp8", "quantization": "fp8", "price_prompt": PRICE_PROMPT,
                   "price_completion": PRICE_COMPLETION, "ttft_s": [0.0, 0.02], "tokens_per_s": [0, 0], **extra}
                  for name, extra in PROVIDERS.items()],
}


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    d = tmp_path_factory.mktemp("bounds-emulator")
    path = d / "scenario.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False), encoding="utf-8")
    e = start_emulator("--scenario", str(path), "--credits", "1000", log=d / "emulator.log")
    yield e
    e.stop()


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    maxrss_mb: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (``VmHWM``, KiB) so far; 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _generate(cfg_path: Path, *, timeout: float = 60.0) -> Run:
    """``draftgen generate CONFIG`` in its own process group, with its peak RSS (sampled every 20 ms)."""
    stem = cfg_path.parent / f"generate-{time.monotonic_ns()}"
    out_path, err_path = stem.with_suffix(".out"), stem.with_suffix(".err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cli_cmd("generate", str(cfg_path)), env=cli_env(), stdout=out, stderr=err,
                                start_new_session=True)
        peak_kib = 0
        while True:
            peak_kib = max(peak_kib, _peak_rss_kib(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                raise AssertionError(f"generate still running after {timeout:g}s (an unbounded wait): "
                                     f"{out_path.read_text(errors='replace')[-1500:]}")
            time.sleep(0.02)
        elapsed = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    # VmHWM is the child's own peak; wait4's ru_maxrss would also count what the parent held when it forked.
    run = Run(proc.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), elapsed,
              (peak_kib or usage.ru_maxrss) / 1024.0)
    for secret in SECRETS:
        assert secret not in run.output, "a key leaked into the output of generate"
    assert "Traceback" not in run.output, run.output[-3000:]
    return run


def _config(tmp: Path, emu: EmulatorProcess, provider: str | None, n: int, *, seed: int, **extra: Any) -> dict[str, Any]:
    """A config over ``n`` new prompts (``seed`` keeps them apart from other tests'), routed to one provider."""
    prompts = write_prompts(tmp / "prompts.jsonl", n, seed=seed)
    if provider is not None:
        extra["routing"] = {"only": [f"{provider}/fp8"], "allow_fallbacks": False}
    return base_config(prompts, tmp / "run", base_url=emu.base_url, **extra)


def _log(tmp: Path) -> str:
    return (tmp / "run" / "logs" / "generate.log").read_text(encoding="utf-8")


def _retry_delays(log: str, kind: str) -> list[float]:
    """Waits of the ``retry …`` lines whose error mentions ``kind``."""
    return [float(m.group(1)) for m in re.finditer(r"retry \S+ attempt \d+/\d+ in ([0-9.]+)s: (.*)", log)
            if kind in m.group(2)]


def _records(tmp: Path) -> list[Any]:
    return read_raw(tmp / "run" / "raw" / "rel" / "raw_responses.jsonl").records


FAST_RETRY = {"max_attempts": 3, "base_delay_s": 0.05, "max_delay_s": 0.2}


# -- time -------------------------------------------------------------------------------------------------


def test_keepalive_only_stream_times_out_on_data_not_bytes(emu: EmulatorProcess, tmp_path: Path) -> None:
    # Keep-alive comments every 50 ms for 600 s: a byte-level read timeout never fires, the data one must.
    endpoint = {"idle_timeout_s": 1.0, "connect_timeout_s": 2.0}
    cfg = _config(tmp_path, emu, "keepalive", 4, seed=101, concurrency=4, max_tokens=128, endpoint=endpoint,
                  retry={**FAST_RETRY, "max_attempts": 1})
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.elapsed < 15, run.output[-2000:]
    fails = read_failures(tmp_path / "run" / "raw" / "rel" / "failures.jsonl")
    assert len(fails) == 4 and {f.kind for f in fails} == {"retries_exhausted:idle_timeout"}
    assert all("keep-alive comments do not count" in f.reason for f in fails)
    assert not _records(tmp_path)
    # The next run retries them (the fault was for each prompt's first attempt) and finishes.
    cfg["retry"] = FAST_RETRY
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.returncode == 0, run.output[-2000:]
    assert len(_records(tmp_path)) == 4


def test_a_stream_with_no_first_byte_is_retried_by_the_rate_floor(emu: EmulatorProcess, tmp_path: Path) -> None:
    # 200 and keep-alive comments only, never a data event, under an idle timeout of 10 minutes: the tail
    # guard's rate floor (tail.slow_window_s 1 s, counted from when the request went out) cancels it.
    endpoint = {"idle_timeout_s": 600.0, "connect_timeout_s": 2.0}
    cfg = _config(tmp_path, emu, "keepalive", 4, seed=107, concurrency=4, max_tokens=128, endpoint=endpoint,
                  retry=FAST_RETRY, tail={"slow_window_s": 1.0, "min_tokens_per_s": 1.0})
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.returncode == 0, run.output[-2000:]
    assert run.elapsed < 15, run.output[-2000:]
    assert len(_records(tmp_path)) == 4  # each on its second attempt
    assert len(_retry_delays(_log(tmp_path), "slow_stream (no data since the request went out")) == 4


def test_trickling_stream_hits_the_total_deadline_derived_from_max_tokens(emu: EmulatorProcess,
                                                                          tmp_path: Path) -> None:
    # An empty data chunk every 50 ms, for ever: the idle timeout keeps being reset and only the total
    # deadline ends it. Its default: connect 1 s + idle 1 s + max_tokens 64 / 64 tokens/s = 3 s.
    endpoint = {"idle_timeout_s": 1.0, "connect_timeout_s": 1.0, "slow_tokens_per_s": 64.0}
    cfg = _config(tmp_path, emu, "trickle", 4, seed=102, concurrency=4, max_tokens=64, endpoint=endpoint,
                  retry=FAST_RETRY)
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.returncode == 0, run.output[-2000:]
    assert run.elapsed < 15
    assert len(_records(tmp_path)) == 4  # each on its second attempt
    log = _log(tmp_path)
    assert len(_retry_delays(log, "no complete response within 3s")) == 4


def test_retry_after_of_a_day_is_capped_at_max_delay(emu: EmulatorProcess, tmp_path: Path) -> None:
    # 429 with Retry-After: 86400 (header, and availability.retry_after in the body) on every first attempt.
    cfg = _config(tmp_path, emu, "dayretry", 6, seed=103, concurrency=6, max_tokens=128,
                  retry={**FAST_RETRY, "max_delay_s": 0.5})
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.returncode == 0, run.output[-2000:]
    assert run.elapsed < 15
    assert len(_records(tmp_path)) == 6
    delays = _retry_delays(_log(tmp_path), "rate-limited")
    assert len(delays) == 6 and all(0.44 <= d <= 0.5 for d in delays), delays


# -- size -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_50mb_body_is_never_a_record_and_memory_stays_bounded(emu: EmulatorProcess, tmp_path: Path,
                                                              stream: bool) -> None:
    # About 50 MB of token ids (~8M ids) on each first attempt, for max_tokens 256, usage billing 5 tokens.
    cfg = _config(tmp_path, emu, "huge", 4, seed=104 if stream else 105, concurrency=4, max_tokens=256,
                  endpoint={"stream": stream}, retry=FAST_RETRY)
    run = _generate(write_config(tmp_path, cfg), timeout=90)
    assert run.returncode == 0, run.output[-2000:]
    recs = _records(tmp_path)
    assert len(recs) == 4 and all(r.output_ids and len(r.output_ids) <= token_limit(256) for r in recs)
    assert (tmp_path / "run" / "raw" / "rel" / "raw_responses.jsonl").stat().st_size < 1_000_000
    assert len(_retry_delays(_log(tmp_path), "body_too_large")) == 4
    print(f"peak RSS of generate: {run.maxrss_mb:.0f} MB")
    assert run.maxrss_mb < 1024, f"peak RSS {run.maxrss_mb:.0f} MB"


@pytest.mark.parametrize("provider", ["manyids", "manytext"])
def test_more_ids_than_max_tokens_are_retried_never_written(emu: EmulatorProcess, tmp_path: Path,
                                                            provider: str) -> None:
    # Under the byte cap but over max_tokens: ~16k returned ids, or ~60k ids rebuilt from 300 KB of text.
    cfg = _config(tmp_path, emu, provider, 4, seed=106 if provider == "manyids" else 107, concurrency=4,
                  max_tokens=256, retry=FAST_RETRY)
    run = _generate(write_config(tmp_path, cfg), timeout=60)
    assert run.returncode == 0, run.output[-2000:]
    recs = _records(tmp_path)
    assert len(recs) == 4 and all(len(r.output_ids or ()) <= token_limit(256) for r in recs)
    log = _log(tmp_path)
    assert len(_retry_delays(log, "too_many_tokens")) == 4
    assert ("reconstructed output ids" if provider == "manytext" else "output ids for max_tokens 256") in log


# -- money ------------------------------------------------------------------------------------------------


def _reservation(max_tokens: int, prompt_tokens: int = 60) -> float:
    return (max_tokens * PRICE_COMPLETION + prompt_tokens * PRICE_PROMPT) / 1e6


def test_dollar_budget_holds_without_usage_cost(emu: EmulatorProcess, tmp_path: Path) -> None:
    # ~90 completion tokens a sample at $2.5/M: 500 prompts would cost ~$0.12; the budget is $0.05.
    budget, concurrency, max_tokens, n = 0.05, 16, 512, 500
    before = emu.get("/key")["data"]["usage"]
    cfg = _config(tmp_path, emu, "nocost", n, seed=108, concurrency=concurrency, max_tokens=max_tokens,
                  budget={"max_spend_usd": budget})
    cfg_path = write_config(tmp_path, cfg)
    run = _generate(cfg_path, timeout=90)
    billed = emu.get("/key")["data"]["usage"] - before
    assert run.returncode != 0 and "dollar budget" in run.output, run.output[-2000:]
    recs = _records(tmp_path)
    assert 50 <= len(recs) < n
    assert all(r.usage is not None and r.usage.cost_computed and r.usage.cost > 0 for r in recs)
    spent = sum(r.usage.cost for r in recs if r.usage is not None)
    in_flight = concurrency * _reservation(max_tokens)
    print(f"budget ${budget}: billed ${billed:.5f}, run dir ${spent:.5f}, {len(recs)} records, in flight ${in_flight:.5f}")
    assert billed <= budget + in_flight + 1e-9, f"billed ${billed:.5f} > ${budget} + ${in_flight:.5f} in flight"
    assert spent <= budget + in_flight + 1e-9
    assert abs(spent - billed) <= 1e-6 * max(1.0, billed), (spent, billed)  # the run dir's spend is the bill
    # Resume: the computed costs in the records are the prior spend, so nothing more is sent.
    again = _generate(cfg_path, timeout=60)
    assert again.returncode != 0 and "dollar budget" in again.output
    assert emu.get("/key")["data"]["usage"] - before == billed and len(_records(tmp_path)) == len(recs)


def test_dollar_budget_without_cost_or_prices_is_refused_unless_allowed(emu: EmulatorProcess,
                                                                       tmp_path: Path) -> None:
    # A vLLM server (the emulator's /v1): no price list and no usage.cost.
    cfg = _config(tmp_path, emu, None, 3, seed=109, concurrency=3, max_tokens=128, budget={"max_spend_usd": 0.05})
    cfg["endpoint"].update(kind="vllm", base_url=f"http://127.0.0.1:{emu.port}/v1")
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.returncode == 2, run.output[-2000:]
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and "budget.max_spend_usd" in lines[0] and "budget.allow_unpriced" in lines[0], lines
    assert not (tmp_path / "run" / "raw" / "rel" / "raw_responses.jsonl").exists()

    cfg["budget"]["allow_unpriced"] = True
    run = _generate(write_config(tmp_path, cfg), timeout=45)
    assert run.returncode == 0, run.output[-2000:]
    assert "warning" in run.stderr and "cannot be enforced" in run.stderr
    assert "cannot be enforced" in _log(tmp_path)
    assert len(_records(tmp_path)) == 3
