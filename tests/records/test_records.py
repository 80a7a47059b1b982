"""records.py: every partial view agrees with its record; the shared response fields have one schema; the
raw log format reads both ways."""

from __future__ import annotations

import msgspec
import pytest

from draftgen.backends.base import Completion
from draftgen.records import (
    VIEWS,
    GroundTruthRecord,
    PromptRecord,
    ReferenceRow,
    ResponseFields,
    ResponseRecord,
    Usage,
    view_mismatches,
)


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda v: v.__name__)
def test_every_view_is_a_subset_of_its_record_with_the_same_types_and_defaults(view: type[msgspec.Struct]) -> None:
    record = VIEWS[view]
    assert view_mismatches(view, record) == []
    rec = {f.name: f for f in msgspec.structs.fields(record)}
    for f in msgspec.structs.fields(view):  # the same check, spelled out
        assert f.name in rec
        if f.type is not msgspec.Raw:
            assert f.type == rec[f.name].type, f.name


def test_a_broken_view_fails_the_check() -> None:
    class Renamed(msgspec.Struct):
        sample_id: str
        finish: str | None = None  # the record calls it finish_reason: would decode as None on every row

    class Retyped(msgspec.Struct):
        sample_id: str
        attempts: str = "1"

    class Redefaulted(msgspec.Struct):
        sample_id: str
        partition: str = "long"

    assert view_mismatches(Renamed, ResponseRecord) == ["Renamed.finish: not a field of ResponseRecord"]
    assert len(view_mismatches(Retyped, ResponseRecord)) == 2  # type, and default
    assert view_mismatches(Redefaulted, ResponseRecord) == [
        "Redefaulted.partition: default differs from ResponseRecord's"]
    assert view_mismatches(Renamed, PromptRecord)


def test_reference_row_reads_ground_truth_and_response_records() -> None:
    gt = {f.name for f in msgspec.structs.fields(GroundTruthRecord)}
    rr = {f.name for f in msgspec.structs.fields(ResponseRecord)}
    assert {f.name for f in msgspec.structs.fields(ReferenceRow)} <= gt | rr
    line = msgspec.json.encode(GroundTruthRecord(generation_id="g", output_ids=[1], prompt_ids=[2]))
    assert msgspec.json.decode(line, type=ReferenceRow).generation_id == "g"


def test_completion_and_record_share_one_schema() -> None:
    shared = set(ResponseFields.__struct_fields__)
    assert shared <= set(Completion.__struct_fields__) and shared <= set(ResponseRecord.__struct_fields__)
    comp = Completion(backend="vllm", reasoning="r", content="c", finish_reason="stop", provider="P",
                      usage=Usage(completion_tokens=3), output_ids=[1, 2, 3], ttft_s=0.5)
    rec = ResponseRecord.from_completion(comp, sample_id="s", dataset="d", content="C", backend=comp.backend)
    assert (rec.reasoning, rec.content, rec.finish_reason, rec.provider, rec.output_ids, rec.ttft_s) == (
        "r", "C", "stop", "P", [1, 2, 3], 0.5)
    assert rec.usage == comp.usage and rec.backend == "vllm" and rec.sample_id == "s"


def test_raw_log_lines_read_both_ways() -> None:
    # an old line (sample_id first, keys in the old order) decodes; a new line keeps omit_defaults
    old = (b'{"sample_id":"s","dataset":"d","reasoning":"r","content":"c","finish_reason":"stop",'
           b'"usage":{"completion_tokens":3},"output_ids":[1,2,3],"ids_source":"reconstructed",'
           b'"recon_flags":["x"],"attempts":2,"schema_version":2}')
    rec = msgspec.json.decode(old, type=ResponseRecord)
    assert (rec.sample_id, rec.content, rec.ids_source, rec.attempts, rec.output_ids) == (
        "s", "c", "reconstructed", 2, [1, 2, 3])
    again = msgspec.json.decode(msgspec.json.encode(rec), type=ResponseRecord)
    assert again == rec
    legacy = msgspec.json.encode(ResponseRecord(sample_id="s", output_ids=[1]))
    assert msgspec.json.decode(legacy) == {"sample_id": "s", "output_ids": [1]}
