"""The schema version every record draftgen writes carries."""

from __future__ import annotations

SCHEMA_VERSION = 2
