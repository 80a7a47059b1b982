"""extensions: a config may name only registered profiles, backend kinds and export formats; the CLI
refuses the others with one line naming the key and the registered names, and the docs list them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, load, write_config
from draftgen.backends import BACKENDS
from draftgen.cli import cli
from draftgen.errors import ConfigError
from draftgen.exporters import EXPORTERS
from draftgen.extensions import check_config, registered
from draftgen.tokens import profile_names


@pytest.mark.parametrize(
    ("sections", "key", "bad"),
    [
        ({"endpoint": {"kind": "tgi"}}, "endpoint.kind", "tgi"),
        ({"model": {"id": "m", "profile": "acme-1", "tokenizer": "bundled:qwen3"}}, "model.profile", "acme-1"),
        ({"merge": {"exports": ["speculators", "eagle-json"]}}, "merge.exports", "eagle-json"),
    ],
)
def test_unregistered_names_are_refused_with_the_registered_ones(tmp_path: Path, sections: dict[str, object],
                                                                  key: str, bad: str) -> None:
    path = write_config(tmp_path, config_dict(tmp_path, **sections))
    cfg = load(path)  # the schema alone accepts any name: config knows no registry
    with pytest.raises(ConfigError) as info:
        check_config(cfg, str(path))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: {key} {bad!r} is not registered; use one of ")
    known = {"endpoint.kind": list(BACKENDS), "model.profile": list(profile_names()),
             "merge.exports": list(EXPORTERS)}[key]
    assert ", ".join(known) in msg

    res = CliRunner().invoke(cli, ["prepare", str(path)])
    assert res.exit_code == ConfigError.exit_code, res.output
    assert f"{key} {bad!r} is not registered" in res.output and "Traceback" not in res.output


def test_a_registered_config_passes(tmp_path: Path) -> None:
    path = write_config(tmp_path, config_dict(tmp_path, merge={"exports": list(EXPORTERS)}))
    check_config(load(path), str(path))


def test_the_docs_list_what_is_registered() -> None:
    assert all(f"``{k}``" in registered("endpoint.kind") for k in BACKENDS)
    assert all(f"``{p}``" in registered("model.profile") for p in profile_names())
    assert all(f"``{e}``" in registered("merge.exports") for e in EXPORTERS)
    assert registered("run_dir") == ""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text(encoding="utf-8")
    assert registered("endpoint.kind").replace("|", "\\|")[:40] in docs
