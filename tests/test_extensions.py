"""extensions: a config may name only registered profiles, backend kinds, export formats and capture
backends; the CLI refuses the others with one line naming the key and the registered names, and the docs
list them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, load, write_config
from draftgen.backends import BACKENDS
from draftgen.cli import cli
from draftgen.errors import ConfigError
from draftgen.exporters import EXPORTERS
from draftgen.extensions import CONFIG_KEYS, check_config, registered
from draftgen.registry import Registry
from draftgen.target import EXTRACT_BACKENDS
from draftgen.tokens import PROFILES

REGISTRIES: dict[str, Registry[Any]] = {"endpoint.kind": BACKENDS, "model.profile": PROFILES,
                                        "merge.exports": EXPORTERS, "hidden_states.backend": EXTRACT_BACKENDS}


@pytest.mark.parametrize(
    ("sections", "key", "bad"),
    [
        ({"endpoint": {"kind": "tgi"}}, "endpoint.kind", "tgi"),
        ({"model": {"id": "m", "profile": "acme-1", "tokenizer": "bundled:qwen3"}}, "model.profile", "acme-1"),
        ({"merge": {"exports": ["speculators", "eagle-json"]}}, "merge.exports", "eagle-json"),
        ({"hidden_states": {"backend": "sglang"}}, "hidden_states.backend", "sglang"),
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
    assert msg.endswith(f"use one of {', '.join(REGISTRIES[key].names())} (see docs/config.md)")

    res = CliRunner().invoke(cli, ["prepare", str(path)])
    assert res.exit_code == ConfigError.exit_code, res.output
    assert f"{key} {bad!r} is not registered" in res.output and "Traceback" not in res.output


def test_a_registered_config_passes(tmp_path: Path) -> None:
    path = write_config(tmp_path, config_dict(tmp_path, merge={"exports": EXPORTERS.names()}))
    check_config(load(path), str(path))


def test_every_registry_backed_key_is_checked() -> None:
    assert set(CONFIG_KEYS) == set(REGISTRIES)
    assert all(CONFIG_KEYS[key].registry() is reg and reg.key == key for key, reg in REGISTRIES.items())


def test_the_docs_list_what_is_registered() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text(encoding="utf-8")
    for key, reg in REGISTRIES.items():
        assert reg.names() and all(f"``{n}``" in registered(key) for n in reg.names()), key
        row = next(line for line in docs.splitlines() if line.startswith(f"| `{key}` |"))
        assert registered(key).replace("|", "\\|") in row, key
    assert registered("run_dir") == ""
