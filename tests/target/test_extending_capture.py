"""Adding a capture backend is its module plus one ``EXTRACT_BACKENDS.register`` line.

A toy ``hidden_states.backend`` is registered here the way a plugin would, in ``draftgen.target.EXTRACT_BACKENDS``
(the target package, below the phases: a plugin imports no phase), as a lazy ``"module:attr"`` entry
naming this module's ``TOY_KIND`` (an hf-backend subclass that records the rows it captures): the config
check refuses ``backend: toy`` until it is registered, then ``draftgen extract`` on a small merged run
(a tiny seeded Qwen3 target, the emulator's rows) captures every merged row through it, and every stored
state equals an independent forward pass of the target. The registration is removed afterwards, and the
kind is then refused again with the registered ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from click.testing import CliRunner

from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.cli import cli
from draftgen.errors import ConfigError
from draftgen.hidden.codec import Captured
from draftgen.hidden.format import open_hidden
from draftgen.target import (
    EXTRACT_BACKENDS,
    ExtractBackendKind,
    ExtractCapabilities,
    ExtractRow,
)
from draftgen.target.hf import HFExtractBackend

torch.set_num_threads(1)

# -- the toy backend: what a plugin's module (or a new module under target/) would hold ---------------------


class ToyCapture(HFExtractBackend):
    """The hf backend, recording the sample ids of every batch it captures."""

    captured: ClassVar[list[str]] = []

    def capture(self, rows: Sequence[ExtractRow]) -> list[Captured]:
        type(self).captured.extend(r.sample_id for r in rows)
        return super().capture(rows)


#: The registered object: the factory and what it can do.
TOY_KIND = ExtractBackendKind(ToyCapture, ExtractCapabilities(reference=True))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("target"), layers=8, hidden=32)
    return model_dir, make_merged_run(tmp_path_factory.mktemp("run"), n_chat=4, n_code=2)


def _config(run: tuple[Path, Path]) -> Path:
    model_dir, cfg = run
    return with_hidden(cfg, "cfg-toy.yaml", backend="toy", model=str(model_dir), compute_dtype="fp32", dtype="fp32",
                       output=str(cfg.parent / "hidden-toy"), teacher_fraction=1.0, teacher_min_margin=None,
                       batch_tokens=256)


def test_a_registered_capture_backend_runs_extract(run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(run)
    res = CliRunner().invoke(cli, ["extract", str(path)])
    assert res.exit_code == ConfigError.exit_code and "hidden_states.backend 'toy' is not registered" in res.output

    monkeypatch.setattr(ToyCapture, "captured", [])
    EXTRACT_BACKENDS.register("toy", f"{__name__}:TOY_KIND", doc="the hf backend, recording")  # the one line
    try:
        res = CliRunner().invoke(cli, ["extract", str(path)])
        assert EXTRACT_BACKENDS.get("toy") is TOY_KIND
    finally:
        EXTRACT_BACKENDS.unregister("toy")
    assert res.exit_code == 0, res.output
    rows = merged_rows(run[1].parent / "run")
    assert sorted(ToyCapture.captured) == sorted(r[0] for r in rows)  # every merged row, through the toy
    hs = open_hidden(str(run[1].parent / "hidden-toy"))
    m = hs.manifest
    assert m.backend == "toy" and m.complete and m.counts.samples == len(rows) and m.counts.flagged == 0

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run[0], dtype=torch.float32).eval()
    for (sid, ids, mask), s in zip(rows, hs.samples(), strict=True):
        assert s.sample_id == sid and s.input_ids.tolist() == ids and s.loss_mask.tolist() == mask
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        want = torch.cat([out.hidden_states[k][0] for k in m.layer_ids.aux], dim=-1)
        assert float((s.aux - want).norm() / want.norm()) < 1e-5


def test_the_registration_is_gone_afterwards(run: tuple[Path, Path]) -> None:
    assert "toy" not in EXTRACT_BACKENDS
    res = CliRunner().invoke(cli, ["extract", str(_config(run))])
    assert res.exit_code == ConfigError.exit_code
    assert "hidden_states.backend 'toy' is not registered; use one of hf, vllm (see docs/config.md)" in res.output
