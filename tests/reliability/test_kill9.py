"""Kill -9 at random moments, many times over one ``draftgen generate`` run, then resume.

The emulator runs in its own process; ``draftgen generate`` runs as a subprocess and is SIGKILLed (its
whole process group) at random moments: some while records are being written, some at a random time
after start (during prepare, the manifest, the first requests). After each kill:

- every record written before the kill is still there, byte for byte (the log only grows);
- every complete line decodes as a ResponseRecord (a partial last line may exist and must be repaired
  by the next start);
- no sample_id appears twice;
- the recorded spend is within the budget plus the in-flight reservation, and what the emulator billed
  (which includes requests lost in flight at each kill) within the budget plus one reservation per start.

CI: 5 kills over 2,500 prompts; ``DRAFTGEN_RELIABILITY_SCALE=large``: 20 kills over 12,000 prompts.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from draftgen.records import PromptRecord

from ._helpers import (
    EmulatorProcess,
    base_config,
    cli_cmd,
    cli_env,
    read_raw,
    scaled,
    start_cli,
    start_emulator,
    write_config,
    write_prompts,
)

SCENARIO = """\
base: fast
name: kill9
reasoning_tokens_median: 90
content_tokens_median: 40
length_sigma: 0.4
runaway_rate: 0.0
providers:
  - {name: Emu, tag: emu/fp8, quantization: fp8, price_prompt: 0.5, price_completion: 2.5,
     ttft_s: [0.02, 0.3], tokens_per_s: [0, 0]}
"""
CONCURRENCY = 48
MAX_TOKENS = 512
PRICE_PROMPT, PRICE_COMPLETION = 0.5e-6, 2.5e-6


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    d = tmp_path_factory.mktemp("kill9-emulator")
    scen = d / "scenario.yaml"
    scen.write_text(SCENARIO, encoding="utf-8")
    emu = start_emulator("--scenario", str(scen), "--credits", "1000", log=d / "emulator.log")
    yield emu
    emu.stop()


def _line_count(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _prompt_ids(run: Path) -> list[str]:
    dec = msgspec.json.Decoder(PromptRecord)
    data = (run / "prepared" / "rel" / "prompts.jsonl").read_bytes()
    return [dec.decode(line).sample_id for line in data.splitlines() if line.strip()]


def _reservation(prompt_tokens: int = 40) -> float:
    """What the engine reserves for one request: max_tokens and the prompt at the worst price."""
    return MAX_TOKENS * PRICE_COMPLETION + prompt_tokens * PRICE_PROMPT


def _kill_repeatedly(cfg_path: Path, run: Path, kills: int, rnd: random.Random, *,
                     max_spend: float | None) -> tuple[bytes, int]:
    """Start, kill, check, ``kills`` times (fewer when a run ends first). Returns (log bytes, kills done)."""
    raw = run / "raw" / "rel" / "raw_responses.jsonl"
    log = run.parent / "generate-output.log"
    before = b""
    done_kills = 0
    for k in range(kills):
        proc = start_cli(["generate", str(cfg_path)], log=log)
        t0 = time.monotonic()
        if k % 2 == 0:  # while records are being written
            target = _line_count(raw) + rnd.randint(1, 150)
            while proc.poll() is None and _line_count(raw) < target and time.monotonic() - t0 < 30:
                time.sleep(0.01)
            time.sleep(rnd.uniform(0.0, 0.15))
        else:  # at any moment after start: prepare, manifest, first requests
            deadline = t0 + rnd.uniform(0.05, 2.0)
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        if proc.poll() is not None:
            assert proc.returncode in (0, 1), f"generate exited {proc.returncode}: {log.read_text()[-2000:]}"
            break
        _kill_group(proc)
        done_kills += 1
        now = read_raw(raw)  # raises on a corrupt complete line
        assert now.complete_bytes.startswith(before), f"kill {k}: records written before the kill changed"
        if before and now.partial_tail:
            assert now.complete_bytes.endswith(b"\n")
        ids = [r.sample_id for r in now.records]
        assert len(ids) == len(set(ids)), f"kill {k}: a sample_id appears twice"
        spent = sum(r.usage.cost for r in now.records if r.usage is not None)
        if max_spend is not None:
            assert spent <= max_spend + CONCURRENCY * _reservation() + 1e-9, f"kill {k}: spend {spent}"
        before = now.complete_bytes
    return before, done_kills


def test_kill9_then_resume_loses_and_duplicates_nothing(emulator: EmulatorProcess, tmp_path: Path) -> None:
    n, kills = scaled(2500, 12000), scaled(5, 20)
    rnd = random.Random(1234)
    prompts = write_prompts(tmp_path / "prompts.jsonl", n, seed=11)
    run = tmp_path / "run"
    cfg_path = write_config(tmp_path, base_config(prompts, run, base_url=emulator.base_url,
                                                  concurrency=CONCURRENCY, max_tokens=MAX_TOKENS))
    before, done_kills = _kill_repeatedly(cfg_path, run, kills, rnd, max_spend=None)
    assert done_kills >= min(3, kills), "the run ended before it could be killed; give it more prompts"

    final = start_cli(["generate", str(cfg_path)], log=tmp_path / "generate-output.log")
    assert final.wait(timeout=scaled(240, 1200)) == 0, (tmp_path / "generate-output.log").read_text()[-3000:]
    raw = read_raw(run / "raw" / "rel" / "raw_responses.jsonl")
    assert raw.partial_tail == b""
    assert raw.complete_bytes.startswith(before)
    ids = [r.sample_id for r in raw.records]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(_prompt_ids(run)), "every prompt is done exactly once after the resume"
    for r in raw.records:
        assert r.output_ids and r.prompt_ids and r.usage is not None and r.finish_reason in ("stop", "length")


def test_kill9_under_a_dollar_budget_stays_within_it(emulator: EmulatorProcess, tmp_path: Path) -> None:
    n, kills = scaled(2500, 12000), scaled(5, 20)
    rnd = random.Random(99)
    # About 260 completion tokens a sample at $2.5/M: the budget runs out at roughly 60 % of the prompts.
    max_spend = round(n * 260 * PRICE_COMPLETION * 0.6, 4)
    prompts = write_prompts(tmp_path / "prompts.jsonl", n, seed=12)
    run = tmp_path / "run"
    cfg = base_config(prompts, run, base_url=emulator.base_url, concurrency=CONCURRENCY, max_tokens=MAX_TOKENS,
                      budget={"max_spend_usd": max_spend})
    cfg_path = write_config(tmp_path, cfg)
    usage_before = emulator.get("/key")["data"]["usage"]
    before, done_kills = _kill_repeatedly(cfg_path, run, kills, rnd, max_spend=max_spend)

    final = subprocess.run(cli_cmd("generate", str(cfg_path)), env=cli_env(), capture_output=True, text=True,
                           timeout=600, check=False)
    raw = read_raw(run / "raw" / "rel" / "raw_responses.jsonl")
    spent = sum(r.usage.cost for r in raw.records if r.usage is not None)
    assert raw.complete_bytes.startswith(before)
    assert len({r.sample_id for r in raw.records}) == len(raw.records)
    assert spent <= max_spend + CONCURRENCY * _reservation() + 1e-9
    assert len(raw.records) < n, "the budget should have stopped the run before every prompt was done"
    assert final.returncode != 0 and "budget" in (final.stdout + final.stderr).lower()
    billed = emulator.get("/key")["data"]["usage"] - usage_before
    assert billed <= max_spend + (done_kills + 2) * CONCURRENCY * _reservation() + 1e-9
