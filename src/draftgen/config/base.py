"""The base of every config section: a msgspec Struct that refuses unknown keys. Pure data."""

from __future__ import annotations

import msgspec


class Section(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass
