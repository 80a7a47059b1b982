"""End to end with the hf backend: prepare → generate (emulator) → merge → ``draftgen extract`` with a tiny
random Qwen3 target built here, then EVERY stored state checked against an independent forward pass
(``output_hidden_states[k]`` for aux, a pre-norm hook on the last layer for final), in bf16 and fp32.
Also: ``draftgen run`` is unchanged by default and runs extract when enabled; the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from _extract_helpers import build_tiny_model, make_merged_run, merged_rows, with_hidden
from draftgen.cli import cli
from draftgen.config import load_config
from draftgen.errors import ConfigError
from draftgen.hidden.format import open_hidden, require
from draftgen.phases.pipeline import run_pipeline

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("target"), layers=8, hidden=32)


@pytest.fixture(scope="module")
def run_cfg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_merged_run(tmp_path_factory.mktemp("run"))


def reference_states(model_dir: Path, ids: list[int], dtype: torch.dtype) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """An independent plain forward: HF output_hidden_states, and the last layer's output (pre-norm) by hook."""
    from transformers import AutoModelForCausalLM

    key = (str(model_dir), dtype)
    if key not in _MODELS:
        _MODELS[key] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    m = _MODELS[key]
    grabbed: list[torch.Tensor] = []
    h = m.model.layers[-1].register_forward_hook(lambda mod, a, out: grabbed.append(out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = m(torch.tensor([ids]), output_hidden_states=True)
    finally:
        h.remove()
    return {k: v[0].float() for k, v in enumerate(out.hidden_states)}, grabbed[0][0].float()


_MODELS: dict[Any, Any] = {}


@pytest.mark.parametrize(("compute", "tol"), [("fp32", 1e-5), ("bf16", 2e-2)])
def test_every_stored_state_equals_an_independent_forward(model_dir: Path, run_cfg: Path, compute: str,
                                                          tol: float) -> None:
    out = run_cfg.parent / f"hidden-{compute}"
    cfg_path = with_hidden(run_cfg, f"cfg-{compute}.yaml", model=str(model_dir), compute_dtype=compute,
                           dtype=compute, output=str(out), teacher_fraction=1.0, teacher_min_margin=None,
                           batch_tokens=256)
    res = CliRunner().invoke(cli, ["extract", str(cfg_path)])
    assert res.exit_code == 0, res.output
    assert "0 flagged" in res.output
    rows = merged_rows(run_cfg.parent / "run")
    hs = open_hidden(str(out))
    m = hs.manifest
    assert m.complete and m.counts.samples == len(rows) > 0 and m.counts.flagged == 0
    assert [e.sample_id for e in m.samples] == [r[0] for r in rows]  # merged train order
    assert m.layer_ids.aux == [2, 4, 5] and m.layer_ids.final == 8 and m.layer_ids.sglang_aux == [1, 3, 4]
    assert m.layer_ids.convention == "vllm-layer-input" and m.checks.teacher_checked == len(rows)
    assert m.throughput_tokens_per_s and m.throughput_tokens_per_s > 0
    dt = torch.float32 if compute == "fp32" else torch.bfloat16
    worst = 0.0
    for (sid, ids, mask), s in zip(rows, hs.samples(), strict=True):
        assert s.sample_id == sid and s.input_ids.tolist() == ids and s.loss_mask.tolist() == mask
        hidden, pre = reference_states(model_dir, ids, dt)
        ref = torch.cat([hidden[k] for k in (2, 4, 5)], dim=-1)
        for got, want in ((s.aux, ref), (s.final, pre)):
            err = float(((got - want).norm(dim=-1) / want.norm(dim=-1)).max())
            worst = max(worst, err)
        # pre-norm, not post-norm: the stored final differs from hidden_states[L] (post-norm) by far
        assert float((s.final - hidden[8]).norm() / hidden[8].norm()) > 0.1
    assert worst <= tol, (compute, worst)


def test_run_is_unchanged_by_default_and_runs_extract_when_enabled(model_dir: Path, run_cfg: Path) -> None:
    cfg = load_config(run_cfg)
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lambda s: None)
    assert "extract" not in rep.phases_run + rep.phases_skipped
    on = with_hidden(run_cfg, "cfg-on.yaml", extract=True, model=str(model_dir), output=str(run_cfg.parent / "h-on"),
                     teacher_min_margin=None)
    lines: list[str] = []
    rep = run_pipeline(load_config(on), argv=["draftgen", "run"], echo=lines.append)
    assert rep.exit_code == 0 and "extract" in rep.phases_run, lines
    assert open_hidden(str(run_cfg.parent / "h-on")).manifest.complete


def test_flagged_over_the_threshold_exits_3_with_the_data_stored(model_dir: Path, run_cfg: Path) -> None:
    """A random target predicts no better than chance: the teacher check flags every sample."""
    out = run_cfg.parent / "h-chance"
    cfg_path = with_hidden(run_cfg, "cfg-chance.yaml", model=str(model_dir), output=str(out), teacher_fraction=1.0)
    res = CliRunner().invoke(cli, ["extract", str(cfg_path)])
    assert res.exit_code == 3, res.output
    assert "teacher_chance" in res.output and "max_flagged_fraction" in res.output
    man = json.loads((out / "manifest.json").read_text())
    assert man["counts"]["flagged"] == man["counts"]["samples"] > 0
    assert man["checks"]["failed_by_check"] == {"teacher_chance": man["counts"]["samples"]}
    assert set(man["checks"]["teacher_logprob_quantiles"]) == {"p0", "p5", "p50", "p95", "p100"}


def test_one_line_errors(model_dir: Path, run_cfg: Path, tmp_path: Path) -> None:
    from _common_helpers import config_dict, write_config

    empty = write_config(tmp_path, config_dict(tmp_path, hidden_states={"model": str(model_dir)}))
    res = CliRunner().invoke(cli, ["extract", str(empty)])
    assert res.exit_code == 1 and "run draftgen merge first" in res.output and "Traceback" not in res.output
    bad = with_hidden(run_cfg, "cfg-bad.yaml", model=str(model_dir), layer_ids=[2, 8], output=str(tmp_path / "h"))
    res = CliRunner().invoke(cli, ["extract", str(bad)])
    assert res.exit_code == 2 and "hidden_states.layer_ids" in res.output and len(res.output.strip().splitlines()) == 1
    nomodel = with_hidden(run_cfg, "cfg-nomodel.yaml", output=str(tmp_path / "h"))
    res = CliRunner().invoke(cli, ["extract", str(nomodel)])
    assert res.exit_code == 2 and "hidden_states.model" in res.output
    with pytest.raises(ConfigError, match=r"pip install 'draftgen\[extract\]'"):
        require("torch_that_is_not_installed")
    assert "--pilot" in CliRunner().invoke(cli, ["extract", "--help"]).output


def test_pilot_records_throughput_that_plan_uses(model_dir: Path, run_cfg: Path) -> None:
    from draftgen.phases.plan.run import run_plan

    out = run_cfg.parent / "h-pilot"
    cfg_path = with_hidden(run_cfg, "cfg-pilot.yaml", model=str(model_dir), output=str(out), teacher_min_margin=None,
                           hidden_size=32)
    res = CliRunner().invoke(cli, ["extract", str(cfg_path), "--pilot", "3"])
    assert res.exit_code == 0, res.output
    assert "extract pilot:" in res.output
    man = open_hidden(str(out)).manifest
    assert not man.complete and man.counts.samples == 3 and man.throughput_tokens_per_s
    lines: list[str] = []
    rep = run_plan(load_config(cfg_path), echo=lines.append)
    assert rep.extraction_tokens_per_s == man.throughput_tokens_per_s
    assert rep.extraction_rate_source and "measured by draftgen extract" in rep.extraction_rate_source
    assert any("extraction:" in ln and "measured by draftgen extract" in ln for ln in lines)
    assert any("fp8 halves the disk" in ln for ln in lines)
