"""The extension points, read in one place: which names a config may use, and their docs.

Each extension point but the phase table is one ``draftgen.registry.Registry`` living beside what it
registers; this module only reads them (docs/extending.md walks through adding to each)::

    registry                                     named by                 a new entry is
    tokens.PROFILES                              model.profile            its module + one register line
    backends.BACKENDS                            endpoint.kind            its module + one register line
    exporters.EXPORTERS                          merge.exports            its builder + one decorator line
    target.EXTRACT_BACKENDS                      hidden_states.backend    its module + one register line
    hidden.exports.HIDDEN_EXPORTERS              export-hidden --format   its sink + one decorator line
    phases.PHASES (the phase table)              (draftgen run)           its package + one register_phase line

``check_config(cfg, where)`` is one loop over the registry-backed config keys (``CONFIG_KEYS``): a config
naming an unregistered profile, backend kind, export format or capture backend is refused with a one-line
ConfigError naming the file, the key and the registered names. No config key names a hidden export format
(``export-hidden --format`` and ``draftgen train`` do; ``export_hidden`` checks them, through its registry,
before reading anything) nor a phase. ``config`` itself checks only the schema: it is the lower layer and
knows no registry, so the CLI runs this check right after loading (a library caller that skips it still
gets the registry's ConfigError when the phase looks the name up).
``registered(key)`` is the docs' list of the names a key accepts (``docgen``). Registries are imported on
first use, so importing this module loads none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftgen.config import RunConfig
from draftgen.errors import ConfigError
from draftgen.registry import Registry

__all__ = ["CONFIG_KEYS", "ConfigKey", "check_config", "registered"]


def _profiles() -> Registry[Any]:
    from draftgen.tokens import PROFILES

    return PROFILES


def _backends() -> Registry[Any]:
    from draftgen.backends import BACKENDS

    return BACKENDS


def _exports() -> Registry[Any]:
    from draftgen.exporters.base import EXPORTERS

    return EXPORTERS


def _capture() -> Registry[Any]:
    from draftgen.target import EXTRACT_BACKENDS

    return EXTRACT_BACKENDS


@dataclass(frozen=True)
class ConfigKey:
    """One registry-backed config key: its registry (imported on use), the names a config gives it, and the
    word docs/config.md puts before the list of registered names."""

    registry: Callable[[], Registry[Any]]
    names: Callable[[RunConfig], list[str]]
    label: str


#: Every config key whose values are a registry's names, in the order ``check_config`` reports them.
CONFIG_KEYS: dict[str, ConfigKey] = {
    "endpoint.kind": ConfigKey(_backends, lambda cfg: [cfg.endpoint.kind], "Kinds"),
    "model.profile": ConfigKey(_profiles, lambda cfg: [cfg.model.profile], "Profiles"),
    "merge.exports": ConfigKey(_exports, lambda cfg: list(cfg.merge.exports), "Formats"),
    "hidden_states.backend": ConfigKey(_capture, lambda cfg: [cfg.hidden_states.backend], "Backends"),
}


def check_config(cfg: RunConfig, where: str) -> None:
    """Every registry-backed name in ``cfg`` is registered; else a ConfigError naming the key and the
    registered names. ``where``: the config file, for the message."""
    for key, ck in CONFIG_KEYS.items():
        registry = ck.registry()
        unknown = [n for n in ck.names(cfg) if n not in registry]
        if unknown:
            raise ConfigError(f"{where}: {key} {unknown[0]!r} is not registered; use one of "
                              f"{', '.join(registry.names())} (see docs/config.md)")


def registered(key: str) -> str:
    """For a key whose values are a registry's names, the docs' sentence listing them (else "")."""
    ck = CONFIG_KEYS.get(key)
    if ck is None:
        return ""
    known = ck.registry().docs()
    if not known:
        return ""
    sep = "; " if any(known.values()) else ", "
    return f"{ck.label}: " + sep.join(f"``{k}``" + (f" ({d})" if d else "") for k, d in known.items()) + "."
