"""The proof of the drafter chain on a CPU (issue 15): data from draftgen trains a drafter that gets accepted.

Runs scripts/tiny-chain's ``chain`` (the command a user runs, loaded from its file) once: the tiny learnable
target (``draftgen.drafter.tiny``) served by ``draftgen emulate --model``, prepare → generate (vllm backend,
exact ids) → merge → extract (hf) → train (speculators, CPU) → accept (``draftgen emulate --drafter``: real
greedy speculative verification, vLLM /metrics counters; once SGLang meta_info), for three drafters:
trained, untrained (the same train path with lr 0, one step) and broken (aux states not captured, zeros;
the checks that would flag them off). A one-position shift is asserted to be flagged by the extract checks
(acceptance does not tell it apart: shared/research/tiny-chain-feasibility.md).

The acceptance lengths are printed at the end of the pytest run (a terminal-summary plugin this module
registers) and recorded in bench/RESULTS.md ("CPU drafter chain (issue 15)"). Bounds are the issue's.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _hidden_export_helpers import speculators_python  # noqa: E402
from draftgen.config import load_config  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tiny-chain"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-chain.yaml"


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("draftgen_tiny_chain", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class _Summary:
    """Prints the chain's figures at the end of the run, whatever the verbosity or capture."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.lines:
            terminalreporter.write_line(f"draftgen chain: {line}")


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> dict[str, Any]:
    spec = speculators_python()
    mp = pytest.MonkeyPatch()
    mp.setenv("DRAFTGEN_SPECULATORS", str(spec))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    torch.manual_seed(0)
    try:
        mod = _script()
        work = tmp_path_factory.mktemp("chain") / "work"
        out = mod.chain(work, echo=lambda s: None)
    finally:
        mp.undo()
    out["work"] = str(work)
    lines = mod.summary(out)
    (work / "figures.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    pytestconfig.pluginmanager.register(_Summary(lines), "draftgen-chain-summary")
    return out


@pytest.mark.slow
def test_trained_drafter_is_accepted_and_untrained_and_broken_are_not(figures: dict[str, Any]) -> None:
    t, u, b = figures["al_trained"], figures["al_untrained"], figures["al_broken"]
    assert t - u >= 0.3, figures
    assert t - b >= 0.2, figures
    # the counters are consistent: AL = 1 + Σ per-position acceptance
    for name in ("trained", "untrained", "broken"):
        assert figures[f"al_{name}"] == pytest.approx(1 + sum(figures[f"per_position_{name}"]), abs=1e-3)


@pytest.mark.slow
def test_sglang_meta_info_measures_the_same_drafter(figures: dict[str, Any]) -> None:
    # Σcompletion_tokens / Σspec_verify_ct counts each request's last, cut-short verification too, so it is close
    # to the vLLM-counter AL but not equal
    sg = figures["al_trained_sglang"]
    assert sg - figures["al_untrained"] >= 0.3 and abs(sg - figures["al_trained"]) < 0.15, figures


@pytest.mark.slow
def test_extract_checks_flag_states_shifted_by_one(figures: dict[str, Any]) -> None:
    s = figures["shifted"]
    assert s["threshold_broken"] and s["flagged"] > 0 and s["reference_aux"] == s["flagged"], s


@pytest.mark.slow
def test_the_chain_trained_on_every_merged_sample(figures: dict[str, Any]) -> None:
    assert figures["samples"] == 204 and figures["train_trained"]["steps"] > 0
    held = json.loads((Path(figures["work"]) / "run" / "accept" / "acceptance.json").read_text())
    assert held["prompts"] == 20 and held["k"] == 3


def test_example_config_loads_and_is_the_chain() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.endpoint.kind == "vllm" and cfg.model.thinking is False
    assert [d.path for d in cfg.datasets] == ["bundled:chat", "bundled:code"]
    assert cfg.train.draft_vocab_size == 2048 and cfg.accept.prompts == 20 and cfg.hidden_states.backend == "hf"
    assert SCRIPT.is_file() and SCRIPT.stat().st_mode & 0o111
