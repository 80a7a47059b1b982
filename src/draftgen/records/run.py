"""The run directory's own records: ``run.json`` (``RunManifest``) and the writer lock's holder."""

from __future__ import annotations

from typing import Any

import msgspec

from draftgen.records.base import SCHEMA_VERSION


class LockHolder(msgspec.Struct, kw_only=True):
    """The text of a run directory's ``.draftgen.lock`` while a writer holds it."""

    pid: int
    command: str
    since: float


class RunManifest(msgspec.Struct, omit_defaults=True):
    """run.json: what produced this run directory. Written atomically; secrets removed from argv."""

    config_hash: str
    config: dict[str, Any]
    argv: list[str]
    versions: dict[str, str]
    git_sha: str | None = None
    created_at: float = 0.0
    schema_version: int = SCHEMA_VERSION
