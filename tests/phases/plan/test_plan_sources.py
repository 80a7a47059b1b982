"""plan times a run with no response yet at the stream rate draftgen probe measured (logs/probe.json), not
at an assumed 50 tokens/s; its pilot says how it is going off a terminal; in batch mode its headline and
budget line are the Batch API's (issue 34)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from _common_helpers import config_dict, load, write_config
from _generate_helpers import emulator, fast
from draftgen.cli import cli
from draftgen.fmt import fmt_usd
from draftgen.phases.plan.run import run_plan
from draftgen.phases.probe.run import run_probe
from draftgen.records import ProbeMeasurement
from draftgen.rundir import RunDir
from draftgen.store import read_json


def test_plan_uses_the_rate_probe_measured(tmp_path: Path) -> None:
    sc = fast()
    for p in list(sc.providers):  # every stream at 20 tokens/s after 1 s, on a clock at 1/10
        sc = sc.with_provider(p.tag, tokens_per_s=(20.0, 20.0), ttft_s=(1.0, 1.0))
    sc = sc.replace(time_scale=0.1)
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' * 1, encoding="utf-8")
    (tmp_path / "key").write_text("sk-or-v1-t", encoding="utf-8")
    with emulator(sc) as emu:
        cfg = load(write_config(tmp_path, config_dict(
            tmp_path, endpoint={"kind": "emulator", "base_url": emu.base_url, "api_key_file": "key"},
            probe={"max_tokens": 64}, plan={"avg_output_tokens": 1000}, progress="off")))
        said: list[str] = []
        assert run_probe(cfg, echo=said.append).ok, said
        m = read_json(RunDir(cfg.run_path).probe, ProbeMeasurement)
        assert 100 < m.tokens_per_s < 400  # 20 tokens/s at time_scale 0.1: about 200
        assert any("recorded in" in s for s in said)
        notes: list[str] = []
        rep = run_plan(cfg, echo=notes.append)
    (line,) = rep.datasets
    assert line.latency_s == (m.ttft_s or 1.0) + 1000 / m.tokens_per_s  # not 1 s + 1000 / 50
    assert line.latency_s < 10
    assert any("measured by draftgen probe" in n for n in notes)


def test_a_pilot_off_a_terminal_says_how_it_is_going(tmp_path: Path) -> None:
    # One pilot request that takes about 11 s (110 tokens at 10 tokens/s): generate's plain status line
    # shows up at least once while it runs, though stderr is no terminal.
    sc = fast()
    for p in list(sc.providers):
        sc = sc.with_provider(p.tag, tokens_per_s=(10.0, 10.0))
    sc = sc.replace(content_tokens_median=2000, reasoning_tokens_median=2000, length_sigma=0.0)
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n', encoding="utf-8")
    (tmp_path / "key").write_text("sk-or-v1-t", encoding="utf-8")
    with emulator(sc) as emu:
        cfg = write_config(tmp_path, config_dict(
            tmp_path, endpoint={"kind": "emulator", "base_url": emu.base_url, "api_key_file": "key"},
            partitions={"short": {"concurrency": 4, "max_tokens": 110}, "long": {"concurrency": 1, "max_tokens": 110}},
            quality={"min_length_fraction": 0.0}, progress="auto"))
        res = CliRunner().invoke(cli, ["plan", str(cfg), "--pilot", "1"])
    assert res.exit_code == 0, res.output
    status = [ln for ln in res.stderr.splitlines() if "tok/s" in ln or "ETA" in ln]
    assert status, res.stderr


def test_batch_mode_plans_at_the_batch_apis_cost_and_time(tmp_path: Path) -> None:
    rows = "".join(f'{{"messages": [{{"role": "user", "content": "topic {i}"}}]}}\n' for i in range(8))
    (tmp_path / "chat.jsonl").write_text(rows, encoding="utf-8")
    (tmp_path / "key").write_text("sk-or-v1-t", encoding="utf-8")
    with emulator() as emu:
        cfg = load(write_config(tmp_path, config_dict(
            tmp_path, endpoint={"kind": "emulator", "base_url": emu.base_url, "api_key_file": "key", "mode": "batch"},
            plan={"avg_output_tokens": 500}, budget={"max_spend_usd": 10}, progress="off")))
        said: list[str] = []
        rep = run_plan(cfg, echo=said.append)
    sync, batch = (next(m for m in rep.modes if m.mode == k) for k in ("sync", "batch"))
    assert batch.available and batch.cost_usd is not None and sync.cost_usd is not None
    assert batch.cost_usd < sync.cost_usd
    assert rep.expected_cost_usd == batch.cost_usd and rep.time_s == batch.time_s
    assert abs(sum(ln.cost_usd or 0 for ln in rep.datasets) - batch.cost_usd) < 1e-9
    budget = next(s for s in said if s.startswith("budget: "))
    assert fmt_usd(batch.cost_usd) in budget and fmt_usd(sync.cost_usd) not in budget
