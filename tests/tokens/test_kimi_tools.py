"""Kimi-K2.5 TypeScript tool declarations (``tools_ts_str``) and how the K2.5/K2-Thinking prompts use them.

Expected strings follow the published byte-exact goldens of the format (schemas covering strings,
optional numbers with constraints, nested objects, arrays, enums, anyOf, type lists, $defs refs,
multi-line and non-ASCII descriptions, empty parameters, unknown types)."""

from __future__ import annotations

from typing import Any

import pytest

from _tokens_helpers import profile
from draftgen.records import Message, Tool, ToolFunction
from draftgen.tokens.kimi_tools_ts import encode_tools_to_typescript

HEAD = "# Tools\n\n## functions\nnamespace functions {\n"


def fn(name: str, params: dict[str, Any] | None, description: str | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"name": name}
    if description is not None:
        f["description"] = description
    if params is not None:
        f["parameters"] = params
    return {"type": "function", "function": f}


def obj(props: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, **extra}


CASES = [
    (
        [fn("delay", obj({"ms": {"type": "integer", "minimum": 0}, "reason": {"type": "string"}}, ["ms"]), "Sleep for some milliseconds.")],
        "// Sleep for some milliseconds.\ntype delay = (_: {\n  // minimum: 0\n  ms: number,\n  reason?: string\n}) => any;\n",
    ),
    (
        [fn("create_user", obj({"user": obj({"name": {"type": "string"}, "age": {"type": "integer"}}, ["name"])}, ["user"]),
            "Create a new user record.")],
        "// Create a new user record.\ntype create_user = (_: {\n  user: {\n    name: string,\n    age?: number\n  }\n}) => any;\n",
    ),
    (
        [fn("tag_items", obj({"tags": {"type": "array", "items": {"type": "string"}}}, ["tags"]), "Apply tags.")],
        "// Apply tags.\ntype tag_items = (_: {\n  tags: Array<string>\n}) => any;\n",
    ),
    (
        [fn("ping", {"type": "object", "properties": {}}), fn("pong", {"type": "object", "properties": {}})],
        "type ping = (_: {}) => any;\ntype pong = (_: {}) => any;\n",
    ),
    (
        [fn("set_status", obj({"status": {"enum": ["active", "paused", "done"]}}, ["status"]))],
        'type set_status = (_: {\n  status: "active" | "paused" | "done"\n}) => any;\n',
    ),
    (
        [fn("set_value", obj({"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, ["v"]))],
        "type set_value = (_: {\n  v: string | number\n}) => any;\n",
    ),
    (
        [fn("store", obj({"x": {"type": ["string", "null"]}}, ["x"]))],
        "type store = (_: {\n  x: string | null\n}) => any;\n",
    ),
    (
        [fn("create_node", {"type": "object",
                            "$defs": {"Node": obj({"id": {"type": "string"}, "label": {"type": "string"}}, ["id"])},
                            "properties": {"node": {"$ref": "#/$defs/Node"}}, "required": ["node"]})],
        "interface Node {\n  id: string,\n  label?: string\n}\ntype create_node = (_: {\n  node: Node\n}) => any;\n",
    ),
    (
        [fn("annotate", obj({"text": {"type": "string", "description": "The text\nto annotate."}}, ["text"]),
            "Annotate the input.\nSupports multiple\nlines.")],
        "// Annotate the input.\n// Supports multiple\n// lines.\ntype annotate = (_: {\n  // The text\n  // to annotate.\n  text: string\n}) => any;\n",
    ),
    (
        [fn("translate", obj({"text": {"type": "string"}}, ["text"]), "翻译 text into 中文.")],
        "// 翻译 text into 中文.\ntype translate = (_: {\n  text: string\n}) => any;\n",
    ),
    ([fn("noop", {"type": "object", "properties": {}})], "type noop = (_: {}) => any;\n"),
    ([fn("weird", obj({"x": {"type": "uuid"}}, ["x"]))], "type weird = (_: {\n  x: uuid\n}) => any;\n"),
    (
        [fn("opts", obj({"n": {"type": "integer", "default": 3}, "flag": {"type": "boolean", "default": True},
                         "m": {"type": "object", "additionalProperties": {"type": "string"}}}, []))],
        "type opts = (_: {\n  // Default: True\n  flag?: boolean,\n  m?: {\n    [k: string]: string\n  },\n  // Default: 3\n  n?: number\n}) => any;\n",
    ),
]


@pytest.mark.parametrize(("tools", "body"), CASES)
def test_typescript_goldens(tools: list[dict[str, Any]], body: str) -> None:
    assert encode_tools_to_typescript(tools) == HEAD + body + "}\n"


def test_unsupported_schemas_fall_back_to_json() -> None:
    assert encode_tools_to_typescript([]) is None
    assert encode_tools_to_typescript([{"type": "_plugin"}]) is None
    bad_ref = [fn("f", obj({"x": {"$ref": "#/$defs/Missing"}}, ["x"]))]
    assert encode_tools_to_typescript(bad_ref) is None
    no_type = [fn("f", obj({"x": {"format": "date"}}, ["x"]))]
    assert encode_tools_to_typescript(no_type) is None
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(50):
        deep = {"type": "array", "items": deep}
    assert "Array<" in (encode_tools_to_typescript([fn("d", obj({"x": deep}, ["x"]))]) or "")


def test_k25_prompt_declares_typescript_and_falls_back_to_compact_json() -> None:
    k25 = profile("kimi-k2.5")
    msgs = [Message(role="user", content="Weather in Paris?")]
    tools = [Tool(function=ToolFunction(name="get_weather", description="Get the weather.",
                                        parameters=obj({"city": {"type": "string"}}, ["city"])))]
    text = k25.render_prompt(msgs, tools)
    assert text.startswith("<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\nnamespace functions {\n"
                           "// Get the weather.\ntype get_weather = (_: {\n  city: string\n}) => any;\n}\n<|im_end|>")
    bad = [Tool(function=ToolFunction(name="f", parameters=obj({"x": {"format": "date"}}, ["x"])))]
    assert k25.render_prompt(msgs, bad).startswith(
        '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"f","parameters":'
    )
    k2t = profile("kimi-k2-thinking")
    assert k2t.render_prompt(msgs, tools).startswith('<|im_system|>tool_declare<|im_middle|>[{"type": "function", ')
