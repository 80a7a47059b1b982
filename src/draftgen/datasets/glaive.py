"""Glaive-style function calling: tools declared as JSON in the system prompt, the chat as one transcript.

Row shape (glaive-function-calling-v2 and its copies)::

    system: "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -
             {"name": ..., "description": ..., "parameters": {...}}   (one or more JSON objects)"
    chat:   "USER: ...\\n\\n\\nASSISTANT: <functioncall> {"name": "f", "arguments": '{"a": 1}'} <|endoftext|>
             \\n\\n\\nFUNCTION RESPONSE: {...}\\n\\n\\nASSISTANT: ... <|endoftext|>"

The function definitions become ``records.Tool`` entries and the system message keeps only the prose
before them. If a definition does not parse, the system prompt is kept whole (tools stay as text) and no
tools are declared. ``<functioncall>`` turns become assistant ``tool_calls`` (the transcript's arguments
are single-quoted, so they are cut out by pattern, not parsed as JSON); ``FUNCTION RESPONSE`` turns become
``tool`` messages answering the preceding call. The ``<|endoftext|>`` markers and the blank-line framing
between turns are transcript syntax and are removed; the text inside a turn is kept as written.
"""

from __future__ import annotations

import json
import re
from typing import Any

from draftgen.datasets.conversation import Conversation, RowError
from draftgen.records import FunctionCall, Message, Tool, ToolCall, ToolFunction

__all__ = ["parse_glaive"]

_TURN = re.compile(r"(?:^|\n)(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_FRAMING = re.compile(r"[ \t\r\n]*(?:<\|endoftext\|>)?[ \t\r\n]*$")
_CALL_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_CALL_ARGS = re.compile(r"\"arguments\"\s*:\s*'(.*)'\s*\}\s*$", re.DOTALL)
_ROLES = {"USER": "user", "ASSISTANT": "assistant", "FUNCTION RESPONSE": "tool"}


def _unframe(text: str) -> str:
    return _FRAMING.sub("", text)


def _system(system: str) -> tuple[str, list[Tool] | None]:
    body = system[len("SYSTEM:"):] if system.startswith("SYSTEM:") else system
    body = body.lstrip(" ")
    start = body.find("{")
    if start < 0:
        return _unframe(body), None
    decoder = json.JSONDecoder()
    tools: list[Tool] = []
    pos = start
    try:
        while pos < len(body):
            obj, end = decoder.raw_decode(body, pos)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError("not a function definition")
            params = obj.get("parameters")
            desc = obj.get("description")
            tools.append(Tool(function=ToolFunction(
                name=obj["name"],
                description=desc if isinstance(desc, str) else None,
                parameters=params if isinstance(params, dict) else None,
            )))
            nxt = body.find("{", end)
            if nxt < 0:
                if body[end:].strip(" \t\r\n"):
                    raise ValueError("text after the function definitions")
                break
            if body[end:nxt].strip(" \t\r\n,"):
                raise ValueError("text between function definitions")
            pos = nxt
    except ValueError:  # json.JSONDecodeError is a ValueError: keep the declarations as text
        return _unframe(body), None
    prose = re.sub(r"[ \t\r\n]*-?[ \t\r\n]*$", "", body[:start])
    return prose, tools


def _call(text: str, index: int) -> ToolCall:
    payload = text.split("<functioncall>", 1)[1]
    payload = _unframe(payload).lstrip(" ")
    name: Any = None
    args: Any = None
    try:
        obj = json.loads(payload)
        if isinstance(obj, dict):
            name, args = obj.get("name"), obj.get("arguments")
    except json.JSONDecodeError:
        m = _CALL_NAME.search(payload)
        name = m.group(1) if m else None
        a = _CALL_ARGS.search(payload)
        args = a.group(1) if a else None
    if not isinstance(name, str):
        raise RowError(f"glaive <functioncall> without a function name: {payload[:60]!r}")
    if args is not None and not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return ToolCall(id=f"call_{index}", function=FunctionCall(name=name, arguments=args or ""))


def parse_glaive(system: str, chat: str) -> Conversation:
    """Parse one glaive row. Raises RowError for a transcript with no turns."""
    prose, tools = _system(system)
    msgs: list[Message] = [Message(role="system", content=prose)] if prose else []
    marks = list(_TURN.finditer(chat))
    if not marks:
        raise RowError("glaive chat has no 'USER:' / 'ASSISTANT:' turns")
    calls = 0
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(chat)
        text = _unframe(chat[m.end():end])
        role = _ROLES[m.group(1)]
        if role == "assistant" and "<functioncall>" in text:
            before = _unframe(text.split("<functioncall>", 1)[0])
            msgs.append(Message(role="assistant", content=before or None, tool_calls=[_call(text, calls)]))
            calls += 1
        elif role == "tool":
            msgs.append(Message(role="tool", content=text, tool_call_id=f"call_{calls - 1}" if calls else None))
        else:
            msgs.append(Message(role=role, content=text))
    return Conversation(messages=msgs, tools=tools)
