"""exports/: speculators rows, SpecForge pre-tokenized prompts and conversations round-trip against the
Parquet output; the manifest lists every file; a rerun removes exactly what the last manifest lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from _merge_helpers import chat_rows, prepared_run
from draftgen.errors import ConfigError
from draftgen.exporters import EXPORTERS, MergedRow, file_digest, loss_mask_bytes
from draftgen.phases.merge.run import run_merge
from draftgen.records import (
    MergeManifest,
    MergeStats,
    PromptRecord,
    ResponseRecord,
    SpecForgeConversationRow,
    SpecForgePromptRow,
    SpeculatorsRow,
)
from draftgen.rundir import RunDir
from draftgen.store import JsonlWriter, atomic_write_json, iter_jsonl, read_json

ALL_EXPORTS = ["speculators", "specforge", "specforge-conversations"]


def _quiet(_: str) -> None:
    pass


def _parquet(cfg: Any, split: str = "train") -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for f in sorted(RunDir(cfg.run_path).merged.glob(f"{split}-*.parquet")):
        rows.update({r["sample_id"]: r for r in pq.read_table(f).to_pylist()})
    return rows


def _export(cfg: Any, kind: str, split: str, type: type[Any]) -> list[Any]:
    return [r for _, r in iter_jsonl(RunDir(cfg.run_path).export_file(kind, split), type)]


def test_speculators_rows_match_parquet_and_text_is_the_exact_decode(tmp_path: Path, qwen3_profile: Any) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 6), "b": chat_rows("b", 4)}, merge={"val_fraction": 0.3})
    run_merge(cfg, echo=_quiet)
    for split in ("train", "validation"):
        table = _parquet(cfg, split)
        rows = _export(cfg, "speculators", split, SpeculatorsRow)
        assert [r.id for r in rows] == list(table)  # same rows, same order
        for r in rows:
            t = table[r.id]
            assert r.input_ids == t["input_ids"] and r.loss_mask == t["loss_mask"]
            assert r.primary_id == t["sample_id"] == r.metadata.sample_id
            assert r.text == qwen3_profile.tokenizer.decode(r.input_ids)
            assert r.text.count("<|im_start|>assistant") == 1 and "</think>" in r.text
            assert (r.metadata.dataset, r.metadata.prompt_len, r.metadata.finish_reason) == (
                t["dataset"], t["prompt_len"], t["finish_reason"])
    # exports/speculators/ holds the train split only: `prepare-data --data DIR` reads every file in it
    assert [p.name for p in RunDir(cfg.run_path).export_dir("speculators").rglob("*")] == ["train.jsonl"]


def test_speculators_primary_id_is_the_sample_id_of_repeats(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 3)})
    cfg.datasets[0].weight = 2.0
    run_merge(cfg, echo=_quiet)
    rows = _export(cfg, "speculators", "train", SpeculatorsRow)
    assert len(rows) == 6 and sum("#rep1" in r.id for r in rows) == 3
    assert all(r.primary_id == r.id.split("#")[0] for r in rows)


def test_specforge_prompts_are_the_parquet_ids_and_masks(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 7)}, long_every=3,
                       merge={"val_fraction": 0.3, "max_seq_len": 150})
    run_merge(cfg, echo=_quiet)
    for split in ("train", "validation"):
        table = _parquet(cfg, split)
        rows = _export(cfg, "specforge", split, SpecForgePromptRow)
        assert [(r.id, r.input_ids, r.loss_mask) for r in rows] == [
            (k, t["input_ids"], t["loss_mask"]) for k, t in table.items()]
    assert any(t["capped"] for t in _parquet(cfg).values())


def test_pretokenized_exports_leave_out_rows_without_a_supervised_token(tmp_path: Path) -> None:
    # max_seq_len cuts every completion inside its reasoning, and mask_reasoning masks the reasoning: the
    # Parquet keeps the rows (they are the data), the consumers would drop them, so the exports leave them out.
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 4)}, merge={"max_seq_len": 28, "mask_reasoning": True})
    rep = run_merge(cfg, echo=_quiet)
    table = _parquet(cfg)
    assert len(table) == 4 and all(sum(t["loss_mask"]) == 0 for t in table.values())
    assert _export(cfg, "speculators", "train", SpeculatorsRow) == []
    assert _export(cfg, "specforge", "train", SpecForgePromptRow) == []
    notes = read_json(RunDir(cfg.run_path).merged_stats, MergeStats).notes
    for kind in ("speculators", "specforge"):
        assert f"exports/{kind}/train.jsonl: 4 rows left out (no supervised token in loss_mask, which the " \
               "consumer drops)" in notes
    assert {f.kind: f.rows for f in rep.files if f.kind in EXPORTERS} == {"speculators": 0, "specforge": 0}


def test_specforge_conversations_round_trip_prompt_and_response_text(tmp_path: Path) -> None:
    conv = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                         {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]}
    cfg = prepared_run(tmp_path, {"a": [*chat_rows("a", 5), conv]})
    cfg.merge.exports = ALL_EXPORTS
    run_merge(cfg, echo=_quiet)
    prompts = {p.sample_id: p for _, p in iter_jsonl(RunDir(cfg.run_path).prepared("a"), PromptRecord)}
    raw = {r.sample_id: r for _, r in iter_jsonl(RunDir(cfg.run_path).raw("a"), ResponseRecord)}
    rows = _export(cfg, "specforge-conversations", "train", SpecForgeConversationRow)
    assert sorted(r.id for r in rows) == sorted(prompts)
    for r in rows:
        p, rec = prompts[r.id], raw[r.id]
        assert (r.status, r.tools) == ("success", "[]")
        assert [(m.role, m.content) for m in r.conversations[:-1]] == [(m.role, m.content) for m in p.messages]
        last = r.conversations[-1]
        assert (last.role, last.content, last.reasoning_content) == ("assistant", rec.content, rec.reasoning or "")
    assert any(len(r.conversations) == 5 for r in rows)


def test_specforge_conversations_carry_tools_and_never_an_empty_assistant_content(tmp_path: Path) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "description": "find a word",
                                             "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    rows_in = [{**r, "tools": [tool]} for r in chat_rows("t", 4)]
    cfg = prepared_run(tmp_path, {"a": rows_in})
    cfg.merge.exports = ALL_EXPORTS
    # One response with no content at all (say, a tool call only): SpecForge rejects an empty assistant turn.
    raw_path = RunDir(cfg.run_path).raw("a")
    recs = [r for _, r in iter_jsonl(raw_path, ResponseRecord)]
    empty = recs[0].sample_id
    recs[0] = msgspec.structs.replace(recs[0], content="")
    raw_path.unlink()
    with JsonlWriter(raw_path, fsync=False) as w:
        w.write_many(recs)
    run_merge(cfg, echo=_quiet)
    rows = _export(cfg, "specforge-conversations", "train", SpecForgeConversationRow)
    assert sorted(r.id for r in rows) == sorted(r.sample_id for r in recs if r.sample_id != empty)
    for r in rows:
        assert msgspec.json.decode(r.tools) == [tool]
        assert all(m.content.strip() for m in r.conversations if m.role == "assistant")
    notes = read_json(RunDir(cfg.run_path).merged_stats, MergeStats).notes
    assert ("exports/specforge-conversations/train.jsonl: 1 rows left out (an assistant turn with empty content, "
            "which SpecForge rejects)") in notes
    assert empty in _parquet(cfg)  # the exact-id outputs keep it
    assert empty in {r.id for r in _export(cfg, "specforge", "train", SpecForgePromptRow)}


def test_capped_rows_export_only_the_kept_text(tmp_path: Path, qwen3_profile: Any) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 4)}, long_every=2, merge={"max_seq_len": 120})
    cfg.merge.exports = ALL_EXPORTS
    run_merge(cfg, echo=_quiet)
    table = _parquet(cfg)
    capped = {k for k, v in table.items() if v["capped"]}
    assert capped
    for r in _export(cfg, "specforge-conversations", "train", SpecForgeConversationRow):
        if r.id not in capped:
            continue
        t = table[r.id]
        parsed = qwen3_profile.parse_output(t["input_ids"][t["prompt_len"]:])
        assert r.conversations[-1].content == parsed.content
        assert r.conversations[-1].reasoning_content == (parsed.reasoning or "")
    spec = {r.id: r for r in _export(cfg, "speculators", "train", SpeculatorsRow)}
    assert all(len(spec[k].input_ids) == 120 and spec[k].metadata.capped for k in capped)


def test_no_exports_when_none_are_asked_for(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 3)}, merge={"exports": []})
    rep = run_merge(cfg, echo=_quiet)
    assert {f.kind for f in rep.files} == {"parquet", "card", "stats"}
    assert not RunDir(cfg.run_path).exports.exists()


def test_an_unknown_export_format_is_refused_before_anything_is_removed(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 3)})
    run_merge(cfg, echo=_quiet)
    rd = RunDir(cfg.run_path)
    before = sorted(p for p in rd.root.rglob("*") if p.is_file() and p.name != ".draftgen.lock")
    cfg.merge.exports = ["speculators", "axolotl"]
    with pytest.raises(ConfigError, match=r"merge\.exports: export format 'axolotl' is not registered"):
        run_merge(cfg, echo=_quiet)
    assert sorted(p for p in rd.root.rglob("*") if p.is_file() and p.name != ".draftgen.lock") == before


def test_manifest_lists_every_file_written_and_merge_echoes_how_to_use_the_exports(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 8)}, merge={"val_fraction": 0.25})
    cfg.merge.exports = ALL_EXPORTS
    out: list[str] = []
    rep = run_merge(cfg, echo=out.append)
    rd = RunDir(cfg.run_path)
    man = read_json(rd.merged_manifest, MergeManifest)
    assert man.layout == 2 and man.files == rep.files
    written = {p.relative_to(rd.root).as_posix() for d in (rd.merged, rd.exports) for p in d.rglob("*") if p.is_file()}
    assert written - {f.path for f in man.files} == {"merged/manifest.json"}
    for f in man.files:
        assert (rd.root / f.path).stat().st_size == f.bytes and file_digest(rd.root / f.path) == f.sha256
    assert {(f.path, f.kind) for f in man.files if f.split == "all"} == {
        ("merged/README.md", "card"), ("merged/stats.json", "stats")}
    assert "export speculators: speculators prepare-data --data exports/speculators/" in out
    assert "export specforge: SpecForge data.prompts_path: exports/specforge/train.jsonl" in out


def test_rerun_removes_what_the_last_manifest_lists_and_nothing_else(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 8)}, merge={"val_fraction": 0.25})
    cfg.merge.exports = ALL_EXPORTS
    run_merge(cfg, echo=_quiet)
    rd = RunDir(cfg.run_path)
    mine = [rd.merged / "notes.txt", rd.exports / "speculators" / "mine.txt", rd.exports / "other" / "x.jsonl"]
    for p in mine:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("user file\n")
    cfg.merge.exports = ["specforge"]
    cfg.merge.val_fraction = 0.0
    run_merge(cfg, echo=_quiet)
    assert all(p.read_text() == "user file\n" for p in mine)
    assert not rd.export_dir("specforge-conversations").exists()
    assert not (rd.exports / "validation").exists()  # emptied folders the merge made go too
    assert not rd.export_file("speculators", "train").exists()
    assert not list(rd.merged.glob("validation-*"))
    assert rd.export_file("specforge", "train").is_file()


def test_rerun_over_a_layout_1_merge_removes_its_files_under_merged(tmp_path: Path) -> None:
    """A run merged before exports/ existed: the exports sat in merged/<format>/ (and broke the loaders)."""
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 4)})
    rd = RunDir(cfg.run_path)
    old = {"train-00000-of-00001.parquet": "parquet", "speculators/train.jsonl": "speculators",
           "specforge/train.jsonl": "specforge"}
    for path in old:
        (rd.merged / path).parent.mkdir(parents=True, exist_ok=True)
        (rd.merged / path).write_text("old\n")
    atomic_write_json(rd.merged_stats, {"datasets": [], "total": {"dataset": "all"}})
    (rd.merged / "keep.txt").write_text("user file\n")
    atomic_write_json(rd.merged_manifest, {
        "files": [{"path": p, "split": "train", "kind": k, "rows": 1, "bytes": 4, "sha256": ""} for p, k in old.items()],
        "seed": 0, "merge": {}, "datasets": ["a"], "profile": "qwen3"})
    assert read_json(rd.merged_manifest, MergeManifest).layout == 1
    run_merge(cfg, echo=_quiet)
    assert not (rd.merged / "speculators").exists() and not (rd.merged / "specforge").exists()
    assert (rd.merged / "keep.txt").read_text() == "user file\n"
    assert sorted(p.name for p in rd.merged.iterdir()) == [
        "README.md", "keep.txt", "manifest.json", "stats.json", "train-00000-of-00001.parquet"]
    assert pq.read_table(rd.merged / "train-00000-of-00001.parquet").num_rows == 4


def test_loss_mask_bytes() -> None:
    row = MergedRow(dataset="d", sample_id="s", buf_index=0, prompt_len=3, completion_len=4, reasoning_len=2,
                    uncapped_len=7, capped=False, finish_reason="stop", provider=None, ids_source="exact",
                    is_tool_call=False, raw_offset=0, prompt_offset=0, key="k")
    assert list(loss_mask_bytes(row, False)) == [0, 0, 0, 1, 1, 1, 1]
    assert list(loss_mask_bytes(row, True)) == [0, 0, 0, 0, 0, 1, 1]


def test_parquet_schema_and_speculators_metadata_come_from_the_column_table(tmp_path: Path) -> None:
    import dataclasses

    import pyarrow as pa

    from draftgen.exporters import parquet_schema
    from draftgen.records import MERGED_COLUMNS, SpeculatorsMetadata, parquet_columns

    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 4)})
    run_merge(cfg, echo=_quiet)
    rd = RunDir(cfg.run_path)
    card = rd.dataset_card.read_text()
    for f in sorted(rd.merged.glob("train-*.parquet")):
        schema = pq.read_schema(f).remove_metadata()
        assert schema.equals(parquet_schema())
        assert schema.names == [c.name for c in parquet_columns()]
        assert schema.field("input_ids").type == pa.list_(pa.int32())
    assert all(f"- `{c.name}` ({c.arrow}):" in card for c in parquet_columns())
    meta = [c for c in MERGED_COLUMNS if c.meta is not None]
    assert [(f.name, f.type) for f in msgspec.structs.fields(SpeculatorsMetadata)] == [(c.name, c.meta) for c in meta]
    row_fields = {f.name for f in dataclasses.fields(MergedRow)} | {"row_id"}
    assert all((c.attr is None or c.attr in row_fields) and (c.meta_attr or c.name) in row_fields | {"input_ids",
               "loss_mask"} for c in MERGED_COLUMNS)
    spec = _export(cfg, "speculators", "train", SpeculatorsRow)
    assert spec and set(msgspec.to_builtins(spec[0].metadata)) == {c.name for c in meta}
