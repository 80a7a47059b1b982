"""Rows of the merged-data peer formats (``exports/<format>/``): speculators and SpecForge.

Export rows are read by Arrow's JSON reader (``datasets.load_dataset("json")``), which infers a schema
per 10 MB chunk and fails when a later chunk disagrees: so every key is always written, with one type
(no omit_defaults, "" rather than null, nested lists as JSON text)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from draftgen.records.merged import SpeculatorsMetadata

# Export rows are read by Arrow's JSON reader (``datasets.load_dataset("json")``), which infers a schema
# per 10 MB chunk and fails when a later chunk disagrees: so every key is always written, with one type
# (no omit_defaults, "" rather than null, nested lists as JSON text).


# SpeculatorsMetadata is generated from the merged columns (``records.merged.MERGED_COLUMNS``); the type checker
# sees a plain Struct, msgspec (which resolves the annotation at runtime) the generated one.
if TYPE_CHECKING:
    _SpeculatorsMetadata = msgspec.Struct
else:
    _SpeculatorsMetadata = SpeculatorsMetadata


class SpeculatorsRow(msgspec.Struct):
    """vllm-project/speculators row, as its ``regenerate-responses`` writes it and ``prepare-data`` reads it:
    pre-tokenized ``input_ids`` + ``loss_mask`` (prepare-data keeps only these two), ``primary_id`` the
    conversation key (draftgen's sample_id; ``id`` adds ``#repN`` to weight repeats), ``text`` =
    decode(input_ids), for review only."""

    id: str
    primary_id: str
    input_ids: list[int]
    loss_mask: list[int]
    text: str
    metadata: _SpeculatorsMetadata


class SpecForgePromptRow(msgspec.Struct):
    """sgl-project/SpecForge pre-tokenized online prompt (``data.prompts_path``): exact ids, binary
    ``loss_mask`` of the same non-empty length (``specforge/data/prompt_builder.py``). ``id`` is ignored
    by SpecForge and kept for tracing."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]


class SpecForgeMessage(msgspec.Struct):
    role: str
    content: str
    reasoning_content: str = ""
    tool_calls: str = "[]"  # JSON text of the OpenAI tool calls (SpecForge's parser accepts a string)
    tool_call_id: str = ""


class SpecForgeConversationRow(msgspec.Struct):
    """sgl-project/SpecForge conversation row (``data.train_data_path``, the shape of its
    ``regenerate_train_data.py`` output). SpecForge re-renders and re-tokenizes it with its own chat
    template, so its ids are not draftgen's exact ids."""

    id: str
    conversations: list[SpecForgeMessage]
    tools: str = "[]"  # JSON text of the prompt's tool definitions (row-level, as SpecForge reads it)
    status: str = "success"
