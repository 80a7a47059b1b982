from __future__ import annotations

import os
from pathlib import Path

import pytest

from draftgen.errors import InputError, RunDirError, StorageError
from draftgen.provenance import check_provenance
from draftgen.records import FailureRecord, Provenance, ResponseRecord, Usage
from draftgen.store import (
    JsonlWriter,
    atomic_write_json,
    iter_jsonl,
    read_json,
    repair_partial_tail,
    scan_failures,
    scan_responses,
)


def _rec(i: int, **kw: object) -> ResponseRecord:
    return ResponseRecord(sample_id=f"s{i}", dataset="d", output_ids=[1, 2, 3], usage=Usage(completion_tokens=3, cost=0.5), **kw)  # type: ignore[arg-type]


def test_writer_appends_and_reads_back(tmp_path: Path) -> None:
    p = tmp_path / "raw.jsonl"
    with JsonlWriter(p) as w:
        w.write_many([_rec(1), _rec(2)])
        w.write(_rec(3))
    rows = [r for _, r in iter_jsonl(p, ResponseRecord)]
    assert [r.sample_id for r in rows] == ["s1", "s2", "s3"]
    assert rows[0].output_ids == [1, 2, 3]


def test_partial_tail_is_repaired_before_append(tmp_path: Path) -> None:
    p = tmp_path / "raw.jsonl"
    with JsonlWriter(p) as w:
        w.write(_rec(1))
    good = p.read_bytes()
    with open(p, "ab") as fh:
        fh.write(b'{"sample_id": "s2", "outp')
    # Readers skip the crash artefact; the writer cuts it before appending.
    assert [r.sample_id for _, r in iter_jsonl(p, ResponseRecord)] == ["s1"]
    assert repair_partial_tail(p) == len(b'{"sample_id": "s2", "outp')
    assert p.read_bytes() == good
    with open(p, "ab") as fh:
        fh.write(b"xx")
    with JsonlWriter(p) as w:
        w.write(_rec(2))
    assert [r.sample_id for _, r in iter_jsonl(p, ResponseRecord)] == ["s1", "s2"]


def test_partial_tail_without_any_newline_truncates_to_empty(tmp_path: Path) -> None:
    p = tmp_path / "raw.jsonl"
    p.write_bytes(b'{"sample_id": "x"')
    assert repair_partial_tail(p) == 17
    assert p.read_bytes() == b""


def test_corrupt_complete_line_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "raw.jsonl"
    p.write_bytes(b'{"sample_id": "a"}\nnot json\n')
    with pytest.raises(InputError, match=r"raw\.jsonl:2: corrupt line"):
        list(iter_jsonl(p, ResponseRecord))


def test_wrong_type_names_field(tmp_path: Path) -> None:
    p = tmp_path / "raw.jsonl"
    p.write_bytes(b'{"sample_id": 5}\n')
    with pytest.raises(InputError, match=r"raw\.jsonl:1: .*sample_id"):
        list(iter_jsonl(p, ResponseRecord))


def test_scan_counts_tokens_spend_and_legacy_sglang_rows(tmp_path: Path) -> None:
    p = tmp_path / "raw.jsonl"
    prov = Provenance(model_id="m", profile="qwen3", tokenizer_sha256="ab" * 32)
    with JsonlWriter(p) as w:
        w.write_many([_rec(1, provenance=prov), _rec(2, provenance=prov)])
    with open(p, "ab") as fh:
        fh.write(b'{"sample_id": "legacy", "output_ids": [5, 6, 7, 8]}\n')
        fh.write(b'{"sample_id": "s1", "output_ids": [1]}\n')  # a later record of s1: its tokens count too
        fh.write(b'{"sample_id": "byok", "usage": {"completion_tokens": 2, "cost": 0.0, "is_byok": true, "upstream_cost": 0.25}}\n')
    idx = scan_responses(p)
    assert idx.done == {"s1", "s2", "legacy", "byok"}
    assert idx.completion_tokens == 3 + 3 + 4 + 1 + 2
    assert idx.spend_usd == pytest.approx(1.25)
    assert idx.duplicates == 1
    # The phases pass a check: it sees every record's provenance and file:line, and refuses by raising.
    seen: list[tuple[Provenance | None, str]] = []
    assert scan_responses(p, check=lambda got, where: seen.append((got, where))) == idx
    assert seen == [(prov, f"{p}:1"), (prov, f"{p}:2"), *((None, f"{p}:{n}") for n in (3, 4, 5))]
    with pytest.raises(RunDirError, match=r"raw\.jsonl:3: the record has no provenance"):
        scan_responses(p, check=lambda got, where: check_provenance(got, prov, where, force=False))


def test_scan_failures_keeps_latest(tmp_path: Path) -> None:
    p = tmp_path / "f.jsonl"
    with JsonlWriter(p) as w:
        w.write(FailureRecord(sample_id="a", dataset="d", kind="server", reason="500"))
        w.write(FailureRecord(sample_id="a", dataset="d", kind="rate_limited", reason="429"))
    assert scan_failures(p)["a"].kind == "rate_limited"


def test_atomic_json_roundtrip(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "x.json"
    atomic_write_json(p, _rec(1))
    assert read_json(p, ResponseRecord).sample_id == "s1"
    assert not [f for f in os.listdir(p.parent) if f.endswith(".tmp")]


def test_enospc_is_a_clear_storage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    p = tmp_path / "raw.jsonl"
    w = JsonlWriter(p)
    w.write(_rec(1))

    class Full:
        def write(self, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def fileno(self) -> int:
            return -1

        def close(self) -> None:
            pass

    w._fh = Full()  # type: ignore[assignment]
    with pytest.raises(StorageError, match="no space left on device"):
        w.write(_rec(2))
    assert [r.sample_id for _, r in iter_jsonl(p, ResponseRecord)] == ["s1"]


def test_move_records_moves_lines_once_even_after_a_crash_between_its_two_steps(tmp_path: Path) -> None:
    from draftgen.store import move_records

    src, dst = tmp_path / "raw.jsonl", tmp_path / "replaced.jsonl"
    lines = [b'{"sample_id": "s%d", "n": %d}\n' % (i, i) for i in range(5)]
    src.write_bytes(b"".join(lines) + b'{"sample_id": "s9", "cut')  # a partial tail: dropped
    assert move_records(src, dst, {"s1", "s3"}) == 2
    assert src.read_bytes() == lines[0] + lines[2] + lines[4]
    assert dst.read_bytes() == lines[1] + lines[3]
    # A crash after the append and before the rename leaves the lines in both: moving again adds none twice.
    src.write_bytes(lines[0] + lines[1] + lines[2])
    assert move_records(src, dst, {"s1"}) == 1
    assert src.read_bytes() == lines[0] + lines[2] and dst.read_bytes() == lines[1] + lines[3]
    assert move_records(src, dst, {"nope"}) == 0 and src.read_bytes() == lines[0] + lines[2]
