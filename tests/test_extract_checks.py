"""The checks flag broken capture: (a) aux layer ids off by one, (b) aux not captured (zeros, or a copy of
the embeddings), (c) positions shifted by one token. Each break is made by wrapping the hf backend's capture
in the test (no production flag); a sound capture flags nothing. Also the deterministic teacher fraction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from _extract_helpers import build_tiny_model, make_merged_run, with_hidden
from draftgen.config import load_config
from draftgen.errors import ThresholdBroken
from draftgen.hidden.format import Captured, HiddenStore
from draftgen.phases.extract.capture import ExtractRow
from draftgen.phases.extract.capture.hf import HFExtractBackend
from draftgen.phases.extract.checks import relative_diff, teacher_selected
from draftgen.phases.extract.run import run_extract

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    model = build_tiny_model(tmp_path_factory.mktemp("target"), layers=8, hidden=32)
    return model, make_merged_run(tmp_path_factory.mktemp("run"), n_chat=4, n_code=2)


def extract_with(setup: tuple[Path, Path], name: str, wrap: Callable[[HFExtractBackend], None] | None,
                 dtype: str = "bf16") -> dict[str, list[str]]:
    model, run_cfg = setup
    out = run_cfg.parent / f"h-{name}"
    cfg = load_config(with_hidden(run_cfg, f"cfg-{name}.yaml", model=str(model), output=str(out), dtype=dtype,
                                  teacher_fraction=1.0, teacher_min_margin=None))
    be = HFExtractBackend(cfg)
    if wrap is not None:
        wrap(be)
    try:
        run_extract(cfg, echo=lambda s: None, backend=be)
        flagged_run = False
    except ThresholdBroken:
        flagged_run = True
    finally:
        be.close()
    done = HiddenStore(str(out)).done()
    failed = {sid: r.failed for sid, r in done.items()}
    assert flagged_run == any(failed.values())
    return failed


def wrap_capture(be: HFExtractBackend, change: Callable[[Captured, ExtractRow], None]) -> None:
    inner = be.capture

    def capture(rows: Sequence[ExtractRow]) -> list[Captured]:
        caps = inner(rows)
        for c, r in zip(caps, rows, strict=True):
            change(c, r)
        return caps

    be.capture = capture  # type: ignore[method-assign]


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
def test_sound_capture_flags_nothing(setup: tuple[Path, Path], dtype: str) -> None:
    failed = extract_with(setup, f"ok-{dtype}", None, dtype)
    assert failed and not any(failed.values()), failed


def test_a_aux_layers_off_by_one_are_flagged(setup: tuple[Path, Path]) -> None:
    def off_by_one(be: HFExtractBackend) -> None:  # capture the input of layer id+1 but claim id
        be.close()
        be._hooks = [be.layers_mod[k + 1].register_forward_pre_hook(be._pre_hook(k), with_kwargs=True)
                     for k in be.info.layers.aux]
        be._hooks.append(be.layers_mod[-1].register_forward_hook(be._post_hook(be.info.num_layers)))

    failed = extract_with(setup, "offbyone", off_by_one)
    assert all("reference_aux" in f for f in failed.values()), failed


def test_b_aux_zeros_or_embedding_copy_are_flagged(setup: tuple[Path, Path]) -> None:
    def zeros(be: HFExtractBackend) -> None:
        wrap_capture(be, lambda c, r: c.aux.zero_())

    failed = extract_with(setup, "zeros", zeros)
    assert all({"norm", "aux_distinct", "reference_aux"} <= set(f) for f in failed.values()), failed

    def embedding(be: HFExtractBackend) -> None:
        n = len(be.info.layers.aux)
        wrap_capture(be, lambda c, r: c.aux.copy_(be.embed(r.input_ids).repeat(1, n).to(c.aux.dtype)))

    failed = extract_with(setup, "embedding", embedding)
    assert all({"aux_embedding", "aux_distinct"} <= set(f) for f in failed.values()), failed


def test_c_positions_shifted_by_one_are_flagged(setup: tuple[Path, Path]) -> None:
    def shift(c: Captured, r: ExtractRow) -> None:  # the states of t+1 stored at t
        c.aux[:-1] = c.aux[1:].clone()
        c.final[:-1] = c.final[1:].clone()

    failed = extract_with(setup, "shifted", lambda be: wrap_capture(be, shift))
    assert all({"reference_aux", "reference_final", "teacher_reference"} <= set(f) for f in failed.values()), failed


def test_teacher_fraction_is_deterministic_by_sample_id() -> None:
    ids = [f"s-{i}" for i in range(4000)]
    picked = [s for s in ids if teacher_selected(s, 0.05)]
    assert picked == [s for s in ids if teacher_selected(s, 0.05)]
    assert 120 < len(picked) < 280
    assert all(teacher_selected(s, 1.0) for s in ids[:10]) and not any(teacher_selected(s, 0.0) for s in ids[:10])


def test_relative_diff() -> None:
    a = torch.ones(3, 4)
    assert relative_diff(a, a) == 0.0 and relative_diff(torch.zeros(2, 2), torch.zeros(2, 2)) == 0.0
    assert relative_diff(a, -a) == pytest.approx(2.0)
