"""draftgen merge: filters, dedupe, caps, weights, split, determinism, loss masks, Parquet output."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from _merge_helpers import chat_rows, fake_generate, prepared_run
from draftgen.cli import cli
from draftgen.errors import InputError, ThresholdBroken
from draftgen.phases.merge.run import run_merge
from draftgen.records import (
    AuditReport,
    DatasetAudit,
    MergeManifest,
    MergeStats,
    PromptRecord,
    ResponseRecord,
)
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, iter_jsonl, read_json


def _quiet(_: str) -> None:
    pass


def _rows(cfg: Any, split: str = "train") -> list[dict[str, Any]]:
    files = sorted((cfg.run_path / "merged").glob(f"{split}-*.parquet"))
    out: list[dict[str, Any]] = []
    for f in files:
        out += pq.read_table(f).to_pylist()
    return out


def _raw(cfg: Any, name: str) -> dict[str, ResponseRecord]:
    return {r.sample_id: r for _, r in iter_jsonl(RunDir(cfg.run_path).raw(name), ResponseRecord)}


def _files(cfg: Any) -> dict[str, bytes]:
    """Every file of merged/ and exports/, by its path in the run directory."""
    root = cfg.run_path
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for d in ("merged", "exports") for p in sorted((root / d).rglob("*")) if p.is_file()}


def test_merge_is_deterministic_and_independent_of_raw_line_order(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 30), "b": chat_rows("b", 20)},
                       merge={"val_fraction": 0.2, "seed": 3})
    run_merge(cfg, echo=_quiet)
    first = _files(cfg)
    assert set(first) == {
        "merged/manifest.json", "merged/stats.json", "merged/README.md", "merged/train-00000-of-00001.parquet",
        "merged/validation-00000-of-00001.parquet", "exports/speculators/train.jsonl",
        "exports/specforge/train.jsonl", "exports/validation/speculators/validation.jsonl",
        "exports/validation/specforge/validation.jsonl"}
    run_merge(cfg, echo=_quiet)
    assert _files(cfg) == first
    # Responses finished in another order (a resumed run): same bytes.
    raw = RunDir(cfg.run_path).raw("a")
    lines = raw.read_bytes().splitlines(keepends=True)
    random.Random(1).shuffle(lines)
    raw.write_bytes(b"".join(lines))
    run_merge(cfg, echo=_quiet)
    assert _files(cfg) == first
    # Another seed: another order, same content.
    other = prepared_run(tmp_path / "o", {"a": chat_rows("a", 30), "b": chat_rows("b", 20)},
                         merge={"val_fraction": 0.2, "seed": 4})
    run_merge(other, echo=_quiet)
    ids3 = [r["sample_id"] for r in _rows(cfg) + _rows(cfg, "validation")]
    ids4 = [r["sample_id"] for r in _rows(other) + _rows(other, "validation")]
    assert ids3 != ids4 and sorted(ids3) == sorted(ids4)


def test_loss_mask_starts_at_the_prompt_boundary_and_covers_the_output(tmp_path: Path, qwen3_profile: Any) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 12)}, with_prompt_ids=False)
    run_merge(cfg, echo=_quiet)
    raw = _raw(cfg, "a")
    prompts = {p.sample_id: p for _, p in iter_jsonl(RunDir(cfg.run_path).prepared("a"), PromptRecord)}
    rows = _rows(cfg)
    assert len(rows) == 12
    for row in rows:
        rec = raw[row["sample_id"]]
        assert rec.output_ids is not None
        p = prompts[row["sample_id"]]
        prompt_ids = qwen3_profile.prompt_ids(p.messages, p.tools)
        assert row["input_ids"] == prompt_ids + rec.output_ids
        mask = row["loss_mask"]
        assert len(mask) == len(row["input_ids"])
        assert sum(mask) == len(rec.output_ids)
        assert mask.index(1) == len(prompt_ids) == row["prompt_len"]
        assert set(mask[len(prompt_ids):]) == {1}
        rebuilt = qwen3_profile.build_output(rec.reasoning, rec.content, rec.finish_reason)
        assert row["reasoning_len"] == rebuilt.reasoning_token_count > 0
        assert row["completion_len"] == len(rec.output_ids) and row["capped"] is False


def test_mask_reasoning_zeroes_the_reasoning_span(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 6)}, merge={"mask_reasoning": True})
    run_merge(cfg, echo=_quiet)
    raw = _raw(cfg, "a")
    for row in _rows(cfg):
        n_out = len(raw[row["sample_id"]].output_ids or [])
        r = row["reasoning_len"]
        assert sum(row["loss_mask"]) == n_out - r
        assert row["loss_mask"].index(1) == row["prompt_len"] + r
    stats = read_json(cfg.run_path / "merged" / "stats.json", MergeStats)
    assert stats.total.supervised_tokens == stats.total.completion_tokens - stats.total.reasoning_tokens


@pytest.mark.parametrize("overflow", ["truncate", "drop"])
def test_length_cap(tmp_path: Path, overflow: str) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 10)}, long_every=3,
                       merge={"max_seq_len": 160, "overflow": overflow})
    run_merge(cfg, echo=_quiet)
    raw = _raw(cfg, "a")
    rows = _rows(cfg)
    long_ids = {sid for sid, r in raw.items() if len(r.prompt_ids or []) + len(r.output_ids or []) > 160}
    assert long_ids
    stats = read_json(cfg.run_path / "merged" / "stats.json", MergeStats)
    if overflow == "drop":
        assert {r["sample_id"] for r in rows}.isdisjoint(long_ids)
        assert stats.datasets[0].dropped == {"over_max_seq_len": len(long_ids)}
        return
    assert len(rows) == 10 and stats.datasets[0].capped == len(long_ids)
    for row in rows:
        rec = raw[row["sample_id"]]
        full = (rec.prompt_ids or []) + (rec.output_ids or [])
        assert row["capped"] is (row["sample_id"] in long_ids)
        assert row["input_ids"] == full[:160]
        assert sum(row["loss_mask"]) == len(row["input_ids"]) - row["prompt_len"] == row["completion_len"]
    assert stats.total.tokens_uncapped > stats.total.prompt_tokens + stats.total.completion_tokens


def test_filters_audit_truncated_and_lengths(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 12)}, truncate_every=4,
                       merge={"drop_truncated": True, "min_tokens": 12})
    notes: list[str] = []
    run_merge(cfg, echo=notes.append)
    assert any("audit/audit.json not found" in n for n in notes)
    raw = _raw(cfg, "a")
    ids = sorted(raw)
    atomic_write_json(cfg.run_path / "audit" / "audit.json", AuditReport(
        profile="qwen3", datasets=[DatasetAudit(dataset="a", failed_sample_ids=ids[:2])],
        overall=DatasetAudit(dataset="all")))
    run_merge(cfg, echo=_quiet)
    kept = {r["sample_id"] for r in _rows(cfg)}
    truncated = {s for s, r in raw.items() if r.finish_reason == "length"}
    short = {s for s, r in raw.items() if len(r.output_ids or []) < 12}
    assert truncated and kept == set(ids) - set(ids[:2]) - truncated - short
    dropped = read_json(cfg.run_path / "merged" / "stats.json", MergeStats).datasets[0].dropped
    assert dropped["audit_failed"] == 2
    assert dropped["truncated"] == len(truncated - set(ids[:2]))
    assert sum(dropped.values()) == 12 - len(kept)


def base(sample_id: str) -> str:
    return sample_id.split("#")[0]


def test_cross_dataset_dedupe_weights_caps_and_split(tmp_path: Path) -> None:
    shared = chat_rows("shared", 10)
    cfg = prepared_run(tmp_path, {"a": shared + chat_rows("a", 10), "b": shared + chat_rows("b", 20),
                                  "c": chat_rows("c", 10)},
                       merge={"val_fraction": 0.25})
    # weights and caps are merge-time settings: edit the config in place
    cfg.datasets[1].weight = 0.5
    cfg.datasets[2].weight = 2.0
    cfg.datasets[2].cap = 15
    run_merge(cfg, echo=_quiet)
    train, val = _rows(cfg), _rows(cfg, "validation")
    by_ds: dict[str, list[str]] = {}
    for r in train + val:
        by_ds.setdefault(r["dataset"], []).append(r["sample_id"])
    assert len(by_ds["a"]) == 20
    # b: its 10 shared prompts are duplicates of a's; weight 0.5 keeps 10 of the remaining 20
    assert len(by_ds["b"]) == 10 and not any(s.replace("b-", "a-") in by_ds["a"] for s in by_ds["b"])
    # c: weight 2 makes 20 rows, the cap keeps 15 (all 10 first copies + 5 repeats)
    assert len(by_ds["c"]) == 15 and sum("#rep1" in s for s in by_ds["c"]) == 5
    assert {base(r["sample_id"]) for r in train}.isdisjoint({base(r["sample_id"]) for r in val})
    assert len({base(r["sample_id"]) for r in val}) == round(40 * 0.25)
    stats = read_json(cfg.run_path / "merged" / "stats.json", MergeStats)
    b = next(s for s in stats.datasets if s.dataset == "b")
    assert b.dropped == {"duplicate": 10, "weight_or_cap": 10}
    assert stats.total.samples == 45 == stats.total.train + stats.total.validation
    # dedupe off keeps the shared prompts twice
    cfg.merge.dedupe = False
    cfg.datasets[1].weight = 1.0
    run_merge(cfg, echo=_quiet)
    assert sum(r["dataset"] == "b" for r in _rows(cfg) + _rows(cfg, "validation")) == 30


def test_legacy_rows_rebuild_prompt_ids_and_missing_prompts_are_orphans(tmp_path: Path, qwen3_profile: Any) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 5)}, legacy=True)  # imported {sample_id, output_ids} rows
    prompts = {p.sample_id: p for _, p in iter_jsonl(RunDir(cfg.run_path).prepared("a"), PromptRecord)}
    run_merge(cfg, echo=_quiet)
    rows = _rows(cfg)
    assert len(rows) == 5
    for row in rows:
        p = prompts[row["sample_id"]]
        n = len(qwen3_profile.prompt_ids(p.messages, p.tools))
        assert row["prompt_len"] == n and row["loss_mask"].index(1) == n
        assert row["finish_reason"] is None and row["ids_source"] == "exact"
    # Without the prepared prompts no record is in the prepared set: all orphans, none merged, and an empty
    # merge is a failure (exit 3), never a success; stats.json says why, no manifest is written.
    RunDir(cfg.run_path).prepared("a").unlink()
    notes: list[str] = []
    with pytest.raises(ThresholdBroken, match=r"no row to write.*orphans 5"):
        run_merge(cfg, echo=notes.append)
    assert not (cfg.run_path / "merged" / "manifest.json").exists()
    stats = read_json(cfg.run_path / "merged" / "stats.json", MergeStats)
    a = stats.datasets[0]
    assert (a.records, a.orphans, a.samples, a.dropped) == (0, 5, 0, {}) and _rows(cfg) == []
    assert stats.total.orphans == 5
    assert "note: 5 records are not in the current prepared set (orphans) and were not merged" in notes


def test_merged_parquet_loads_with_datasets_and_manifest_is_last(tmp_path: Path) -> None:
    import datasets

    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 8)}, merge={"val_fraction": 0.25},
                       extra={"hidden_states": {"hidden_size": 7168}})
    out: list[str] = []
    rep = run_merge(cfg, echo=out.append)
    merged = cfg.run_path / "merged"
    ds = datasets.load_dataset("parquet", data_files={
        "train": [str(p) for p in sorted(merged.glob("train-*.parquet"))],
        "validation": [str(p) for p in sorted(merged.glob("validation-*.parquet"))],
    })
    assert ds["train"].num_rows == 6 and ds["validation"].num_rows == 2
    assert ds["train"].features["input_ids"].feature.dtype == "int32"
    assert ds["train"].features["loss_mask"].feature.dtype == "int8"
    man = read_json(merged / "manifest.json", MergeManifest)
    assert man.files == rep.files
    assert {f.kind for f in man.files} == {"parquet", "speculators", "specforge", "card", "stats"}
    for f in man.files:
        assert (cfg.run_path / f.path).stat().st_size == f.bytes
    assert (merged / "manifest.json").stat().st_mtime_ns >= max(
        (cfg.run_path / f.path).stat().st_mtime_ns for f in man.files)
    assert any(line.startswith("hidden states (4 slots × hidden 7,168 × bf16)") for line in out)
    assert read_json(merged / "stats.json", MergeStats).hidden_states is not None


def test_merge_without_raw_responses_is_an_input_error(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 2)})
    RunDir(cfg.run_path).raw("a").unlink()
    with pytest.raises(InputError, match="run `draftgen generate` first"):
        run_merge(cfg, echo=_quiet)


def test_cli_merge_prints_the_stats_table(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 4), "b": chat_rows("b", 3)})
    fake_generate(cfg, seed=5)
    res = CliRunner().invoke(cli, ["merge", str(tmp_path / "cfg.yaml")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    # a rich table, as plan's and audit's: header, a rule of box characters, the rows, the total
    assert lines[0].split()[:6] == ["dataset", "┃", "samples", "┃", "prompt", "tok"]
    assert set(lines[1]) <= set("━╇ ") and "-" * 10 not in res.output
    assert any(line.split()[:3] == ["all", "│", "7"] for line in lines)
    assert "merged: 7 train + 0 validation rows" in res.output


def test_merged_rows_decode_as_their_record_type_and_row_ids_parse(tmp_path: Path) -> None:
    import msgspec

    from draftgen.records import MergedParquetRow, parquet_columns, parse_row_id, row_id

    assert [f.name for f in msgspec.structs.fields(MergedParquetRow)] == [c.name for c in parquet_columns()]
    cfg = prepared_run(tmp_path, {"c": chat_rows("c", 6)})
    cfg.datasets[0].weight = 2.0  # every row once more, as x#rep1
    run_merge(cfg, echo=_quiet)
    rows = [msgspec.convert(r, MergedParquetRow) for r in _rows(cfg)]  # a wrong type or a missing column fails
    assert len(rows) == 12 and all(len(r.input_ids) == len(r.loss_mask) == r.prompt_len + r.completion_len
                                   for r in rows)
    parsed = [parse_row_id(r.sample_id) for r in rows]
    assert sorted(n for _, n in parsed) == [0] * 6 + [1] * 6
    assert {row_id(s, n) for s, n in parsed} == {r.sample_id for r in rows}
    assert {s for s, n in parsed if n} == {s for s, n in parsed if not n}
    assert parse_row_id("x#rep0") == ("x#rep0", 0) and parse_row_id("#rep3") == ("#rep3", 0)
