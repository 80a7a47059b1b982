"""The end of a run against the emulator: every line of generate's summary (the per-provider table included)
fits in 80 columns, the run's pace is under the one labelled definition, and the run leaves its figures in
logs/progress.json, which ``status`` then shows with the same labels, also in 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from _generate_helpers import claim, emulator, fast, make_config, write_prompts
from draftgen.engine.progress import pace_text
from draftgen.phases.generate.run import run_generate
from draftgen.phases.status.run import run_status
from draftgen.records import ProgressRecord
from draftgen.rundir import RunDir
from draftgen.store import read_json


def test_summary_and_status_fit_80_columns_and_share_the_pace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    # every provider answers: the provider table has a row per provider, every column filled
    sc = fast(time_scale=0.001)
    with emulator(sc) as emu:
        cfg = make_config(tmp_path, ["chat"], base_url=emu.base_url, budget={"max_spend_usd": 5.0})
        write_prompts(claim(cfg), "chat", 24)
        lines: list[str] = []
        rep = run_generate(cfg, echo=lines.append)
    assert rep.exit_code == 0, lines
    summary = lines[lines.index(next(ln for ln in lines if ln.startswith("total:"))) - 1:]
    assert all(len(ln) <= 80 for ln in summary), [ln for ln in summary if len(ln) > 80]
    text = "\n".join(summary)
    for head in ("provider", "responses", "$/M out", "p50 lat", "p95 lat", "p50 TTFT", "p95 TTFT", "retries",
                 "dropped", "quant", "cool-downs", "tier"):
        assert head in text, head
    assert "DeepInfra" in text and "Chutes" in text
    # the run recorded its pace; the summary shows it under the one definition, labelled
    pr = read_json(RunDir(cfg.run_path).progress, ProgressRecord)
    assert pr.finished and pr.done == 24 and pr.planned == 24 and pr.eta_s == 0.0
    assert rep.completion_tokens > 0 and pr.mean_tok_s == pytest.approx(rep.completion_tokens / pr.elapsed_s, rel=0.05)
    assert "tok/s (this run)" in " ".join(summary) and "elapsed " in " ".join(summary)
    # status, read from another process's point of view: the same figures under the same labels, in 80 columns
    out: list[str] = []
    run_status(str(cfg.run_path), echo=out.append)
    status = out[0]
    assert all(len(ln) <= 80 for ln in status.splitlines()), [ln for ln in status.splitlines() if len(ln) > 80]
    assert "last generate finished" in status and pace_text(pr.elapsed_s, pr.mean_tok_s) in status.replace("\n  ", " · ")
    assert "first to last response" in status  # the span over every run is named as such, not as "elapsed"
