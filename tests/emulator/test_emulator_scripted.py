"""The emulated model: determinism, profile round trips, non-canonical ids, truncation, text variety."""

from __future__ import annotations

import unicodedata

import pytest

from draftgen.emulator.scenarios import builtin_scenario
from draftgen.emulator.scripted import EmulatedModel
from draftgen.tokens import Profile


@pytest.fixture(scope="module")
def model(qwen3_profile: Profile) -> EmulatedModel:
    sc = builtin_scenario("fast").replace(pool_size=48, non_canonical_rate=0.4, runaway_rate=0.1,
                                          tool_call_rate=0.3, reasoning_tokens_median=300, content_tokens_median=150)
    return EmulatedModel(qwen3_profile, sc, seed=7)


def test_same_key_same_output_and_seed_changes_it(qwen3_profile: Profile, model: EmulatedModel) -> None:
    a = model.output(12345, thinking=True, max_tokens=8192)
    again = EmulatedModel(qwen3_profile, model.scenario, seed=7).output(12345, thinking=True, max_tokens=8192)
    other = EmulatedModel(qwen3_profile, model.scenario, seed=8).output(12345, thinking=True, max_tokens=8192)
    assert a.ids == again.ids and a.content == again.content
    assert other.ids != a.ids


def test_fields_are_the_profile_parse_of_the_true_ids(qwen3_profile: Profile, model: EmulatedModel) -> None:
    for k in range(48):
        out = model.output(k, thinking=True, max_tokens=8192)
        parsed = qwen3_profile.parse_output(out.ids)
        assert (parsed.reasoning, parsed.content) == (out.reasoning, out.content)
        assert out.reasoning_tokens == parsed.reasoning_token_count
        tok = qwen3_profile.tokenizer
        if out.finish_reason == "stop":
            assert out.ids[-1] == tok.special_tokens["<|im_end|>"]
            # Canonical junctions are the model's own: Qwen3 reasoning "\n…\n", content "\n\n…".
            assert out.reasoning is not None and out.reasoning.startswith("\n") and out.reasoning.endswith("\n")
            assert out.content.startswith("\n\n")
            assert out.ids[out.reasoning_tokens - 1] == tok.special_tokens["</think>"]


def test_canonical_samples_rebuild_exactly_and_non_canonical_differ_with_same_text(
        qwen3_profile: Profile, model: EmulatedModel) -> None:
    tok = qwen3_profile.tokenizer
    seen = {True: 0, False: 0}
    for k in range(48):
        out = model.output(k, thinking=True, max_tokens=8192)
        rebuilt = qwen3_profile.build_output(out.reasoning, out.content, out.finish_reason).ids
        assert tok.decode(rebuilt) == tok.decode(out.ids)  # identical text either way
        assert (rebuilt != out.ids) == out.non_canonical
        seen[out.non_canonical] += 1
        if out.non_canonical:
            assert len(out.ids) > len(rebuilt)  # a token was split into two
            assert b"".join(tok.token_bytes(t) for t in out.ids) == b"".join(tok.token_bytes(t) for t in rebuilt)
    assert seen[True] >= 5 and seen[False] >= 5


def test_max_tokens_truncates_as_a_prefix_and_runaways_reach_it(model: EmulatedModel) -> None:
    full = [model.output(k, thinking=True, max_tokens=20_000) for k in range(48)]
    for k, f in enumerate(full):
        cut = model.output(k, thinking=True, max_tokens=64)
        assert len(cut.ids) <= 64
        if len(f.ids) > 64:
            assert cut.finish_reason == "length" and cut.ids == f.ids[:64]
        if f.finish_reason == "length":  # a runaway sample: never ends, any budget is reached
            assert len(f.ids) == 20_000 or len(model.output(k, thinking=True, max_tokens=3000).ids) == 3000
    assert any(f.finish_reason == "length" for f in full)
    lengths = sorted(len(f.ids) for f in full if f.finish_reason == "stop")
    assert lengths[-1] > 2.5 * lengths[len(lengths) // 2]  # long tail


def test_truncated_in_reasoning_has_no_content(qwen3_profile: Profile, model: EmulatedModel) -> None:
    out = model.output(3, thinking=True, max_tokens=5)
    assert out.finish_reason == "length" and out.content == "" and out.reasoning is not None
    assert out.reasoning_tokens == 5


def test_segments_concatenate_to_the_fields(model: EmulatedModel) -> None:
    for k in range(48):
        out = model.output(k, thinking=True, max_tokens=777)
        for size in (1, 4, 32):
            segs = out.segments(size)
            assert "".join(s.text for s in segs if s.field == "reasoning") == (out.reasoning or "")
            assert "".join(s.text for s in segs if s.field == "content") == out.content
            assert all(s.tok0 < s.tok1 for s in segs)


def test_text_variety_nfc_and_tool_markup(model: EmulatedModel) -> None:
    text = ""
    for k in range(48):
        out = model.output(k, thinking=True, max_tokens=20_000)
        text += (out.reasoning or "") + out.content
        assert unicodedata.normalize("NFC", out.content) == out.content
    assert any("\u4e00" <= c <= "\u9fff" for c in text)  # CJK
    assert any(ord(c) >= 0x1F300 for c in text)  # emoji
    assert "```" in text and "   " in text and any(c.isdigit() for c in text)
    assert "<tool_call>\n{" in text and "</tool_call>" in text


def test_plain_variant_has_no_reasoning(model: EmulatedModel) -> None:
    out = model.output(5, thinking=False, max_tokens=4096)
    assert out.reasoning is None and out.reasoning_tokens == 0
    assert 151667 not in out.ids  # no <think>


def test_stop_cuts_content_and_ids_run_through_the_match(qwen3_profile: Profile, model: EmulatedModel) -> None:
    out = next(o for k in range(48) if (o := model.output(k, thinking=True, max_tokens=20_000)).finish_reason == "stop"
               and len(o.content) > 40)
    body = out.content[2:]
    stop = body[10:14]
    cut = model.cut_at_stop(out, [stop], thinking=True)
    assert cut.content == out.content[: out.content.index(stop)]
    decoded = qwen3_profile.tokenizer.decode(cut.ids)
    assert decoded.endswith(stop) or stop in decoded[-40:]
    assert cut.ids == out.ids[: len(cut.ids)] and cut.finish_reason == "stop"


def test_runaways_are_capped_when_the_budget_is_huge(qwen3_profile: Profile) -> None:
    sc = builtin_scenario("fast").replace(pool_size=4, runaway_rate=1.0, max_runaway_tokens=500)
    m = EmulatedModel(qwen3_profile, sc, seed=1)
    small = m.output(2, thinking=True, max_tokens=300)
    big = m.output(2, thinking=True, max_tokens=100_000)
    assert small.finish_reason == "length" and len(small.ids) == 300
    assert big.finish_reason == "stop" and 500 <= len(big.ids) < 2000 and big.content
    assert big.ids[:250] == small.ids[:250]  # the same text, going on
