"""Chat-template rendering the way transformers does it: a sandboxed jinja2 environment with
``trim_blocks``/``lstrip_blocks``, loop controls, a ``tojson`` filter with HF's defaults
(``ensure_ascii=False``, optional ``indent``/``separators``/``sort_keys``) and ``raise_exception``.
Compiled templates are cached by their text. Template errors become ``TokenizerError``.
"""

from __future__ import annotations

import json
from typing import Any

from draftgen.errors import TokenizerError

__all__ = ["render_template"]


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    if separators is not None:
        separators = (separators[0], separators[1])
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TokenizerError(f"chat template raised: {message}")


_ENV: Any = None
_TEMPLATES: dict[str, Any] = {}


def render_template(template: str, **context: Any) -> str:
    """Render a chat template the way transformers does (sandboxed, trim_blocks, lstrip_blocks)."""
    global _ENV
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if _ENV is None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        _ENV = env
    try:
        tmpl = _TEMPLATES.get(template)
        if tmpl is None:
            tmpl = _TEMPLATES[template] = _ENV.from_string(template)
        out: str = tmpl.render(**context)
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"chat template failed to render: {exc}") from None
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        raise TokenizerError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None
    return out
