"""Small pieces of ``emulate --model``'s HTTP layer: counters and sampling fields (the request bodies and
error bodies it shares with the scripted emulator are ``emulator.local_wire``'s).

``Counters`` holds what ``/metrics`` (vLLM's ``vllm:spec_decode_*`` counters) and ``/server_info`` report;
``job_of`` turns a request's sampling fields into an engine job (or says why they are invalid).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftgen.emulator.real.engine import GenJob, GenResult

__all__ = ["Counters", "job_of", "token_id"]


@dataclass
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    verify_calls: int = 0
    spec_completion_tokens: int = 0

    def add_spec(self, res: GenResult) -> None:
        s = res.spec
        if s is None:
            return
        self.drafts += s.drafts
        self.draft_tokens += s.draft_tokens
        self.accepted += s.accepted
        self.verify_calls += s.verify_calls
        self.spec_completion_tokens += len(res.ids)
        for i, n in enumerate(s.accepted_per_pos):
            if i < len(self.per_pos):
                self.per_pos[i] += n



def token_id(tok: Any, text: str) -> int | None:
    tid = tok.convert_tokens_to_ids(text)
    unk = getattr(tok, "unk_token_id", None)
    return int(tid) if isinstance(tid, int) and tid != unk and tid >= 0 else None


def job_of(body: dict[str, Any], prompt_ids: list[int], max_new: int) -> GenJob | str:
    """The engine job of a request's sampling fields, or why they are invalid."""
    temp, top_p, top_k, seed = body.get("temperature"), body.get("top_p"), body.get("top_k"), body.get("seed")
    if temp is not None and (isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0):
        return "temperature must be a number >= 0"
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        return "top_p must be in (0, 1]"
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        return "top_k must be an integer"
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return "seed must be an integer"
    return GenJob(prompt_ids=prompt_ids, max_new=max_new, temperature=None if temp is None else float(temp),
                  top_p=None if top_p is None else float(top_p), top_k=top_k if top_k and top_k > 0 else None,
                  seed=seed)
