"""Adding an export format is a builder plus one ``@register_exporter`` line: a toy format registered here is
validated by the config, written by merge beside the built-in ones, listed by the manifest and the dataset
card, and removed by the next merge's ``_clear``; ``EXPORTERS.unregister`` removes the registration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from _merge_helpers import chat_rows, make_config, prepared_run
from draftgen.errors import ConfigError
from draftgen.exporters import EXPORTERS, ExportContext, MergedRow, register_exporter
from draftgen.extensions import check_config
from draftgen.phases.merge.run import run_merge
from draftgen.records import MergeManifest
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, read_json


class ToyRow(msgspec.Struct):
    sample_id: str
    n_tokens: int


def _quiet(_: str) -> None:
    pass


@pytest.fixture
def toy() -> Iterator[str]:
    @register_exporter("toy", pretokenized=False, usage="wc -l {file}", doc="one line per row: id and length")
    def _toy(ctx: ExportContext, row: MergedRow, ids: list[int], mask: list[int]) -> msgspec.Struct | str:
        return ToyRow(sample_id=row.row_id, n_tokens=len(ids))

    try:
        yield "toy"
    finally:
        if "toy" in EXPORTERS:
            EXPORTERS.unregister("toy")


def test_a_registered_format_is_written_listed_and_cleared(tmp_path: Path, toy: str) -> None:
    cfg = prepared_run(tmp_path, {"a": chat_rows("a", 6)}, merge={"exports": ["speculators", toy]})
    rd = RunDir(cfg.run_path)
    run_merge(cfg, echo=_quiet)
    parquet = [r for f in sorted(rd.merged.glob("train-*.parquet")) for r in pq.read_table(f).to_pylist()]
    rows = [r for _, r in iter_jsonl(rd.export_file(toy, "train"), ToyRow)]
    assert rows and [(r.sample_id, r.n_tokens) for r in rows] == [
        (p["sample_id"], len(p["input_ids"])) for p in parquet]
    manifest = read_json(rd.merged_manifest, MergeManifest)
    toy_files = [f for f in manifest.files if f.kind == toy]
    assert [(f.path, f.rows) for f in toy_files] == [("exports/toy/train.jsonl", len(rows))]
    assert f"- `{toy}`: wc -l exports/toy/train.jsonl" in rd.dataset_card.read_text()

    cfg.merge.exports = ["speculators"]
    run_merge(cfg, echo=_quiet)
    assert not rd.export_file(toy, "train").exists() and not rd.export_dir(toy).exists()
    assert rd.export_file("speculators", "train").is_file()


def test_config_validates_exports_against_the_registry(tmp_path: Path, toy: str) -> None:
    ds = [{"name": "a", "path": "a.jsonl"}]
    cfg = make_config(tmp_path, ds, merge={"exports": [toy]})
    check_config(cfg, "cfg.yaml")
    assert cfg.merge.exports == [toy]
    EXPORTERS.unregister(toy)
    with pytest.raises(ConfigError, match=r"cfg.yaml: merge.exports 'toy' is not registered; use one of "
                                          r"speculators, specforge, specforge-conversations"):
        check_config(cfg, "cfg.yaml")


def test_a_format_name_is_registered_once(toy: str) -> None:
    def build(ctx: ExportContext, row: MergedRow, ids: list[int], mask: list[int]) -> Any:
        return ""

    with pytest.raises(ConfigError, match=r"merge\.exports: export format 'toy' is registered already"):
        register_exporter(toy, pretokenized=False, usage="")(build)
