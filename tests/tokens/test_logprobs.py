"""Exact ids from per-token logprobs: the content run comes from the sampled tokens, the rest is rebuilt."""

from __future__ import annotations

from dataclasses import dataclass

from _tokens_helpers import profile
from draftgen.tokens.logprobs import (
    TokenLogprob,
    ids_from_token_bytes,
    output_ids_from_logprobs,
    reconstruct_with_logprobs,
    token_bytes_from_logprobs,
)


def _bytes(name: str, ids: list[int]) -> list[bytes]:
    tok = profile(name).tokenizer
    return [tok.token_bytes(i) for i in ids]


def test_kimi_content_from_sampled_tokens_is_exact() -> None:
    p = profile("kimi-k2.5")
    tok = p.tokenizer
    content = " The Peace Hotel is located at the Bund."
    canonical = tok.encode(content)
    # A non-canonical segmentation the model might have sampled: split one multi-byte token.
    i = next(k for k, t in enumerate(canonical) if len(tok.token_bytes(t)) > 2)
    b = tok.token_bytes(canonical[i])
    sampled = [*canonical[:i], tok.bytes_to_id[b[:1]], *tok.encode_ordinary(b[1:].decode()), *canonical[i + 1:]]
    rec = reconstruct_with_logprobs(p, " reasoning.", content, "stop", _bytes("kimi-k2.5", sampled))
    assert rec is not None and rec.ids_source == "logprobs"
    assert rec.ids == [*tok.encode(" reasoning."), 163607, *sampled, 163586]
    assert rec.ids != p.build_output(" reasoning.", content, "stop").ids
    # Without "bytes", the token strings' UTF-8 is used.
    entries = [TokenLogprob(token=tok.token_bytes(t).decode(), logprob=-0.1) for t in canonical]
    rec2 = reconstruct_with_logprobs(p, " reasoning.", content, "stop", token_bytes_from_logprobs(entries))
    assert rec2 is not None and rec2.ids == p.build_output(" reasoning.", content, "stop").ids


def test_qwen3_junction_in_or_out_of_the_logprobs() -> None:
    p = profile("qwen3")
    tok = p.tokenizer
    want = p.build_output("r", "Hello NORTH.", "stop").ids
    with_junction = _bytes("qwen3", tok.encode("\n\nHello NORTH."))
    rec = reconstruct_with_logprobs(p, "r", "Hello NORTH.", "stop", with_junction)
    assert rec is not None and rec.ids == want and "logprobs_junction_assumed" not in rec.flags
    without = _bytes("qwen3", tok.encode("Hello NORTH."))
    rec = reconstruct_with_logprobs(p, "r", "Hello NORTH.", "stop", without)
    assert rec is not None and rec.ids == want and "logprobs_junction_assumed" in rec.flags
    noncanon = [b"Hello", b" N", b"OR", b"TH", b"."]
    rec = reconstruct_with_logprobs(p, "r", "Hello NORTH.", "stop", noncanon)
    assert rec is not None and tok.token_strs(rec.ids[-6:]) == ["Hello", " N", "OR", "TH", ".", "<|im_end|>"]


def test_gives_up_when_logprobs_do_not_describe_the_text() -> None:
    p = profile("kimi-k2.5")
    tok = p.tokenizer
    good = _bytes("kimi-k2.5", tok.encode(" Answer."))
    assert reconstruct_with_logprobs(p, "r", " Answer!", "stop", good) is None  # different text
    assert reconstruct_with_logprobs(p, "r", " Answer.", "stop", [b"\xf8\xff\x00", *good]) is None  # unknown bytes
    # A token that ends inside a UTF-8 sequence: exact with "bytes", lost when only strings came back.
    half = [b" ", b"\xc3", b"\xa9"]
    rec = reconstruct_with_logprobs(p, "r", " é", "stop", half)
    assert rec is not None and tok.decode(rec.ids).endswith(" é<|im_end|>")
    as_strings = token_bytes_from_logprobs([TokenLogprob(token=h.decode("utf-8", "replace")) for h in half])
    assert reconstruct_with_logprobs(p, "r", " é", "stop", as_strings) is None
    from draftgen.records import FunctionCall, ToolCall

    calls = [ToolCall(id="functions.f:0", function=FunctionCall(name="f", arguments="{}"))]
    assert reconstruct_with_logprobs(p, "r", " Answer.", "tool_calls", good, tool_calls=calls) is None


def test_markup_tokens_and_trailing_end_of_turn() -> None:
    p = profile("qwen3")
    tok = p.tokenizer
    content = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    ids = tok.encode("\n\n" + content)
    token_bytes = [*_bytes("qwen3", ids), b"<|im_end|>"]
    rec = reconstruct_with_logprobs(p, "r", content, "stop", token_bytes)
    assert rec is not None and rec.ids == p.build_output("r", content, "stop").ids
    assert ids_from_token_bytes(p, [b"<|im_start|>"]) is None  # not a generated control token


@dataclass
class _Entry:
    token: str
    bytes: list[int] | None


def test_engine_facing_adapter() -> None:
    p = profile("deepseek-v3.1")
    tok = p.tokenizer
    ids = tok.encode("Answer with 中文 and 😀.")
    entries = [_Entry(tok.token_bytes(i).decode("utf-8", "replace"), list(tok.token_bytes(i))) for i in ids]
    rec = output_ids_from_logprobs(p, entries, reasoning="Hmm.", finish_reason="stop")
    assert rec is not None and rec.ids == p.build_output("Hmm.", "Answer with 中文 and 😀.", "stop").ids
    assert output_ids_from_logprobs(p, [], reasoning="x", finish_reason="stop") is None
    assert output_ids_from_logprobs(p, [_Entry("x", [0xFF])], finish_reason="stop") is None
