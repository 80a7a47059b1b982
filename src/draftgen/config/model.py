"""The ``model`` section: the target model's id, token profile, tokenizer and chat template. Pure data."""

from __future__ import annotations

from typing import Any

import msgspec

from draftgen.config.base import Section


class ModelConfig(Section):
    """The target model."""

    id: str = "qwen/qwen3-8b"
    """API model slug sent as ``model`` (OpenRouter: ``moonshotai/kimi-k2.5``)."""
    profile: str = "qwen3"
    """Token profile, one of those registered in ``draftgen.tokens.PROFILES``."""
    tokenizer: str = "bundled:qwen3"
    """Tokenizer: ``bundled:qwen3``, a local folder, or ``hf:org/name@revision``."""
    tokenizer_sha256: str | None = None
    """Optional sha256 pin of the vocabulary file (uncompressed)."""
    chat_template: str | None = None
    """Optional path to a chat template overriding the tokenizer folder's."""
    thinking: bool = True
    """Whether the model reasons (selects the thinking prompt and suffix)."""
    profile_options: dict[str, Any] = msgspec.field(default_factory=dict)
    """Markers of the ``generic`` profile: think_start, think_end, end_of_turn, reasoning_lead,
    reasoning_trail, content_lead, tool_specials, thinking_kwarg, expected_ids (see draftgen.tokens.generic)."""
    template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    """Extra chat-template variables, e.g. gpt-oss ``reasoning_effort`` / ``current_date``."""
    context_length: int | None = None
    """Longest prompt, in tokens, that ``prepare`` accepts (default: the tokenizer config's ``model_max_length``, else 131,072)."""
