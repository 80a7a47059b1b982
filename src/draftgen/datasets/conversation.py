"""Normalised conversations and the prompts cut from them.

A format adapter turns one source row into a ``Conversation`` (``records.Message`` list + optional
``records.Tool`` list). ``prompts_from`` cuts the prompt(s) to regenerate from it:

- ``last`` (default): the reply to the last user turn is regenerated; the prompt is the conversation up
  to and including the last user message (the original answer and anything after it are dropped).
- ``all``: one prompt per assistant turn (prompt = everything before that turn, ending with a user or
  tool message), plus the trailing user turn if the conversation ends with one. ``turn_index`` counts
  assistant turns from 0.

``content_hash`` is the sha256 of the canonical JSON of (messages, tools): sorted keys, exact text (no
whitespace normalisation), so the same prompt always hashes the same in every dataset and run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from draftgen.records import Message, Tool

__all__ = ["Conversation", "CutPrompt", "RowError", "content_hash", "prompts_from"]


class RowError(ValueError):
    """A source row cannot be turned into a prompt; the message says what is wrong (no location)."""


@dataclass
class Conversation:
    messages: list[Message]
    tools: list[Tool] | None = None


@dataclass
class CutPrompt:
    messages: list[Message]
    tools: list[Tool] | None
    turn_index: int | None


class _Canonical(msgspec.Struct, omit_defaults=True):
    messages: list[Message]
    tools: list[Tool] | None = None


_enc = msgspec.json.Encoder(order="sorted")


def content_hash(messages: list[Message], tools: list[Tool] | None) -> str:
    """Hex sha256 of the canonical JSON of a prompt (independent of dataset, source and position)."""
    return hashlib.sha256(_enc.encode(_Canonical(messages=messages, tools=tools or None))).hexdigest()


def _check_prompt(messages: list[Message]) -> None:
    if not messages:
        raise RowError("the conversation has no messages")
    last = messages[-1]
    if last.role not in ("user", "tool"):
        raise RowError(f"the prompt ends with a {last.role!r} message; it must end with a user or tool message")
    if last.role == "user" and not last.content:
        raise RowError("the last user message is empty")


def prompts_from(conv: Conversation, mode: str) -> list[CutPrompt]:
    """The prompt(s) to regenerate from ``conv`` (see the module docstring). Raises RowError."""
    msgs = conv.messages
    user_idx = [i for i, m in enumerate(msgs) if m.role == "user"]
    if not user_idx:
        raise RowError("the conversation has no user message")
    if mode == "last":
        prompt = msgs[: user_idx[-1] + 1]
        _check_prompt(prompt)
        return [CutPrompt(messages=prompt, tools=conv.tools, turn_index=None)]
    out: list[CutPrompt] = []
    turn = 0
    for i, m in enumerate(msgs):
        if m.role != "assistant":
            continue
        prompt = msgs[:i]
        if prompt and prompt[-1].role in ("user", "tool") and any(p.role == "user" for p in prompt):
            _check_prompt(prompt)
            out.append(CutPrompt(messages=prompt, tools=conv.tools, turn_index=turn))
        turn += 1
    if msgs[-1].role == "user":
        _check_prompt(msgs)
        out.append(CutPrompt(messages=list(msgs), tools=conv.tools, turn_index=turn))
    if not out:
        raise RowError("no assistant turn follows a user or tool message")
    return out
