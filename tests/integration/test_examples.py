"""The example configs shipped in examples/ stay valid as the config schema changes, and the quickstart
writes its run directory where the README says (./runs/quickstart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftgen.config import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.datasets
    for ds in cfg.datasets:
        if path.name == "tiny-chain.yaml":  # scripts/tiny-chain writes the learned language's prompts there
            assert ds.path and ds.path.startswith("../runs/tiny-chain/prompts/"), ds.path
        else:
            assert ds.path and ds.path.startswith("bundled:")


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "openrouter-kimi.yaml"}


QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def test_quickstart_writes_its_run_dir_under_the_working_directory(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """README: ``draftgen run examples/quickstart.yaml --run-dir runs/quickstart`` writes ./runs/quickstart
    (a command-line path is relative to the working directory), and never into examples/."""
    from click.testing import CliRunner

    from draftgen.cli import cli

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["prepare", str(QUICKSTART), "--run-dir", "runs/quickstart"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "runs" / "quickstart" / "run.json").is_file()
    assert not (QUICKSTART.parent / "runs").exists()


def test_quickstart_run_dir_in_the_file_is_beside_examples_not_inside() -> None:
    cfg = load_config(QUICKSTART)
    assert cfg.run_path.resolve() == QUICKSTART.parents[1] / "runs" / "quickstart"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_keep_fp4_out_with_quantizations_and_kimi_sets_a_token_budget(path: Path) -> None:
    cfg = load_config(path)
    if cfg.endpoint.kind in ("openrouter", "emulator"):
        assert cfg.routing.quantizations is not None and not {"fp4", "nvfp4", "mxfp4"} & set(cfg.routing.quantizations)
        assert "quantizations" in path.read_text(encoding="utf-8").split("routing:", 1)[1].split("partitions:")[0]
    if path.name == "openrouter-kimi.yaml":
        assert cfg.budget.token_budget == 10_000_000 and cfg.budget.max_spend_usd == 100.0


def test_the_quickstart_routes_no_request_to_an_fp4_provider(tmp_path: Path) -> None:
    """The quickstart's own routing against its own emulator roster (two fp4 hosts, one int4): every
    response, and the report's providers, come from the int4 host."""
    import yaml

    from draftgen.config import config_from_mapping
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.prepare.run import run_prepare
    from draftgen.records import ResponseRecord
    from draftgen.runview.metrics import compute_metrics
    from draftgen.store import iter_jsonl

    data = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    data["run_dir"] = str(tmp_path / "run")
    data["datasets"] = [{**d, "max_samples": 10} for d in data["datasets"][:2]]
    data["progress"] = "off"
    cfg = config_from_mapping(data, where="quickstart", base_dir=QUICKSTART.parent)
    rep = run_generate(cfg, echo=lambda s: None, prepare=run_prepare)
    assert rep.done == 20 and rep.failed == 0
    quants = {r.quantization for d in ("chat", "code")
              for _, r in iter_jsonl(tmp_path / "run" / "raw" / d / "raw_responses.jsonl", ResponseRecord)}
    assert quants == {"int4"}
    providers = {p.provider for p in compute_metrics(tmp_path / "run", ["chat", "code"]).providers_table}
    assert providers == {"Chutes"}
