"""gpt-oss profile (OpenAI harmony format, o200k_harmony vocabulary).

The prompt ends ``<|start|>assistant``; the model writes
``<|channel|>analysis<|message|>{r}<|end|><|start|>assistant<|channel|>final<|message|>{c}<|return|>``.
Without reasoning (none came back and none was billed) the output is ``<|channel|>final<|message|>{c}<|return|>``.
A tool call replaces the final message: ``<|start|>assistant<|channel|>commentary to=functions.{name}
<|constrain|>json<|message|>{args}<|call|>`` (harmony allows one call per turn; a content preamble goes in a
``commentary`` message before it). Ids: ``<|return|>`` 200002, ``<|call|>`` 200012, ``<|end|>`` 200007.

A provider whose harmony parser broke returns ``content: "analysis…assistantfinal…"`` with no reasoning
(the detokenizer dropped the control tokens); that is split back into the two messages, flagged
``harmony_leak_repaired``.

Prompt pitfall: the system block prints the *current date* and the reasoning effort. Both are template
kwargs: ``reasoning_effort`` (default "medium") and ``current_date`` ("YYYY-MM-DD"); without
``current_date`` the date of ``when`` (the request time) or today is used. History assistant turns are
passed with ``thinking`` (the template's name for reasoning).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from draftgen.records import Message, Tool, ToolCall
from draftgen.tokens.profile import Field, Lit, Piece, Profile, Special, call_name_args

__all__ = ["GptOssProfile"]

_ANALYSIS: tuple[Piece, ...] = (
    Special("<|channel|>"), Lit("analysis"), Special("<|message|>"), Field("reasoning"), Special("<|end|>"),
)
_FINAL: tuple[Piece, ...] = (Special("<|channel|>"), Lit("final"), Special("<|message|>"), Field("content"))
_NEXT: tuple[Piece, ...] = (Special("<|start|>"), Lit("assistant"))


class GptOssProfile(Profile):
    name = "gpt-oss"
    model_families: tuple[str, ...] = ("gpt-oss",)
    tool_markup = None  # harmony tool calls are messages of their own; the emulator writes none
    thinking_suffix: tuple[Piece, ...] = (*_ANALYSIS, *_NEXT, *_FINAL)
    plain_suffix: tuple[Piece, ...] = _FINAL
    think_end = "<|end|>"
    end_of_turn = ("<|return|>", "<|call|>")
    generated_specials = ()
    thinking_kwarg: str | None = None
    think_end_unique = False
    expected_special_ids = MappingProxyType({
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|call|>": 200012,
    })
    assumptions = (
        "the prompt's 'Current date' line uses current_date, else the request time; the provider's own date may differ",
    )

    def message_dict(self, message: Message) -> dict[str, Any]:
        d = super().message_dict(message)
        if "reasoning_content" in d:
            d["thinking"] = d.pop("reasoning_content")
        return d

    def template_context(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None,
        *,
        add_generation_prompt: bool = True,
        when: float | None = None,
    ) -> dict[str, Any]:
        ctx = super().template_context(messages, tools, add_generation_prompt=add_generation_prompt, when=when)
        date = self.template_kwargs.get("current_date")
        if isinstance(date, str):
            ctx["strftime_now"] = lambda fmt: time.strftime(fmt, time.strptime(date, "%Y-%m-%d"))
        ctx.pop("current_date", None)
        return ctx

    @property
    def allowed_output_special_ids(self) -> frozenset[int]:
        tok = self.tokenizer
        return super().allowed_output_special_ids | {tok.special_tokens["<|constrain|>"]}

    def suffix_for(
        self, reasoning: str, content: str, reasoning_tokens: int, tool_calls: Sequence[ToolCall] | None
    ) -> tuple[Piece, ...]:
        analysis = (*_ANALYSIS, *_NEXT) if self.thinking and (reasoning or reasoning_tokens > 0) else ()
        if not tool_calls:
            return (*analysis, *_FINAL)
        name, args = call_name_args(tool_calls[0])
        # Content next to a tool call is a preamble: a commentary message of its own.
        preamble: tuple[Piece, ...] = (
            (Special("<|channel|>"), Lit("commentary"), Special("<|message|>"), Field("content"), Special("<|end|>"), *_NEXT)
            if content
            else ()
        )
        call: tuple[Piece, ...] = (
            Special("<|channel|>"),
            Lit(f"commentary to=functions.{name} "),
            Special("<|constrain|>"),
            Lit("json"),
            Special("<|message|>"),
            Lit(args),
        )
        return (*analysis, *preamble, *call)

    def repair_fields(self, reasoning: str | None, content: str | None, flags: list[str]) -> tuple[str | None, str | None]:
        # A provider whose harmony parser broke returns "analysis{r}assistantfinal{c}" as the content
        # (control tokens dropped by the detokenizer, reasoning null): split it back, flagged.
        if not reasoning and content and content.startswith("analysis") and "assistantfinal" in content:
            r, _, c = content[len("analysis"):].partition("assistantfinal")
            flags.append("harmony_leak_repaired")
            return r, c
        return reasoning, content

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        # The call is part of the layout (suffix_for), not text after the content.
        flags.append("tool_calls_rendered")
        if len(tool_calls) > 1:
            flags.append("tool_calls_truncated")
        return ""

    def end_token(self, content: str, finish_reason: str | None, tool_calls: Sequence[ToolCall] | None = None) -> str:
        return "<|call|>" if tool_calls or finish_reason == "tool_calls" else "<|return|>"
