"""Format adapters: one decoded source row → ``Conversation``.

Formats (``DatasetConfig.format``; ``auto`` picks one per row from its keys):

    messages   {"messages": [{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?}], "tools"?}
               (also "conversations"/"conversation" holding role/content dicts; content may be a list of
               {"type": "text", "text"} parts, joined with "\\n")
    sharegpt   {"conversations": [{"from": "human"|"gpt"|"system"|"function_call"|"observation", "value"}],
               "system"?, "tools"?}
    alpaca     {"instruction", "input"?, "output"?, "system"?, "history"?: [[user, assistant], ...]}
    prompt     a JSON string, or {"prompt"|"question"|"text"|"query": str}; "prompt" may also hold messages
    glaive     {"system": "SYSTEM: ... {function json} ...", "chat": "USER: ... ASSISTANT: ..."}

``field`` names the key holding the conversation or prompt when it is not the usual one. Tools may be a
list or a JSON string of a list; bare ``{name, description, parameters}`` entries are wrapped as
``{"type": "function", "function": ...}``. Adapters raise ``RowError`` with what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from draftgen.datasets.conversation import Conversation, RowError
from draftgen.datasets.glaive import parse_glaive
from draftgen.records import FunctionCall, Message, Tool, ToolCall, ToolFunction

__all__ = ["FORMATS", "detect_format", "parse_tools", "to_conversation"]

_ROLE_ALIASES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bot": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
    "ipython": "tool",
}
_CONV_KEYS = ("messages", "conversations", "conversation")
_PROMPT_KEYS = ("prompt", "question", "text", "query")


def _text(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts: list[str] = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", None) and isinstance(
                part.get("text"), str
            ):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RowError(f"{what}: content part of type {kind!r} is not supported (text only)")
        return "\n".join(parts)
    raise RowError(f"{what}: content must be a string or a list of text parts, not {type(value).__name__}")


def _arguments(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _tool_calls(value: Any, what: str) -> list[ToolCall] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise RowError(f"{what}: tool_calls must be a list")
    out: list[ToolCall] = []
    for j, tc in enumerate(value):
        if not isinstance(tc, dict):
            raise RowError(f"{what}: tool_calls[{j}] must be an object")
        fn = tc.get("function", tc)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RowError(f"{what}: tool_calls[{j}] has no function name")
        out.append(
            ToolCall(
                id=str(tc.get("id") or f"call_{j}"),
                type=str(tc.get("type") or "function"),
                function=FunctionCall(name=fn["name"], arguments=_arguments(fn.get("arguments"))),
            )
        )
    return out


def parse_tools(value: Any, what: str = "tools") -> list[Tool] | None:
    """A tools list (or its JSON string) → ``records.Tool``; bare function objects are wrapped."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(f"{what}: not valid JSON ({exc.msg})") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise RowError(f"{what}: must be a list of tool definitions")
    out: list[Tool] = []
    for j, t in enumerate(value):
        if not isinstance(t, dict):
            raise RowError(f"{what}[{j}]: must be an object")
        fn = t.get("function") if "function" in t else t
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RowError(f"{what}[{j}]: a tool needs a function name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise RowError(f"{what}[{j}]: parameters must be a JSON schema object")
        desc = fn.get("description")
        out.append(
            Tool(
                type=str(t.get("type") or "function"),
                function=ToolFunction(
                    name=fn["name"], description=desc if isinstance(desc, str) else None, parameters=params
                ),
            )
        )
    return out or None


def _from_messages(items: Any, tools: Any) -> Conversation:
    if not isinstance(items, list):
        raise RowError("messages must be a list")
    msgs: list[Message] = []
    for i, m in enumerate(items):
        what = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RowError(f"{what}: must be an object with role and content")
        role_raw = m.get("role")
        role = _ROLE_ALIASES.get(role_raw) if isinstance(role_raw, str) else None
        if role is None:
            raise RowError(f"{what}: unknown role {role_raw!r}")
        name = m.get("name")
        tcid = m.get("tool_call_id")
        msgs.append(
            Message(
                role=role,
                content=_text(m.get("content"), what),
                name=name if isinstance(name, str) else None,
                tool_calls=_tool_calls(m.get("tool_calls"), what),
                tool_call_id=str(tcid) if tcid is not None else None,
            )
        )
    return Conversation(messages=msgs, tools=parse_tools(tools))


def _from_sharegpt(items: Any, system: Any, tools: Any) -> Conversation:
    if not isinstance(items, list):
        raise RowError("conversations must be a list")
    msgs: list[Message] = []
    if isinstance(system, str) and system:
        msgs.append(Message(role="system", content=system))
    calls = 0
    for i, turn in enumerate(items):
        what = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise RowError(f"{what}: must be an object with from and value")
        frm = turn.get("from")
        value = _text(turn.get("value"), what)
        if frm == "function_call":
            try:
                call = json.loads(value or "")
            except json.JSONDecodeError:
                raise RowError(f"{what}: function_call value is not JSON") from None
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise RowError(f"{what}: function_call needs a name")
            tc = ToolCall(id=f"call_{calls}", function=FunctionCall(name=call["name"],
                                                                     arguments=_arguments(call.get("arguments"))))
            calls += 1
            msgs.append(Message(role="assistant", content=None, tool_calls=[tc]))
            continue
        role = _ROLE_ALIASES.get(frm) if isinstance(frm, str) else None
        if role is None:
            raise RowError(f"{what}: unknown speaker {frm!r}")
        tcid = f"call_{calls - 1}" if role == "tool" and calls else None
        msgs.append(Message(role=role, content=value, tool_call_id=tcid))
    return Conversation(messages=msgs, tools=parse_tools(tools))


def _from_alpaca(row: dict[str, Any], field: str | None) -> Conversation:
    instruction = row.get(field or "instruction")
    if not isinstance(instruction, str) or not instruction:
        raise RowError(f"{field or 'instruction'!r} must be a non-empty string")
    extra = row.get("input")
    if extra is not None and not isinstance(extra, str):
        raise RowError("'input' must be a string")
    msgs: list[Message] = []
    system = row.get("system")
    if isinstance(system, str) and system:
        msgs.append(Message(role="system", content=system))
    history = row.get("history")
    if history:
        if not isinstance(history, list):
            raise RowError("'history' must be a list of [user, assistant] pairs")
        for j, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise RowError(f"history[{j}] must be a [user, assistant] pair of strings")
            msgs.append(Message(role="user", content=pair[0]))
            msgs.append(Message(role="assistant", content=pair[1]))
    msgs.append(Message(role="user", content=f"{instruction}\n\n{extra}" if extra else instruction))
    return Conversation(messages=msgs)


def _from_prompt(row: Any, field: str | None) -> Conversation:
    if isinstance(row, str):
        value: Any = row
    elif isinstance(row, dict):
        keys = (field,) if field else _PROMPT_KEYS
        value = next((row[k] for k in keys if k in row), None)
        if value is None:
            raise RowError(f"no prompt: expected one of the keys {', '.join(keys)}")
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return _from_messages(value, row.get("tools"))
    else:
        raise RowError(f"a prompt row must be a string or an object, not {type(row).__name__}")
    if not isinstance(value, str) or not value:
        raise RowError("the prompt must be a non-empty string")
    system = row.get("system") if isinstance(row, dict) else None
    msgs = [Message(role="system", content=system)] if isinstance(system, str) and system else []
    msgs.append(Message(role="user", content=value))
    return Conversation(messages=msgs)


def detect_format(row: Any, field: str | None = None) -> str:
    """The format of one row, from its shape. Raises RowError when nothing fits."""
    if isinstance(row, str):
        return "prompt"
    if not isinstance(row, dict):
        raise RowError(f"a row must be an object or a string, not {type(row).__name__}")
    if field is not None and field in row:
        v = row[field]
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return "sharegpt" if "from" in v[0] else "messages"
        return "prompt"
    for k in _CONV_KEYS:
        if k in row:
            v = row[k]
            first = v[0] if isinstance(v, list) and v else None
            return "sharegpt" if isinstance(first, dict) and "from" in first else "messages"
    if isinstance(row.get("chat"), str) and isinstance(row.get("system"), str):
        return "glaive"
    if "instruction" in row:
        return "alpaca"
    if any(k in row for k in _PROMPT_KEYS):
        return "prompt"
    keys = ", ".join(sorted(row)[:8])
    raise RowError(f"cannot tell the format of this row (keys: {keys}); set 'format' and 'field' for the dataset")


def _conv_value(row: Any, field: str | None, fmt: str) -> Any:
    if not isinstance(row, dict):
        raise RowError(f"a {fmt} row must be an object")
    keys = (field,) if field else _CONV_KEYS
    for k in keys:
        if k in row:
            return row[k]
    raise RowError(f"no conversation: expected one of the keys {', '.join(keys)}")


def _messages(row: Any, field: str | None) -> Conversation:
    return _from_messages(_conv_value(row, field, "messages"), row.get("tools"))


def _sharegpt(row: Any, field: str | None) -> Conversation:
    return _from_sharegpt(_conv_value(row, field, "sharegpt"), row.get("system"), row.get("tools"))


def _alpaca(row: Any, field: str | None) -> Conversation:
    if not isinstance(row, dict):
        raise RowError("an alpaca row must be an object")
    return _from_alpaca(row, field)


def _glaive(row: Any, field: str | None) -> Conversation:
    if not isinstance(row, dict):
        raise RowError("a glaive row must be an object with 'system' and 'chat'")
    system, chat = row.get("system"), row.get(field or "chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise RowError(f"a glaive row needs string 'system' and {field or 'chat'!r}")
    return parse_glaive(system, chat)


FORMATS: dict[str, Callable[[Any, str | None], Conversation]] = {
    "messages": _messages,
    "sharegpt": _sharegpt,
    "alpaca": _alpaca,
    "prompt": _from_prompt,
    "glaive": _glaive,
}


def to_conversation(row: Any, fmt: str, field: str | None = None) -> Conversation:
    """Adapt one row; ``fmt`` is a format name or ``auto``. Raises RowError."""
    if fmt == "auto":
        fmt = detect_format(row, field)
    try:
        return FORMATS[fmt](row, field)
    except (msgspec.ValidationError, TypeError) as exc:
        raise RowError(f"{fmt} row is malformed ({exc})") from None
