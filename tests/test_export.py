"""merged/ exports: speculators rows and SpecForge conversations round-trip against the Parquet output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from _merge_helpers import chat_rows, prepared_run
from draftgen.export import MergedRow, loss_mask_bytes
from draftgen.merge import raw_responses_path, run_merge
from draftgen.prepare import prepared_prompts_path
from draftgen.records import PromptRecord, ResponseRecord, SpecForgeRow, SpeculatorsRow
from draftgen.store import iter_jsonl


def _quiet(_: str) -> None:
    pass


def _parquet(cfg: Any, split: str = "train") -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for f in sorted((cfg.run_path / "merged").glob(f"{split}-*.parquet")):
        rows.update({r["sample_id"]: r for r in pq.read_table(f).to_pylist()})
    return rows


def test_speculators_rows_match_parquet_and_text_is_the_exact_decode(tmp_path: Path, qwen3_profile: Any) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 6), "b": chat_rows("b", 4)}, merge={"val_fraction": 0.3})
    run_merge(cfg, echo=_quiet)
    for split in ("train", "validation"):
        table = _parquet(cfg, split)
        rows = [r for _, r in iter_jsonl(cfg.run_path / "merged" / "speculators" / f"{split}.jsonl", SpeculatorsRow)]
        assert [r.id for r in rows] == list(table)  # same rows, same order
        for r in rows:
            t = table[r.id]
            assert r.input_ids == t["input_ids"] and r.loss_mask == t["loss_mask"]
            assert r.text == qwen3_profile.tokenizer.decode(r.input_ids)
            assert r.text.count("<|im_start|>assistant") == 1 and "</think>" in r.text
            assert (r.metadata.sample_id, r.metadata.dataset, r.metadata.prompt_len) == (
                t["sample_id"], t["dataset"], t["prompt_len"])


def test_specforge_conversations_round_trip_prompt_and_response_text(tmp_path: Path) -> None:
    conv = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                         {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]}
    cfg = prepared_run(tmp_path, {"a": [*chat_rows("a", 5), conv]})
    run_merge(cfg, echo=_quiet)
    prompts = {p.sample_id: p for _, p in iter_jsonl(prepared_prompts_path(cfg.run_path, "a"), PromptRecord)}
    raw = {r.sample_id: r for _, r in iter_jsonl(raw_responses_path(cfg.run_path, "a"), ResponseRecord)}
    rows = [r for _, r in iter_jsonl(cfg.run_path / "merged" / "specforge" / "train.jsonl", SpecForgeRow)]
    assert sorted(r.id for r in rows) == sorted(prompts)
    for r in rows:
        p, rec = prompts[r.id], raw[r.id]
        assert [(m.role, m.content) for m in r.conversations[:-1]] == [(m.role, m.content) for m in p.messages]
        last = r.conversations[-1]
        assert (last.role, last.content, last.reasoning_content) == ("assistant", rec.content, rec.reasoning)
    assert any(len(r.conversations) == 5 for r in rows)


def test_capped_rows_export_only_the_kept_text(tmp_path: Path, qwen3_profile: Any) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 4)}, long_every=2, merge={"max_seq_len": 120})
    run_merge(cfg, echo=_quiet)
    table = _parquet(cfg)
    capped = {k for k, v in table.items() if v["capped"]}
    assert capped
    for _, r in iter_jsonl(cfg.run_path / "merged" / "specforge" / "train.jsonl", SpecForgeRow):
        if r.id not in capped:
            continue
        t = table[r.id]
        parsed = qwen3_profile.parse_output(t["input_ids"][t["prompt_len"]:])
        assert r.conversations[-1].content == parsed.content
        assert r.conversations[-1].reasoning_content == (parsed.reasoning or None)
    spec = {r.id: r for _, r in iter_jsonl(cfg.run_path / "merged" / "speculators" / "train.jsonl", SpeculatorsRow)}
    assert all(len(spec[k].input_ids) == 120 and spec[k].metadata.capped for k in capped)


def test_no_exports_when_none_are_asked_for(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 3)}, merge={"exports": []})
    rep = run_merge(cfg, echo=_quiet)
    assert {f.kind for f in rep.files} == {"parquet"}
    assert not (cfg.run_path / "merged" / "speculators").exists()


def test_loss_mask_bytes() -> None:
    row = MergedRow(dataset="d", sample_id="s", buf_index=0, prompt_len=3, completion_len=4, reasoning_len=2,
                    uncapped_len=7, capped=False, finish_reason="stop", provider=None, ids_source="exact",
                    is_tool_call=False, raw_offset=0, prompt_offset=0, key="k")
    assert list(loss_mask_bytes(row, False)) == [0, 0, 0, 1, 1, 1, 1]
    assert list(loss_mask_bytes(row, True)) == [0, 0, 0, 0, 0, 1, 1]
