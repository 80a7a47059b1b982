"""Prompt sources and format adapters (draftgen.datasets)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from _merge_helpers import write_jsonl
from draftgen.config import DatasetConfig
from draftgen.datasets import (
    RowError,
    bundled_names,
    content_hash,
    detect_format,
    iter_rows,
    parse_glaive,
    prompts_from,
    source_fingerprint,
    to_conversation,
)
from draftgen.errors import ConfigError, InputError
from draftgen.records import Message, Tool, ToolFunction


def _ds(**kw: Any) -> DatasetConfig:
    kw.setdefault("name", "d")
    return DatasetConfig(**kw)


def _rows(ds: DatasetConfig, base: Path) -> list[tuple[str, Any, str | None]]:
    return [(r.where, r.data, r.error) for r in iter_rows(ds, base)]


# -- formats -------------------------------------------------------------------------------------


def test_messages_format_keeps_text_exactly_and_joins_text_parts() -> None:
    row = {"messages": [
        {"role": "system", "content": "  Be brief.\n"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two "}]},
    ], "tools": json.dumps([{"name": "f", "description": "d", "parameters": {"type": "object"}}])}
    conv = to_conversation(row, "auto")
    assert [m.role for m in conv.messages] == ["system", "user"]
    assert conv.messages[0].content == "  Be brief.\n"
    assert conv.messages[1].content == "part one\npart two "
    assert conv.tools == [Tool(function=ToolFunction(name="f", description="d", parameters={"type": "object"}))]


def test_messages_tool_calls_with_dict_arguments_become_json_strings() -> None:
    row = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]}
    conv = to_conversation(row, "messages")
    call = conv.messages[1].tool_calls
    assert call is not None and call[0].function is not None
    assert json.loads(call[0].function.arguments) == {"city": "Oslo"}
    assert conv.messages[2].tool_call_id == "c1"


@pytest.mark.parametrize(("row", "needle"), [
    ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown role"),
    ({"messages": "hello"}, "must be a list"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "image_url"),
    ({"messages": [{"role": "user", "content": 5}]}, "content must be"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "[not json"}, "tools: not valid JSON"),
])
def test_messages_malformed(row: dict[str, Any], needle: str) -> None:
    with pytest.raises(RowError, match=needle):
        to_conversation(row, "auto")


def test_sharegpt_roles_and_function_calls() -> None:
    row = {"system": "sys", "conversations": [
        {"from": "human", "value": "What's 2+2?"},
        {"from": "function_call", "value": json.dumps({"name": "calc", "arguments": {"expr": "2+2"}})},
        {"from": "observation", "value": "4"},
        {"from": "gpt", "value": "It is 4."},
        {"from": "human", "value": "And 3+3?"},
    ]}
    assert detect_format(row) == "sharegpt"
    conv = to_conversation(row, "auto")
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    tc = conv.messages[2].tool_calls
    assert tc is not None and tc[0].function is not None and tc[0].function.name == "calc"
    assert conv.messages[3].tool_call_id == tc[0].id
    with pytest.raises(RowError, match="unknown speaker"):
        to_conversation({"conversations": [{"from": "narrator", "value": "x"}]}, "sharegpt")


def test_alpaca_instruction_input_history_and_output_dropped() -> None:
    row = {"instruction": "Fix the bug.", "input": "def f(): return 1/0", "output": "ORIGINAL ANSWER",
           "history": [["hi", "hello"]]}
    conv = to_conversation(row, "auto")
    assert [m.role for m in conv.messages] == ["user", "assistant", "user"]
    assert conv.messages[-1].content == "Fix the bug.\n\ndef f(): return 1/0"
    assert "ORIGINAL ANSWER" not in json.dumps([m.content for m in conv.messages])
    assert to_conversation({"instruction": "Only this.", "input": ""}, "alpaca").messages[-1].content == "Only this."
    with pytest.raises(RowError, match="non-empty string"):
        to_conversation({"instruction": ""}, "alpaca")


def test_prompt_format_strings_keys_and_field() -> None:
    assert to_conversation("just a prompt", "auto").messages == [Message(role="user", content="just a prompt")]
    conv = to_conversation({"question": "Q?", "system": "S"}, "auto")
    assert [(m.role, m.content) for m in conv.messages] == [("system", "S"), ("user", "Q?")]
    assert to_conversation({"body": "B"}, "prompt", "body").messages[-1].content == "B"
    with pytest.raises(RowError, match="no prompt"):
        to_conversation({"body": "B"}, "prompt")
    with pytest.raises(RowError, match="cannot tell the format"):
        to_conversation({"foo": 1}, "auto")
    with pytest.raises(RowError, match="must be an object or a string"):
        to_conversation(42, "auto")


GLAIVE_SYSTEM = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
    + json.dumps({"name": "calculate_bmi", "description": "BMI", "parameters": {
        "type": "object", "properties": {"weight": {"type": "number"}}, "required": ["weight"]}}, indent=4)
    + "\n\n"
    + json.dumps({"name": "get_time", "description": "Time", "parameters": {"type": "object", "properties": {}}},
                 indent=4)
)
GLAIVE_CHAT = (
    "USER: My weight is 70kg.\n\n\nASSISTANT: <functioncall> {\"name\": \"calculate_bmi\", "
    "\"arguments\": '{\"weight\": 70}'} <|endoftext|>\n\n\nFUNCTION RESPONSE: {\"bmi\": 22.9}\n\n\n"
    "ASSISTANT: Your BMI is 22.9. <|endoftext|>\n\n\nUSER: Thanks! What time is it?\n"
)


def test_glaive_tools_from_system_prompt_and_function_calls() -> None:
    conv = parse_glaive(GLAIVE_SYSTEM, GLAIVE_CHAT)
    assert conv.tools is not None
    assert [t.function.name for t in conv.tools if t.function] == ["calculate_bmi", "get_time"]
    assert conv.tools[0].function is not None and conv.tools[0].function.parameters is not None
    assert conv.tools[0].function.parameters["required"] == ["weight"]
    roles = [m.role for m in conv.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert conv.messages[0].content == ("You are a helpful assistant with access to the following functions. "
                                        "Use them if required")
    call = conv.messages[2].tool_calls
    assert call is not None and call[0].function is not None
    assert (call[0].function.name, call[0].function.arguments) == ("calculate_bmi", '{"weight": 70}')
    assert conv.messages[3].content == '{"bmi": 22.9}' and conv.messages[3].tool_call_id == call[0].id
    assert conv.messages[4].content == "Your BMI is 22.9."
    assert conv.messages[5].content == "Thanks! What time is it?"
    # detect + adapt through the row shape, then the default cut regenerates the last reply
    cut = prompts_from(to_conversation({"system": GLAIVE_SYSTEM, "chat": GLAIVE_CHAT}, "auto"), "last")
    assert cut[0].messages == conv.messages and cut[0].tools == conv.tools


def test_glaive_unparseable_functions_stay_in_the_system_prompt() -> None:
    broken = "SYSTEM: You can use -\n{\"name\": \"f\", \"parameters\": {oops}}"
    conv = parse_glaive(broken, "USER: hi\n")
    assert conv.tools is None
    assert conv.messages[0].content == "You can use -\n{\"name\": \"f\", \"parameters\": {oops}}"
    plain = parse_glaive("SYSTEM: You are a helpful assistant, with no access to external functions.", "USER: hi")
    assert plain.tools is None and plain.messages[0].content.endswith("external functions.")  # type: ignore[union-attr]
    with pytest.raises(RowError, match="no 'USER:'"):
        parse_glaive("SYSTEM: x", "hello there")


# -- turns and hashing ---------------------------------------------------------------------------


def _conv(*turns: tuple[str, str]) -> Any:
    return to_conversation({"messages": [{"role": r, "content": c} for r, c in turns]}, "messages")


def test_multi_turn_last_and_all() -> None:
    conv = _conv(("system", "S"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "a2"))
    (last,) = prompts_from(conv, "last")
    assert [m.content for m in last.messages] == ["S", "u1", "a1", "u2"]  # a2 (the answer regenerated) dropped
    allc = prompts_from(conv, "all")
    assert [[m.content for m in c.messages] for c in allc] == [["S", "u1"], ["S", "u1", "a1", "u2"]]
    assert [c.turn_index for c in allc] == [0, 1]
    # a conversation ending with a user turn: that turn is the last prompt in both modes
    open_end = _conv(("user", "u1"), ("assistant", "a1"), ("user", "u2"))
    assert [c.turn_index for c in prompts_from(open_end, "all")] == [0, 1]
    assert prompts_from(open_end, "last")[0].messages[-1].content == "u2"
    with pytest.raises(RowError, match="no user message"):
        prompts_from(_conv(("system", "S"), ("assistant", "a")), "last")
    with pytest.raises(RowError, match="empty"):
        prompts_from(_conv(("user", "")), "last")


def test_content_hash_is_canonical() -> None:
    t1 = [Tool(function=ToolFunction(name="f", parameters={"a": 1, "b": {"c": 2, "d": 3}}))]
    t2 = [Tool(function=ToolFunction(name="f", parameters={"b": {"d": 3, "c": 2}, "a": 1}))]
    msgs = [Message(role="user", content="hi")]
    assert content_hash(msgs, t1) == content_hash(msgs, t2)
    assert content_hash(msgs, None) == content_hash(msgs, [])
    assert content_hash(msgs, None) != content_hash([Message(role="user", content="hi ")], None)


# -- sources -------------------------------------------------------------------------------------


def test_jsonl_rows_carry_file_line_and_decode_errors(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"prompt": "one"}\n\n{"prompt": "two"\n"three"\r\n')
    rows = _rows(_ds(path="a.jsonl"), tmp_path)
    assert rows[0] == (f"{p}:1", {"prompt": "one"}, None)
    assert rows[1][0] == f"{p}:3" and rows[1][2] is not None and "not valid JSON" in rows[1][2]
    assert rows[2] == (f"{p}:4", "three", None)


def test_gzip_txt_and_folder_with_split_files(tmp_path: Path) -> None:
    folder = tmp_path / "set"
    folder.mkdir()
    with gzip.open(folder / "train-0.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write('"gz prompt"\n')
    (folder / "train-1.txt").write_text("line one\n\nline two\r\n", encoding="utf-8")
    (folder / "test-0.jsonl").write_text('"held out"\n', encoding="utf-8")
    rows = [d for _, d, _ in _rows(_ds(path="set"), tmp_path)]
    assert rows == ["gz prompt", "line one", "line two"]
    assert [d for _, d, _ in _rows(_ds(path="set", split="test"), tmp_path)] == ["held out"]


def test_json_array_keeps_line_numbers_and_object_wrappers(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_text('[\n  {"prompt": "a"},\n  {"prompt":\n     "b"},\n\n  "c"\n]\n', encoding="utf-8")
    assert [(w.rsplit(":", 1)[1], d) for w, d, _ in _rows(_ds(path="a.json"), tmp_path)] == [
        ("2", {"prompt": "a"}), ("3", {"prompt": "b"}), ("6", "c")]
    (tmp_path / "b.json").write_text(json.dumps({"data": ["x", "y"]}), encoding="utf-8")
    assert [d for _, d, _ in _rows(_ds(path="b.json"), tmp_path)] == ["x", "y"]
    (tmp_path / "bad.json").write_text('[\n {"prompt": "a"},\n {"prompt": }\n]', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.json:3: not valid JSON"):
        _rows(_ds(path="bad.json"), tmp_path)


def test_parquet_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"conversations": [[{"from": "human", "value": "hi"}], [{"from": "human", "value": "yo"}]]})
    pq.write_table(table, tmp_path / "s.parquet")
    rows = _rows(_ds(path="s.parquet"), tmp_path)
    assert rows[1][0].endswith("s.parquet#1")
    assert to_conversation(rows[1][1], "auto").messages == [Message(role="user", content="yo")]
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        _rows(_ds(path="junk.parquet"), tmp_path)


def test_missing_path_and_unknown_bundled_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        _rows(_ds(path="nope.jsonl"), tmp_path)
    with pytest.raises(ConfigError, match="bundled sets: chat, code, tools"):
        _rows(_ds(path="bundled:nope"), tmp_path)


def test_bundled_sets_parse_with_their_formats() -> None:
    assert {"chat", "code", "tools"} <= set(bundled_names())
    seen: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for name in ("chat", "code", "tools"):
        rows = list(iter_rows(_ds(path=f"bundled:{name}"), Path(".")))
        counts[name] = len(rows)
        seen[name] = set()
        for r in rows:
            assert r.error is None, r.where
            seen[name].add(detect_format(r.data))
            assert prompts_from(to_conversation(r.data, "auto"), "all")
    assert counts["chat"] >= 110 and counts["code"] >= 90 and counts["tools"] >= 55
    assert seen["tools"] == {"messages", "glaive"} and seen["code"] == {"alpaca", "prompt"}
    tools_rows = [r.data for r in iter_rows(_ds(path="bundled:tools"), Path("."))]
    assert all(to_conversation(r, "auto").tools for r in tools_rows)


def test_fingerprint_changes_with_the_file(tmp_path: Path) -> None:
    p = write_jsonl(tmp_path / "a.jsonl", ["x"])
    ds = _ds(path="a.jsonl")
    before = source_fingerprint(ds, tmp_path)
    assert source_fingerprint(ds, tmp_path) == before
    write_jsonl(p, ["x", "y"])
    assert source_fingerprint(ds, tmp_path) != before


def test_hf_datasets_local_folders(tmp_path: Path) -> None:
    import datasets

    d = datasets.Dataset.from_list([{"instruction": "a", "input": ""}, {"instruction": "b", "input": "c"}])
    d.save_to_disk(str(tmp_path / "saved"))
    rows = _rows(_ds(hf="saved"), tmp_path)
    assert [r[1]["instruction"] for r in rows] == ["a", "b"]
    assert rows[0][0] == "hf:saved[train]#0"
    # a save_to_disk folder given as a plain path goes through datasets as well
    assert len(_rows(_ds(path="saved"), tmp_path)) == 2
    # a folder of data files, by name (datasets' own loader)
    write_jsonl(tmp_path / "hub" / "train.jsonl", [{"prompt": "p1"}, {"prompt": "p2"}])
    rows = _rows(_ds(hf=str(tmp_path / "hub")), tmp_path)
    assert [r[1]["prompt"] for r in rows] == ["p1", "p2"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "train.jsonl").write_text('{"prompt": "p1"}\n{"prompt": oops\n', encoding="utf-8")
    with pytest.raises(InputError, match="could not load the dataset"):
        _rows(_ds(hf=str(tmp_path / "broken")), tmp_path)


def test_hf_without_datasets_package_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match=r"pip install 'draftgen\[hub\]'"):
        _rows(_ds(hf="org/some-dataset"), tmp_path)


def test_hf_hub_name_is_loaded_by_name_subset_and_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The hub itself is out of reach offline; stand in for datasets.load_dataset and check what it is asked for.
    import datasets

    calls: list[tuple[Any, ...]] = []

    def fake_load_dataset(name: str, subset: str | None, *, split: str) -> Any:
        calls.append((name, subset, split))
        return datasets.Dataset.from_list([{"conversations": [{"from": "human", "value": "hi"}]}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = _rows(_ds(hf="org/sharegpt-like", hf_subset="en", split="test"), tmp_path)
    assert calls == [("org/sharegpt-like", "en", "test")]
    assert rows[0][0] == "hf:org/sharegpt-like/en[test]#0"
    assert rows[0][1]["conversations"][0]["value"] == "hi"


# -- bounds: no row is held beyond max_line_bytes --------------------------------------------------------


def test_line_byte_limit_and_context_length_of_the_tokenizer_config() -> None:
    from draftgen.datasets import line_byte_limit
    from draftgen.tokens import context_length_of

    assert line_byte_limit(131_072) == 8 << 20 and line_byte_limit(1_000_000) == 32_000_000
    assert context_length_of({"model_max_length": 32768}) == 32768
    assert context_length_of({"model_max_length": 4096.0}) == 4096
    for absurd in (int(1e30), 1e30, 0, -5, True, "131072", None):
        assert context_length_of({"model_max_length": absurd}) is None
    assert context_length_of({}) is None


def test_jsonl_and_text_lines_over_the_limit_are_error_rows_and_reading_goes_on(tmp_path: Path) -> None:
    ok, long_ = '"' + "a" * 98 + '"', '"' + "b" * 500 + '"'  # 100 bytes (at the limit), 502 bytes
    body = f"{ok}\n{long_}\n{'1' * 101}\n{ok}\n{long_}"  # the last one has no newline
    (tmp_path / "a.jsonl").write_text(body, encoding="utf-8")
    with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(body)
    for name in ("a.jsonl", "a.jsonl.gz"):
        rows = list(iter_rows(_ds(path=name), tmp_path, max_line_bytes=100))
        assert [r.where.rsplit(":", 1)[1] for r in rows] == ["1", "2", "3", "4", "5"]
        assert [r.data for r in rows] == ["a" * 98, None, None, "a" * 98, None]
        assert [r.error for r in rows[1:3]] == [
            "the line is 502 bytes, over the limit of 100 bytes for one row",
            "the line is 101 bytes, over the limit of 100 bytes for one row"]
        assert rows[1].fix is not None and "model.context_length" in rows[1].fix and "--skip-bad" in rows[1].fix
    (tmp_path / "t.txt").write_text("short\n" + "x" * 300 + "\nlast\n", encoding="utf-8")
    rows = list(iter_rows(_ds(path="t.txt"), tmp_path, max_line_bytes=100))
    assert [(r.data, r.error is not None) for r in rows] == [("short", False), (None, True), ("last", False)]


def test_json_array_is_streamed_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from draftgen.datasets import sources

    rng = random.Random(7)

    def value(depth: int = 0) -> Any:
        k = rng.random()
        if depth > 2 or k < 0.4:
            return rng.choice([12345678901, -0.5e-7, 3, True, None, "é漢😀 \\\" \n" * rng.randint(0, 3), ""])
        if k < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 3))}

    for case in range(40):
        rows = [value() for _ in range(rng.randint(0, 8))]
        text, lines = ("\ufeff" if case % 2 else "") + "[\n", []
        for j, row in enumerate(rows):
            text += rng.choice(["", " ", "\n", "\n\n  "])
            lines.append(text.count("\n") + 1)
            text += json.dumps(row, ensure_ascii=case % 3 == 0, indent=1 if case % 4 == 0 else None)
            text += ("," + rng.choice(["", "\n"])) if j < len(rows) - 1 else ""
        text += "\n]\n"
        (tmp_path / "a.json").write_bytes(text.encode())
        for chunk in (1, 2, 5, 64):
            monkeypatch.setattr(sources, "_CHUNK", chunk)
            got = list(iter_rows(_ds(path="a.json"), tmp_path))
            assert [r.data for r in got] == rows, (chunk, text)
            assert [int(r.where.rsplit(":", 1)[1]) for r in got] == lines, (chunk, text)


def test_json_array_element_over_the_limit_and_other_json_errors_name_the_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from draftgen.datasets import sources

    monkeypatch.setattr(sources, "_CHUNK", 16)
    (tmp_path / "a.json").write_text('[\n"ok",\n"' + "x" * 500 + '",\n"never read"\n]', encoding="utf-8")
    rows = iter_rows(_ds(path="a.json"), tmp_path, max_line_bytes=100)
    assert next(rows).data == "ok"
    with pytest.raises(InputError, match=r"a\.json:3: this array element is over the limit of 100 bytes"):
        next(rows)
    (tmp_path / "b.json").write_bytes(b'[\n"a",\n"caf\xe9"\n]')
    with pytest.raises(InputError, match=r"b\.json:3: not UTF-8 text"):
        _rows(_ds(path="b.json"), tmp_path)
    (tmp_path / "c.json").write_text("[\n1,\n" + "[" * 50_000 + "]" * 50_000 + "]", encoding="utf-8")
    with pytest.raises(InputError, match=r"c\.json:3: .*nested too deeply"):
        _rows(_ds(path="c.json"), tmp_path)
    (tmp_path / "d.jsonl").write_text('"a"\n' + "[" * 50_000 + "]" * 50_000 + "\n", encoding="utf-8")
    assert _rows(_ds(path="d.jsonl"), tmp_path)[1] == (f"{tmp_path / 'd.jsonl'}:2", None,
                                                       "the JSON is nested too deeply to read")


def test_parquet_rows_over_the_limit_are_error_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["small one", "y" * 5000, "small two"]})
    pq.write_table(table, tmp_path / "s.parquet")
    rows = _rows(_ds(path="s.parquet"), tmp_path)
    assert [d["prompt"] for _, d, _ in rows] == ["small one", "y" * 5000, "small two"]
    rows = list(iter_rows(_ds(path="s.parquet"), tmp_path, max_line_bytes=1000))
    assert [(r.where.rsplit("#", 1)[1], r.data) for r in rows] == [("0", {"prompt": "small one"}), ("1", None),
                                                                  ("2", {"prompt": "small two"})]
    assert rows[1].error is not None and "over the limit of 1,000 bytes" in rows[1].error


def test_corrupt_gzip_names_the_file(tmp_path: Path) -> None:
    data = bytearray(gzip.compress("".join(f'"prompt {i} {i * 7919 % 104729}"\n' for i in range(20000)).encode()))
    for k in range(2000, 2100):
        data[k] ^= 0x55
    (tmp_path / "z.jsonl.gz").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"z\.jsonl\.gz: cannot read"):
        _rows(_ds(path="z.jsonl.gz"), tmp_path)
