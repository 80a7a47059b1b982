"""Golden tests per profile against the real tokenizer files: prompt endings, control ids, the exact
generated suffix, tool calls, and the reconstruction rules (junctions, truncation, dropped reasoning,
control-token strings inside text)."""

from __future__ import annotations

import pytest

from _tokens_helpers import profile, profile_with
from draftgen.records import FunctionCall, Message, ToolCall

HI = [Message(role="user", content="Hi")]


def call(name: str = "get_weather", args: str = '{"city": "Paris"}', cid: str = "call_1") -> list[ToolCall]:
    return [ToolCall(id=cid, function=FunctionCall(name=name, arguments=args))]


def strs(name: str, ids: list[int], thinking: bool = True) -> list[str]:
    return profile(name, thinking).tokenizer.token_strs(ids)


def test_qwen3_hybrid() -> None:
    p = profile("qwen3")
    assert p.render_prompt(HI).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    off = profile("qwen3", thinking=False)
    assert off.render_prompt(HI).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    rec = p.build_output("\nLet me think.\n", "\n\nDone.\n", "stop")
    assert strs("qwen3", rec.ids) == ["<think>", "\n", "Let", " me", " think", ".\n", "</think>", "\n\n", "Done", ".\n", "<|im_end|>"]
    assert rec.ids[0] == 151667 and rec.ids[6] == 151668 and rec.ids[-1] == 151645
    assert rec.flags == [] and rec.reasoning_token_count == 7
    # A provider trimmed the junctions: the canonical ones come back, flagged; model text is untouched.
    trimmed = p.build_output("Let me think.", "Done.\n", "stop")
    assert trimmed.ids == rec.ids and trimmed.flags == ["junction_restored"]
    # "Done.\n" is one run: ['Done', '.\n'], never 'Done' '.' '\n' from per-field encoding.
    assert strs("qwen3", off.build_output(None, "Done.\n", "stop").ids) == ["Done", ".\n", "<|im_end|>"]
    # Only the missing part of a junction is restored.
    assert p.build_output("r", "\nx", "stop").content_text == "\n\nx"
    calls = p.build_output("r", "", "tool_calls", tool_calls=call())
    assert p.tokenizer.decode(calls.ids).endswith(
        '</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    )
    assert 151657 in calls.ids and {"tool_calls_rendered", "tool_markup"} <= set(calls.flags)


def test_qwen3_thinking_2507() -> None:
    p = profile("qwen3-thinking-2507")
    assert p.render_prompt(HI).endswith("<|im_start|>assistant\n<think>\n")
    rec = p.build_output("Let me think.", "Done.", "stop")
    assert strs("qwen3-thinking-2507", rec.ids) == ["Let", " me", " think", ".\n", "</think>", "\n\n", "Done", ".", "<|im_end|>"]


def test_deepseek_r1() -> None:
    p = profile("deepseek-r1")
    ids = p.prompt_ids(HI)
    assert ids[0] == 0 and ids.count(0) == 1  # BOS from the template, once
    assert ids[-3:] == [128804, 128798, *p.tokenizer.encode("\n")]
    rec = p.build_output("Hmm.", "Answer.", "stop")
    assert strs("deepseek-r1", rec.ids) == ["H", "mm", ".\n", "</think>", "\n\n", "Answer", ".", "<｜end▁of▁sentence｜>"]
    text = p.tokenizer.decode(p.build_output("", "", "tool_calls", tool_calls=call()).ids)
    assert text.endswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                         '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>')


def test_deepseek_v31_thinking_kwarg() -> None:
    on, off = profile("deepseek-v3.1"), profile("deepseek-v3.1", thinking=False)
    assert on.prompt_ids(HI)[-2:] == [128804, 128798]
    assert off.prompt_ids(HI)[-2:] == [128804, 128799]
    rec = on.build_output("Hmm.", "Answer.", "stop")
    assert strs("deepseek-v3.1", rec.ids) == ["H", "mm", ".", "</think>", "Answer", ".", "<｜end▁of▁sentence｜>"]
    assert off.build_output(None, "Answer.", "stop").ids == [*off.tokenizer.encode("Answer."), 1]
    text = on.tokenizer.decode(on.build_output("r", "", "tool_calls", tool_calls=call()).ids)
    assert text == 'r</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'


def test_glm45_assumed_end_token() -> None:
    p = profile("glm-4.5")
    assert p.render_prompt(HI) == "[gMASK]<sop><|user|>\nHi<|assistant|>"
    off = profile("glm-4.5", thinking=False)
    assert off.render_prompt(HI) == "[gMASK]<sop><|user|>\nHi/nothink<|assistant|>\n<think></think>"
    rec = p.build_output("\nreasoning", "Answer.", "stop")
    assert strs("glm-4.5", rec.ids)[:3] == ["\n", "<think>", "\n"]
    assert rec.ids[-1] == 151336 and "assumed_end_token" in rec.flags
    assert p.tokenizer.decode(rec.ids) == "\n<think>\nreasoning</think>\nAnswer.<|user|>"
    tools = p.build_output("r", "", "tool_calls", tool_calls=call())
    assert p.tokenizer.decode(tools.ids) == (
        "\n<think>r</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call><|observation|>"
    )
    assert off.build_output(None, "Answer.", "stop").ids == [*off.tokenizer.encode("\nAnswer."), 151336]
    parsed = p.parse_output(tools.ids)
    assert parsed.ended and parsed.reasoning == "r"


def test_gpt_oss_harmony() -> None:
    p = profile_with("gpt-oss", template_kwargs={"current_date": "2025-06-28", "reasoning_effort": "high"})
    prompt = p.render_prompt(HI)
    assert "Current date: 2025-06-28\n\nReasoning: high\n\n" in prompt and prompt.endswith("<|start|>assistant")
    tok = p.tokenizer
    rec = p.build_output("Think.", "Answer.", "stop")
    assert tok.decode(rec.ids) == "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.<|return|>"
    assert rec.ids[0] == 200005 and rec.ids[-1] == 200002
    assert rec.reasoning_token_count == rec.ids.index(200007) + 1
    parsed = p.parse_output(rec.ids)
    assert (parsed.reasoning, parsed.content, parsed.ended) == ("Think.", "Answer.", True)
    plain = p.build_output(None, "Answer.", "stop")
    assert tok.decode(plain.ids) == "<|channel|>final<|message|>Answer.<|return|>"
    assert p.parse_output(plain.ids).content == "Answer."
    tc = p.build_output("Need a tool.", None, "tool_calls", tool_calls=call())
    assert tok.decode(tc.ids) == (
        "<|channel|>analysis<|message|>Need a tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    assert "tool_calls_rendered" in tc.flags
    cut = p.build_output("Thinking and then", None, "length")
    assert tok.decode(cut.ids) == "<|channel|>analysis<|message|>Thinking and then"
    # History: reasoning_content goes to the template's "thinking" field; final turns drop it.
    hist = [*HI, Message(role="assistant", content="Hello!", reasoning_content="greet"), Message(role="user", content="More")]
    assert "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>" in p.render_prompt(hist)


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1", "deepseek-v3.1", "glm-4.5", "gpt-oss", "kimi-k2.5", "kimi-k2-thinking"])
def test_truncation_rules(name: str) -> None:
    p = profile(name)
    tok = p.tokenizer
    full = p.build_output("reasoning", "content", "stop")
    assert full.ids[-1] in p.end_of_turn_ids and full.ended
    cut = p.build_output("reasoning", "content", "length")
    assert cut.ids[-1] not in p.end_of_turn_ids and "truncated" in cut.flags
    assert p.think_end_id in cut.ids
    inside = p.build_output("reasoning cut off", None, "length")
    assert p.think_end_id not in inside.ids and "truncated_in_reasoning" in inside.flags
    assert inside.reasoning_token_count == len(inside.ids)
    assert tok.decode(inside.ids).endswith("reasoning cut off")
    parsed = p.parse_output(inside.ids)
    assert parsed.in_reasoning and not parsed.ended and parsed.reasoning is not None
    dropped = p.build_output(None, "content", "stop", reasoning_tokens=42)
    assert "reasoning_dropped" in dropped.flags
    assert "reasoning_dropped" not in p.build_output(None, "content", "stop").flags
    for fr in ("content_filter", "error", None):
        assert p.build_output("r", "c", fr).ids[-1] not in p.end_of_turn_ids


def test_never_strips_model_text() -> None:
    p = profile("kimi-k2.5")
    rec = p.build_output(" leading space ", " content with trailing spaces   \n", "stop")
    assert p.tokenizer.decode(rec.ids) == " leading space </think> content with trailing spaces   \n<|im_end|>"
    assert rec.flags == []


def test_control_strings_inside_text() -> None:
    p = profile("qwen3")
    tok = p.tokenizer
    # <|im_end|> has the HF special flag: a server would have dropped a generated one, so it is text.
    rec = p.build_output("r", "say <|im_end|> please", "stop")
    assert rec.ids.count(151645) == 1 and rec.ids[-1] == 151645
    assert "special_in_text:<|im_end|>" in rec.flags
    assert tok.decode(rec.ids).endswith("say <|im_end|> please<|im_end|>")
    # <think> is not flagged special: the model's tokenizer makes it a control id, flagged.
    rec = p.build_output("r", "a <think> b", "stop")
    assert rec.ids.count(151667) == 2 and "special_in_text:<think>" in rec.flags
    # The end-of-think string inside the reasoning field is text (the parser would have split there).
    rec = p.build_output("mention </think> here", "c", "stop")
    assert rec.ids.count(151668) == 1 and "special_in_text:</think>" in rec.flags
    assert p.parse_output(rec.ids).reasoning == "\nmention </think> here\n"
    # Tool-call markup the model wrote into its content stays control ids, flagged as markup.
    rec = p.build_output("r", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "stop")
    assert 151657 in rec.ids and 151658 in rec.ids and "tool_markup" in rec.flags
    assert not [f for f in rec.flags if f.startswith("special_in_text")]


def test_parse_is_the_inverse_of_build() -> None:
    p = profile("qwen3")
    rec = p.build_output("\nr\n", "\n\nc", "stop")
    parsed = p.parse_output(rec.ids)
    assert (parsed.reasoning, parsed.content, parsed.ended, parsed.in_reasoning) == ("\nr\n", "\n\nc", True, False)
    assert parsed.reasoning_token_count == rec.reasoning_token_count
    off = profile("qwen3", thinking=False)
    assert off.parse_output(off.build_output(None, "c", "stop").ids).reasoning is None


def test_parse_accepts_a_non_canonical_literal() -> None:
    """A model may spell a structural literal in other tokens ("anal" "ysis"): it still parses."""
    p = profile("gpt-oss")
    tok = p.tokenizer
    rec = p.build_output("Think.", "Answer.", "stop")
    i = rec.ids.index(tok.encode_ordinary("analysis")[0])
    split = [*rec.ids[:i], *tok.encode_ordinary("anal"), *tok.encode_ordinary("ysis"), *rec.ids[i + 1:]]
    assert len(tok.encode_ordinary("analysis")) == 1 and split != rec.ids
    parsed = p.parse_output(split)
    assert (parsed.reasoning, parsed.content, parsed.ended) == ("Think.", "Answer.", True)


def test_gpt_oss_harmony_leak_is_split_back() -> None:
    p = profile("gpt-oss")
    leaked = p.build_output(None, "analysisThe user greets.assistantfinalHello!", "stop")
    assert "harmony_leak_repaired" in leaked.flags
    assert leaked.ids == p.build_output("The user greets.", "Hello!", "stop").ids
    plain = p.build_output(None, "analysis of the data shows growth", "stop")
    assert "harmony_leak_repaired" not in plain.flags
