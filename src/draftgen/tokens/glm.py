"""GLM-4.5 / 4.6 profile (one tokenizer for GLM-4.5, 4.5-Air, 4.5V, 4.6, 4.6V, 4.7).

The prompt ends ``<|assistant|>``; the model writes ``\\n<think>{r}</think>\\n{c}`` (non-thinking: the
prompt ends ``<|assistant|>\\n<think></think>`` and the model writes ``\\n{c}``). Tool calls follow the
content as ``\\n<tool_call>{name}\\n<arg_key>{k}</arg_key>\\n<arg_value>{v}</arg_value>\\n</tool_call>``.

GLM has no end-of-turn token: the model ends an answer by writing the next role marker
(generation_config eos = ``<|endoftext|>`` 151329, ``<|user|>`` 151336, ``<|observation|>`` 151338) and
OpenRouter does not say which. ASSUMPTION (flagged ``assumed_end_token``): ``<|observation|>`` after
tool calls, else ``<|user|>`` — what the template writes next. The folder ships the GLM-4.6 template
(``chat_template.glm-4.6.jinja``); GLM-4.5's is believed identical but for ``tc.arguments or {}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import MappingProxyType

from draftgen.records import ToolCall
from draftgen.tokens.profile import Field, Lit, Piece, Profile, Special, call_name_args

__all__ = ["GLM_TOOL_SPECIALS", "Glm45Profile"]

GLM_TOOL_SPECIALS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


class Glm45Profile(Profile):
    name = "glm-4.5"
    model_families: tuple[str, ...] = ("glm-4.5", "glm-4.6", "glm-4.7")
    # research: providers-and-quirks §2, GLM-4.5's reasoning often begins with a newline
    tool_markup = "glm"
    reasoning_edge = "\n"
    thinking_suffix: tuple[Piece, ...] = (
        Lit("\n"),
        Special("<think>"),
        Field("reasoning"),
        Special("</think>"),
        Field("content", lead="\n"),
    )
    plain_suffix: tuple[Piece, ...] = (Field("content", lead="\n"),)
    think_end = "</think>"
    end_of_turn = ("<|user|>", "<|observation|>", "<|endoftext|>")
    generated_specials = GLM_TOOL_SPECIALS
    thinking_kwarg: str | None = "enable_thinking"
    expected_special_ids = MappingProxyType({
        "<|endoftext|>": 151329,
        "<|user|>": 151336,
        "<|assistant|>": 151337,
        "<|observation|>": 151338,
        "<think>": 151350,
        "</think>": 151351,
        "<tool_call>": 151352,
    })
    template_names = ("chat_template.glm-4.5.jinja", "chat_template.glm-4.6.jinja")
    config_names = ("tokenizer_config.glm-4.5v.json",)
    end_token_assumed = True
    assumptions = (
        "GLM has no end-of-turn token; <|observation|> is assumed after tool calls and <|user|> otherwise",
    )

    def end_token(self, content: str, finish_reason: str | None, tool_calls: Sequence[ToolCall] | None = None) -> str:
        if tool_calls or finish_reason == "tool_calls" or "<tool_call>" in content:
            return "<|observation|>"
        return "<|user|>"

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        flags.append("tool_calls_rendered")
        out = []
        for i, call in enumerate(tool_calls):
            name, args = call_name_args(call)
            try:
                parsed = json.loads(args) if args else {}
            except ValueError:
                parsed = None
            sep = "\n" if (i > 0 or content) else ""
            text = f"{sep}<tool_call>{name}\n"
            if isinstance(parsed, dict):
                for k, v in parsed.items():
                    value = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                    text += f"<arg_key>{k}</arg_key>\n<arg_value>{value}</arg_value>\n"
            else:
                flags.append("tool_arguments_unparsed")
                text += f"{args}\n"
            out.append(text + "</tool_call>")
        return "".join(out)
