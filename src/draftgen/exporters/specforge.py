"""The SpecForge exports.

``specforge``: ``records.SpecForgePromptRow`` ``{id, input_ids, loss_mask}``, the pre-tokenized JSONL that
sgl-project/SpecForge's ``data.prompts_path`` takes: exact ids. SpecForge cuts rows to ``data.max_length``
(default 2048): set it to at least ``merge.max_seq_len``.

``specforge-conversations``: ``records.SpecForgeConversationRow`` for SpecForge's ``data.train_data_path``: the
prepared prompt's messages plus the regenerated assistant turn. SpecForge re-tokenizes it with its own chat
template, so its ids are not draftgen's exact ids. Rows with an empty assistant ``content`` are left out."""

from __future__ import annotations

from typing import Any

import msgspec

from draftgen.exporters.base import ExportContext, Exporter, MergedRow
from draftgen.records import (
    SpecForgeConversationRow,
    SpecForgeMessage,
    SpecForgePromptRow,
    Tool,
    ToolCall,
)


def build_specforge(ctx: ExportContext, row: MergedRow, ids: list[int], mask: list[int]) -> msgspec.Struct | str:
    return SpecForgePromptRow(id=row.row_id, input_ids=ids, loss_mask=mask)


#: ``merge.exports: [specforge]`` (registered in ``exporters.base.EXPORTERS`` by this path).
SPECFORGE = Exporter(build_specforge, pretokenized=True, usage="SpecForge data.prompts_path: {file}")


def _json_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _tool_calls_text(calls: list[ToolCall] | None) -> str:
    """OpenAI tool calls, every key written (the records omit defaults such as ``type``)."""
    return _json_text([{"id": c.id, "type": c.type,
                        "function": {"name": c.function.name if c.function else "",
                                     "arguments": c.function.arguments if c.function else ""}}
                       for c in calls or []])


def _tools_text(tools: list[Tool] | None) -> str:
    """OpenAI tool definitions as the chat template sees them (``type`` written; absent fields left out)."""
    out = []
    for t in tools or []:
        entry: dict[str, Any] = {"type": t.type}
        if t.function is not None:
            entry["function"] = msgspec.to_builtins(t.function)
        out.append(entry)
    return _json_text(out)


def _message(role: str, content: str | None, reasoning: str | None, tool_calls: list[ToolCall] | None,
             tool_call_id: str | None) -> SpecForgeMessage:
    return SpecForgeMessage(role=role, content=content or "", reasoning_content=reasoning or "",
                            tool_calls=_tool_calls_text(tool_calls), tool_call_id=tool_call_id or "")


def build_specforge_conversation(ctx: ExportContext, row: MergedRow, ids: list[int],
                            mask: list[int]) -> msgspec.Struct | str:
    prompt = ctx.prompt(row)
    if prompt is None:
        return "no prepared prompt to take the messages from"
    rec = ctx.response(row)
    reasoning, content = rec.reasoning, rec.content
    if row.capped or (content is None and reasoning is None):
        parsed = ctx.profile.parse_output(ids[row.prompt_len:])
        reasoning, content = parsed.reasoning, parsed.content
    conv = [_message(m.role, m.content, m.reasoning_content, m.tool_calls, m.tool_call_id) for m in prompt.messages]
    conv.append(_message("assistant", content, reasoning, None if row.capped else rec.tool_calls, None))
    if any(m.role == "assistant" and not m.content.strip() for m in conv):
        return "an assistant turn with empty content, which SpecForge rejects"
    return SpecForgeConversationRow(id=row.row_id, conversations=conv, tools=_tools_text(prompt.tools))


#: ``merge.exports: [specforge-conversations]`` (registered in ``exporters.base.EXPORTERS`` by this path).
SPECFORGE_CONVERSATIONS = Exporter(
    build_specforge_conversation, pretokenized=False,
    usage="SpecForge data.train_data_path: {file} (re-tokenized by SpecForge: not the exact ids)")
