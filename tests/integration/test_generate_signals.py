"""`draftgen generate` as a subprocess: kill -9 at several points then resume; SIGINT and a second SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common_helpers import FAKE_KEY, config_dict, write_config
from _generate_helpers import claim, emulator, fast, responses, write_prompts
from draftgen.config import load_config
from draftgen.emulator import Scenario
from draftgen.records import ResponseRecord
from draftgen.store import iter_jsonl


def _slow(ttft: tuple[float, float] = (0.05, 0.3)) -> Scenario:
    sc = fast()
    for p in list(sc.providers):
        sc = sc.with_provider(p.tag, ttft_s=ttft)
    return sc


def _config(tmp: Path, base_url: str, **extra: object) -> Path:
    """The emulator at ``base_url``, dataset ``a``, fast retries, plain progress; ``extra`` sections replace
    the defaults whole."""
    sections = {
        "endpoint": {"kind": "emulator", "base_url": base_url, "idle_timeout_s": 60},
        "partitions": {"short": {"concurrency": 6, "max_tokens": 1024}, "long": {"concurrency": 2, "max_tokens": 1024}},
        "retry": {"base_delay_s": 0.01, "max_delay_s": 0.1, "shutdown_grace_s": 20},
        "progress": "plain",
        **extra,
    }
    return write_config(tmp, config_dict(tmp, ["a"], replace=True, **sections))


def _start(cfg: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OPENROUTER_API_KEY": FAKE_KEY}
    return subprocess.Popen([sys.executable, "-m", "draftgen.cli", "generate", str(cfg)], cwd=cfg.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _wait_lines(path: Path, n: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _lines(path) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)


def test_kill9_at_several_points_then_resume(tmp_path: Path) -> None:
    raw = tmp_path / "run" / "raw" / "a" / "raw_responses.jsonl"
    with emulator(_slow()) as emu:
        cfg = _config(tmp_path, emu.base_url)
        ids = write_prompts(claim(load_config(cfg)), "a", 70, long_every=9)
        for i, at in enumerate((5, 25, 45)):
            proc = _start(cfg)
            _wait_lines(raw, at, proc)
            proc.kill()
            proc.wait()
            if i == 1:  # a write cut mid-line by the crash
                with raw.open("ab") as fh:
                    fh.write(b'{"sample_id": "a-00069", "dataset": "a", "output_ids": [1, 2')
        proc = _start(cfg)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    assert raw.read_bytes().endswith(b"\n")
    recs = [r for _, r in iter_jsonl(raw, ResponseRecord, skip_partial_tail=False)]  # every line is whole
    done = [r.sample_id for r in recs]
    assert len(done) == len(set(done)) == 70 and set(done) == set(ids)
    assert all(r.output_ids and r.prompt_ids for r in recs)


def test_sigint_finishes_in_flight_and_second_sigint_exits_now(tmp_path: Path) -> None:
    raw = tmp_path / "run" / "raw" / "a" / "raw_responses.jsonl"
    with emulator(_slow((0.2, 0.6))) as emu:
        cfg = _config(tmp_path, emu.base_url)
        write_prompts(claim(load_config(cfg)), "a", 200)
        proc = _start(cfg)
        _wait_lines(raw, 6, proc)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert time.monotonic() - t0 < 5
        text = out.decode() + err.decode()
        assert "stopped: interrupted (SIGINT)" in text and "Traceback" not in text
        after_first = len(responses(tmp_path / "run", "a"))
        assert 6 <= after_first < 200

    # In-flight requests that never finish: the first SIGINT waits, the second exits at once.
    sc = fast().replace(hang_s=60.0)
    for p in list(sc.providers):
        sc = sc.with_provider(p.tag, faults={"hang": 1.0})
    with emulator(sc) as emu:
        cfg = _config(tmp_path, emu.base_url, endpoint={"kind": "emulator", "base_url": emu.base_url,
                                                         "idle_timeout_s": 60, "stream": False})
        proc = _start(cfg)
        deadline = time.monotonic() + 30
        while emu.state.requests < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)  # one Ctrl-C delivered twice within milliseconds is one interrupt
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None  # waiting for the in-flight requests
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)  # the abort is under way: said once
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130 and time.monotonic() - t0 < 5
        said = err.decode()  # the display's one-off lines (also in logs/generate.log)
        assert said.count("SIGINT: stopping; grace period") == 1 and said.count("again: aborting") == 1
        assert said.count("exiting now") == 1
    assert len(responses(tmp_path / "run", "a")) == after_first
