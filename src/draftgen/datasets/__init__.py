"""Prompt datasets: sources (local files, bundled sets, Hugging Face) and format adapters.

``iter_rows(ds, base_dir)`` yields the raw rows of a dataset's source; ``to_conversation(row, format,
field)`` adapts one row into a ``Conversation``; ``prompts_from(conversation, multi_turn)`` cuts the
prompt(s) to regenerate; ``content_hash`` keys a prompt for ids and dedupe. ``prepare`` drives these.
"""

from __future__ import annotations

from draftgen.datasets.adapters import FORMATS, detect_format, parse_tools, to_conversation
from draftgen.datasets.conversation import Conversation, CutPrompt, RowError, content_hash, prompts_from
from draftgen.datasets.glaive import parse_glaive
from draftgen.datasets.sources import (
    SourceRow,
    bundled_names,
    iter_rows,
    line_byte_limit,
    source_files,
    source_fingerprint,
    source_label,
    source_where,
)

__all__ = [
    "FORMATS",
    "Conversation",
    "CutPrompt",
    "RowError",
    "SourceRow",
    "bundled_names",
    "content_hash",
    "detect_format",
    "iter_rows",
    "line_byte_limit",
    "parse_glaive",
    "parse_tools",
    "prompts_from",
    "source_files",
    "source_fingerprint",
    "source_label",
    "source_where",
    "to_conversation",
]
