"""draftgen prepare: stable ids, dedupe, multi-turn cuts, sampling, partitions, bad input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from _merge_helpers import chat_rows, make_config, write_jsonl
from draftgen.cli import cli
from draftgen.errors import InputError
from draftgen.phases.prepare.run import run_prepare
from draftgen.records import DatasetStats, PromptRecord
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, read_json


def _quiet(_: str) -> None:
    pass


def _prompts(cfg: Any, name: str) -> list[PromptRecord]:
    return [r for _, r in iter_jsonl(RunDir(cfg.run_path).prepared(name), PromptRecord)]


def test_prepare_writes_prompts_then_stats_with_stable_ids(tmp_path: Path, qwen3_profile: Any) -> None:
    rows = [*chat_rows("a", 5), chat_rows("a", 1)[0], {"instruction": "Sort a list.", "input": "[3, 1]"}]
    for sub in ("one", "two"):
        (tmp_path / sub).mkdir()
        write_jsonl(tmp_path / sub / "p.jsonl", rows)
    cfg1 = make_config(tmp_path / "one", [{"name": "mix", "path": "p.jsonl"}])
    cfg2 = make_config(tmp_path / "two", [{"name": "mix", "path": "p.jsonl"}], prepare={"seed": 9})
    rep = run_prepare(cfg1, echo=_quiet)
    run_prepare(cfg2, echo=_quiet)
    p1, p2 = _prompts(cfg1, "mix"), _prompts(cfg2, "mix")
    # Same prompts, other folder and seed: same ids (dataset + content hash), duplicates removed.
    assert [p.sample_id for p in p1] == [p.sample_id for p in p2]
    assert len(p1) == 6 and len({p.sample_id for p in p1}) == 6
    assert all(p.sample_id == f"mix-{p.content_hash[:16]}" for p in p1)
    assert [p.source for p in p1][:2] == [f"{tmp_path / 'one' / 'p.jsonl'}:1", f"{tmp_path / 'one' / 'p.jsonl'}:2"]
    for p in p1:
        assert p.prompt_tokens == len(qwen3_profile.prompt_ids(p.messages, p.tools))
    stats = read_json(RunDir(cfg1.run_path).prepared_stats("mix"), DatasetStats)
    assert (stats.samples, stats.duplicates_removed, stats.rows_read) == (6, 1, 7)
    assert stats.prompt_tokens == sum(p.prompt_tokens or 0 for p in p1)
    assert rep.datasets[0] == stats and rep.samples == 6


def test_rerun_is_a_noop_and_a_changed_source_rewrites_identical_bytes(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "p.jsonl", chat_rows("x", 4))
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}])
    run_prepare(cfg, echo=_quiet)
    out = RunDir(cfg.run_path).prepared("d")
    before, mtime = out.read_bytes(), out.stat().st_mtime_ns
    rep = run_prepare(cfg, echo=_quiet)
    assert rep.unchanged == ["d"] and out.stat().st_mtime_ns == mtime
    os.utime(src, ns=(mtime + 10**9, mtime + 10**9))  # touched: the fingerprint changes, the content not
    rep = run_prepare(cfg, echo=_quiet)
    assert rep.unchanged == [] and out.read_bytes() == before
    # A new row keeps every existing id.
    old_ids = [p.sample_id for p in _prompts(cfg, "d")]
    write_jsonl(src, [*chat_rows("x", 4), "one more"])
    run_prepare(cfg, echo=_quiet)
    ids = [p.sample_id for p in _prompts(cfg, "d")]
    assert len(ids) == 5 and ids[:4] == old_ids


def test_dedupe_off_keeps_repeats_with_distinct_stable_ids(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", ["same", "same", "other"])
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], prepare={"dedupe": False})
    run_prepare(cfg, echo=_quiet)
    ids = [p.sample_id for p in _prompts(cfg, "d")]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert ids[1] == ids[0] + "-1"


def test_multi_turn_last_is_default_and_all_makes_one_sample_per_turn(tmp_path: Path) -> None:
    conv = {"messages": [
        {"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "ORIGINAL a1"}, {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "ORIGINAL a2"},
    ]}
    write_jsonl(tmp_path / "c.jsonl", [conv])
    cfg = make_config(tmp_path, [{"name": "last", "path": "c.jsonl"},
                                 {"name": "all", "path": "c.jsonl", "multi_turn": "all"}])
    run_prepare(cfg, echo=_quiet)
    (last,) = _prompts(cfg, "last")
    assert [m.content for m in last.messages] == ["S", "u1", "ORIGINAL a1", "u2"] and last.turn_index is None
    both = _prompts(cfg, "all")
    assert [p.turn_index for p in both] == [0, 1]
    assert [m.content for m in both[0].messages] == ["S", "u1"]
    assert both[1].content_hash == last.content_hash  # the same prompt in both datasets
    assert read_json(RunDir(cfg.run_path).prepared_stats("all"), DatasetStats).multi_turn == "all"


def test_max_samples_is_a_seeded_stable_draw(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", chat_rows("q", 40))
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "max_samples": 10}])
    run_prepare(cfg, echo=_quiet)
    first = [p.sample_id for p in _prompts(cfg, "d")]
    assert len(first) == 10
    st = read_json(RunDir(cfg.run_path).prepared_stats("d"), DatasetStats)
    assert st.not_selected == 30
    # source order is kept
    order = [int(p.source.rsplit(":", 1)[1]) for p in _prompts(cfg, "d") if p.source]
    assert order == sorted(order)
    cfg_seed = make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "max_samples": 10}], prepare={"seed": 1})
    run_prepare(cfg_seed, echo=_quiet)
    assert [p.sample_id for p in _prompts(cfg_seed, "d")] != first
    # Bottom-k: after the source grows, every old row still drawn was drawn before, and only new rows
    # (with smaller keys) displace old ones.
    write_jsonl(tmp_path / "p.jsonl", chat_rows("q", 40) + chat_rows("z", 40))
    run_prepare(cfg, echo=_quiet)
    grown = _prompts(cfg, "d")
    assert len(grown) == 10
    for p in grown:
        from_old_rows = int(p.source.rsplit(":", 1)[1]) <= 40 if p.source else False
        assert (p.sample_id in first) == from_old_rows


def test_partitions_by_prompt_length_or_dataset_rule(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", ["short one", "long " * 300])
    cfg = make_config(tmp_path, [{"name": "auto", "path": "p.jsonl"},
                                 {"name": "forced", "path": "p.jsonl", "partition": "long"}],
                      prepare={"long_prompt_tokens": 200})
    run_prepare(cfg, echo=_quiet)
    auto = _prompts(cfg, "auto")
    assert [p.partition for p in auto] == ["short", "long"]
    assert (auto[1].prompt_tokens or 0) >= 200 > (auto[0].prompt_tokens or 0)
    assert [p.partition for p in _prompts(cfg, "forced")] == ["long", "long"]
    st = read_json(RunDir(cfg.run_path).prepared_stats("auto"), DatasetStats)
    assert (st.short, st.long) == (1, 1)


def test_bad_line_stops_with_file_line_or_is_skipped_and_counted(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('"fine"\n{"broken json\n{"messages": [{"role": "assistant", "content": "no user"}]}\n"ok"\n',
                 encoding="utf-8")
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}])
    with pytest.raises(InputError) as err:
        run_prepare(cfg, echo=_quiet)
    msg = str(err.value)
    assert msg.startswith(f"{p}:2: not valid JSON") and msg.endswith("; fix or pass --skip-bad")
    assert not RunDir(cfg.run_path).prepared_stats("d").exists()
    cfg_skip = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], prepare={"skip_bad": True})
    notes: list[str] = []
    run_prepare(cfg_skip, echo=notes.append)
    st = read_json(RunDir(cfg.run_path).prepared_stats("d"), DatasetStats)
    assert (st.samples, st.bad_lines_skipped, st.rows_read) == (2, 2, 4)
    assert any(f"{p}:3: the conversation has no user message" in n for n in notes)


def test_cli_prepare_reports_one_line_error_and_skip_bad(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('"fine"\n{"role": 1}\n', encoding="utf-8")
    make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}])
    runner = CliRunner()
    res = runner.invoke(cli, ["prepare", str(tmp_path / "cfg.yaml")])
    assert res.exit_code == 1
    assert "p.jsonl:2: cannot tell the format" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, ["prepare", str(tmp_path / "cfg.yaml"), "--skip-bad"])
    assert res.exit_code == 0, res.output
    assert "1 bad rows skipped" in res.output


def test_bundled_sets_prepare(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, [{"name": n, "path": f"bundled:{n}"} for n in ("chat", "code", "tools")])
    rep = run_prepare(cfg, echo=_quiet)
    by = {s.dataset: s for s in rep.datasets}
    assert by["chat"].samples >= 110 and by["code"].samples >= 90 and by["tools"].samples >= 55
    assert all(s.bad_lines_skipped == 0 and s.duplicates_removed == 0 for s in rep.datasets)
    tools = _prompts(cfg, "tools")
    assert all(p.tools for p in tools)
    assert any(p.messages[-1].role == "user" and any(m.role == "tool" for m in p.messages) for p in tools)


# -- bounds, empty datasets, temp files -------------------------------------------------------------------


def test_context_length_comes_from_the_config_then_the_tokenizer_config_then_the_default(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from draftgen.errors import ConfigError
    from draftgen.phases.prepare.run import context_length

    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}])
    prof: Any = SimpleNamespace(config={"model_max_length": 32768})
    assert context_length(cfg, prof) == (32768, "the tokenizer config's model_max_length")
    prof.config = {"model_max_length": int(1e30)}  # HF's "unset"
    assert context_length(cfg, prof) == (131_072, "the default")
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], model={
        "profile": "qwen3", "tokenizer": "bundled:qwen3", "context_length": 4000})
    assert context_length(cfg, prof) == (4000, "model.context_length")
    cfg.model.context_length = -1
    with pytest.raises(ConfigError, match=r"model\.context_length"):
        context_length(cfg, prof)


def test_prompts_over_the_context_length_stop_or_are_skipped(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "p.jsonl", ["short", " ".join(f"w{i}" for i in range(400)), "short too"])
    model = {"profile": "qwen3", "tokenizer": "bundled:qwen3", "context_length": 300}
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], model=model)
    with pytest.raises(InputError) as err:
        run_prepare(cfg, echo=_quiet)
    msg = str(err.value)
    assert msg.startswith(f"{p}:2: the prompt has ") and "over the context length of 300 (model.context_length)" in msg
    assert msg.endswith("; raise model.context_length or pass --skip-bad to skip such prompts")
    assert not cfg.run_path.exists()  # neither a temp file nor a half file, nor the claim of a run that wrote nothing
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], model=model, prepare={"skip_bad": True})
    rep = run_prepare(cfg, echo=_quiet)
    assert [r.source for r in _prompts(cfg, "d")] == [f"{p}:1", f"{p}:3"]
    assert rep.datasets[0].bad_lines_skipped == 1 and rep.datasets[0].max_prompt_tokens <= 300


def test_a_prompt_far_over_the_context_is_refused_on_a_prefix(tmp_path: Path) -> None:
    # 400k characters against a 1,000-token context: counted on a few thousand characters, not tokenized whole.
    p = write_jsonl(tmp_path / "p.jsonl", ["fine", "hello " * 70_000])
    model = {"profile": "qwen3", "tokenizer": "bundled:qwen3", "context_length": 1000}
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}], model=model)
    with pytest.raises(InputError, match=rf"^{p}:2: the prompt has at least 1,\d{{3}} tokens in its first 8,000 "
                                         r"characters, over the context length of 1,000 \(model.context_length\)"):
        run_prepare(cfg, echo=_quiet)


def test_an_empty_dataset_is_an_input_error_at_once(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text("\n", encoding="utf-8")
    write_jsonl(tmp_path / "ok.jsonl", ["fine"])
    cfg = make_config(tmp_path, [{"name": "good", "path": "ok.jsonl"}, {"name": "d", "path": "p.jsonl"}])
    with pytest.raises(InputError) as err:
        run_prepare(cfg, echo=_quiet)
    assert str(err.value) == (
        f"dataset d: no prompts from {tmp_path / 'p.jsonl'} (no rows); check its path, format (auto) and field "
        "(the format default), or remove the dataset from the config")
    (tmp_path / "p.jsonl").write_text('{"text": 1}\n{"text": 2}\n', encoding="utf-8")
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl", "format": "alpaca"}], prepare={"skip_bad": True})
    with pytest.raises(InputError, match=r"dataset d: no prompts from .*p\.jsonl \(2 rows read, 2 bad rows skipped, "
                                         r"0 duplicates removed\); check its path, format \(alpaca\)"):
        run_prepare(cfg, echo=_quiet)
    folder = tmp_path / "set"
    write_jsonl(folder / "train-0.jsonl", [])
    cfg = make_config(tmp_path, [{"name": "d", "path": "set"}])
    with pytest.raises(InputError, match=r"\(no rows\); check its path, format \(auto\), field \(the format default\) "
                                         r"and split \(train\)"):
        run_prepare(cfg, echo=_quiet)


def test_the_temp_file_is_unique_and_gone_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import draftgen.store as store_mod  # prepare's temp file is renamed by store.publish

    write_jsonl(tmp_path / "p.jsonl", chat_rows("t", 3))
    cfg = make_config(tmp_path, [{"name": "d", "path": "p.jsonl"}])
    run_prepare(cfg, echo=_quiet)
    folder = cfg.run_path / "prepared" / "d"
    (folder / ".prompts.jsonl.tmp").write_text("another writer's temp file\n", encoding="utf-8")
    write_jsonl(tmp_path / "p.jsonl", chat_rows("t", 4))  # a changed source: prepared again
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(store_mod.os, "replace", spy)
    run_prepare(cfg, echo=_quiet)
    assert seen and seen[0] != ".prompts.jsonl.tmp" and seen[0].startswith(".prompts.jsonl.")
    # The other writer's file is untouched; this writer's is renamed, with the usual permissions.
    assert (folder / ".prompts.jsonl.tmp").read_text(encoding="utf-8") == "another writer's temp file\n"
    assert sorted(f.name for f in folder.iterdir()) == [".prompts.jsonl.tmp", "prompts.jsonl", "stats.json"]
    assert (folder / "prompts.jsonl").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
