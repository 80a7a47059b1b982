"""A full disk (ENOSPC, simulated): a clean stop with a clear message, nothing corrupted, and a resume that
works once space returns.

The disk is simulated by wrapping the file of every ``JsonlWriter`` opened during the run: writes succeed
until a byte budget is spent, then one write is cut short (as a real full disk does: a partial line on
disk) and the next raises ``OSError(ENOSPC)``. ``draftgen generate`` runs in-process through click's
``CliRunner`` (so the patch applies) against an emulator in a thread. No root, no tmpfs needed.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from draftgen import store
from draftgen.cli import cli
from draftgen.emulator.server import EmulatorOptions, start_in_thread
from draftgen.records import PromptRecord

from ._helpers import FAKE_KEY, base_config, read_raw, scaled, write_config, write_prompts


class _Disk:
    def __init__(self, free: int) -> None:
        self.free = free
        self.refused = 0


class _FullDiskFile:
    """A raw file handle on a disk with ``disk.free`` bytes left."""

    def __init__(self, real: Any, disk: _Disk) -> None:
        self._real = real
        self._disk = disk

    def write(self, data: Any) -> int:
        n = len(data)
        if n <= self._disk.free:
            self._disk.free -= n
            written: int = self._real.write(data)
            return written
        if self._disk.free > 0:  # a short write: part of the batch reaches the disk
            part = bytes(data[: self._disk.free])
            self._disk.free = 0
            short: int = self._real.write(part)
            return short
        self._disk.refused += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:
        fd: int = self._real.fileno()
        return fd

    def close(self) -> None:
        self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _invoke(args: list[str]) -> Any:
    runner = CliRunner()
    return runner.invoke(cli, args, env={"OPENROUTER_API_KEY": FAKE_KEY}, catch_exceptions=True)


def test_full_disk_stops_cleanly_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = scaled(1500, 8000)
    prompts = write_prompts(tmp_path / "prompts.jsonl", n, seed=31)
    run = tmp_path / "run"
    with start_in_thread(EmulatorOptions(scenario="fast", api_key=FAKE_KEY, credits=1e6)) as emu:
        cfg_path = write_config(tmp_path, base_config(prompts, run, base_url=emu.base_url, concurrency=64,
                                                      max_tokens=512))
        prep = _invoke(["prepare", str(cfg_path)])
        assert prep.exit_code == 0, prep.output

        # -- the disk fills up part-way through the run ---------------------------------------------
        disk = _Disk(free=scaled(400_000, 2_000_000))
        real_init = store.JsonlWriter.__init__

        def init(self: store.JsonlWriter, path: Path, *, fsync: bool = True) -> None:
            real_init(self, path, fsync=fsync)
            self._fh = _FullDiskFile(self._fh, disk)  # type: ignore[assignment]

        monkeypatch.setattr(store.JsonlWriter, "__init__", init)
        full = _invoke(["generate", str(cfg_path)])
        monkeypatch.undo()

        assert disk.refused >= 1, "the simulated disk never filled up; lower its free bytes"
        assert full.exit_code not in (0, None), full.output
        assert not isinstance(full.exception, Exception) or isinstance(full.exception, SystemExit), \
            f"a traceback instead of a clean stop: {full.exception!r}"
        lines = [ln for ln in (full.stderr or "").splitlines() if ln.startswith("Error:")]
        message = (full.stderr or "") + full.stdout
        assert "no space left" in message.lower(), message[-2000:]
        assert len(lines) == 1, message[-2000:]
        raw_path = run / "raw" / "rel" / "raw_responses.jsonl"
        after_full = read_raw(raw_path)  # every complete line decodes
        assert after_full.partial_tail == b"", "the cut line was left on disk"
        ids = [r.sample_id for r in after_full.records]
        assert len(ids) == len(set(ids))
        assert 0 < len(ids) < n

        # -- space returns: the resume finishes the run -------------------------------------------------
        resumed = _invoke(["generate", str(cfg_path)])
        assert resumed.exit_code == 0, (resumed.stderr or "") + resumed.output

    final = read_raw(raw_path)
    assert final.complete_bytes.startswith(after_full.complete_bytes), "records written before ENOSPC changed"
    final_ids = [r.sample_id for r in final.records]
    assert len(final_ids) == len(set(final_ids))
    dec = msgspec.json.Decoder(PromptRecord)
    expected = {dec.decode(line).sample_id for line in (run / "prepared" / "rel" / "prompts.jsonl").read_bytes()
                .splitlines() if line.strip()}
    assert set(final_ids) == expected
