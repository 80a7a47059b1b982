"""The one reader of merged Parquet (``exporters.parquet.read_merged``, ``merged_shards``) and the merged train rows
extract and ``train --online`` read through it (``target.rows.read_merged_rows``).

Real files: shards written with the merge's own Arrow schema (``parquet_schema``) under a run directory, listed
by a real ``MergeManifest``. The rows come back typed (``MergedParquetRow`` or a view that reads only its own
columns), a manifest of either layout is rooted by its rule, and a shard that cannot be read is one line naming
it and the fix.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
np = pytest.importorskip("numpy")

from draftgen.errors import InputError  # noqa: E402
from draftgen.exporters.parquet import file_entry, merged_shards, parquet_schema, read_merged  # noqa: E402
from draftgen.records import (  # noqa: E402
    MERGED_VIEWS,
    MergedLengths,
    MergedParquetRow,
    MergedRowId,
    MergedTokens,
    MergeManifest,
)
from draftgen.rundir import RunDir  # noqa: E402
from draftgen.store import atomic_write_json  # noqa: E402
from draftgen.target.rows import read_merged_rows  # noqa: E402


def _row(i: int, n: int, *, rid: str | None = None) -> MergedParquetRow:
    return MergedParquetRow(input_ids=[100 + i + k for k in range(n)], loss_mask=[0] * (n // 2) + [1] * (n - n // 2),
                            sample_id=rid or f"s{i}", dataset="chat" if i % 2 else "code",
                            finish_reason=None if i == 1 else "stop", provider="p", ids_source="exact",
                            prompt_len=n // 2, completion_len=n - n // 2, reasoning_len=i % 3, capped=i == 2)


def _write(path: Path, rows: list[MergedParquetRow]) -> None:
    schema = parquet_schema()
    cols = {f.name: [getattr(r, f.name) for r in rows] for f in schema}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pydict(cols, schema=schema), path)


def _run(tmp: Path, shards: dict[str, list[MergedParquetRow]], *, layout: int = 2) -> RunDir:
    """A run directory whose merged/ holds ``shards`` (split → rows), listed by a manifest of ``layout``."""
    rd = RunDir(tmp / "run")
    files = []
    for split, rows in shards.items():
        path = rd.merged_shard(split, 0, 1)
        _write(path, rows)
        entry = file_entry(rd, path, split, "parquet", len(rows))
        if layout == 1:  # paths relative to merged/, as an older merge wrote them
            entry = msgspec.structs.replace(entry, path=path.relative_to(rd.merged).as_posix())
        files.append(entry)
    atomic_write_json(rd.merged_manifest, MergeManifest(files=files, seed=0, merge={}, datasets=["chat", "code"],
                                                        profile="qwen3", layout=layout))
    return rd


@pytest.mark.parametrize("layout", [1, 2])
def test_rows_come_back_typed_in_order_from_either_layout(tmp_path: Path, layout: int) -> None:
    train = [_row(i, 4 + i) for i in range(5)]
    val = [_row(9, 3)]
    rd = _run(tmp_path, {"train": train, "validation": val}, layout=layout)
    man = msgspec.json.decode(rd.merged_manifest.read_bytes(), type=MergeManifest)
    assert merged_shards(rd, man, "train") == [rd.merged_shard("train", 0, 1)]
    assert list(read_merged(merged_shards(rd, man, "train"), MergedParquetRow)) == train
    assert list(read_merged(merged_shards(rd, man), MergedParquetRow)) == train + val  # path order
    assert [r.sample_id for r in read_merged(merged_shards(rd, man), MergedRowId)] == [r.sample_id for r in train + val]
    assert [(r.prompt_len, r.completion_len) for r in read_merged(merged_shards(rd, man), MergedLengths)] == \
        [(r.prompt_len, r.completion_len) for r in train + val]
    rows = read_merged_rows(rd)  # the train split only, as extract's rows
    assert [r.sample_id for r in rows] == [r.sample_id for r in train]
    assert all(r.input_ids.dtype == np.int64 and r.loss_mask.dtype == np.uint8 for r in rows)
    assert [r.input_ids.tolist() for r in rows] == [r.input_ids for r in train]
    assert [r.loss_mask.tolist() for r in rows] == [r.loss_mask for r in train]


def test_every_view_is_part_of_the_row_and_reads_only_its_columns(tmp_path: Path) -> None:
    whole = {f.name: f.type for f in msgspec.structs.fields(MergedParquetRow)}
    for view in MERGED_VIEWS:
        assert all(whole.get(f.name) == f.type for f in msgspec.structs.fields(view)), view
    # a shard that has only the ids, the mask and the row id: enough for MergedTokens, not for the whole row
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"sample_id": ["a", "b"], "input_ids": [[1, 2], [3]], "loss_mask": [[0, 1], [1]]}), path)
    assert list(read_merged([path], MergedTokens)) == [MergedTokens("a", [1, 2], [0, 1]), MergedTokens("b", [3], [1])]
    with pytest.raises(InputError) as err:
        list(read_merged([path], MergedParquetRow))
    assert str(path) in str(err.value) and "draftgen merge" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TypeError):
        list(read_merged([path], MergeManifest))  # type: ignore[type-var]


def test_a_weight_repeat_is_one_extract_row(tmp_path: Path) -> None:
    rows = [_row(0, 5), _row(1, 4), _row(0, 5, rid="s0")]  # the same row id twice: captured once
    assert [r.sample_id for r in read_merged_rows(_run(tmp_path, {"train": rows}))] == ["s0", "s1"]


def test_a_shard_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path) -> None:
    rd = _run(tmp_path, {"train": [_row(i, 6) for i in range(3)]})
    shard = rd.merged_shard("train", 0, 1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated after the merge
    with pytest.raises(InputError) as err:
        read_merged_rows(rd)
    msg = str(err.value)
    assert str(shard) in msg and "run `draftgen merge` again" in msg and "\n" not in msg
    shard.unlink()  # listed, but gone
    with pytest.raises(InputError, match="cannot read"):
        read_merged_rows(rd)
    rd.merged_manifest.unlink()
    with pytest.raises(InputError, match="no merged data; run draftgen merge first"):
        read_merged_rows(rd)
