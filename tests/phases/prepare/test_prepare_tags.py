"""prepare with ``datasets[].tags_field``: each prompt's tags from its row, ids unchanged by them, a bad value
refused with file:line (or skipped), per-tag counts in stats.json, and a started round drawing its per-tag
adds in sample-key order while every earlier prompt keeps its id and its round."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from _merge_helpers import make_config, write_jsonl
from draftgen.cli import cli
from draftgen.config import RunConfig
from draftgen.phases.prepare.run import run_prepare
from draftgen.records import DatasetStats, PromptRecord, RoundDataset, RoundPlan, RoundTag
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, iter_jsonl, read_json


def _quiet(_: str) -> None:
    pass


def _prompts(cfg: RunConfig, name: str) -> list[PromptRecord]:
    return [r for _, r in iter_jsonl(RunDir(cfg.run_path).prepared(name), PromptRecord)]


def _stats(cfg: RunConfig, name: str) -> DatasetStats:
    return read_json(RunDir(cfg.run_path).prepared_stats(name), DatasetStats)


def _row(i: int, tags: Any = None, key: str = "topic") -> dict[str, Any]:
    row: dict[str, Any] = {"messages": [{"role": "user", "content": f"question {i}: what is {i} squared?"}]}
    if tags is not None:
        row[key] = tags
    return row


def test_tags_come_from_a_string_or_a_list_and_change_no_id(tmp_path: Path) -> None:
    rows = [_row(0, "math"), _row(1, ["code", "math", "code", ""]), _row(2), _row(3, []), _row(4, "code"),
            _row(5, ""), _row(6, "math", key="other")]
    write_jsonl(tmp_path / "p.jsonl", rows)
    plain = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], run_dir="plain")
    tagged = make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "tags_field": "topic"}], run_dir="plain")
    run_prepare(plain, echo=_quiet)
    before = _prompts(plain, "d")
    assert all(p.tags is None for p in before) and _stats(plain, "d").tags == {}
    assert b'"tags"' not in RunDir(plain.run_path).prepared("d").read_bytes()  # no tags: nothing written
    # Setting tags_field re-prepares (the fingerprint holds it); the same prompts keep their ids and hashes.
    lines: list[str] = []
    rep = run_prepare(tagged, echo=lines.append)
    assert rep.unchanged == [] and "2 tags" in lines[0]
    after = _prompts(tagged, "d")
    assert [(p.sample_id, p.content_hash) for p in after] == [(p.sample_id, p.content_hash) for p in before]
    assert [p.tags for p in after] == [["math"], ["code", "math"], None, None, ["code"], None, None]
    st = _stats(tagged, "d")
    assert st.tags == {"math": 2, "code": 2, "": 4}  # a prompt of two tags counts in each; "": untagged
    assert st.tags_not_selected == {"math": 0, "code": 0, "": 0}  # no max_samples: nothing left out
    assert run_prepare(tagged, echo=_quiet).unchanged == ["d"]


def test_a_tags_value_of_another_type_is_refused_with_its_line_or_skipped(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [_row(0, "math"), _row(1, ["code", 3]), _row(2, {"a": 1}), _row(3, "code")])
    cfg_path = tmp_path / "cfg.yaml"
    make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "tags_field": "topic"}])
    res = CliRunner().invoke(cli, ["prepare", str(cfg_path)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert f"{tmp_path / 'p.jsonl'}:2:" in line and "'topic'" in line and '["code",3]' in line
    assert "not a string or a list of strings" in line and "--skip-bad" in line
    assert not RunDir(tmp_path / "run").prepared_stats("d").exists()
    skip = make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "tags_field": "topic"}],
                       prepare={"skip_bad": True})
    run_prepare(skip, echo=_quiet)
    assert [p.tags for p in _prompts(skip, "d")] == [["math"], ["code"]]
    st = _stats(skip, "d")
    assert st.bad_lines_skipped == 2 and st.samples == 2 and st.tags == {"math": 1, "code": 1}


def _key(seed: int, content_hash: str) -> int:
    """prepare's sample key, written out again: sha256(seed, content hash), first 8 bytes."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{content_hash}".encode()).digest()[:8], "big")


def _start(cfg: RunConfig, n: int, lines: list[RoundDataset]) -> None:
    """A started round as ``generate --round n`` leaves it."""
    plan = RoundPlan(round=n, spread="guided", budget_unit="tokens", budget=1.0, k=3, alpha=0.5, basis="x",
                     datasets=lines, proposed_at=time.time(), started_at=time.time())
    atomic_write_json(RunDir(cfg.run_path).round_plan(n), plan)


def test_a_started_round_draws_each_tags_adds_in_sample_key_order_and_keeps_every_earlier_prompt(
        tmp_path: Path) -> None:
    tags = [["a"], ["b"], ["a", "b"], None]
    write_jsonl(tmp_path / "p.jsonl", [_row(i, tags[i % 4]) for i in range(80)])
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "tags_field": "topic", "max_samples": 8}])
    run_prepare(cfg, echo=_quiet)
    one = {p.sample_id: p for p in _prompts(cfg, "d")}
    st = _stats(cfg, "d")
    assert len(one) == 8 and st.not_selected == 72
    # every tag's prompts drawn and left add up to its prompts in the source (20 per pattern)
    assert {t: st.tags.get(t, 0) + st.tags_not_selected.get(t, 0) for t in ("a", "b", "")} == \
        {"a": 40, "b": 40, "": 20}
    # round 2 adds 6 of tag a and 1 untagged, round 3 (by sample key, no tags) 4 more
    _start(cfg, 2, [RoundDataset(dataset="d", traffic=1.0, add_samples=7,
                                 tags=[RoundTag(tag="a", add_samples=6), RoundTag(tag="", add_samples=1)])])
    _start(cfg, 3, [RoundDataset(dataset="d", traffic=1.0, add_samples=4)])
    assert run_prepare(cfg, echo=_quiet).unchanged == []
    every = _prompts(cfg, "d")
    by_round = {n: [p for p in every if p.round == n] for n in (1, 2, 3)}
    assert {p.sample_id: p for p in by_round[1]} == one  # round 1's prompts, ids and records unchanged
    assert len(every) == len({p.sample_id for p in every}) == 8 + 7 + 4
    # the reference draw, written out: by sample key, earlier draws excluded, the tags in sorted order
    source = sorted(_source_pool(tmp_path / "p.jsonl", cfg), key=lambda x: x[0])
    taken = {sid for _, sid, _ in source[:8]}
    assert taken == set(one)
    expect: dict[int, set[str]] = {}
    for n, picks in ((2, [("", 1), ("a", 6)]), (3, [(None, 4)])):
        got: set[str] = set()
        for tag, count in picks:
            fits = [sid for _, sid, t in source if sid not in taken and (tag is None or (tag in t if tag else not t))]
            got |= set(fits[:count])
            taken |= set(fits[:count])
        expect[n] = got
    assert expect[2] != {sid for _, sid, _ in source[8:15]}  # not what 7 more by sample key alone would be
    assert {p.sample_id for p in by_round[2]} == expect[2]
    assert {p.sample_id for p in by_round[3]} == expect[3]
    assert sum(1 for p in by_round[2] if p.tags and "a" in p.tags) == 6
    assert sum(1 for p in by_round[2] if not p.tags) == 1
    # drawing round 3 moved no round-2 prompt: prepare again with round 3 gone gives round 2 alone the same
    RunDir(cfg.run_path).round_plan(3).unlink()
    run_prepare(cfg, echo=_quiet)
    assert {p.sample_id for p in _prompts(cfg, "d") if p.round == 2} == expect[2]
    assert _stats(cfg, "d").tags_not_selected["a"] == 40 - sum(1 for p in _prompts(cfg, "d") if p.tags and "a" in p.tags)


def _source_pool(path: Path, cfg: RunConfig) -> list[tuple[int, str, list[str]]]:
    """(sample key, sample id, tags) of every prompt of the source, from a prepare of the whole source (no
    max_samples) in a run directory of its own."""
    whole = make_config(path.parent / "whole", [{"name": "d", "path": str(path), "tags_field": "topic"}])
    run_prepare(whole, echo=_quiet)
    return [(_key(cfg.prepare.seed, p.content_hash), p.sample_id, p.tags or []) for p in _prompts(whole, "d")]
