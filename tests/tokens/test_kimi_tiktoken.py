"""Kimi's tokenizer on plain tiktoken: the special-id layout, the ``&&`` split pattern, the chat templates
against the SpecForge oracle, suffix assembly — with a synthetic ranks file and the real config/template —
and, when ``DRAFTGEN_KIMI_TIKTOKEN`` names the real ``tiktoken.model``, the real vocabulary."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import regex

from _tokens_helpers import ASSETS, need_shared, profile, synthetic_kimi_dir
from draftgen.errors import TokenizerError
from draftgen.records import FunctionCall, Message, ToolCall
from draftgen.tokens import load_profile, load_tokenizer
from draftgen.tokens.kimi_tiktoken import (
    KIMI_NUM_BASE_TOKENS,
    KIMI_PAT_STR,
    KIMI_PAT_STR_SHA256,
    KIMI_TIKTOKEN_SHA256,
    parse_tiktoken_ranks,
    synthetic_kimi_ranks,
)
from draftgen.tokens.tokenizer import Tokenizer, _split_long_runs

KIMI = ASSETS / "kimi-k2.5"
TEXTS = [
    "Hello World! The Peace Hotel is located at the intersection of Nanjing East Road.",
    "It's THE answer: we'll see, they'd know. CamelCase and ALLCAPS words.",
    "中文 text 你好世界 mixed with English 東京",
    "numbers 1234567 and 3.14159, emoji 😀🎉 and ümlauts Ärger",
    "code:\n    def f(x):\n        return x  # done.\n\n\n",
    "  spaces   and\ttabs\r\nCRLF  ",
]


def _oracle() -> dict:  # type: ignore[type-arg]
    need_shared()
    return json.loads((KIMI / "kimi_token_oracle.json").read_text(encoding="utf-8"))


def _bpe(ranks: dict[bytes, int], piece: bytes) -> list[int]:
    """Reference byte-pair encoding: merge the lowest-ranked adjacent pair until none is in ``ranks``."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 60))
        if parts[best] + parts[best + 1] not in ranks:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


def test_pattern_is_the_documented_one() -> None:
    assert hashlib.sha256(KIMI_PAT_STR.encode()).hexdigest() == KIMI_PAT_STR_SHA256
    need_shared()
    facts = json.loads((KIMI / "special_tokens.json").read_text(encoding="utf-8"))
    assert facts["pat_str_join"].join(facts["pat_str_parts"]) == KIMI_PAT_STR


def test_synthetic_layout_matches_the_real_special_ids() -> None:
    need_shared()
    data = synthetic_kimi_ranks()
    ranks = parse_tiktoken_ranks(data, where="synthetic")
    assert len(ranks) == KIMI_NUM_BASE_TOKENS == len(data.splitlines())
    tok = load_tokenizer(str(synthetic_kimi_dir())).tokenizer
    assert tok.vocab_size == 163_840
    facts = json.loads((KIMI / "special_tokens.json").read_text(encoding="utf-8"))
    for text, tid in facts["named_special_tokens"].items():
        assert tok.special_tokens[text] == tid, text
    assert tok.special_tokens["<|reserved_token_163589|>"] == 163589
    assert len(tok.special_tokens) == 256
    assert min(tok.special_ids) == 163584 and max(tok.special_ids) == 163839
    # HF "special" flags from the config: think/tool tokens are not special, chat markers are.
    assert 163606 not in tok.hf_special_ids and 163595 not in tok.hf_special_ids
    assert {163586, 163587, 163601} <= tok.hf_special_ids


def test_tiktoken_split_honours_class_intersections() -> None:
    """tiktoken's Rust regex must split like Python ``regex`` in V1 mode (where ``&&`` is intersection)."""
    need_shared()
    ranks = parse_tiktoken_ranks(synthetic_kimi_ranks(), where="synthetic")
    tok = load_tokenizer(str(synthetic_kimi_dir())).tokenizer
    for text in TEXTS:
        want: list[int] = []
        for piece in regex.findall(KIMI_PAT_STR, text, flags=regex.V1):
            want.extend(_bpe(ranks, piece.encode("utf-8")))
        assert tok.encode_ordinary(text) == want, text
        assert tok.decode(tok.encode(text)) == text
    # Without V1, Python's regex misreads "&&" and loses the Latin words: the pitfall the loader avoids.
    assert "".join(regex.findall(KIMI_PAT_STR, "Hello World")) != "Hello World"


def test_specials_inside_text_follow_kimis_encode() -> None:
    tok = load_tokenizer(str(synthetic_kimi_dir())).tokenizer
    assert tok.encode("a<|im_end|>b")[1] == 163586  # allowed_special="all", as Kimi's encode
    assert 163586 not in tok.encode_ordinary("a<|im_end|>b")


def test_templates_render_the_oracle_strings() -> None:
    oracle = _oracle()
    conv_std = [
        Message(role="system", content="You are a helpful assistant."),
        Message(role="user", content="Who are you?"),
        Message(role="assistant", content="My name is Qwen2."),
        Message(role="user", content="How old are you?"),
        Message(role="assistant", content="11 years old."),
    ]
    conv_multi = [
        Message(role="system", content="You are a helpful assistant."),
        Message(role="user", content="Can you recommend a good restaurant in Shanghai?"),
        Message(role="assistant", content="Sure! I think I can help with that.", reasoning_content="hidden"),
        Message(role="user", content="Where is the Peace Hotel?"),
        Message(role="assistant", content="The Peace Hotel is located at the intersection of Nanjing East Road and the Bund."),
    ]
    folder = str(synthetic_kimi_dir())
    instruct = load_profile("kimi-k2-thinking", folder, chat_template=str(ASSETS / "kimi-k2-instruct" / "chat_template.jinja"))
    thinking = profile("kimi-k2-thinking")
    k25 = profile("kimi-k2.5")
    cases = {c["file"].rsplit("/", 1)[1]: c for c in oracle["cases"]}
    assert instruct.render_prompt(conv_std, add_generation_prompt=False) == cases["kimi-k2-instruct_standard.json"]["rendered_text"]
    assert instruct.render_prompt(conv_multi, add_generation_prompt=False) == cases["kimi-k2-instruct_reasoning-multi-turn.json"]["rendered_text"]
    for prof in (thinking, k25):  # history assistant turns render as <think></think>{content}
        assert prof.render_prompt(conv_std, add_generation_prompt=False) == cases["kimi-k2-thinking_standard.json"]["rendered_text"]
        assert prof.render_prompt(conv_multi, add_generation_prompt=False) == cases["kimi-k2-thinking_reasoning-multi-turn.json"]["rendered_text"]


def test_oracle_control_ids_and_text_runs() -> None:
    """With the synthetic vocabulary the control ids land where the real ones do and every text run
    between them decodes to the oracle's strings."""
    oracle = _oracle()
    text_of = {tuple(v): k for k, v in oracle["text_to_ids"].items()}
    tok = load_tokenizer(str(synthetic_kimi_dir())).tokenizer
    for case in oracle["cases"]:
        ours = tok.encode(case["rendered_text"])
        want = case["input_ids"]
        assert [t for t in ours if t >= 163584] == [t for t in want if t >= 163584]

        def runs(ids: list[int]) -> list[list[int]]:
            out: list[list[int]] = [[]]
            for t in ids:
                if t >= 163584:
                    out.append([])
                else:
                    out[-1].append(t)
            return [r for r in out if r]

        assert [tok.decode(r) for r in runs(ours)] == [text_of[tuple(r)] for r in runs(want)]


def test_generation_prompts_and_suffix_assembly() -> None:
    k25, k2t = profile("kimi-k2.5"), profile("kimi-k2-thinking")
    k25_off = profile("kimi-k2.5", thinking=False)
    msgs = [Message(role="user", content="Hi")]
    tail = [163588, *k25.tokenizer.encode("assistant"), 163601, 163606]
    assert k25.prompt_ids(msgs)[-len(tail):] == tail
    assert k25_off.render_prompt(msgs).endswith("<|im_middle|><think></think>")
    assert k2t.render_prompt(msgs).startswith("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.")
    assert k2t.render_prompt(msgs).endswith("<|im_assistant|>assistant<|im_middle|>")

    tok = k25.tokenizer
    rec = k25.build_output(" I reason.", " Answer.", "stop")
    assert rec.ids == [*tok.encode(" I reason."), 163607, *tok.encode(" Answer."), 163586]
    assert rec.flags == [] and rec.reasoning_token_count == len(tok.encode(" I reason.")) + 1
    assert k2t.build_output(" I reason.", " Answer.", "stop").ids[0] == 163606
    assert k25_off.build_output(None, "Answer.", "stop").ids == [*tok.encode("Answer."), 163586]
    calls = [ToolCall(id="functions.get_weather:0", function=FunctionCall(name="get_weather", arguments='{"city":"Paris"}'))]
    rec = k25.build_output("Need weather.", "", "tool_calls", tool_calls=calls)
    tail = rec.ids[rec.ids.index(163607) + 1:]
    assert tail[0] == 163595 and tail[1] == 163597 and tail[-2:] == [163596, 163586]
    assert tok.decode(tail[2:tail.index(163598)]) == "functions.get_weather:0"
    assert "tool_call_id_assumed" not in rec.flags and "tool_calls_rendered" in rec.flags
    rewritten = [ToolCall(id="call_abc", function=FunctionCall(name="get_weather", arguments="{}"))]
    rec = k25.build_output("", "", "tool_calls", tool_calls=rewritten)
    assert "tool_call_id_assumed" in rec.flags and "functions.get_weather:0" in tok.decode(rec.ids)


def test_ranks_file_errors() -> None:
    good = b"\n".join(base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256))
    assert len(parse_tiktoken_ranks(good, where="x")) == 256
    with pytest.raises(TokenizerError, match="single-byte tokens missing"):
        parse_tiktoken_ranks(b"QQ== 0\n", where="x")
    with pytest.raises(TokenizerError, match="listed twice"):
        parse_tiktoken_ranks(good + b"\nQQ== 256\n", where="x")
    with pytest.raises(TokenizerError, match=r"not exactly 0..256"):
        parse_tiktoken_ranks(good + b"\nQUI= 900\n", where="x")
    with pytest.raises(TokenizerError, match="x:1: expected 'base64 rank'"):
        parse_tiktoken_ranks(b"onlyonefield\n", where="x")
    with pytest.raises(TokenizerError, match="empty ranks file"):
        parse_tiktoken_ranks(b"\n\n", where="x")


def test_long_runs_are_chunked_like_kimi() -> None:
    text = "a" * 30_000 + " " * 3 + "b" * 10
    chunks = list(_split_long_runs(text, 25_000))
    assert "".join(chunks) == text
    assert [len(c) for c in chunks] == [25_000, 5_013]
    tok = load_tokenizer(str(synthetic_kimi_dir())).tokenizer
    raw = tok.raw  # type: ignore[attr-defined]
    assert tok.encode(text) == raw.encode(text[:25_000]) + raw.encode(text[25_000:])


REAL = os.environ.get("DRAFTGEN_KIMI_TIKTOKEN")


@pytest.mark.skipif(not REAL, reason="set DRAFTGEN_KIMI_TIKTOKEN to the real Kimi tiktoken.model to run")
def test_real_kimi_vocabulary(tmp_path: Path) -> None:
    need_shared()
    src = Path(str(REAL))
    assert hashlib.sha256(src.read_bytes()).hexdigest() == KIMI_TIKTOKEN_SHA256
    shutil.copyfile(src, tmp_path / "tiktoken.model")
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(KIMI / name, tmp_path / name)
    prof = load_profile("kimi-k2.5", str(tmp_path), sha256=KIMI_TIKTOKEN_SHA256)
    tok: Tokenizer = prof.tokenizer
    oracle = _oracle()
    for text, ids in oracle["text_to_ids"].items():
        assert tok.encode(text) == ids, text
    for case in oracle["cases"]:
        assert tok.encode(case["rendered_text"]) == case["input_ids"], case["file"]
