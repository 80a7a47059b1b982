"""SGLang ``/generate`` and vLLM ``return_token_ids`` modes, and the Kimi-K2.5 profile on a synthetic vocab."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from _emulator_helpers import chat, chat_body, parse_sse, request
from draftgen.emulator import EmulatorOptions, builtin_scenario, start_in_thread
from draftgen.emulator.local_wire import GenerateRequest, parse_generate
from draftgen.emulator.server import RunningEmulator
from draftgen.records import GroundTruthRecord, Message
from draftgen.store import iter_jsonl
from draftgen.tokens import Profile


@pytest.fixture(scope="module")
def gt_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local") / "gt.jsonl"


@pytest.fixture(scope="module")
def emu(gt_path: Path) -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(ground_truth=str(gt_path))) as e:
        yield e


def _generate(emu: RunningEmulator, body: dict[str, object]) -> object:
    r = request(f"{emu.root_url}/generate", "POST", body, key=None)
    assert r.status == 200, r.body
    return r.json()


def test_sglang_text_and_input_ids(emu: RunningEmulator, qwen3_profile: Profile, gt_path: Path) -> None:
    tok = qwen3_profile.tokenizer
    prompt = qwen3_profile.render_prompt([Message(role="user", content="Tell me about tokenizers.")])
    a = _generate(emu, {"text": prompt, "sampling_params": {"max_new_tokens": 4096, "temperature": 0.6}})
    assert isinstance(a, dict)
    ids = a["output_ids"]
    meta = a["meta_info"]
    assert meta["prompt_tokens"] == len(tok.encode(prompt)) and meta["completion_tokens"] == len(ids)
    assert ids[0] == tok.special_tokens["<think>"]
    if meta["finish_reason"]["type"] == "stop":
        assert meta["finish_reason"]["matched"] == ids[-1] == tok.special_tokens["<|im_end|>"]
        assert a["text"] == tok.decode(ids[:-1])
    b = _generate(emu, {"input_ids": tok.encode(prompt), "sampling_params": {"max_new_tokens": 4096,
                                                                             "temperature": 0.6}})
    assert isinstance(b, dict) and b["output_ids"] == ids  # same prompt ids, same output
    gt = {r.generation_id: r for _, r in iter_jsonl(gt_path, GroundTruthRecord)}
    assert gt[meta["id"]].output_ids == ids and gt[meta["id"]].prompt_ids == tok.encode(prompt)


def test_sglang_length_batch_stream_and_thinking_off(emu: RunningEmulator, qwen3_profile: Profile) -> None:
    tok = qwen3_profile.tokenizer
    short = _generate(emu, {"text": "hello", "sampling_params": {"max_new_tokens": 5}})
    assert isinstance(short, dict)
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 5} and len(short["output_ids"]) == 5
    batch = _generate(emu, {"text": ["one", "two", "three"], "sampling_params": {"max_new_tokens": 8}})
    assert isinstance(batch, list) and len(batch) == 3
    assert len({tuple(x["output_ids"]) for x in batch}) > 1  # prompts map onto the pool by hash
    r = request(f"{emu.root_url}/generate", "POST", {"text": "hello", "sampling_params": {"max_new_tokens": 40},
                                                     "stream": True}, key=None)
    s = parse_sse(r.body)
    assert s.done and s.events[-1]["output_ids"][:5] == short["output_ids"]
    assert len(s.events) > 1 and s.events[-1]["meta_info"]["completion_tokens"] == 40
    off = qwen3_profile.render_prompt([Message(role="user", content="hi")]) + "<think>\n\n</think>\n\n"
    plain = _generate(emu, {"text": off, "sampling_params": {"max_new_tokens": 4096}})
    assert isinstance(plain, dict) and tok.special_tokens["</think>"] not in plain["output_ids"]
    assert request(f"{emu.root_url}/generate", "POST", {"sampling_params": {}}, key=None).status == 400


def test_vllm_return_token_ids(emu: RunningEmulator, qwen3_profile: Profile) -> None:
    # current vLLM: message.reasoning / delta.reasoning, never reasoning_content
    messages = [{"role": "user", "content": "vLLM please"}]
    body = {"model": "Qwen/Qwen3-8B", "messages": messages, "max_tokens": 4096, "return_token_ids": True}
    r = request(f"{emu.root_url}/v1/chat/completions", "POST", body, key=None)
    b = r.json()
    assert r.status == 200 and b["object"] == "chat.completion" and b["model"] == "Qwen/Qwen3-8B"
    assert b["prompt_token_ids"] == qwen3_profile.prompt_ids(msgspec.convert(messages, list[Message]))
    ch = b["choices"][0]
    parsed = qwen3_profile.parse_output(ch["token_ids"])
    assert ch["message"]["reasoning"] == parsed.reasoning and ch["message"]["content"] == parsed.content
    assert "reasoning_content" not in ch["message"]
    assert b["usage"]["completion_tokens"] == len(ch["token_ids"])
    plain = request(f"{emu.root_url}/v1/chat/completions", "POST", {**body, "return_token_ids": False}, key=None).json()
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
    assert plain["choices"][0]["message"] == ch["message"]

    s = parse_sse(request(f"{emu.root_url}/v1/chat/completions", "POST",
                          {**body, "stream": True, "stream_options": {"include_usage": True}}, key=None).body)
    assert s.done and s.events[0]["prompt_token_ids"] == b["prompt_token_ids"]
    assert [t for ev in s.events for c in ev["choices"] for t in c.get("token_ids") or []] == ch["token_ids"]
    assert s.text("reasoning") == parsed.reasoning and s.text("content") == parsed.content
    assert s.text("reasoning_content") == ""
    assert s.usage == {k: v for k, v in b["usage"].items() if v is not None}

    off = request(f"{emu.root_url}/v1/chat/completions", "POST",
                  {**body, "chat_template_kwargs": {"enable_thinking": False}}, key=None).json()
    assert off["choices"][0]["message"]["reasoning"] is None
    assert request(f"{emu.root_url}/v1/models", key=None).json()["data"]


def test_vllm_legacy_reasoning_content(qwen3_profile: Profile) -> None:
    # Scenario.vllm_legacy: the shape of vLLM before the rename
    opts = EmulatorOptions(scenario_obj=builtin_scenario("fast").replace(vllm_legacy=True))
    body = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "old vLLM"}], "max_tokens": 4096,
            "return_token_ids": True}
    with start_in_thread(opts) as e:
        b = request(f"{e.root_url}/v1/chat/completions", "POST", body, key=None).json()
        s = parse_sse(request(f"{e.root_url}/v1/chat/completions", "POST", {**body, "stream": True},
                              key=None).body)
        plain = request(f"{e.root_url}/v1/chat/completions", "POST", {**body, "return_token_ids": False},
                        key=None).json()
    m = b["choices"][0]["message"]
    parsed = qwen3_profile.parse_output(b["choices"][0]["token_ids"])
    assert m["reasoning_content"] == parsed.reasoning and "reasoning" not in m
    assert s.text("reasoning_content") == parsed.reasoning and s.text("reasoning") == ""
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_kimi_k25_on_a_synthetic_vocab(tmp_path: Path, tokenizer_assets: Path) -> None:
    from draftgen.tokens import load_profile
    from draftgen.tokens.kimi_tiktoken import write_synthetic_kimi_folder

    folder = write_synthetic_kimi_folder(tmp_path / "kimi", shared_kimi_dir=tokenizer_assets / "kimi-k2.5")
    profile = load_profile("kimi-k2.5", str(folder))
    gt = tmp_path / "gt.jsonl"
    sc = builtin_scenario("fast").replace(tool_call_rate=0.5)
    opts = EmulatorOptions(profile="kimi-k2.5", tokenizer=str(folder), ground_truth=str(gt), scenario_obj=sc)
    with start_in_thread(opts) as e:
        replies = [chat(e.base_url, chat_body(f"kimi {i}", model="moonshotai/kimi-k2.5", max_tokens=30000)).json()
                   for i in range(8)]
    truth = {r.generation_id: r for _, r in iter_jsonl(gt, GroundTruthRecord)}
    spaced = ended = 0
    for b in replies:
        m = b["choices"][0]["message"]
        rec = truth[b["id"]]
        parsed = profile.parse_output(rec.output_ids)
        assert (m["reasoning"], m["content"]) == (parsed.reasoning, parsed.content)
        finish = b["choices"][0]["finish_reason"]
        if finish == "stop":
            ended += 1
            assert rec.output_ids[-1] == 163586 and 163607 in rec.output_ids  # <|im_end|>, </think>
            spaced += m["reasoning"].startswith(" ") + m["content"].startswith(" ")
        if not rec.non_canonical:
            assert profile.build_output(m["reasoning"], m["content"], finish).ids == rec.output_ids
    assert ended >= 5 and spaced >= 4  # Kimi's fields usually begin with a space
    markup = [b["choices"][0]["message"]["content"] for b in replies
              if "<|tool_calls_section_begin|><|tool_call_begin|>functions." in b["choices"][0]["message"]["content"]]
    assert markup and all("<|tool_call_argument_begin|>{" in c for c in markup)


def test_one_generate_parser_for_both_servers() -> None:
    """``local_wire.parse_generate``: what the scripted emulator and the model server accept."""

    def enc(text: str) -> list[int]:
        return [len(text)]

    one = parse_generate({"input_ids": [1, 2], "text": "ignored", "stream": True}, enc)
    assert isinstance(one, GenerateRequest)
    assert (one.prompts, one.max_new, one.batched, one.stream) == ([[1, 2]], [128], False, True)
    batch = parse_generate({"text": ["ab", "c"], "sampling_params": [{"max_new_tokens": 3}, {"top_k": 5}]}, enc)
    assert isinstance(batch, GenerateRequest)
    assert (batch.prompts, batch.max_new, batch.batched) == ([[2], [1]], [3, 128], True)
    assert batch.sampling[1] == {"top_k": 5}
    # An empty prompt: the scripted emulator serves one, a model cannot.
    assert isinstance(parse_generate({"input_ids": []}, enc), GenerateRequest)
    assert parse_generate({"input_ids": []}, enc, allow_empty_ids=False) == (
        "input_ids must be a list of integers (or a list of such lists)")
    assert parse_generate({"input_ids": [[1], [True]]}, enc) == (
        "input_ids must be a list of integers (or a list of such lists)")
    assert parse_generate({"text": 3}, enc) == "text must be a string or a list of strings"
    assert parse_generate({}, enc) == "either text or input_ids is required"
    assert parse_generate({"text": ["a", "b"], "sampling_params": [{}]}, enc) == (
        "sampling_params must be an object or one object per prompt")
    for bad in (0, True, "8"):
        assert parse_generate({"text": "a", "sampling_params": {"max_new_tokens": bad}}, enc) == (
            "sampling_params.max_new_tokens must be a positive integer")
