"""What a vLLM extract server's completion answer says, read for the vllm capture backend (``target.vllm``).

``completion_of(raw, where)``: the answer (``/v1/completions``) and its first choice, or a RetryableAPIError
``bad_response``. ``check_prompt_ids``: the ``prompt_token_ids`` it reports (``choices[0]``, or top level) must be
the ids sent, else a PermanentAPIError (``no_prompt_ids``, ``ids_mismatch``: the sample and the first differing
position). ``engine_logprobs``: the engine's log-prob of each next prompt id from vLLM's ``prompt_logprobs``
(None, then one ``{token id: {logprob, rank, decoded_token}}`` per position, JSON keys as strings), or a
PermanentAPIError ``no_prompt_logprobs``. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.errors import PermanentAPIError, RetryableAPIError

if TYPE_CHECKING:
    import torch

__all__ = ["check_prompt_ids", "completion_of", "engine_logprobs"]


def completion_of(raw: bytes, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The completion ``raw`` holds and its first choice."""
    try:
        out = msgspec.json.decode(raw)
        choice = out["choices"][0]
        if not isinstance(out, dict) or not isinstance(choice, dict):
            raise TypeError
    except (msgspec.DecodeError, KeyError, IndexError, TypeError):
        raise RetryableAPIError(f"bad_response: not a completion ({where})", kind="bad_response") from None
    return out, choice


def check_prompt_ids(sample_id: str, sent: list[int], out: dict[str, Any], choice: dict[str, Any], where: str) -> None:
    """The answer's ``prompt_token_ids`` are ``sent`` (see the module docstring)."""
    got = choice.get("prompt_token_ids")
    if got is None:
        got = out.get("prompt_token_ids")
    if got is None:
        raise PermanentAPIError(f"sample {sample_id}: the server returned no prompt_token_ids ({where}); "
                                "the vllm backend needs vLLM >= 0.22 (return_token_ids)", kind="no_prompt_ids")
    if got != sent:
        n = len(got) if isinstance(got, list) else 0
        at = next((k for k, (a, b) in enumerate(zip(got, sent, strict=False)) if a != b), min(n, len(sent))) \
            if isinstance(got, list) else 0
        raise PermanentAPIError(
            f"sample {sample_id}: the server's prompt_token_ids differ from the ids sent (first at position "
            f"{at} of {len(sent)}; {n} ids came back) ({where}); its hidden states would belong to other "
            "tokens, so nothing is stored for it", kind="ids_mismatch")


def engine_logprobs(sample_id: str, plp: Any, sent: list[int], where: str) -> torch.Tensor:
    """log p(sent[t+1]) for t = 0..T-2 (float32 [T-1]) from the answer's ``prompt_logprobs`` (see the module
    docstring)."""
    import torch

    if not isinstance(plp, list) or len(plp) != len(sent):
        raise PermanentAPIError(
            f"sample {sample_id}: the server returned no prompt_logprobs for the {len(sent)} prompt ids ({where}); "
            "the log-prob check needs them (vLLM returns them when asked: prompt_logprobs 0)", kind="no_prompt_logprobs")
    out = []
    for t in range(1, len(sent)):
        entry = plp[t].get(str(sent[t])) if isinstance(plp[t], dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
            raise PermanentAPIError(f"sample {sample_id}: prompt_logprobs[{t}] has no log-prob for prompt id "
                                    f"{sent[t]} ({where})", kind="no_prompt_logprobs")
        out.append(float(entry["logprob"]))
    return torch.tensor(out, dtype=torch.float32)
