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
