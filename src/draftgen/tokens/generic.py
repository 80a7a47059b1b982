"""Generic profile: any chat-template model, described by declared markers in ``model.profile_options``.

    model:
      profile: generic
      tokenizer: path/to/folder          # tokenizer.json + chat_template.jinja
      profile_options:
        think_start: "<think>"           # control token the model writes before reasoning (omit if the prompt opens it)
        think_end: "</think>"            # control token ending reasoning (omit: the model does not reason)
        end_of_turn: ["<|im_end|>"]      # the first is appended after a finished turn
        reasoning_lead: "\\n"             # canonical junction whitespace
        reasoning_trail: "\\n"
        content_lead: "\\n\\n"
        tool_specials: ["<tool_call>", "</tool_call>"]   # control tokens allowed inside generated text
        thinking_kwarg: enable_thinking  # template variable switching thinking
        expected_ids: {"<|im_end|>": 151645}             # pins checked when loading

The generated suffix is ``[think_start] reasoning_lead{r}reasoning_trail think_end content_lead{c} end_of_turn``
(``content_lead{c} end_of_turn`` without thinking). Structured tool calls cannot be rendered generically;
such outputs are flagged ``tool_calls_unrendered`` (tool markup the model wrote into the content is kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftgen.errors import ConfigError
from draftgen.tokens.profile import Field, Piece, Profile, Special

__all__ = ["GenericProfile"]

_STR_KEYS = ("think_start", "think_end", "reasoning_lead", "reasoning_trail", "content_lead", "thinking_kwarg")
_LIST_KEYS = ("end_of_turn", "tool_specials")
_KEYS = (*_STR_KEYS, *_LIST_KEYS, "expected_ids")


class GenericProfile(Profile):
    name = "generic"
    tool_markup = None  # markers come from model.profile_options; the emulator writes no tool calls

    def configure(self, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - set(_KEYS))
        if unknown:
            raise ConfigError(
                f"model.profile_options: unknown key {unknown[0]!r}; known keys: {', '.join(_KEYS)}"
            )
        for key in _STR_KEYS:
            v = options.get(key)
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"model.profile_options.{key}: expected a string, got {type(v).__name__}")
        for key in _LIST_KEYS:
            v = options.get(key, [])
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigError(f"model.profile_options.{key}: expected a list of strings")
        expected = options.get("expected_ids", {})
        if not isinstance(expected, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in expected.items()):
            raise ConfigError("model.profile_options.expected_ids: expected a mapping of token text to id")
        think_start: str | None = options.get("think_start")
        think_end: str | None = options.get("think_end")
        if think_start and not think_end:
            raise ConfigError("model.profile_options: think_start needs think_end")
        content = Field("content", lead=options.get("content_lead") or "")
        self.plain_suffix = (content,)
        if think_end:
            head: tuple[Piece, ...] = (Special(think_start),) if think_start else ()
            reasoning = Field("reasoning", lead=options.get("reasoning_lead") or "", trail=options.get("reasoning_trail") or "")
            self.thinking_suffix = (*head, reasoning, Special(think_end), content)
        else:
            self.thinking_suffix = (content,)
        self.think_end = think_end
        self.end_of_turn = tuple(options.get("end_of_turn", []))
        self.generated_specials = tuple(options.get("tool_specials", []))
        self.thinking_kwarg = options.get("thinking_kwarg")
        self.expected_special_ids = dict(expected)
