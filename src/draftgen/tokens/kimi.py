"""Kimi profiles: Kimi-K2.5 (the flagship) and Kimi-K2-Thinking.

K2.5: the prompt ends ``<|im_assistant|>assistant<|im_middle|><think>``; the model writes
``{r}</think>{c}[<|tool_calls_section_begin|>…<|tool_calls_section_end|>]<|im_end|>``. No junction
whitespace: text the API returns with a leading space is the model's own and is kept.
With thinking off the prompt ends ``…<think></think>`` and the model writes ``{c}<|im_end|>``.
K2-Thinking: the prompt ends ``<|im_assistant|>assistant<|im_middle|>`` and the model writes
``<think>{r}</think>{c}<|im_end|>``.
``<|im_end|>`` is 163586 (not 163533, not [EOS] 163585); ``<think>`` 163606, ``</think>`` 163607.
"""

from __future__ import annotations

from .profile import Field, Profile, Special

__all__ = ["KIMI_TOOL_SPECIALS", "KimiK25Profile", "KimiK2ThinkingProfile"]

KIMI_TOOL_SPECIALS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)


class KimiK25Profile(Profile):
    name = "kimi-k2.5"
    thinking_suffix = (
        Field("reasoning"),
        Special("</think>"),
        Field("content"),
    )
    plain_suffix = (Field("content"),)
    think_end = "</think>"
    end_of_turn = ("<|im_end|>",)
    generated_specials = KIMI_TOOL_SPECIALS
    thinking_kwarg = "thinking"


class KimiK2ThinkingProfile(KimiK25Profile):
    name = "kimi-k2-thinking"
    thinking_suffix = (
        Special("<think>"),
        Field("reasoning"),
        Special("</think>"),
        Field("content"),
    )
