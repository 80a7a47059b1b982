"""Extraction to S3: a real moto server subprocess on a free loopback port, a bucket made with boto3,
``draftgen extract`` to s3://bucket/prefix (storage_options endpoint_url; credentials from AWS_* variables),
first with --limit then to the end (resume), every sample read back equal to a local run's; the
credentials never appear in the output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from _common_helpers import moto_s3
from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.cli import cli
from draftgen.hidden.format import HiddenStore, open_hidden

SECRET = "draftgen-test-secret-value-0123456789"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_s3(tmp_path_factory.mktemp("moto"), "hidden", SECRET) as url:
        yield url


def test_extract_to_s3_resumes_and_reads_back_equal_to_local(s3: str, tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "target", layers=8, hidden=32)
    run_cfg = make_merged_run(tmp_path / "r", n_chat=5, n_code=3)
    rows = merged_rows(run_cfg.parent / "run")
    common = dict(model=str(model), teacher_fraction=1.0, teacher_min_margin=None,
                  batch_tokens=min(len(r[1]) for r in rows) - 1)
    local = with_hidden(run_cfg, "cfg-local.yaml", output=str(tmp_path / "local"), **common)
    remote = with_hidden(run_cfg, "cfg-s3.yaml", output="s3://hidden/runs/a", storage_options={"endpoint_url": s3},
                         **common)
    res = CliRunner().invoke(cli, ["extract", str(local)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["extract", str(remote), "--limit", "3"])
    assert res.exit_code == 0, res.output
    st = HiddenStore("s3://hidden/runs/a", {"endpoint_url": s3})
    assert len(st.done()) == 3 and not st.read_manifest().complete
    res2 = CliRunner().invoke(cli, ["extract", str(remote)])
    assert res2.exit_code == 0, res2.output
    assert f"{len(rows) - 3:,} of {len(rows):,} samples to do (3 done before)" in res2.output
    assert SECRET not in res.output + res2.output
    got, want = open_hidden("s3://hidden/runs/a", {"endpoint_url": s3}), open_hidden(str(tmp_path / "local"))
    assert got.manifest.complete and [e.sample_id for e in got.manifest.samples] == [r[0] for r in rows]
    for a, b in zip(want.samples(), got.samples(), strict=True):
        assert a.sample_id == b.sample_id and a.input_ids.equal(b.input_ids) and a.loss_mask.equal(b.loss_mask)
        assert a.aux.equal(b.aux) and a.final.equal(b.final)
    for e in got.manifest.samples:  # byte for byte, file by file
        assert st.read_bytes(e.file) == (tmp_path / "local" / e.file).read_bytes()
