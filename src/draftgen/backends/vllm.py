"""vLLM's OpenAI-compatible server with ``return_token_ids``: exact prompt and output token ids.

Same protocol as ``openrouter.OpenAIChatBackend`` plus ``"return_token_ids": true`` in the body. vLLM then
returns ``prompt_token_ids`` (top level, or in the first stream chunk) and ``choices[0].token_ids`` (whole,
or per delta when streaming); both land in ``Completion.prompt_ids``/``output_ids`` and the record's
``ids_source`` is ``exact``. A server too old to know the flag ignores it; the engine then rebuilds the
ids from text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from .http import Bounds
from .openrouter import OpenAIChatBackend

__all__ = ["VLLMBackend"]


class VLLMBackend(OpenAIChatBackend):
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        model: str,
        stream: bool = True,
        reasoning: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        super().__init__(
            session, base_url, model=model, stream=stream, openrouter=False, reasoning=reasoning,
            sampling=sampling, extra={"return_token_ids": True, **(extra or {})}, name="vllm", bounds=bounds,
        )
