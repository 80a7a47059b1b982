"""Prompt records: ``prepared/<dataset>/prompts.jsonl`` (``PromptRecord``) and ``stats.json`` (``DatasetStats``)."""

from __future__ import annotations

from typing import Any

import msgspec

from draftgen.errors import InputError
from draftgen.records.base import SCHEMA_VERSION


class FunctionCall(msgspec.Struct, omit_defaults=True):
    name: str
    arguments: str = ""


class ToolCall(msgspec.Struct, omit_defaults=True):
    id: str = ""
    type: str = "function"
    function: FunctionCall | None = None


class ToolFunction(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    # A JSON schema object; its shape is the tool author's, so it stays a mapping.
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct, omit_defaults=True):
    type: str = "function"
    function: ToolFunction | None = None


class Message(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None = None
    reasoning_content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class PromptRecord(msgspec.Struct, omit_defaults=True):
    sample_id: str
    dataset: str
    messages: list[Message]
    tools: list[Tool] | None = None
    partition: str = "short"
    prompt_tokens: int | None = None
    content_hash: str = ""
    source: str | None = None  # "file:line" or "hf:name[split]#row"
    turn_index: int | None = None
    round: int = 1  # the round that drew it (records.rounds); 1, the run as configured, is not written
    tags: list[str] | None = None  # its source row's ``datasets[].tags_field``: sorted, unique, none empty
    schema_version: int = SCHEMA_VERSION


#: the tag key of the prompts that carry no tag, in a dataset whose other prompts do (``DatasetStats.tags``,
#: accept's per-tag figures, a round's tag lines); shown as ``UNTAGGED_LABEL``
UNTAGGED = ""
UNTAGGED_LABEL = "(untagged)"


def tag_keys(tags: list[str] | None) -> list[str]:
    """The tag keys a prompt counts under: its tags, or ``UNTAGGED`` when it has none."""
    return list(tags) if tags else [UNTAGGED]


def tag_label(tag: str | None) -> str:
    """How a tag key is shown (``UNTAGGED``: ``UNTAGGED_LABEL``)."""
    return tag or UNTAGGED_LABEL


def check_ids(ids: list[int] | None, vocab_size: int, where: str, name: str) -> None:
    """Refuse token ids outside ``[0, vocab_size)``; ``where`` is ``file:line``."""
    if not ids:
        return
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise InputError(f"{where}: {name} holds id {bad}, outside the tokenizer's vocabulary [0, {vocab_size}); "
                         "the record is corrupt or from another model: remove that line or regenerate it")


class DatasetStats(msgspec.Struct, omit_defaults=True):
    dataset: str
    samples: int = 0
    duplicates_removed: int = 0
    bad_lines_skipped: int = 0
    prompt_tokens: int = 0
    short: int = 0
    long: int = 0
    source: str = ""
    rows_read: int = 0  # source rows read (before multi-turn cuts, dedupe and sampling)
    not_selected: int = 0  # unique prompts left out by max_samples
    # where any prompt of the source carries a tag (``datasets[].tags_field``), per tag key (``tag_keys``: a
    # prompt of several tags counts under each): the prompts written, and the unique prompts left out by
    # max_samples (what a round can still draw for that tag); empty for a dataset without tags
    tags: dict[str, int] = msgspec.field(default_factory=dict)
    tags_not_selected: dict[str, int] = msgspec.field(default_factory=dict)
    max_prompt_tokens: int = 0
    multi_turn: str = ""  # "last" | "all"
    fingerprint: str = ""  # hash of the inputs that decide prompts.jsonl; equal → prepare is a no-op
    schema_version: int = SCHEMA_VERSION


class PromptIdView(msgspec.Struct):
    """``PromptRecord``: the id, content hash and partition of a prepared prompt (indexes of prompts.jsonl)."""

    sample_id: str
    content_hash: str = ""
    partition: str = "short"
    round: int = 1
