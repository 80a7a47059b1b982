"""The checks flag broken capture: (a) aux layer ids off by one, (b) aux not captured (zeros, or a copy of
the embeddings), (c) positions shifted by one token, (d) a final state taken after the norm or from the wrong
layer. Each break is made by wrapping the hf backend's capture in the test (no production flag); a sound
capture flags nothing. The log-prob check (``teacher_reference`` for the final state, ``teacher_aux`` for the
aux slots run on through the target) flags every break; tests/target/test_extract_vllm.py makes the same
breaks in the vllm backend's server and checks against the engine's own ``prompt_logprobs``. Also the
deterministic teacher fraction (the hf backend's), the secret spot check a server's samples get
(``SpotCheck``: exactly its share of every block, drawn anew by each instance) and the log-prob tolerance."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from _extract_helpers import build_tiny_model, make_merged_run, with_hidden
from draftgen.config import load_config
from draftgen.drafter.hf import rms_norm
from draftgen.errors import ThresholdBroken
from draftgen.hidden.codec import Captured, decode_sample, encode_sample
from draftgen.hidden.format import HiddenStore
from draftgen.phases.extract.run import run_extract
from draftgen.target import ExtractRow
from draftgen.target.checks import (
    LOGPROB_FLOOR,
    SpotCheck,
    logprob_tolerance,
    relative_diff,
    teacher_selected,
)
from draftgen.target.hf import HFExtractBackend

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
        # the backend stages its states on its device; a break is made before that, so each sample is handed
        # on unstaged (its states as stored, float32): the worker stages it on the CPU, checks the same way
        caps = []
        for c, r in zip(inner(rows), rows, strict=True):
            s = decode_sample(encode_sample(c, c.staged.dtype if c.staged else "fp32"))
            caps.append(Captured(sample_id=c.sample_id, input_ids=c.input_ids, loss_mask=c.loss_mask,
                                 aux=s.aux.clone(), final=s.final.clone()))
            change(caps[-1], r)
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
    assert all({"reference_aux", "teacher_aux"} <= set(f) for f in failed.values()), failed


def test_b_aux_zeros_or_embedding_copy_are_flagged(setup: tuple[Path, Path]) -> None:
    def zeros(be: HFExtractBackend) -> None:
        wrap_capture(be, lambda c, r: c.aux.zero_())

    failed = extract_with(setup, "zeros", zeros)
    assert all({"norm", "aux_distinct", "reference_aux", "teacher_aux"} <= set(f) for f in failed.values()), failed

    def embedding(be: HFExtractBackend) -> None:
        n = len(be.info.layers.aux)
        wrap_capture(be, lambda c, r: c.aux.copy_(be.embed(r.input_ids).repeat(1, n).to(c.aux.dtype)))

    failed = extract_with(setup, "embedding", embedding)
    assert all({"aux_embedding", "aux_distinct", "teacher_aux"} <= set(f) for f in failed.values()), failed


def test_c_positions_shifted_by_one_are_flagged(setup: tuple[Path, Path]) -> None:
    def shift(c: Captured, r: ExtractRow) -> None:  # the states of t+1 stored at t
        c.aux[:-1] = c.aux[1:].clone()
        c.final[:-1] = c.final[1:].clone()

    failed = extract_with(setup, "shifted", lambda be: wrap_capture(be, shift))
    assert all({"reference_aux", "reference_final", "teacher_reference", "teacher_aux"} <= set(f)
               for f in failed.values()), failed


def test_d_final_after_the_norm_or_from_the_wrong_layer_is_flagged(setup: tuple[Path, Path]) -> None:
    def post_norm(be: HFExtractBackend) -> None:  # the post-norm state stored as the final one
        wrap_capture(be, lambda c, r: c.final.copy_(rms_norm(c.final, be.info.norm_weight, be.info.norm_eps)))

    failed = extract_with(setup, "postnorm", post_norm)
    assert all({"teacher_reference", "reference_final"} <= set(f) for f in failed.values()), failed

    def wrong_layer(be: HFExtractBackend) -> None:  # the input of the last layer claimed as its output
        be.close()
        L = be.info.num_layers
        be._hooks = [be.layers_mod[k].register_forward_pre_hook(be._pre_hook(k), with_kwargs=True)
                     for k in be.info.layers.aux]
        be._hooks.append(be.layers_mod[L - 1].register_forward_pre_hook(be._pre_hook(L), with_kwargs=True))

    failed = extract_with(setup, "wronglayer", wrong_layer)
    assert all("teacher_reference" in f for f in failed.values()), failed


def test_logprob_tolerance_scales_with_the_dtypes() -> None:
    head = torch.nn.Linear(16, 50, bias=False)
    torch.nn.init.normal_(head.weight, std=1.0)
    state = torch.randn(8, 16)
    targets = torch.arange(8)

    def lp(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(head(x), -1).gather(-1, targets[:, None])[:, 0]

    base = lp(state)
    tol = {d: logprob_tolerance(lp, state, base, d, "fp32") for d in ("fp32", "bf16", "fp8")}
    assert tol["fp32"] == LOGPROB_FLOOR < tol["bf16"] < tol["fp8"]
    assert tol["fp8"] / tol["bf16"] == pytest.approx(16.0, rel=1e-3)  # linear in the unit roundoff
    deeper = logprob_tolerance(lp, state, base, "bf16", "bf16", depth=9)
    assert deeper == pytest.approx(tol["bf16"] * 4, rel=1e-3)  # compute rounding accumulated over sqrt(9) layers


def test_teacher_fraction_is_deterministic_by_sample_id() -> None:
    ids = [f"s-{i}" for i in range(4000)]
    picked = [s for s in ids if teacher_selected(s, 0.05)]
    assert picked == [s for s in ids if teacher_selected(s, 0.05)]
    assert 120 < len(picked) < 280
    assert all(teacher_selected(s, 1.0) for s in ids[:10]) and not any(teacher_selected(s, 0.0) for s in ids[:10])


def test_the_spot_check_draws_its_share_of_every_block_in_secret() -> None:
    """Item 2: at 0.05, exactly 5 of every 100 answers, at places drawn anew by each instance (two runs over the
    same samples check different ones); at least one in each block for a small fraction; all or none at 1 and 0."""
    spots = [SpotCheck(0.05), SpotCheck(0.05)]
    draws = [[spot.next() for _ in range(400)] for spot in spots]
    for d in draws:
        assert [sum(d[b:b + 100]) for b in range(0, 400, 100)] == [5, 5, 5, 5]
    assert draws[0] != draws[1]
    rare = SpotCheck(0.001)
    assert rare.block == 1000 and sum(rare.next() for _ in range(3000)) == 3
    assert SpotCheck(0.3).per_block == 30
    every, none = SpotCheck(1.0), SpotCheck(0.0)
    assert all(every.next() for _ in range(5)) and not any(none.next() for _ in range(5))


def test_relative_diff() -> None:
    a = torch.ones(3, 4)
    assert relative_diff(a, a) == 0.0 and relative_diff(torch.zeros(2, 2), torch.zeros(2, 2)) == 0.0
    assert relative_diff(a, -a) == pytest.approx(2.0)
