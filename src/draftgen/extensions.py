"""The four extension points, read in one place: which names a config may use, and their docs.

Each registry lives beside what it registers; this module only reads them (docs/extending.md walks
through adding to each)::

    registry                                   config key        a new entry is
    tokens.PROFILE_TABLE (register_profile)    model.profile     its module + one line in the table
    backends.BACKENDS                          endpoint.kind     its module + one line in the table
    export.EXPORTERS (@register_exporter)      merge.exports     its builder + one decorator line
    phases.PHASES (register_phase)             (draftgen run)    its module + one register_phase line

``check_config(cfg, where)`` refuses a config that names an unregistered profile, backend kind or export
format, with a one-line ConfigError naming the key and the registered names. ``config`` itself checks only
the schema: it is the lower layer and knows no registry, so the CLI runs this check right after loading
(a library caller that skips it still gets the same error when the phase looks the name up).
``registered(key)`` is the docs' list of the names a key accepts (``docgen``).
"""

from __future__ import annotations

from draftgen.config import RunConfig
from draftgen.errors import ConfigError

__all__ = ["check_config", "registered"]


def _known(key: str) -> dict[str, str]:
    """The registered names ``key`` accepts, each with its one-line description ("" when none)."""
    if key == "endpoint.kind":
        from draftgen.backends import BACKENDS

        return {k: b.doc for k, b in BACKENDS.items()}
    if key == "model.profile":
        from draftgen.tokens import profile_names

        return dict.fromkeys(profile_names(), "")
    if key == "merge.exports":
        from draftgen.exporters import EXPORTERS

        return {k: e.doc for k, e in EXPORTERS.items()}
    return {}


def _named(cfg: RunConfig) -> dict[str, list[str]]:
    return {"endpoint.kind": [cfg.endpoint.kind], "model.profile": [cfg.model.profile],
            "merge.exports": list(cfg.merge.exports)}


def check_config(cfg: RunConfig, where: str) -> None:
    """Every registry-backed name in ``cfg`` is registered; else a ConfigError naming the key and the
    registered names. ``where``: the config file, for the message."""
    for key, names in _named(cfg).items():
        known = _known(key)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"{where}: {key} {unknown[0]!r} is not registered; use one of "
                              f"{', '.join(known)} (see docs/config.md)")


def registered(key: str) -> str:
    """For a key whose values are a registry's names, the docs' sentence listing them (else "")."""
    known = _known(key)
    if not known:
        return ""
    label = {"endpoint.kind": "Kinds", "model.profile": "Profiles", "merge.exports": "Formats"}[key]
    sep = "; " if any(known.values()) else ", "
    return f"{label}: " + sep.join(f"``{k}``" + (f" ({d})" if d else "") for k, d in known.items()) + "."
