"""Qwen3 profiles: hybrid thinking (Qwen3-0.6B…235B-A22B) and the *-Thinking-2507 models.

Hybrid: the prompt ends ``<|im_start|>assistant\\n``; the model writes
``<think>\\n{r}\\n</think>\\n\\n{c}<|im_end|>``. With thinking off the template already appends
``<think>\\n\\n</think>\\n\\n`` to the prompt, so the model writes ``{c}<|im_end|>``.
2507-Thinking: the prompt ends ``…assistant\\n<think>\\n``; the model writes ``{r}\\n</think>\\n\\n{c}<|im_end|>``.
A provider without a reasoning parser leaves the think block in ``content``: ``repair_fields`` splits it
back (``think_in_content_repaired``).
Ids: ``<|im_end|>`` 151645, ``<think>`` 151667, ``</think>`` 151668. Tool calls are text between
``<tool_call>``/``</tool_call>`` control tokens (151657/151658): ``\\n<tool_call>\\n{"name": …,
"arguments": …}\\n</tool_call>`` after the content (no leading newline on the first when the content is empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from draftgen.records import ToolCall
from draftgen.tokens.profile import Field, Piece, Profile, Special, call_name_args

__all__ = ["Qwen3Profile", "Qwen3ThinkingProfile"]


class Qwen3Profile(Profile):
    name = "qwen3"
    model_families: tuple[str, ...] = ("qwen3",)
    tool_markup = "qwen3"
    thinking_suffix: tuple[Piece, ...] = (
        Special("<think>"),
        Field("reasoning", lead="\n", trail="\n"),
        Special("</think>"),
        Field("content", lead="\n\n"),
    )
    plain_suffix: tuple[Piece, ...] = (Field("content"),)
    think_end = "</think>"
    end_of_turn = ("<|im_end|>",)
    generated_specials = ("<tool_call>", "</tool_call>")
    thinking_kwarg: str | None = "enable_thinking"
    expected_special_ids = MappingProxyType({"<|im_end|>": 151645, "<think>": 151667, "</think>": 151668, "<tool_call>": 151657})

    def repair_fields(self, reasoning: str | None, content: str | None, flags: list[str]) -> tuple[str | None, str | None]:
        # A provider serving Qwen3 without a reasoning parser returns the think block inside the content
        # (reasoning empty, reasoning_tokens 0): "<think>\nR\n</think>\n\nC", or "R\n</think>\n\nC" from
        # the 2507 models, whose prompt opens it. Split back at the end-of-think, flagged; no text is edited.
        if self.thinking and not reasoning and content and self.think_end in content:
            before, _, after = content.partition(self.think_end)
            if before.startswith("<think>"):
                before = before[len("<think>"):]
            flags.append("think_in_content_repaired")
            return before, after
        return reasoning, content

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        flags.append("tool_calls_rendered")
        out = []
        for i, call in enumerate(tool_calls):
            name, args = call_name_args(call)
            sep = "\n" if (i > 0 or content) else ""
            out.append(f'{sep}<tool_call>\n{{"name": "{name}", "arguments": {args or "{}"}}}\n</tool_call>')
        return "".join(out)


class Qwen3ThinkingProfile(Qwen3Profile):
    """Qwen3-*-Thinking-2507: ``<think>\\n`` is part of the prompt; thinking cannot be switched off."""

    name = "qwen3-thinking-2507"
    thinking_suffix: tuple[Piece, ...] = (
        Field("reasoning", trail="\n"),
        Special("</think>"),
        Field("content", lead="\n\n"),
    )

    def render_prompt(self, messages: Any, tools: Any = None, **kw: Any) -> str:
        text = super().render_prompt(messages, tools, **kw)
        if not kw.get("add_generation_prompt", True):
            return text
        # The 2507 template's generation prompt opens the think block; the hybrid template does not.
        return text if text.endswith("<think>\n") else text + "<think>\n"
