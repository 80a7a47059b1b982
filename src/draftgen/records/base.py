"""The schema version every record draftgen writes carries (3: train.json says what the drafter trained on; a
hidden set records its target's weights digest, an export its files' sizes and sha256)."""

from __future__ import annotations

SCHEMA_VERSION = 3
