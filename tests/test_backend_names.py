"""No code outside ``backends/`` decides behaviour from a backend's name or kind: it asks ``capabilities``.

The scan reads every module of ``src/draftgen`` outside ``backends/`` with ``ast`` and fails on a
comparison (``==``, ``!=``, ``in``, ``not in``, a ``match`` case) between a string literal equal to a
registered ``endpoint.kind`` and an expression that mentions ``kind``, ``backend``, ``server`` (a config key
such as ``accept.server``, or a variable holding one) or ``.name``. Emulator code naming its own protocol in
a hash key or a JSON body is not a comparison and passes.
"""

from __future__ import annotations

import ast
from pathlib import Path

from draftgen.backends import BACKENDS
from draftgen.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src" / "draftgen"


def _is_kind(name: str) -> bool:
    try:
        BACKENDS.get(name)
    except ConfigError:
        return False
    return True


def _kind_literals(node: ast.expr) -> list[str]:
    """Registered kinds spelled by ``node``: a string literal, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if _is_kind(node.value) else []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [k for elt in node.elts for k in _kind_literals(elt)]
    return []


def _mentions_backend(node: ast.AST) -> bool:
    text = ast.unparse(node)
    low = text.lower()
    return "kind" in text or "backend" in low or "server" in low or ".name" in text


def _violations(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(
                isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                kinds = _kind_literals(side)
                others = [s for j, s in enumerate(sides) if j != i]
                if kinds and any(_mentions_backend(o) for o in others):
                    out.append((node.lineno, ast.unparse(node)))
                    break
        elif isinstance(node, ast.Match) and _mentions_backend(node.subject):
            for case in node.cases:
                for pat in ast.walk(case.pattern):
                    if isinstance(pat, ast.MatchValue) and _kind_literals(pat.value):
                        out.append((pat.lineno, f"match {ast.unparse(node.subject)}: case {ast.unparse(pat.value)}"))
    return out


def test_no_backend_name_comparisons_outside_backends() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "backends":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found += [f"{rel}:{line}: {text}" for line, text in _violations(tree)]
    assert not found, "compare capabilities, not backend names:\n" + "\n".join(found)


def test_the_scan_catches_what_it_should() -> None:
    bad = ("if cfg.endpoint.kind == 'emulator': pass\n"
           "if backend.name in ('vllm', 'sglang'): pass\n"
           "match ep.kind:\n    case 'openrouter': pass\n"
           "if cfg.accept.server == 'sglang': pass\n"  # a config key naming a backend kind
           "if server != 'vllm': pass\n"  # a variable holding one
           "x = 1 if 'sglang' == accept_server else 2\n"
           "match server:\n    case 'vllm': pass\n")
    assert len(_violations(ast.parse(bad))) == 7
    fine = ("key = ('openrouter', model)\n"  # a hash key naming a protocol
            "body = {'object': 'vllm'}\n"
            "if fmt == 'openai': pass\n")  # no kind/backend/.name on the other side
    assert _violations(ast.parse(fine)) == []
