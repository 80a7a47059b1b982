"""A chaos soak: thousands of requests against the ``chaos`` emulator, every fault kind, often.

``draftgen generate`` runs as a subprocess (the real CLI) against an emulator in this process's thread,
so the emulator's counters can be read. Passing means: no crash (exit 0), no hang (a hard timeout, and a
short idle timeout so the emulator's hanging connections are given up and retried), an exit code that
says whether the session left failures (0: none, 4: some, listed in ``failures.jsonl``), and every
prompt ends either done exactly once in ``raw_responses.jsonl`` or in ``failures.jsonl`` with its kind
and reason. A second run retries the failures and still never duplicates a sample.

CI: 2,000 prompts (about 3,000 requests); ``DRAFTGEN_RELIABILITY_SCALE=large``: 16,000 prompts, at
least 20,000 requests.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import msgspec

from draftgen.emulator.server import EmulatorOptions, start_in_thread
from draftgen.errors import EXIT_FAILURES, EXIT_OK
from draftgen.records import PromptRecord

from ._helpers import (
    FAKE_KEY,
    LARGE,
    base_config,
    cli_cmd,
    cli_env,
    read_failures,
    read_raw,
    scaled,
    write_config,
    write_prompts,
)


def _prompt_ids(run: Path) -> set[str]:
    dec = msgspec.json.Decoder(PromptRecord)
    data = (run / "prepared" / "rel" / "prompts.jsonl").read_bytes()
    return {dec.decode(line).sample_id for line in data.splitlines() if line.strip()}


def _generate(cfg_path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cli_cmd("generate", str(cfg_path)), env=cli_env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"generate hung: no exit within {timeout:.0f} s") from exc


def test_chaos_soak_every_sample_ends_done_or_recorded(tmp_path: Path) -> None:
    n = scaled(2000, 16000)
    prompts = write_prompts(tmp_path / "prompts.jsonl", n, seed=21)
    run = tmp_path / "run"
    opts = EmulatorOptions(scenario="chaos", seed=7, api_key=FAKE_KEY, credits=1e6,
                           ground_truth=str(tmp_path / "ground_truth.jsonl"))
    with start_in_thread(opts) as emu:
        cfg = base_config(prompts, run, base_url=emu.base_url, concurrency=scaled(200, 400), max_tokens=1024)
        cfg["endpoint"]["idle_timeout_s"] = 2.0
        cfg["retry"] = {"max_attempts": 6, "base_delay_s": 0.05, "max_delay_s": 1.0}
        cfg_path = write_config(tmp_path, cfg)
        first = _generate(cfg_path, timeout=scaled(200, 1500))
        requests_first = emu.state.requests
        faults = dict(emu.state.by_fault)
        failed_first = len(read_failures(run / "raw" / "rel" / "failures.jsonl"))
        second = _generate(cfg_path, timeout=scaled(120, 900))
        requests_total = emu.state.requests
        failed_second = len(read_failures(run / "raw" / "rel" / "failures.jsonl")) - failed_first

    # Exit 0 when every sample of the session finished, 4 (EXIT_FAILURES) when some failed (each failed
    # sample of a session appends one line to failures.jsonl).
    for res, failed in ((first, failed_first), (second, failed_second)):
        assert res.returncode == (EXIT_FAILURES if failed else EXIT_OK), (failed, res.stderr[-3000:])
        if failed:
            said = res.stdout + res.stderr
            assert f"stopped: {failed:,} samples failed: " in said and "(raw/rel/failures.jsonl says why)" in said
        assert "Traceback" not in res.stdout + res.stderr
    assert requests_first >= n * 1.2, f"only {requests_first} requests for {n} prompts: chaos was not chaotic"
    if LARGE:
        assert requests_total >= 20_000
    assert len(faults) >= 8, f"few fault kinds were injected: {faults}"

    expected = _prompt_ids(run)
    raw = read_raw(run / "raw" / "rel" / "raw_responses.jsonl")
    done = [r.sample_id for r in raw.records]
    assert len(done) == len(set(done)), "a sample was written twice"
    assert set(done) <= expected
    failures = {f.sample_id: f for f in read_failures(run / "raw" / "rel" / "failures.jsonl")}
    for f in failures.values():
        assert f.kind and f.reason, f"a failure record without its kind or reason: {f}"
    missing = expected - set(done) - set(failures)
    assert not missing, f"{len(missing)} samples ended neither done nor recorded as failed, e.g. {sorted(missing)[:3]}"
    for r in raw.records:
        assert r.output_ids and r.usage is not None and r.finish_reason in ("stop", "length", "tool_calls")
    log = (run / "logs" / "generate.log").read_text(encoding="utf-8")
    assert "retry" in log.lower() or "attempt" in log.lower(), "the log does not record the retries"
