"""Shared helpers for the benchmark scripts: machine facts, CPU/RSS measurement, and the result line.

Convention (read by ``python -m bench``): a script prints, as its last line, ``RESULT-JSON: {...}``
via ``emit_result(name, figures)``. ``figures`` is a flat mapping of figure name → number, string,
bool or None; units go in the name (``cpu_s_per_1k``, ``wall_s``, ``peak_rss_mb``, ``ratio_...``).
A script that prints no such line still runs; its stdout is kept verbatim in RESULTS.md.

Smoke size: ``quick_mode()`` is true when the script got ``--quick`` or the environment has
``DRAFTGEN_BENCH_QUICK=1`` (the orchestrator sets it). Scripts import this module either as
``bench._common`` (``python -m bench.<name>`` from the repo root, or when the orchestrator puts the root
on ``PYTHONPATH``) or as ``_common`` (``python bench/<name>.py``).

Nothing here imports draftgen, so every bench can use it.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "RESULT_PREFIX",
    "CpuTimer",
    "cpu_seconds",
    "current_rss_mb",
    "emit_result",
    "free_port",
    "git_sha",
    "machine_info",
    "package_versions",
    "parse_results",
    "peak_rss_mb",
    "pin_cpu",
    "pinned_cpu",
    "quick_mode",
    "stop_process",
    "wait_for_emulator",
]

RESULT_PREFIX = "RESULT-JSON: "
REPO_ROOT = Path(__file__).resolve().parents[1]


def quick_mode() -> bool:
    return "--quick" in sys.argv[1:] or os.environ.get("DRAFTGEN_BENCH_QUICK", "") not in ("", "0")


def emit_result(name: str, figures: dict[str, Any]) -> None:
    """Print the one machine-readable line the orchestrator collects (flushes stdout)."""
    line = json.dumps({"name": name, "figures": figures}, sort_keys=False, default=str)
    print(RESULT_PREFIX + line, flush=True)


def parse_results(text: str) -> list[dict[str, Any]]:
    """Every ``RESULT-JSON:`` object in ``text`` (a script may emit several); bad lines are skipped."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.startswith(RESULT_PREFIX):
            continue
        try:
            obj = json.loads(line[len(RESULT_PREFIX):])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("figures"), dict):
            out.append(obj)
    return out


def cpu_seconds(children: bool = False) -> float:
    """User + system CPU seconds of this process (or of its waited-for children)."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident set size in MiB.

    For this process it reads ``VmHWM`` from /proc (reset by exec, unlike ``ru_maxrss``, which a child
    inherits from the parent it was forked from). ``children``: the largest of the waited-for children.
    """
    if not children:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
        except OSError:
            pass
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    kib = resource.getrusage(who).ru_maxrss
    if sys.platform == "darwin":
        kib //= 1024
    return kib / 1024.0


def current_rss_mb(pid: int | None = None) -> float:
    """Current RSS in MiB, from /proc (0.0 where /proc is absent)."""
    try:
        fields = Path(f"/proc/{pid or 'self'}/statm").read_text().split()
    except OSError:
        return 0.0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


@dataclass
class CpuTimer:
    """Wall and CPU seconds of a block: ``with CpuTimer() as t: ...; t.wall_s, t.cpu_s``."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    _w0: float = 0.0
    _c0: float = 0.0

    def __enter__(self) -> CpuTimer:
        self._w0 = time.perf_counter()
        self._c0 = cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._w0
        self.cpu_s = cpu_seconds() - self._c0


def pin_cpu(cpu: int) -> None:
    """Pin this process to one core for good (a ``preexec_fn`` or a worker's first line); a no-op on a
    one-core machine or where unsupported."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass


def wait_for_emulator(url: str, key: str, proc: subprocess.Popen[Any], log: Path, timeout_s: float = 60.0) -> None:
    """Wait until an emulator started as ``proc`` answers ``GET {url}/key``; SystemExit with its log's tail
    when it dies or does not answer within ``timeout_s``."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            req = urllib.request.Request(url + "/key", headers={"Authorization": f"Bearer {key}"})
            urllib.request.urlopen(req, timeout=2).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the emulator did not start: " + log.read_text(errors="replace")[-1000:]) from None
            time.sleep(0.2)


@contextmanager
def pinned_cpu(cpu: int = 0) -> Iterator[None]:
    """Run the block on one core (restores the previous affinity); a no-op where unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)



def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate a child process, then kill it if it has not exited within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 0.0


def machine_info() -> dict[str, Any]:
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "usable_cores": usable,
        "ram_gib": round(_ram_gib(), 1),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "libc": " ".join(platform.libc_ver()).strip(),
    }


def package_versions(names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "not installed"
    return out


def git_sha(root: Path = REPO_ROOT) -> str | None:
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = res.stdout.strip()
    if res.returncode != 0 or not sha:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True,
        timeout=10, check=False,
    )
    return sha + ("-dirty" if dirty.stdout.strip() else "")
