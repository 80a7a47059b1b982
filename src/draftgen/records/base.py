"""The schema version every record draftgen writes carries (3: train.json says what the drafter trained on; a
hidden set records its target's weights digest, an export its files' sizes and sha256; 4: an accept report per
pass, ``accept/<drafter key>/<pass name>.json``; a hidden index's teacher check records its state comparison's
tolerances and noise)."""

from __future__ import annotations

SCHEMA_VERSION = 4
