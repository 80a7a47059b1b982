"""draftgen.registry.Registry, the one shape of every extension point: a lazy ``"module:attr"`` entry is
imported on its first ``get`` and only once, a miss names the key and every registered name (with the nearest
one suggested), a name is registered once unless replaced, and ``unregister`` removes it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftgen.errors import ConfigError
from draftgen.registry import Registry

MODULE = "draftgen_toy_registry_target"


@pytest.fixture
def lazy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module on sys.path that appends one byte to ``<module>.loads`` each time it is executed."""
    (tmp_path / f"{MODULE}.py").write_text(
        "from pathlib import Path\n"
        "with Path(__file__).with_suffix('.loads').open('a') as fh:\n"
        "    fh.write('1')\n"
        "VALUE = {'name': 'toy'}\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield tmp_path / f"{MODULE}.loads"
    sys.modules.pop(MODULE, None)


def _loads(counter: Path) -> int:
    return len(counter.read_text()) if counter.is_file() else 0


def test_a_lazy_entry_is_imported_on_first_get_and_only_once(lazy_module: Path) -> None:
    reg: Registry[dict[str, str]] = Registry("toy.kind", "toy")
    reg.register("lazy", f"{MODULE}:VALUE", doc="imported on use")
    assert MODULE not in sys.modules and _loads(lazy_module) == 0
    assert reg.names() == ["lazy"] and reg.docs() == {"lazy": "imported on use"}  # no import for the docs
    assert "lazy" in reg and len(reg) == 1 and _loads(lazy_module) == 0
    first = reg.get("lazy")
    assert first == {"name": "toy"} and _loads(lazy_module) == 1
    del sys.modules[MODULE]  # a second import would run the module again: get must not import twice
    assert reg.get("lazy") is first and dict(reg.items()) == {"lazy": first} and _loads(lazy_module) == 1


def test_a_miss_names_the_key_the_registered_names_and_the_nearest() -> None:
    reg: Registry[int] = Registry("endpoint.kind", "backend kind")
    reg.register("openrouter", 1)
    reg.register("openai", 2)
    with pytest.raises(ConfigError) as info:
        reg.get("openrouer")
    assert str(info.value) == ("endpoint.kind: backend kind 'openrouer' is not registered (did you mean "
                               "'openrouter'?); use one of openrouter, openai")
    with pytest.raises(ConfigError) as info:
        reg.get("zzz")
    assert str(info.value) == "endpoint.kind: backend kind 'zzz' is not registered; use one of openrouter, openai"
    empty: Registry[int] = Registry("k", "thing")
    with pytest.raises(ConfigError, match=r"use one of \(none\)"):
        empty.get("a")


def test_a_name_is_registered_once_unless_replaced() -> None:
    reg: Registry[int] = Registry("merge.exports", "export format")
    reg.register("a", 1, doc="one")
    reg.register("b", 2)
    with pytest.raises(ConfigError, match=r"^merge\.exports: export format 'a' is registered already$"):
        reg.register("a", 3)
    assert reg.get("a") == 1
    reg.register("a", 3, doc="three", replace=True)
    assert reg.get("a") == 3 and reg.names() == ["a", "b"] and reg.docs()["a"] == "three"  # order kept
    with pytest.raises(ConfigError, match="a lazy entry is 'module:attr'"):
        reg.register("c", "no_colon")  # type: ignore[arg-type]


def test_decorator_registers_and_unregister_removes() -> None:
    reg: Registry[type[object]] = Registry("model.profile", "profile")

    @reg.decorator("toy", doc="a toy")
    class Toy:
        pass

    assert reg.get("toy") is Toy and reg.docs() == {"toy": "a toy"}
    reg.unregister("toy")
    assert "toy" not in reg and len(reg) == 0
    with pytest.raises(ConfigError, match="profile 'toy' is not registered"):
        reg.get("toy")
    with pytest.raises(ConfigError, match="profile 'toy' is not registered"):
        reg.unregister("toy")
    reg.register("toy", Toy)  # a removed name can be registered again
    assert reg.get("toy") is Toy


def test_a_lazy_entry_whose_module_is_missing_fails_on_get_not_on_register() -> None:
    reg: Registry[object] = Registry("hidden_states.backend", "capture backend")
    reg.register("ghost", "draftgen_no_such_module_xyz:Thing")
    assert "ghost" in reg
    with pytest.raises(ImportError):
        reg.get("ghost")
