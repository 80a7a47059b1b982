"""plan --next-round per tag: a dataset whose measured prompts carry tags (``datasets[].tags_field``) is proposed
per (dataset, tag), each tag an arm of the model; ``generate --round 2`` then draws each tag's adds. Round 1 is
generated and merged on the embedded emulator; the acceptance is a measurement file as accept writes it."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from draftgen.cli import cli
from draftgen.config import RunConfig, load_config
from draftgen.phases.generate.run import run_generate
from draftgen.phases.merge.run import run_merge
from draftgen.phases.plan.rounds import _Arm, propose_round, run_next_round
from draftgen.phases.prepare.run import run_prepare
from draftgen.records import (
    AcceptanceFigures,
    AcceptReport,
    DatasetAcceptance,
    DatasetStats,
    PromptRecord,
    RoundDataset,
    RoundTag,
    ThroughputFigures,
)
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, iter_jsonl, read_json

QUIET = {"echo": lambda s: None}


class _Id(msgspec.Struct):
    sample_id: str


def _setup(tmp: Path) -> Path:
    """Dataset ``mix`` (80 prompts, tagged ``hard`` or ``easy`` in its ``topic`` column, 24 drawn) and dataset
    ``plain`` (40 prompts, no tags, 16 drawn)."""
    tmp.mkdir(parents=True, exist_ok=True)
    mix = [{"messages": [{"role": "user", "content": f"mix question {i}?"}], "topic": ("hard", "easy")[i % 2]}
           for i in range(80)]
    plain = [{"messages": [{"role": "user", "content": f"plain question {i}?"}]} for i in range(40)]
    for name, rows in (("mix", mix), ("plain", plain)):
        (tmp / f"{name}.jsonl").write_bytes(b"\n".join(msgspec.json.encode(r) for r in rows) + b"\n")
    ds = [{"name": "mix", "path": "mix.jsonl", "max_samples": 24, "tags_field": "topic"},
          {"name": "plain", "path": "plain.jsonl", "max_samples": 16}]
    return write_config(tmp, config_dict(tmp, ds, progress="off",
                                         partitions={"short": {"concurrency": 8, "max_tokens": 200}}))


def _round_one(cfg_path: Path) -> RunConfig:
    """Generate and merge round 1, then leave the measurement accept would at k = 3: ``mix`` 2.3 over all its
    prompts, its tag ``hard`` weak (1.4) and ``easy`` strong (3.2); ``plain`` 2.6."""
    cfg = load_config(cfg_path)
    assert run_generate(cfg, argv=["draftgen"], prepare=run_prepare, **QUIET).exit_code == 0
    run_merge(cfg, **QUIET)
    fig = AcceptanceFigures(source="vllm-per-request", acceptance_length=2.4)
    thr = ThroughputFigures(base_url="http://127.0.0.1:1/v1", requests=48, completion_tokens=1, seconds=1.0,
                            tokens_per_s=1.0)
    rep = AcceptReport(drafter="train/drafter", server="vllm", prompts=48, sample_ids=[], max_tokens=64,
                       acceptance=fig, speculative=thr, k=3, created_at=time.time(),
                       datasets=[DatasetAcceptance(dataset="mix", prompts=32, acceptance_length=2.3, ci95=[2.2, 2.4]),
                                 DatasetAcceptance(dataset="plain", prompts=16, acceptance_length=2.6,
                                                   ci95=[2.5, 2.7])],
                       tags=[DatasetAcceptance(dataset="mix", tag="easy", prompts=16, acceptance_length=3.2,
                                               ci95=[3.1, 3.3]),
                             DatasetAcceptance(dataset="mix", tag="hard", prompts=16, acceptance_length=1.4,
                                               ci95=[1.3, 1.5])])
    atomic_write_json(RunDir(cfg.run_path).accept_json, rep)
    return cfg


def _prompts(run: Path, name: str) -> list[PromptRecord]:
    return [p for _, p in iter_jsonl(RunDir(run).prepared(name), PromptRecord)]


def _objective(arms: list[RoundDataset | RoundTag], tps: list[float], adds: list[int]) -> float:
    """The traffic-weighted expected gain of ``adds`` prompts per arm under the proposal's model (k = 3)."""
    total = 0.0
    for line, t, n in zip(arms, tps, adds, strict=True):
        arm = _Arm(line, 4 - (line.acceptance_length or 4), float(line.training_tokens), t, 0.5)
        total += line.traffic * arm.gain(n)
    return total


def test_a_tagged_dataset_is_proposed_per_tag_and_guided_spends_on_its_weak_tag(tmp_path: Path) -> None:
    cfg = _round_one(_setup(tmp_path))
    stats = read_json(RunDir(cfg.run_path).prepared_stats("mix"), DatasetStats)
    assert set(stats.tags) == {"easy", "hard"} and sum(stats.tags.values()) == stats.samples == 24
    plan = propose_round(cfg, add_tokens=6000)
    mix, plain = plan.datasets
    assert plain.tags == []  # an untagged dataset: one line, as before
    easy, hard = mix.tags
    assert (easy.tag, hard.tag) == ("easy", "hard")
    # each tag: its measurement, its traffic and training tokens by its share of the drawn prompts, its room
    for t in mix.tags:
        assert t.traffic == pytest.approx(mix.traffic * stats.tags[t.tag] / stats.samples, abs=1e-6)
        assert t.training_tokens == round(mix.training_tokens * stats.tags[t.tag] / stats.samples)
        assert t.available == stats.tags_not_selected[t.tag] == 40 - stats.tags[t.tag]
        assert t.tokens_per_sample == mix.tokens_per_sample
    assert (hard.acceptance_length, hard.ci95, hard.prompts_measured) == (1.4, [1.3, 1.5], 16)
    assert hard.add_samples > easy.add_samples and hard.add_samples > 0
    assert mix.add_samples == hard.add_samples + easy.add_samples
    assert mix.add_tokens + plain.add_tokens <= 6000 + 1  # each line rounds its tokens
    assert hard.expected_acceptance_length is not None and hard.expected_acceptance_length > 1.4
    gain = sum(t.traffic * ((t.expected_acceptance_length or 0) - (t.acceptance_length or 0)) for t in mix.tags)
    assert mix.expected_acceptance_length == pytest.approx(2.3 + gain / mix.traffic, abs=2e-4)
    # No other split of the same budget over the three arms does better under the model.
    arms: list[RoundDataset | RoundTag] = [hard, easy, plain]
    tps = [mix.tokens_per_sample, mix.tokens_per_sample, plain.tokens_per_sample]
    best = _objective(arms, tps, [a.add_samples for a in arms])
    for adds in itertools.product(*(range(a.available + 1) for a in arms)):
        if sum(n * t for n, t in zip(adds, tps, strict=True)) <= 6000:
            assert _objective(arms, tps, list(adds)) <= best + 1e-9
    # uniform: the same share for each dataset, a tagged one's split evenly over its tags
    u_mix, u_plain = propose_round(cfg, add_tokens=6000, spread="uniform").datasets
    u_easy, u_hard = u_mix.tags
    assert abs(u_easy.add_samples - u_hard.add_samples) <= 1
    assert abs(u_mix.add_tokens - u_plain.add_tokens) <= 2 * max(u_mix.tokens_per_sample, u_plain.tokens_per_sample)


def test_generate_round_two_draws_each_tags_proposed_prompts(tmp_path: Path) -> None:
    cfg_path = _setup(tmp_path)
    cfg = _round_one(cfg_path)
    run = cfg.run_path
    before = {n: {p.sample_id: p for p in _prompts(run, n)} for n in ("mix", "plain")}
    lines: list[str] = []
    plan = run_next_round(cfg, add_tokens=4000, echo=lines.append)
    mix = plan.datasets[0]
    at = next(i for i, line in enumerate(lines) if line.startswith("  mix "))
    assert lines[at + 1].startswith("    / easy") and lines[at + 2].startswith("    / hard")  # under their dataset
    assert read_json(RunDir(run).round_plan(2), type(plan)).datasets[0].tags == mix.tags  # written as proposed
    res = CliRunner().invoke(cli, ["generate", str(cfg_path), "--round", "2"])
    assert res.exit_code == 0, res.output
    prompts = _prompts(run, "mix")
    assert {p.sample_id: p for p in prompts if p.round == 1} == before["mix"]  # round 1 kept, ids and all
    second = [p for p in prompts if p.round == 2]
    for t in mix.tags:
        assert sum(1 for p in second if p.tags == [t.tag]) == t.add_samples
    assert len(second) == mix.add_samples
    plain = [p for p in _prompts(run, "plain") if p.round == 2]
    assert len(plain) == plan.datasets[1].add_samples
    for name in ("mix", "plain"):
        raw = {r.sample_id for _, r in iter_jsonl(RunDir(run).raw(name), _Id)}
        assert raw == {p.sample_id for p in _prompts(run, name)}  # every prompt answered once, round 2 too
    stats = read_json(RunDir(run).prepared_stats("mix"), DatasetStats)
    assert {t: stats.tags[t] for t in ("easy", "hard")} == {
        t.tag: sum(1 for p in prompts if p.tags == [t.tag]) for t in mix.tags}
    assert all(stats.tags_not_selected[t.tag] == t.available - t.add_samples for t in mix.tags)
