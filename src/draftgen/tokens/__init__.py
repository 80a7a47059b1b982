"""Tokenizers, model profiles and reconstruction of exact token ids.

``load_profile(name, tokenizer_spec, ...)`` is the entry point: it loads the tokenizer and returns the
profile that renders prompts and rebuilds generated ids for that model family.
``profile_from_config(cfg)`` does the same from a run configuration's ``model`` section.

Profiles are registered in ``PROFILE_TABLE`` (name → ``"module:Class"`` in this package, imported on first
use): adding a profile is its module plus one line there. ``register_profile(cls)`` adds one at run time
(a plugin, a test) and ``unregister_profile(name)`` removes it; ``profile_names()`` lists them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.errors import TokenizerError
from draftgen.tokens.loader import DEFAULT_CONTEXT_LENGTH, LoadedTokenizer, context_length_of, load_tokenizer
from draftgen.tokens.profile import Field, Lit, ParsedOutput, Profile, Reconstruction, Special
from draftgen.tokens.tokenizer import Tokenizer

if TYPE_CHECKING:
    from draftgen.config import RunConfig

__all__ = [
    "DEFAULT_CONTEXT_LENGTH",
    "PROFILES",
    "PROFILE_TABLE",
    "Field",
    "Lit",
    "LoadedTokenizer",
    "ParsedOutput",
    "Profile",
    "Reconstruction",
    "Special",
    "Tokenizer",
    "context_length_of",
    "load_profile",
    "load_tokenizer",
    "profile_class",
    "profile_from_config",
    "profile_names",
    "register_profile",
    "unregister_profile",
]

#: profile name → ``"module:Class"`` of this package, imported on first use. One line per profile.
PROFILE_TABLE: dict[str, str] = {
    "kimi-k2.5": "kimi:KimiK25Profile",
    "kimi-k2-thinking": "kimi:KimiK2ThinkingProfile",
    "qwen3": "qwen3:Qwen3Profile",
    "qwen3-thinking-2507": "qwen3:Qwen3ThinkingProfile",
    "deepseek-r1": "deepseek:DeepSeekR1Profile",
    "deepseek-v3.1": "deepseek:DeepSeekV31Profile",
    "glm-4.5": "glm:Glm45Profile",
    "gpt-oss": "gpt_oss:GptOssProfile",
    "generic": "generic:GenericProfile",
}

#: The built-in profiles' names (``PROFILE_TABLE``); ``profile_names()`` adds those registered at run time.
PROFILES: tuple[str, ...] = tuple(PROFILE_TABLE)

#: Profiles registered at run time (``register_profile``), name → class.
_RUNTIME: dict[str, type[Profile]] = {}


def register_profile(cls: type[Profile]) -> type[Profile]:
    """Register ``cls`` under ``cls.name`` (usable as a decorator). A name already taken is a TokenizerError."""
    if cls.name in PROFILE_TABLE or cls.name in _RUNTIME:
        raise TokenizerError(f"profile {cls.name!r} is already registered")
    _RUNTIME[cls.name] = cls
    return cls


def unregister_profile(name: str) -> None:
    """Remove a profile registered with ``register_profile`` (built-in ones stay)."""
    _RUNTIME.pop(name, None)


def profile_names() -> tuple[str, ...]:
    """Every registered profile's name: the built-in ones, then those registered at run time."""
    return PROFILES + tuple(_RUNTIME)


def profile_class(name: str) -> type[Profile]:
    """The profile class registered as ``name``; a TokenizerError naming the known profiles."""
    if name in _RUNTIME:
        return _RUNTIME[name]
    target = PROFILE_TABLE.get(name)
    if target is None:
        raise TokenizerError(f"unknown profile {name!r}; known profiles: {', '.join(profile_names())}")
    module, _, attr = target.partition(":")
    cls: type[Profile] = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    if cls.name != name:  # the table and the class must agree, or records would carry another name
        raise TokenizerError(f"PROFILE_TABLE[{name!r}] names {cls.__name__}, whose name is {cls.name!r}")
    return cls


def _template_text(chat_template: str, base_dir: Path | None, folder: Path | None) -> str:
    """``chat_template`` is template text (it has ``{{``/``{%``) or the path of a template file."""
    if "{{" in chat_template or "{%" in chat_template:
        return chat_template
    p = Path(chat_template).expanduser()
    candidates = [p] if p.is_absolute() else [c for c in ((base_dir / p) if base_dir else p, (folder / p) if folder else None) if c]
    for c in candidates:
        if c.is_file():
            try:
                return c.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"{c}: cannot read the chat template ({exc})") from None
    raise TokenizerError(
        f"chat_template {chat_template!r}: file not found (looked in {', '.join(map(str, candidates))}); "
        "fix model.chat_template"
    )


def load_profile(
    name: str,
    tokenizer: str,
    *,
    sha256: str | None = None,
    thinking: bool = True,
    base_dir: Path | None = None,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Profile:
    """Load ``tokenizer`` and build profile ``name`` over it. A mismatch is a TokenizerError.

    ``chat_template``: template text or a template file path (relative to ``base_dir``, then to the
    tokenizer folder); default: the tokenizer folder's. ``options``: ``model.profile_options``.
    """
    cls = profile_class(name)
    loaded = load_tokenizer(
        tokenizer, sha256=sha256, base_dir=base_dir, template_names=cls.template_names, config_names=cls.config_names
    )
    template = (
        _template_text(chat_template, base_dir, loaded.folder) if chat_template is not None else loaded.chat_template
    )
    prof = cls(
        loaded.tokenizer, template, thinking=thinking, template_kwargs=template_kwargs, config=loaded.config,
        options=options,
    )
    prof.tokenizer_sha256 = loaded.sha256
    return prof


def profile_from_config(cfg: RunConfig) -> Profile:
    """The profile described by ``cfg.model`` (gpt-oss also takes ``reasoning.effort`` as its effort).

    Loads afresh on every call (nothing is cached here): a command loads it once and passes it on, as
    ``pipeline`` does to every phase (each ``run_<phase>`` takes ``profile=``).
    """
    m = cfg.model
    kwargs = dict(m.template_kwargs)
    if m.profile == "gpt-oss" and cfg.reasoning.effort and "reasoning_effort" not in kwargs:
        kwargs["reasoning_effort"] = cfg.reasoning.effort
    return load_profile(
        m.profile,
        m.tokenizer,
        sha256=m.tokenizer_sha256,
        thinking=m.thinking,
        base_dir=Path(cfg.base_dir) if cfg.base_dir else None,
        chat_template=m.chat_template,
        template_kwargs=kwargs,
        options=m.profile_options,
    )
