"""plan --next-round and generate --round: a second round proposed from measured acceptance, then generated
into the same run (the embedded emulator; the acceptance is a measurement file as accept writes it)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from draftgen.cli import cli
from draftgen.config import load_config
from draftgen.errors import InputError
from draftgen.phases.generate.run import run_generate
from draftgen.phases.merge.run import run_merge
from draftgen.phases.plan.rounds import _Arm, propose_round, run_next_round
from draftgen.phases.prepare.run import run_prepare
from draftgen.records import (
    AcceptanceFigures,
    AcceptReport,
    DatasetAcceptance,
    PromptRecord,
    RoundDataset,
    ThroughputFigures,
)
from draftgen.rundir import RunDir
from draftgen.runview.rounds import read_rounds, round_counts
from draftgen.store import atomic_write_json, iter_jsonl

QUIET = {"echo": lambda s: None}


class _Id(msgspec.Struct):
    sample_id: str


def _setup(tmp: Path, *, traffic: tuple[float, float] = (1.0, 1.0), first: tuple[int, int] = (8, 24)) -> Path:
    """Datasets ``weak`` and ``strong`` of 40 prompts each, round 1 drawing ``first`` of them (uneven)."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name in ("weak", "strong"):
        rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"{name} question {i}?"}]})
                for i in range(40)]
        (tmp / f"{name}.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    ds = [{"name": n, "path": f"{n}.jsonl", "max_samples": m, "traffic": t}
          for n, m, t in zip(("weak", "strong"), first, traffic, strict=True)]
    return write_config(tmp, config_dict(tmp, ds, progress="off",
                                         partitions={"short": {"concurrency": 8, "max_tokens": 200}}))


def _round_one(cfg_path: Path, als: dict[str, float]) -> Any:
    """Generate and merge round 1, then leave the measurement accept would: AL per dataset at k = 3."""
    cfg = load_config(cfg_path)
    assert run_generate(cfg, argv=["draftgen"], prepare=run_prepare, **QUIET).exit_code == 0
    run_merge(cfg, **QUIET)
    fig = AcceptanceFigures(source="vllm-per-request", acceptance_length=2.0)
    thr = ThroughputFigures(base_url="http://127.0.0.1:1/v1", requests=32, completion_tokens=1, seconds=1.0,
                            tokens_per_s=1.0)
    rep = AcceptReport(drafter="train/drafter", server="vllm", prompts=32, sample_ids=[], max_tokens=64,
                       acceptance=fig, speculative=thr, k=3, created_at=time.time(),
                       datasets=[DatasetAcceptance(dataset=n, prompts=16, acceptance_length=al,
                                                   ci95=[al - 0.1, al + 0.1]) for n, al in als.items()])
    atomic_write_json(RunDir(cfg.run_path).accept_json, rep)
    return cfg


def _prompts(run: Path, name: str) -> list[PromptRecord]:
    return [p for _, p in iter_jsonl(RunDir(run).prepared(name), PromptRecord)]


def _objective(lines: list[RoundDataset], k: int, alpha: float, adds: list[int]) -> float:
    arms = [_Arm(ln, k + 1 - (ln.acceptance_length or 0), float(ln.training_tokens), 1.0, alpha) for ln in lines]
    return sum(a.line.traffic * a.gain(n) for a, n in zip(arms, adds, strict=True))


def test_the_guided_round_goes_where_acceptance_is_weakest_and_is_the_best_split_under_its_model(tmp_path: Path) -> None:
    cfg = _round_one(_setup(tmp_path), {"weak": 1.4, "strong": 3.2})
    plan = propose_round(cfg, add_tokens=6000)
    weak, strong = plan.datasets
    assert plan.round == 2 and plan.budget_unit == "tokens" and plan.k == 3
    assert weak.training_share < strong.training_share  # the uneven round 1
    assert weak.add_samples > strong.add_samples
    assert weak.add_tokens + strong.add_tokens <= 6000
    assert weak.expected_acceptance_length is not None and weak.expected_acceptance_length > 1.4
    assert plan.weighted_expected is not None and plan.weighted_now is not None
    assert plan.weighted_expected > plan.weighted_now
    # No other split of the same budget (whole prompts, within what each source has left) does better.
    best = _objective(plan.datasets, 3, plan.alpha, [weak.add_samples, strong.add_samples])
    for a, b in itertools.product(range(weak.available + 1), range(strong.available + 1)):
        if a * weak.tokens_per_sample + b * strong.tokens_per_sample <= 6000:
            assert _objective(plan.datasets, 3, plan.alpha, [a, b]) <= best + 1e-9
    uniform = propose_round(cfg, add_tokens=6000, spread="uniform")
    u_weak, u_strong = uniform.datasets
    assert abs(u_weak.add_tokens - u_strong.add_tokens) <= max(u_weak.tokens_per_sample, u_strong.tokens_per_sample)


def test_traffic_weights_move_the_budget_to_the_served_dataset(tmp_path: Path) -> None:
    even = propose_round(_round_one(_setup(tmp_path / "a"), {"weak": 2.0, "strong": 2.2}), add_tokens=3000)
    served = propose_round(_round_one(_setup(tmp_path / "b", traffic=(1.0, 20.0)), {"weak": 2.0, "strong": 2.2}),
                           add_tokens=3000)
    assert served.datasets[1].traffic == pytest.approx(20 / 21)
    assert served.datasets[1].add_samples > even.datasets[1].add_samples


def test_generate_round_two_draws_only_new_prompts_and_every_view_shows_the_rounds(tmp_path: Path) -> None:
    cfg_path = _setup(tmp_path)
    cfg = _round_one(cfg_path, {"weak": 1.4, "strong": 3.2})
    run = cfg.run_path
    before = {n: {p.sample_id for p in _prompts(run, n)} for n in ("weak", "strong")}
    lines: list[str] = []
    plan = run_next_round(cfg, add_tokens=4000, echo=lines.append)
    assert any(line.startswith("round 2 (guided") for line in lines)
    assert "generate CONFIG --round 2" in lines[-1]
    assert read_rounds(run)[0].started_at is None
    res = CliRunner().invoke(cli, ["generate", str(cfg_path), "--round", "2"])
    assert res.exit_code == 0, res.output
    assert "round 2 started (guided)" in res.output
    for d in plan.datasets:
        prompts = _prompts(run, d.dataset)
        assert len(prompts) == len(before[d.dataset]) + d.add_samples
        assert {p.sample_id for p in prompts if p.round == 1} == before[d.dataset]
        assert sum(p.round == 2 for p in prompts) == d.add_samples
        raw = {r.sample_id for _, r in iter_jsonl(RunDir(run).raw(d.dataset), _Id)}
        assert raw == {p.sample_id for p in prompts}  # every prompt answered once, round 2 too
    counts = round_counts(run, ["weak", "strong"])
    assert [(c.round, c.prepared, c.done) for c in counts] == [
        (1, 32, 32), (2, sum(d.add_samples for d in plan.datasets), sum(d.add_samples for d in plan.datasets))]
    status = CliRunner().invoke(cli, ["status", str(cfg_path)])
    assert "round 2:" in status.output, status.output
    merged = CliRunner().invoke(cli, ["merge", str(cfg_path)])
    assert merged.exit_code == 0 and "round 2:" in merged.output, merged.output
    # Starting it again resumes; the next proposal is round 3; a stray --round is refused in one line.
    again = CliRunner().invoke(cli, ["generate", str(cfg_path), "--round", "2"])
    assert again.exit_code == 0 and "started before; resuming it" in again.output
    assert propose_round(load_config(cfg_path), add_tokens=1000).round == 3
    stray = CliRunner().invoke(cli, ["generate", str(cfg_path), "--round", "4"])
    assert stray.exit_code != 0 and "round-4.json: not found" in stray.output and "Traceback" not in stray.output


def test_without_a_measurement_or_room_the_proposal_says_what_to_do(tmp_path: Path) -> None:
    cfg = load_config(_setup(tmp_path))
    with pytest.raises(InputError, match=r"no acceptance measured.*draftgen accept"):
        propose_round(cfg, add_tokens=1000)
    full = _setup(tmp_path / "full", first=(40, 40))
    cfg = _round_one(full, {"weak": 1.4, "strong": 3.2})
    with pytest.raises(InputError, match="buys no prompt"):
        run_next_round(cfg, add_tokens=1000, **QUIET)
    assert not RunDir(cfg.run_path).round_plan(2).exists()
    res = CliRunner().invoke(cli, ["generate", str(full), "--round", "2"])
    assert res.exit_code != 0 and "plan CONFIG --next-round" in res.output
