"""DeepSeek profiles: DeepSeek-R1 and DeepSeek-V3.1 (one BPE model for V3/R1/V3.1).

The template starts with ``{{bos_token}}`` (``<｜begin▁of▁sentence｜>``, id 0); the rendered prompt is
encoded without adding specials, so BOS appears exactly once (a second BOS from
``add_special_tokens=True`` is the classic pitfall). The turn ends with ``<｜end▁of▁sentence｜>`` (id 1).

- R1: the prompt ends ``<｜Assistant｜><think>\\n``; the model writes ``{r}\\n</think>\\n\\n{c}<｜end▁of▁sentence｜>``.
- V3.1 (``thinking`` template kwarg, not ``enable_thinking``): thinking → prompt ends ``<｜Assistant｜><think>``,
  the model writes ``{r}</think>{c}<｜end▁of▁sentence｜>``; non-thinking → prompt ends
  ``<｜Assistant｜></think>``, the model writes ``{c}<｜end▁of▁sentence｜>``.

``<think>``/``</think>`` are 128798/128799. Tool calls: V3.1
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``;
R1 ``…<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\\n```json\\n{args}\\n```<｜tool▁call▁end｜>`` joined by
newlines. Both templates concatenate argument strings, so arguments reach the template as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from draftgen.records import ToolCall
from draftgen.tokens.profile import Field, Piece, Profile, Special, call_name_args

__all__ = ["DEEPSEEK_TOOL_SPECIALS", "DeepSeekR1Profile", "DeepSeekV31Profile"]

DEEPSEEK_TOOL_SPECIALS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)
_EOS = "<｜end▁of▁sentence｜>"


class DeepSeekR1Profile(Profile):
    name = "deepseek-r1"
    model_families: tuple[str, ...] = ("deepseek-r1",)
    tool_markup = None  # the emulator writes no DeepSeek tool-call markup
    thinking_suffix: tuple[Piece, ...] = (
        Field("reasoning", trail="\n"),
        Special("</think>"),
        Field("content", lead="\n\n"),
    )
    plain_suffix: tuple[Piece, ...] = (Field("content"),)
    think_end = "</think>"
    end_of_turn = (_EOS,)
    generated_specials = DEEPSEEK_TOOL_SPECIALS
    thinking_kwarg: str | None = None
    tool_arguments_as_dict = False
    expected_special_ids = MappingProxyType({
        "<｜begin▁of▁sentence｜>": 0,
        _EOS: 1,
        "<think>": 128798,
        "</think>": 128799,
        "<｜User｜>": 128803,
        "<｜Assistant｜>": 128804,
    })

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        flags.append("tool_calls_rendered")
        calls = []
        for call in tool_calls:
            name, args = call_name_args(call)
            calls.append(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>")
        return "<｜tool▁calls▁begin｜>" + "\n".join(calls) + "<｜tool▁calls▁end｜>"


class DeepSeekV31Profile(DeepSeekR1Profile):
    name = "deepseek-v3.1"
    model_families: tuple[str, ...] = ("deepseek-v3.1", "deepseek-chat-v3.1")
    thinking_suffix: tuple[Piece, ...] = (
        Field("reasoning"),
        Special("</think>"),
        Field("content"),
    )
    thinking_kwarg: str | None = "thinking"

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        flags.append("tool_calls_rendered")
        calls = []
        for call in tool_calls:
            name, args = call_name_args(call)
            calls.append(f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>")
        return "<｜tool▁calls▁begin｜>" + "".join(calls) + "<｜tool▁calls▁end｜>"
