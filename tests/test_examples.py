"""The example configs shipped in examples/ stay valid as the config schema changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftgen.config import load_config

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.datasets
    for ds in cfg.datasets:
        assert ds.path and ds.path.startswith("bundled:")


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "openrouter-kimi.yaml"}
