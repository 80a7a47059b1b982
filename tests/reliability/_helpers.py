"""Helpers of the reliability suite: sizes, the fake key, prompt files, configs, the CLI and the emulator.

Size: CI runs the suite small; ``DRAFTGEN_RELIABILITY_SCALE=large`` runs it at full size (20k-request
chaos soak, 20 kills, 10x the fuzz examples). Every run here uses ``FAKE_KEY``, a recognisable key that
must never appear in a run directory, a log or an output (``conftest`` scans for it after the session).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from _common_helpers import FAKE_KEY, config_dict, free_port
from _common_helpers import write_config as _write_config
from draftgen.records import FailureRecord, ResponseRecord

LARGE = os.environ.get("DRAFTGEN_RELIABILITY_SCALE", "").lower() == "large"
# FAKE_KEY and free_port come from _common_helpers (the one fake key, the one free-port helper).
OTHER_FAKE_KEY = "sk-or-v1-" + "W4R0NG" * 8
SECRETS = (FAKE_KEY, OTHER_FAKE_KEY, "S3CR3TS3CR3T", "W4R0NGW4R0NG")


def scaled(ci: int, large: int) -> int:
    return large if LARGE else ci


def fuzz_examples(ci: int) -> int:
    return ci * 10 if LARGE else ci


# -- inputs -------------------------------------------------------------------------------------------

_WORDS = ("why", "how", "explain", "compare", "write", "list", "prove", "sort", "rust", "python", "tides",
          "bread", "graphs", "prime", "cache", "river", "sky", "music", "tax", "orbit")


def write_prompts(path: Path, n: int, *, seed: int = 0) -> Path:
    """``n`` distinct chat prompts as JSONL (OpenAI messages format)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        words = " ".join(_WORDS[(i * 7 + k * 3 + seed) % len(_WORDS)] for k in range(6))
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"Prompt {seed}-{i}: {words}?"}]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_config(folder: Path, data: dict[str, Any], name: str = "config.yaml") -> Path:
    return _write_config(folder, data, name)


def base_config(prompts: Path, run_dir: Path, *, base_url: str | None = None, concurrency: int = 64,
                max_tokens: int = 512, **extra: Any) -> dict[str, Any]:
    """An ``openrouter``-kind config pointed at an emulator (``base_url``) over one prompt file
    (``_common_helpers.config_dict`` with the suite's endpoint, partitions and plain progress)."""
    endpoint: dict[str, Any] = {"kind": "openrouter", "idle_timeout_s": 5.0, "connect_timeout_s": 5.0}
    if base_url is not None:
        endpoint["base_url"] = base_url
    cfg = config_dict(run_dir.parent, [{"name": "rel", "path": str(prompts)}], run_dir=str(run_dir),
                      endpoint=endpoint, progress="plain",
                      partitions={"short": {"concurrency": concurrency, "max_tokens": max_tokens},
                                  "long": {"concurrency": max(1, concurrency // 4), "max_tokens": max_tokens}})
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


# -- the CLI --------------------------------------------------------------------------------------------


def cli_env(key: str | None = FAKE_KEY, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    if key is not None:
        env["OPENROUTER_API_KEY"] = key
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "draftgen.cli", *args]


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``draftgen ARGS`` in a subprocess; its output must never hold a secret."""
    res = subprocess.run(cli_cmd(*args), env=env if env is not None else cli_env(), capture_output=True,
                         text=True, timeout=timeout, cwd=cwd, check=False)
    for secret in SECRETS:
        assert secret not in res.stdout and secret not in res.stderr, f"a key leaked into the output of {args}"
    return res


def start_cli(args: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed by the child's exit)
    return subprocess.Popen(cli_cmd(*args), env=env if env is not None else cli_env(), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


# -- an emulator in its own process ------------------------------------------------------------------------


@dataclass
class EmulatorProcess:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1"

    def get(self, path: str, key: str = FAKE_KEY) -> Any:
        req = urllib.request.Request(self.base_url + path, headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_emulator(*args: str, log: Path | None = None, key: str = FAKE_KEY) -> EmulatorProcess:
    """``DRAFTGEN_EMULATOR_API_KEY=KEY draftgen emulate --port P ARGS`` in a subprocess; returns once it answers."""
    port = free_port()
    proc = start_cli(["emulate", "--host", "127.0.0.1", "--port", str(port), *args],
                     env=cli_env(DRAFTGEN_EMULATOR_API_KEY=key), log=log)
    emu = EmulatorProcess(proc, port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            detail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"the emulator exited with {proc.returncode}: {detail}")
        try:
            emu.get("/key", key)
            return emu
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    emu.stop()
    raise RuntimeError("the emulator did not answer within 60 s")


# -- run directory checks ----------------------------------------------------------------------------------


@dataclass
class RawLog:
    records: list[ResponseRecord]
    complete_bytes: bytes  # every complete line
    partial_tail: bytes  # an unterminated last line (a crash artefact), if any


def read_raw(path: Path) -> RawLog:
    """Decode every complete line strictly (a corrupt one raises); keep a partial tail apart."""
    data = path.read_bytes() if path.exists() else b""
    cut = data.rfind(b"\n") + 1
    complete, tail = data[:cut], data[cut:]
    dec = msgspec.json.Decoder(ResponseRecord)
    records = []
    for n, line in enumerate(complete.splitlines(), 1):
        try:
            records.append(dec.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise AssertionError(f"{path}:{n}: corrupt line ({exc}): {line[:120]!r}") from None
    return RawLog(records, complete, tail)


def read_failures(path: Path) -> list[FailureRecord]:
    if not path.exists():
        return []
    dec = msgspec.json.Decoder(FailureRecord)
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    return [dec.decode(line) for line in data[:cut].splitlines() if line.strip()]


def _holds(path: Path, needles: list[bytes]) -> bytes | None:
    """The first needle found in the file, read in 4 MiB chunks (overlapping, so none is split)."""
    overlap = max(len(n) for n in needles) - 1
    tail = b""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            window = tail + chunk
            for needle in needles:
                if needle in window:
                    return needle
            tail = window[-overlap:]
    return None


def files_holding(root: Path, secrets: Sequence[str] = SECRETS) -> list[str]:
    """Every file under ``root`` whose bytes contain one of ``secrets``."""
    needles = [s.encode() for s in secrets]
    hits = []
    for p in root.rglob("*"):
        if not p.is_file() or p.is_symlink():
            continue
        try:
            found = _holds(p, needles)
        except OSError:
            continue
        if found is not None:
            hits.append(f"{p} holds {found[:12].decode()}…")
    return hits
