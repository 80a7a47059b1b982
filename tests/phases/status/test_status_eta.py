"""``status`` on a run in progress shows the ETA generate's display recorded (``logs/progress.json``), counted
down from when it was written, with the model in use and the pace under the display's labels; once the run
is over, its last figures."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from _report_helpers import held_lock, write_run_dir
from draftgen import rundir
from draftgen.phases.status.run import StatusSummary, run_status
from draftgen.records import ProgressRecord
from draftgen.store import atomic_write_json


def test_status_shows_the_recorded_eta_of_a_run_in_progress(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 20}, done_fraction=0.5)
    now = time.time()
    atomic_write_json(rundir.RunDir(run).progress, ProgressRecord(
        written_at=now - 4.0, pid=os.getpid(), elapsed_s=125.0, mean_tok_s=1234.0, tok_s=2100.0, done=10,
        planned=20, failed=0, eta_s=100.0, eta_basis="in flight"))
    with held_lock(run, "generate", ("chat",)):  # the writer lock held as a running `draftgen generate` holds it
        lines: list[str] = []
        run_status(str(run), echo=lines.append, now=now)
        out = " ".join(lines[0].split())
        assert "generate running: ETA 1m 36s (in flight) · as of 4.0s ago" in out
        assert "elapsed 2m 05s · mean 1.2k tok/s (this run)" in out and "2,100 tok/s (30s)" in out
        js: list[str] = []
        run_status(str(run), echo=js.append, now=now, as_json=True)
        summary = msgspec.json.decode(js[0], type=StatusSummary)
        assert summary.live and summary.progress is not None and summary.progress.eta_basis == "in flight"
    # the run is over (no writer): no ETA, the last figures named as such
    lines = []
    run_status(str(run), echo=lines.append, now=now)
    out = " ".join(lines[0].split())
    assert "ETA" not in out and "last generate stopped 4.0s ago · elapsed 2m 05s · mean 1.2k tok/s (this run)" in out
