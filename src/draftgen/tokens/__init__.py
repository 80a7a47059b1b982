"""Tokenizers, model profiles and reconstruction of exact token ids.

``load_profile(name, tokenizer_spec, ...)`` is the entry point: it loads the tokenizer and returns the
profile that renders prompts and rebuilds generated ids for that model family.
``profile_from_config(cfg)`` does the same from a run configuration's ``model`` section.

Profiles: kimi-k2.5, kimi-k2-thinking, qwen3, qwen3-thinking-2507, deepseek-r1, deepseek-v3.1, glm-4.5,
gpt-oss, generic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import TokenizerError
from .loader import DEFAULT_CONTEXT_LENGTH, LoadedTokenizer, context_length_of, load_tokenizer
from .profile import Field, Lit, ParsedOutput, Profile, Reconstruction, Special
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = [
    "DEFAULT_CONTEXT_LENGTH",
    "PROFILES",
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
]

PROFILES: tuple[str, ...] = (
    "kimi-k2.5",
    "kimi-k2-thinking",
    "qwen3",
    "qwen3-thinking-2507",
    "deepseek-r1",
    "deepseek-v3.1",
    "glm-4.5",
    "gpt-oss",
    "generic",
)


def _registry() -> dict[str, type[Profile]]:
    from .deepseek import DeepSeekR1Profile, DeepSeekV31Profile
    from .generic import GenericProfile
    from .glm import Glm45Profile
    from .gpt_oss import GptOssProfile
    from .kimi import KimiK2ThinkingProfile, KimiK25Profile
    from .qwen3 import Qwen3Profile, Qwen3ThinkingProfile

    classes: list[type[Profile]] = [
        KimiK25Profile,
        KimiK2ThinkingProfile,
        Qwen3Profile,
        Qwen3ThinkingProfile,
        DeepSeekR1Profile,
        DeepSeekV31Profile,
        Glm45Profile,
        GptOssProfile,
        GenericProfile,
    ]
    return {c.name: c for c in classes}


def profile_class(name: str) -> type[Profile]:
    reg = _registry()
    try:
        return reg[name]
    except KeyError:
        raise TokenizerError(f"unknown profile {name!r}; known profiles: {', '.join(PROFILES)}") from None


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

    Every phase loads the target's profile through here. The last one is kept for reuse (a run has one
    target), keyed by everything that shapes it, including the template file's modification time.
    """
    m = cfg.model
    kwargs = dict(m.template_kwargs)
    if m.profile == "gpt-oss" and cfg.reasoning.effort and "reasoning_effort" not in kwargs:
        kwargs["reasoning_effort"] = cfg.reasoning.effort
    base_dir = Path(cfg.base_dir) if cfg.base_dir else None
    stamp: int | None = None
    if m.chat_template:
        with contextlib.suppress(OSError):
            stamp = cfg.path(m.chat_template).stat().st_mtime_ns
    key = msgspec.json.encode([msgspec.to_builtins(m), kwargs, str(base_dir), stamp], order="sorted")
    cached = _LAST_PROFILE.get(key)
    if cached is not None:
        return cached
    prof = load_profile(
        m.profile,
        m.tokenizer,
        sha256=m.tokenizer_sha256,
        thinking=m.thinking,
        base_dir=base_dir,
        chat_template=m.chat_template,
        template_kwargs=kwargs,
        options=m.profile_options,
    )
    _LAST_PROFILE.clear()
    _LAST_PROFILE[key] = prof
    return prof


_LAST_PROFILE: dict[bytes, Profile] = {}
