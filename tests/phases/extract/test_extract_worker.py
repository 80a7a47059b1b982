"""``extract.worker.Worker``: with overlap (capture of batch k+1 beside the finish of batch k, teacher checks
in their own lane) it writes exactly what it writes without: the same files byte for byte and the same index
records, teacher results included; each sample comes back once; a lane of one place still finishes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _common_helpers import config_dict, load, write_config
from _extract_helpers import build_tiny_model
from draftgen.hidden.format import HiddenStore
from draftgen.phases.extract import worker as worker_mod
from draftgen.phases.extract.batches import split_batches
from draftgen.phases.extract.worker import Worker
from draftgen.target import ExtractRow
from draftgen.target.hf import HFExtractBackend

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("worker")
    model = build_tiny_model(tmp / "target", layers=8, hidden=32, vocab=512)
    cfg = load(write_config(tmp, config_dict(tmp, hidden_states={
        "model": str(model), "teacher_fraction": 0.5, "teacher_min_margin": None, "batch_tokens": 96})))
    be = HFExtractBackend(cfg)
    yield cfg, be
    be.close()


def _rows(n: int) -> list[ExtractRow]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        t = int(rng.integers(12, 30))
        out.append(ExtractRow(sample_id=f"w-{i:02d}", input_ids=rng.integers(0, 512, t).astype(np.int64),
                              loss_mask=np.array([0] * (t // 2) + [1] * (t - t // 2), dtype=np.uint8)))
    return out


def _run(cfg: Any, be: Any, out: Path, *, overlap: bool) -> tuple[list[str], HiddenStore]:
    store = HiddenStore(str(out))
    store.claim()
    batches = list(split_batches(_rows(16), cfg.hidden_states.batch_tokens))
    assert len(batches) > 2
    got = [rec.sample_id for res in Worker(cfg, store, be, overlap=overlap).run(batches) for rec in res.records]
    return got, store


def test_overlap_and_the_teacher_lane_write_what_a_plain_run_writes(backend: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, be = backend
    plain_ids, plain = _run(cfg, be, tmp_path / "plain", overlap=False)
    monkeypatch.setattr(worker_mod, "TEACHER_HELD", 1)  # one place in the lane: finish waits for it
    lane_ids, lane = _run(cfg, be, tmp_path / "lane", overlap=True)
    assert sorted(lane_ids) == sorted(plain_ids) == [r.sample_id for r in _rows(16)]  # each sample once
    a, b = plain.done(), lane.done()
    assert a == b  # the same records, teacher results included
    teacher = [sid for sid, r in a.items() if r.teacher is not None]
    assert 0 < len(teacher) < len(a)
    assert all(t.reference_logprob_mean is not None for s in teacher if (t := a[s].teacher) is not None)
    for rec in a.values():
        assert plain.read_bytes(rec.file) == lane.read_bytes(rec.file)
    # a teacher sample lands after its batch, in an index part of its own
    assert len(lane.index_parts()) == len(plain.index_parts()) + len(teacher)
