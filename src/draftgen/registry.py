"""One shape for every extension point: a ``Registry`` maps a name to an object, or to a lazy ``"module:attr"``.

The six registries of draftgen (token profiles, generation backends, merged-data exporters, hidden-state
exporters, capture backends, phases) are each one ``Registry`` living beside what it registers; built-ins are
registered by the same ``register`` call a plugin uses. A lazy entry is imported on its first ``get``, so a
registry of heavy objects (torch backends) costs nothing to import. A miss is a ``ConfigError`` naming the
config key and every registered name, with the nearest one suggested. No I/O beyond those imports.

    PROFILES = Registry[type[Profile]]("model.profile", "profile")
    PROFILES.register("qwen3", "draftgen.tokens.qwen3:Qwen3Profile", doc="…")
    PROFILES.get("qwen3")            # imports draftgen.tokens.qwen3 once, returns Qwen3Profile
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from draftgen.errors import ConfigError

__all__ = ["Entry", "Registry"]

T = TypeVar("T")


@dataclass
class Entry(Generic[T]):
    """One registered name: the object, or its ``"module:attr"`` path until the first ``get``."""

    name: str
    target: T | str
    doc: str = ""

    @property
    def loaded(self) -> bool:
        return not isinstance(self.target, str)


class Registry(Generic[T]):
    """Name → object (or lazy ``"module:attr"``), in registration order.

    ``key``: the config key whose values are this registry's names (``model.profile``), named in errors;
    ``label``: what one entry is, for messages ("backend kind")."""

    def __init__(self, key: str, label: str) -> None:
        self.key = key
        self.label = label
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, target: T | str, *, doc: str = "", replace: bool = False) -> None:
        """Add ``name``. ``target`` is the object, or ``"module:attr"`` imported on the first ``get``.
        A name already registered is a ConfigError unless ``replace``."""
        if isinstance(target, str) and ":" not in target:
            raise ConfigError(f"{self.key}: {name!r} registered as {target!r}; a lazy entry is 'module:attr'")
        if name in self._entries and not replace:
            raise ConfigError(f"{self.key}: {self.label} {name!r} is registered already")
        self._entries[name] = Entry(name, target, doc)

    def decorator(self, name: str, *, doc: str = "") -> Callable[[T], T]:
        """``@REGISTRY.decorator("name")`` above a class or function registers it under ``name``."""

        def add(obj: T) -> T:
            self.register(name, obj, doc=doc)
            return obj

        return add

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a plugin's or a test's entry); a name not registered is a ConfigError."""
        if self._entries.pop(name, None) is None:
            raise ConfigError(self._miss(name))

    def names(self) -> list[str]:
        return list(self._entries)

    def docs(self) -> dict[str, str]:
        """Name → its one-line description ("" when none), without importing lazy entries."""
        return {n: e.doc for n, e in self._entries.items()}

    def get(self, name: str) -> T:
        """The object registered as ``name`` (a lazy entry is imported now, once); else a ConfigError
        listing the registered names."""
        entry = self._entries.get(name)
        if entry is None:
            raise ConfigError(self._miss(name))
        if isinstance(entry.target, str):
            module, _, attr = entry.target.partition(":")
            obj: T = getattr(importlib.import_module(module), attr)
            entry.target = obj
        return entry.target  # type: ignore[return-value]

    def items(self) -> Iterator[tuple[str, T]]:
        """Every (name, object), importing lazy entries."""
        for name in list(self._entries):
            yield name, self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _miss(self, name: str) -> str:
        known = self.names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (f"{self.key}: {self.label} {name!r} is not registered{hint}; "
                f"use one of {', '.join(known) or '(none)'}")
