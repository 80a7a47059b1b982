"""Kimi-K2.5 tool declarations as TypeScript (the ``tools_ts_str`` its chat template prints).

K2.5's tokenizer turns OpenAI-style tool definitions into a ``namespace functions { … }`` block before
rendering the template; the template prints compact JSON only when that conversion fails. This module
implements the documented format (facts checked against the published goldens):

    # Tools\\n\\n## functions\\nnamespace functions {\\n// {description}\\ntype {name} = (_: {\\n
      // {param description}\\n  // {constraint}: {value}, …\\n  // Default: {repr}\\n  {param}[?]: {type},\\n…
    }) => any;\\n}\\n

Required parameters first, then optional ones (``?``), each group sorted by name; ``integer`` → ``number``;
arrays ``Array<T>``; enums ``"a" | "b"``; ``anyOf`` and type lists as unions; ``$ref`` to ``$defs`` as
``interface Name {…}`` blocks above the type. A schema shape the format does not cover (an unresolvable
``$ref``, a schema without type/enum/anyOf/$ref) makes the whole encoding None → JSON fallback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["encode_tools_to_typescript"]

_INDENT = "  "
_DELIM = ",\n"
_MAX_DEPTH = 32


@dataclass
class _Registry:
    defs: dict[str, Any] = field(default_factory=dict)
    has_self_ref: bool = False
    unsupported: bool = False
    depth: int = 0


@dataclass
class _Node:
    kind: str  # scalar | object | array | enum | anyof | union | ref
    description: str = ""
    constraints: list[tuple[str, Any]] = field(default_factory=list)
    typ: str = "any"
    props: list[_Param] = field(default_factory=list)
    additional: Any = None  # None | True | False | _Node
    item: _Node | None = None
    values: list[Any] = field(default_factory=list)
    branches: list[_Node] = field(default_factory=list)


@dataclass
class _Param:
    name: str
    node: _Node
    optional: bool
    has_default: bool
    default: Any


def _base(schema: Any, allowed: tuple[str, ...], kind: str) -> _Node:
    desc = schema.get("description") if isinstance(schema, dict) else None
    cons = sorted((k, v) for k, v in schema.items() if k in allowed) if isinstance(schema, dict) else []
    return _Node(kind=kind, description=desc if isinstance(desc, str) else "", constraints=cons)


def _inline(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _py_repr(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _default_repr(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _describe(text: str, indent: str) -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _parse_object(schema: Any, reg: _Registry) -> _Node:
    node = _base(schema, (), "object")
    if not isinstance(schema, dict):
        return node
    defs = schema.get("$defs")
    if isinstance(defs, dict):
        for name, sub in defs.items():
            reg.defs[name] = sub
    addl = schema.get("additionalProperties", None)
    if isinstance(addl, bool) or addl is None:
        node.additional = addl
    else:
        node.additional = _parse(addl, reg)
    props = schema.get("properties")
    required = schema.get("required")
    req = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    if isinstance(props, dict):
        for name, sub in props.items():
            has_default = isinstance(sub, dict) and "default" in sub
            node.props.append(
                _Param(name, _parse(sub, reg), name not in req, has_default, sub.get("default") if has_default else None)
            )
    return node


def _parse(schema: Any, reg: _Registry) -> _Node:
    if reg.depth >= _MAX_DEPTH:
        return _Node("scalar")
    reg.depth += 1
    try:
        return _parse_inner(schema, reg)
    finally:
        reg.depth -= 1


def _parse_inner(schema: Any, reg: _Registry) -> _Node:
    if isinstance(schema, bool):
        return _Node("scalar", typ="any" if schema else "null")
    if not isinstance(schema, dict):
        reg.unsupported = True
        return _Node("scalar")
    if "$ref" in schema:
        node = _base(schema, (), "ref")
        ref = schema.get("$ref")
        ref = ref if isinstance(ref, str) else ""
        if ref == "#":
            reg.has_self_ref = True
            node.typ = "parameters"
        elif ref.startswith("#/$defs/") and ref[len("#/$defs/"):] in reg.defs:
            node.typ = ref.rsplit("/", 1)[-1]
        else:
            reg.unsupported = True
            node.typ = "any"
        return node
    if "anyOf" in schema:
        node = _base(schema, (), "anyof")
        branches = schema.get("anyOf")
        node.branches = [_parse(b, reg) for b in branches] if isinstance(branches, list) else []
        return node
    if "enum" in schema:
        node = _base(schema, (), "enum")
        values = schema.get("enum")
        node.values = list(values) if isinstance(values, list) else []
        return node
    typ = schema.get("type")
    if isinstance(typ, list):
        node = _base(schema, (), "union")
        names = {"integer": "number", "object": "{}", "array": "Array<any>"}
        node.values = [names.get(t, t) for t in typ if isinstance(t, str)]
        return node
    if isinstance(typ, str):
        if typ == "object":
            return _parse_object(schema, reg)
        if typ == "array":
            node = _base(schema, ("maxItems", "minItems"), "array")
            items = schema.get("items")
            node.item = _parse(items, reg) if items is not None else _Node("scalar")
            return node
        allowed: tuple[str, ...] = ()
        if typ == "string":
            allowed = ("maxLength", "minLength", "pattern")
        elif typ in ("number", "integer"):
            allowed = ("maximum", "minimum")
        node = _base(schema, allowed, "scalar")
        node.typ = typ
        return node
    if not schema:
        return _Node("scalar")
    reg.unsupported = True
    return _Node("scalar")


def _doc(node: _Node, indent: str) -> str:
    out = ""
    if node.description:
        out += _describe(node.description, indent) + "\n"
    if node.constraints:
        out += f"{indent}// " + ", ".join(f"{k}: {_inline(v)}" for k, v in node.constraints) + "\n"
    return out


def _param_ts(p: _Param, indent: str) -> str:
    out = _doc(p.node, indent)
    if p.has_default:
        out += f"{indent}// Default: {_default_repr(p.default)}\n"
    return out + f"{indent}{p.name}{'?' if p.optional else ''}: {_ts(p.node, indent)}"


def _ts(node: _Node, indent: str) -> str:
    k = node.kind
    if k == "scalar":
        return "number" if node.typ == "integer" else node.typ
    if k == "ref":
        return node.typ
    if k == "enum":
        return " | ".join(_py_repr(v) for v in node.values)
    if k == "anyof":
        return " | ".join(_ts(b, indent) for b in node.branches)
    if k == "union":
        return " | ".join(str(v) for v in node.values)
    inner = indent + _INDENT
    if k == "array":
        assert node.item is not None
        item_doc = _doc(node.item, inner)
        item_ts = _ts(node.item, inner)
        return f"Array<{item_ts}>" if not item_doc else f"Array<\n{item_doc}{inner}{item_ts}\n{indent}>"
    required = sorted((p for p in node.props if not p.optional), key=lambda p: p.name)
    optional = sorted((p for p in node.props if p.optional), key=lambda p: p.name)
    parts = [_param_ts(p, inner) for p in (*required, *optional)]
    if node.additional is True:
        parts.append(f"{inner}[k: string]: any")
    elif node.additional is False:
        parts.append(f"{inner}[k: string]: never")
    elif isinstance(node.additional, _Node):
        parts.append(f"{inner}[k: string]: {_ts(node.additional, inner)}")
    if not parts:
        return "{}"
    return "{\n" + _DELIM.join(parts) + "\n" + indent + "}"


def _function_ts(fn: dict[str, Any]) -> str | None:
    params = fn.get("parameters")
    reg = _Registry()
    parsed = _parse_object(params if params is not None else {}, reg)
    interfaces: list[str] = []
    root: str | None = None
    if reg.has_self_ref:
        root = "parameters"
        body = _DELIM.join(_param_ts(p, _INDENT) for p in parsed.props)
        interfaces.append("interface parameters {" + (f"\n{body}\n" if body else "") + "}")
    for name in list(reg.defs):
        schema = reg.defs[name]
        body = _ts(_parse(schema, reg), "")
        desc = schema.get("description") if isinstance(schema, dict) else None
        head = _describe(desc, "") + "\n" if isinstance(desc, str) and desc else ""
        interfaces.append(f"{head}interface {name} {body}")
    fname = fn.get("name")
    type_def = f"type {fname if isinstance(fname, str) else 'function'} = (_: {root or _ts(parsed, '')}) => any;"
    desc = fn.get("description")
    desc_block = _describe(desc, "") if isinstance(desc, str) and desc else ""
    if reg.unsupported:
        return None
    return "\n".join(s for s in ("\n".join(interfaces), desc_block, type_def) if s)


def encode_tools_to_typescript(tools: Any) -> str | None:
    """The ``tools_ts_str`` for OpenAI-style ``tools`` (plain mappings), or None → JSON fallback."""
    if not tools:
        return None
    fns: list[str] = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        fn = tool.get("function")
        if not isinstance(fn, dict) or not fn:
            continue
        ts = _function_ts(fn)
        if ts is None:
            return None
        fns.append(ts)
    if not fns:
        return None
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(fns) + "\n}\n"
