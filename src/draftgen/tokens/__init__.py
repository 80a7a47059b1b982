"""Tokenizers, model profiles and reconstruction of exact token ids.

``load_profile(name, tokenizer_spec, ...)`` is the entry point: it loads the tokenizer and returns the
profile that renders prompts and rebuilds generated ids for that model family.
``profile_from_config(cfg)`` does the same from a run configuration's ``model`` section.

Profiles are registered in ``PROFILES`` (a ``draftgen.registry.Registry`` keyed by ``model.profile``): the
built-in ones below as lazy ``"module:Class"`` entries, imported on first use, so adding a profile is its
module plus one ``PROFILES.register`` line. ``register_profile(cls)`` (usable as a decorator) registers a
class under its own ``cls.name`` (a plugin, a test); ``PROFILES.unregister(name)`` removes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.errors import DraftgenError, TokenizerError
from draftgen.registry import Registry
from draftgen.tokens.loader import DEFAULT_CONTEXT_LENGTH, LoadedTokenizer, context_length_of, load_tokenizer
from draftgen.tokens.profile import Field, Lit, ParsedOutput, Profile, Reconstruction, Special
from draftgen.tokens.tokenizer import Tokenizer

if TYPE_CHECKING:
    from draftgen.config import RunConfig

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
    "profile_fit",
    "profile_from_config",
    "register_profile",
]

#: ``model.profile`` → profile class. The built-in ones are lazy (imported on first use); one line each.
PROFILES: Registry[type[Profile]] = Registry("model.profile", "profile")
PROFILES.register("kimi-k2.5", "draftgen.tokens.kimi:KimiK25Profile")
PROFILES.register("kimi-k2-thinking", "draftgen.tokens.kimi:KimiK2ThinkingProfile")
PROFILES.register("qwen3", "draftgen.tokens.qwen3:Qwen3Profile")
PROFILES.register("qwen3-thinking-2507", "draftgen.tokens.qwen3:Qwen3ThinkingProfile")
PROFILES.register("deepseek-r1", "draftgen.tokens.deepseek:DeepSeekR1Profile")
PROFILES.register("deepseek-v3.1", "draftgen.tokens.deepseek:DeepSeekV31Profile")
PROFILES.register("glm-4.5", "draftgen.tokens.glm:Glm45Profile")
PROFILES.register("gpt-oss", "draftgen.tokens.gpt_oss:GptOssProfile")
PROFILES.register("generic", "draftgen.tokens.generic:GenericProfile")


def register_profile(cls: type[Profile]) -> type[Profile]:
    """Register ``cls`` under ``cls.name`` (usable as a decorator); a name already taken is a ConfigError.
    ``PROFILES.unregister(cls.name)`` removes it."""
    PROFILES.register(cls.name, cls)
    return cls


def profile_class(name: str) -> type[Profile]:
    """The profile class registered as ``name``; a miss is a ConfigError naming the registered profiles."""
    cls = PROFILES.get(name)
    if cls.name != name:  # the entry and the class must agree, or records would carry another name
        raise TokenizerError(f"profile {name!r} is registered as {cls.__name__}, whose name is {cls.name!r}")
    return cls


def profile_fit(model_id: str, profile: str) -> str | None:
    """Why ``model_id`` does not look like a model of ``profile``'s family (``Profile.model_families``), naming
    the registered profiles whose family it does fit; None when it fits (or the profile is not registered:
    loading it says so)."""
    try:
        cls = profile_class(profile)
    except DraftgenError:
        return None
    slug = model_id.lower().split(":")[0]
    if not cls.model_families or any(f in slug for f in cls.model_families):
        return None
    fits = [n for n in PROFILES.names() if _families(n) and any(f in slug for f in _families(n))]
    hint = f"; for this model: {' or '.join(fits)}" if fits else ""
    return (f"model.id {model_id!r} does not look like a model of profile {profile!r} (its family: "
            f"{', '.join(cls.model_families)}); check model.profile and model.tokenizer{hint}")


def _families(name: str) -> tuple[str, ...]:
    try:
        return profile_class(name).model_families
    except DraftgenError:
        return ()


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
