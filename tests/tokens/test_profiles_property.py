"""Property tests: reconstruction is exact for every canonical sequence, on every profile.

For any text fields: build → ids; parse(ids) gives the fields a server would return; rebuilding from
those gives the same ids, with no junction flag; and the ids decode to exactly the text the rebuild
says they spell (up to the tokenizer's own normalisation). Adversarial text: CJK, emoji, ``\\r\\n``,
trailing spaces, literal control-token strings and tool-call markup."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _tokens_helpers import ADVERSARIAL, ALL_PROFILES, profile

CONTROL_STRINGS = [
    "<think>", "</think>", "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<|end|>", "<|channel|>",
    "<|message|>", "<|return|>", "<|start|>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜tool▁sep｜>", "<|user|>",
    "<|observation|>", "<|tool_call_begin|>", "<|tool_calls_section_begin|>", "[EOS]", "[BOS]", "<arg_key>",
    "<|endoftext|>", "<|reserved_token_163700|>",
]
VARIANTS = [(n, True) for n in ALL_PROFILES] + [(n, False) for n in ("qwen3", "deepseek-v3.1", "glm-4.5", "kimi-k2.5", "gpt-oss")]

pieces = st.one_of(
    st.text(max_size=10),
    st.sampled_from(ADVERSARIAL),
    st.sampled_from(CONTROL_STRINGS),
    st.sampled_from(["\n", "\n\n", " ", "\r\n", "  \n", "\t", "é", "e\u0301", "中", "😀"]),
)
texts = st.lists(pieces, max_size=6).map("".join)
finish = st.sampled_from(["stop", "length", "tool_calls", None])


def _check(name: str, thinking: bool, reasoning: str | None, content: str | None, fr: str | None, rt: int) -> None:
    p = profile(name, thinking)
    tok = p.tokenizer
    rec = p.build_output(reasoning, content, fr, reasoning_tokens=rt)
    assert tok.decode(rec.ids) == tok.normalize(rec.text)
    assert (rec.ids[-1] in p.end_of_turn_ids) == (fr in ("stop", "tool_calls")) if rec.ids else fr not in ("stop", "tool_calls")
    parsed = p.parse_output(rec.ids)
    assert parsed.ended == rec.ended
    again = p.build_output(parsed.reasoning, parsed.content, fr, reasoning_tokens=parsed.reasoning_token_count)
    assert again.ids == rec.ids
    assert "junction_restored" not in again.flags
    assert parsed.reasoning_token_count == rec.reasoning_token_count or not p.thinking


@pytest.mark.parametrize(("name", "thinking"), VARIANTS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reasoning=st.one_of(st.none(), texts), content=st.one_of(st.none(), texts), fr=finish, rt=st.integers(0, 3))
def test_rebuild_is_exact_for_canonical_sequences(
    name: str, thinking: bool, reasoning: str | None, content: str | None, fr: str | None, rt: int
) -> None:
    _check(name, thinking, reasoning, content, fr, rt)


@pytest.mark.parametrize(("name", "thinking"), VARIANTS)
def test_adversarial_texts(name: str, thinking: bool) -> None:
    for a in ADVERSARIAL:
        for b in (ADVERSARIAL[0], a, ""):
            for fr in ("stop", "length"):
                _check(name, thinking, a, b, fr, 0)
                _check(name, thinking, b, a, fr, 5)
