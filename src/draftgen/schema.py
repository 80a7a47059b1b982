"""The schema version of every record draftgen writes (``records`` and ``records_chain``).

Version 2 added ``ResponseRecord.provenance``. A record of a newer version than this is an error (``store``).
"""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION"]

SCHEMA_VERSION = 2
