"""``target.rows``: the merged train rows and who served each, with its quantization (extract's provider
fidelity groups by both), read from a run the embedded emulator generated and merge wrote."""

from __future__ import annotations

from pathlib import Path

import msgspec

from _common_helpers import config_dict, load, write_config
from draftgen.phases.generate.run import run_generate
from draftgen.phases.merge.run import run_merge
from draftgen.phases.prepare.run import run_prepare
from draftgen.records import ResponseRecord, parse_row_id
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl
from draftgen.target.rows import read_merged_providers, read_merged_rows


def test_each_row_is_labelled_with_its_provider_and_the_quantization_its_record_names(tmp_path: Path) -> None:
    rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Question {i}?"}]}) for i in range(16)]
    (tmp_path / "chat.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    cfg = load(write_config(tmp_path, config_dict(tmp_path, ["chat"], progress="off",
                                                  partitions={"short": {"concurrency": 4, "max_tokens": 64}})))
    assert run_generate(cfg, argv=["draftgen"], prepare=run_prepare, echo=lambda s: None).exit_code == 0
    run_merge(cfg, echo=lambda s: None)
    rd = RunDir(cfg.run_path)
    records = {r.sample_id: r for _, r in iter_jsonl(rd.raw("chat"), ResponseRecord)}
    assert any(r.quantization for r in records.values())  # the emulator's endpoints name theirs
    labels = read_merged_providers(rd)
    assert set(labels) == {r.sample_id for r in read_merged_rows(rd)}
    for rid, label in labels.items():
        rec = records[parse_row_id(rid)[0]]
        assert label == (f"{rec.provider} ({rec.quantization})" if rec.quantization else rec.provider)
