"""kill -9 during ``endpoint.mode: batch``, then rerun: every sample paid for once and recorded once.

The emulator runs in its own process; ``draftgen generate`` runs as a subprocess and dies by SIGKILL at an
exact step of a batch's life (started through ``_batch_kill.py``, which wraps the journal's, the client's or
the sinks' function in that process and kills it there: a real kill -9; draftgen itself has no hook) or at
a random moment while its batches run (killed from here). Steps:

- ``prepared``: the batch is journalled, its submission not sent (the rerun finds nothing at OpenRouter
  and submits it);
- ``submit``: OpenRouter accepted it, its id is not journalled (the rerun finds it among the account's
  batches, its results carrying the batch's key in their custom_ids, and adopts it: never submitted twice);
- ``status``: while polling (the rerun polls it again);
- ``ingest:5``: records are written five at a time; the first five of a finished batch are durable, the
  rest not (the rerun writes the rest).

At ``prepared`` and ``submit`` another client then submits a decoy of the same model and size, with the
custom_ids draftgen used before batch keys: the rerun must not take it for its own (at ``prepared`` it
waits for the decoy's results, finds them another's, and only then submits).

After the rerun: each prompt has exactly one record; the emulator holds exactly the batches the journal
knows (none submitted twice); what it billed equals the records' costs (none paid twice).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftgen.engine.batch_journal import load_batches
from draftgen.rundir import RunDir

from ._helpers import (
    FAKE_KEY,
    EmulatorProcess,
    base_config,
    cli_env,
    read_raw,
    start_cli,
    start_emulator,
    write_config,
    write_prompts,
)

SCENARIO = """\
base: fast
name: batch-kill9
reasoning_tokens_median: 60
content_tokens_median: 30
length_sigma: 0.3
runaway_rate: 0.0
batch: {validating_s: 0.05, in_progress_s: 0.6, per_request_s: 0.0, finalizing_s: 0.05}
"""
PROMPTS = 40  # three or four batches


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    d = tmp_path_factory.mktemp("batch-kill9-emulator")
    scen = d / "scenario.yaml"
    scen.write_text(SCENARIO, encoding="utf-8")
    emu = start_emulator("--scenario", str(scen), "--credits", "1000", log=d / "emulator.log")
    yield emu
    emu.stop()


def _batches(emu: EmulatorProcess) -> list[dict[str, object]]:
    got = emu.get("/batches?limit=100")
    data: list[dict[str, object]] = got["data"]
    return data


def _setup(emu: EmulatorProcess, tmp: Path, size: int) -> tuple[Path, Path]:
    """A batch run of ``PROMPTS`` prompts in batches of ``size`` (each test its own size: the emulator's
    account is shared, and only batches of its model and size are candidates for a batch found again)."""
    prompts = write_prompts(tmp / "prompts.jsonl", PROMPTS, seed=size)
    run = tmp / "run"
    cfg = base_config(prompts, run, base_url=emu.base_url, concurrency=8, max_tokens=256,
                      endpoint={"mode": "batch", "batch": {"max_requests": size, "poll_interval_s": 0.05,
                                                           "poll_max_interval_s": 0.2}})
    return write_config(tmp, cfg), run


def _start_killed_at(point: str, cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    """``draftgen generate CFG`` through the launcher that SIGKILLs it at ``point``."""
    launcher = Path(__file__).with_name("_batch_kill.py")
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, str(launcher), point, "generate", str(cfg)], env=cli_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _submit_decoy(emu: EmulatorProcess, run: Path) -> str:
    """Another client's batch like the open one: its model, its size, created after it was prepared, and
    the custom_ids draftgen used before keys (``<dataset>:<sample_id>``)."""
    v = next(v for v in load_batches(RunDir(run).batch_journal).values() if v.open)
    reqs = [{"custom_id": f"{it.dataset}:{it.sample_id}",
             "body": {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 16}} for it in v.items]
    body = json.dumps({"endpoint": "/v1/chat/completions", "model": v.model, "requests": reqs}).encode()
    req = urllib.request.Request(emu.base_url + "/batches", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {FAKE_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(json.loads(resp.read())["id"])


def _cost_when_done(emu: EmulatorProcess, batch_id: str) -> float:
    deadline = time.monotonic() + 30
    while (b := emu.get(f"/batches/{batch_id}"))["status"] not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, b["status"]
        time.sleep(0.05)
    return float(b["usage"]["cost"]) if b["usage"] else 0.0


def _rerun_and_check(emu: EmulatorProcess, cfg: Path, run: Path, before: set[str], usage0: float,
                     decoy: str | None = None) -> None:
    log = run.parent / "rerun.log"
    proc = start_cli(["generate", str(cfg)], log=log)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    raw = read_raw(run / "raw" / "rel" / "raw_responses.jsonl")
    ids = [r.sample_id for r in raw.records]
    assert len(ids) == PROMPTS and len(set(ids)) == PROMPTS, "every prompt recorded exactly once"
    views = load_batches(RunDir(run).batch_journal)
    mine = {v.batch_id for v in views.values() if v.batch_id}
    at_emulator = {str(b["id"]) for b in _batches(emu)} - before - {decoy}
    assert at_emulator == mine, "OpenRouter holds exactly the batches the journal knows: none submitted twice"
    assert all(v.finished for v in views.values())
    decoy_cost = _cost_when_done(emu, decoy) if decoy else 0.0
    billed = emu.get("/key")["data"]["usage"] - usage0 - decoy_cost
    recorded = sum(r.usage.cost for r in raw.records if r.usage is not None)
    assert billed == pytest.approx(recorded, rel=1e-9, abs=1e-12), "billed once per sample, recorded once"
    assert all(r.batch_id in mine for r in raw.records)


@pytest.mark.parametrize(("point", "size"), [("prepared", 11), ("submit", 12), ("status", 13), ("ingest:5", 14)])
def test_kill9_at_each_step_then_rerun(emulator: EmulatorProcess, tmp_path: Path, point: str, size: int) -> None:
    cfg, run = _setup(emulator, tmp_path, size)
    before = {str(b["id"]) for b in _batches(emulator)}
    usage0 = emulator.get("/key")["data"]["usage"]
    log = tmp_path / "killed.log"
    proc = _start_killed_at(point, cfg, log)
    assert proc.wait(timeout=120) == -signal.SIGKILL, log.read_text()[-3000:]
    views = load_batches(RunDir(run).batch_journal)
    assert views and any(v.open for v in views.values()), "killed with a batch open"
    open_key = next(v.key for v in views.values() if v.open)
    accepted: set[str] = set()
    if point == "prepared":
        assert all(v.batch_id is None for v in views.values())
    if point == "submit":
        accepted = {str(b["id"]) for b in _batches(emulator)} - before
        assert len(accepted) == 1, "accepted, id not journalled"
    if point.startswith("ingest"):
        assert len(read_raw(run / "raw" / "rel" / "raw_responses.jsonl").records) == 5
    decoy = _submit_decoy(emulator, run) if point in ("prepared", "submit") else None
    _rerun_and_check(emulator, cfg, run, before, usage0, decoy)
    after = load_batches(RunDir(run).batch_journal)[open_key]
    if point == "prepared":
        assert after.batch_id not in (None, decoy) and not after.adopted, "the decoy is not taken for it"
    if point == "submit":
        assert after.adopted and {after.batch_id} == accepted, "the batch it submitted, exactly"


def test_kill9_at_a_random_moment_while_batches_run(emulator: EmulatorProcess, tmp_path: Path) -> None:
    cfg, run = _setup(emulator, tmp_path, 16)
    before = {str(b["id"]) for b in _batches(emulator)}
    usage0 = emulator.get("/key")["data"]["usage"]
    proc = start_cli(["generate", str(cfg)], log=tmp_path / "killed.log")
    journal = RunDir(run).batch_journal
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if journal.is_file() and b'"submitted"' in journal.read_bytes():
            break
        time.sleep(0.01)
    time.sleep(random.Random(7).uniform(0.0, 0.5))
    assert proc.poll() is None, "the run ended before it could be killed"
    _kill_group(proc)
    lines = [json.loads(x) for x in journal.read_bytes().splitlines() if x.endswith(b"}")]
    assert any(x["event"] == "submitted" for x in lines)
    _rerun_and_check(emulator, cfg, run, before, usage0)
