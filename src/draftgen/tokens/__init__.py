"""Tokenizers, model profiles and reconstruction of exact token ids.

``load_profile(name, tokenizer_spec, ...)`` is the entry point: it loads the tokenizer and returns the
profile that renders prompts and rebuilds generated ids for that model family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .loader import LoadedTokenizer, load_tokenizer
from .profile import Field, Lit, ParsedOutput, Profile, Reconstruction, Special
from .tokenizer import Tokenizer

__all__ = [
    "PROFILES",
    "Field",
    "Lit",
    "LoadedTokenizer",
    "ParsedOutput",
    "Profile",
    "Reconstruction",
    "Special",
    "Tokenizer",
    "load_profile",
    "load_tokenizer",
    "profile_class",
]


def _registry() -> dict[str, type[Profile]]:
    from .kimi import KimiK2ThinkingProfile, KimiK25Profile
    from .qwen3 import Qwen3Profile, Qwen3ThinkingProfile

    classes: list[type[Profile]] = [KimiK25Profile, KimiK2ThinkingProfile, Qwen3Profile, Qwen3ThinkingProfile]
    try:  # profiles added by the fidelity work register themselves in tokens.extra_profiles
        from .extra_profiles import EXTRA_PROFILES

        classes.extend(EXTRA_PROFILES)
    except ModuleNotFoundError:
        pass
    return {c.name: c for c in classes}


PROFILES: tuple[str, ...] = ()


def profile_class(name: str) -> type[Profile]:
    reg = _registry()
    try:
        return reg[name]
    except KeyError:
        raise TokenizerError(f"unknown profile {name!r}; known profiles: {', '.join(sorted(reg))}") from None


def load_profile(
    name: str,
    tokenizer: str,
    *,
    sha256: str | None = None,
    thinking: bool = True,
    base_dir: Path | None = None,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> Profile:
    """Load ``tokenizer`` and build profile ``name`` over it. A mismatch is a TokenizerError."""
    cls = profile_class(name)
    loaded = load_tokenizer(tokenizer, sha256=sha256, base_dir=base_dir)
    template = chat_template if chat_template is not None else loaded.chat_template
    return cls(loaded.tokenizer, template, thinking=thinking, template_kwargs=template_kwargs)
