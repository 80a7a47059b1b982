"""Kimi profiles: Kimi-K2.5 (the flagship) and Kimi-K2-Thinking.

K2.5: the prompt ends ``<|im_assistant|>assistant<|im_middle|><think>``; the model writes
``{r}</think>{c}[<|tool_calls_section_begin|>…<|tool_calls_section_end|>]<|im_end|>``. No junction
whitespace: text the API returns with a leading space is the model's own and is kept.
With thinking off the prompt ends ``…<think></think>`` and the model writes ``{c}<|im_end|>``.
K2-Thinking: the prompt ends ``<|im_assistant|>assistant<|im_middle|>`` and the model writes
``<think>{r}</think>{c}<|im_end|>``.
``<|im_end|>`` is 163586 (not 163533, not [EOS] 163585); ``<think>`` 163606, ``</think>`` 163607.

K2.5 declares tools in the prompt as TypeScript (``tools_ts_str``, see ``kimi_tools_ts``), falling back
to the template's compact JSON when a schema is outside what the encoder supports. Tool calls are
``<|tool_call_begin|>functions.{name}:{idx}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>``
inside a tool-calls section; a provider that rewrote the call id gets the canonical one (flagged).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from draftgen.records import Message, Tool, ToolCall
from draftgen.tokens.kimi_tools_ts import encode_tools_to_typescript
from draftgen.tokens.profile import Field, Piece, Profile, Special, call_name_args

__all__ = ["KIMI_TOOL_SPECIALS", "KimiK2ThinkingProfile", "KimiK25Profile"]

KIMI_TOOL_SPECIALS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_KIMI_CALL_ID = re.compile(r"functions\.[^:\s]+:\d+")


class KimiK25Profile(Profile):
    name = "kimi-k2.5"
    model_families: tuple[str, ...] = ("kimi-k2.5", "kimi-k2.6")
    # research: providers-and-quirks §2, K2.5's reasoning and content often begin with a space
    tool_markup = "kimi"
    reasoning_edge = " "
    content_edge = " "
    thinking_suffix: tuple[Piece, ...] = (
        Field("reasoning"),
        Special("</think>"),
        Field("content"),
    )
    plain_suffix: tuple[Piece, ...] = (Field("content"),)
    think_end = "</think>"
    end_of_turn = ("<|im_end|>",)
    generated_specials = KIMI_TOOL_SPECIALS
    thinking_kwarg: str | None = "thinking"
    expected_special_ids = MappingProxyType({
        "[BOS]": 163584,
        "[EOS]": 163585,
        "<|im_end|>": 163586,
        "<|im_user|>": 163587,
        "<|im_assistant|>": 163588,
        "<|im_system|>": 163594,
        "<|tool_calls_section_begin|>": 163595,
        "<|im_middle|>": 163601,
        "<think>": 163606,
        "</think>": 163607,
    })
    #: K2.5 sends tools through the TypeScript encoder (``tools_ts_str``); K2-Thinking does not
    typescript_tools = True

    def template_context(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None,
        *,
        add_generation_prompt: bool = True,
        when: float | None = None,
    ) -> dict[str, Any]:
        ctx = super().template_context(messages, tools, add_generation_prompt=add_generation_prompt, when=when)
        if self.typescript_tools and ctx.get("tools") and "tools_ts_str" not in ctx:
            ts = encode_tools_to_typescript(ctx["tools"])
            if ts is not None:
                ctx["tools_ts_str"] = ts
        return ctx

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        flags.append("tool_calls_rendered")
        out = ["<|tool_calls_section_begin|>"]
        for i, call in enumerate(tool_calls):
            name, args = call_name_args(call)
            call_id = call.id
            if not _KIMI_CALL_ID.fullmatch(call_id or ""):
                call_id = f"functions.{name}:{i}"
                if "tool_call_id_assumed" not in flags:
                    flags.append("tool_call_id_assumed")
            out.append(f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>")
        out.append("<|tool_calls_section_end|>")
        return "".join(out)


class KimiK2ThinkingProfile(KimiK25Profile):
    name = "kimi-k2-thinking"
    model_families: tuple[str, ...] = ("kimi-k2",)
    thinking_suffix: tuple[Piece, ...] = (
        Special("<think>"),
        Field("reasoning"),
        Special("</think>"),
        Field("content"),
    )
    typescript_tools = False
