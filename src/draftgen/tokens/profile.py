"""Model profiles: how a target model's prompt is rendered and how its generated tokens are laid out.

A profile describes the generated assistant suffix as a sequence of pieces:

    Special("<think>")            a control token the model emits
    Lit("analysis")               fixed text the model emits between control tokens
    Field("reasoning", lead, trail)   the text an API returns in one field; ``lead``/``trail`` are the
                                  canonical junction whitespace the model writes at the field's edges

``build_output`` turns the API's text fields back into token ids. It never strips or normalises model
text: a field that already carries its junction is used as is; one whose junction a provider trimmed gets
the canonical junction and the record is flagged ``junction_restored``. Text between two control tokens is
encoded as one string (never per field: BPE merges across ``"Done." + "\\n"``).

``parse_output`` is the inverse: ids → the fields an OpenAI-compatible server returns (reasoning parser
semantics: the raw text between the markers, control tokens of tool-call markup kept as text).

Flags written into ``ResponseRecord.recon_flags``:

    junction_restored       a provider trimmed junction whitespace; the canonical junction was used
    reasoning_dropped       reasoning_tokens > 0 but no reasoning text came back
    truncated_in_reasoning  finish_reason=length with no content: no end-of-think, no end-of-turn
    truncated               finish_reason=length: no end-of-turn
    special_in_text:<tok>   a control-token string inside model text (not tool-call markup)
    tool_markup             tool-call control tokens inside model text (allowed for this profile)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ..errors import TokenizerError
from ..records import Message, Tool
from .tokenizer import Tokenizer

__all__ = [
    "Field",
    "Lit",
    "ParsedOutput",
    "Piece",
    "Profile",
    "Reconstruction",
    "Special",
    "render_template",
]


@dataclass(frozen=True)
class Special:
    text: str


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Field:
    name: Literal["reasoning", "content"]
    lead: str = ""
    trail: str = ""


Piece = Special | Lit | Field


@dataclass
class Reconstruction:
    ids: list[int]
    flags: list[str] = field(default_factory=list)
    reasoning_token_count: int = 0  # ids up to and including the end-of-think marker


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str
    ended: bool  # the end-of-turn token was generated
    in_reasoning: bool  # the output stopped before the end-of-think marker
    reasoning_token_count: int = 0


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise TokenizerError(f"chat template raised: {message}")


_ENV: Any = None


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
        tmpl = _compiled(template)
        out: str = tmpl.render(**context)
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"chat template failed to render: {exc}") from None
    return out


_TEMPLATES: dict[str, Any] = {}


def _compiled(template: str) -> Any:
    t = _TEMPLATES.get(template)
    if t is None:
        t = _ENV.from_string(template)
        _TEMPLATES[template] = t
    return t


class Profile:
    """Base profile. Subclasses set the class attributes and may override the hooks."""

    name: str = "base"
    #: the generated suffix when the model reasons, and when it does not
    thinking_suffix: tuple[Piece, ...] = ()
    plain_suffix: tuple[Piece, ...] = (Field("content"),)
    #: control token that ends reasoning; None if the format has no think markers
    think_end: str | None = None
    #: control token(s) ending a finished turn; the first is used when reconstructing
    end_of_turn: tuple[str, ...] = ()
    #: control tokens that may legitimately appear inside generated text (tool-call markup)
    generated_specials: tuple[str, ...] = ()
    #: keyword the chat template reads to switch thinking, e.g. "enable_thinking" or "thinking"
    thinking_kwarg: str | None = None

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None, *, thinking: bool = True,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.thinking = thinking
        self.template_kwargs = dict(template_kwargs or {})
        tok = tokenizer
        # Resolve every control token now, so a tokenizer that does not match fails at load time.
        for piece in (*self.thinking_suffix, *self.plain_suffix):
            if isinstance(piece, Special):
                tok.special_id(piece.text)
        self.end_of_turn_ids = tuple(tok.special_id(t) for t in self.end_of_turn)
        self.think_end_id = tok.special_id(self.think_end) if self.think_end else None
        self.generated_special_ids = frozenset(
            tok.special_tokens[t] for t in self.generated_specials if t in tok.special_tokens
        )

    # -- prompt -----------------------------------------------------------------------------------

    def template_context(self, messages: Sequence[Message], tools: Sequence[Tool] | None) -> dict[str, Any]:
        ctx: dict[str, Any] = {
            "messages": [msgspec.to_builtins(m) for m in messages],
            "tools": [msgspec.to_builtins(t) for t in tools] if tools else None,
            "add_generation_prompt": True,
            "bos_token": "",
            "eos_token": "",
        }
        if self.thinking_kwarg:
            ctx[self.thinking_kwarg] = self.thinking
        ctx.update(self.template_kwargs)
        return ctx

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[Tool] | None = None) -> str:
        if not self.chat_template:
            raise TokenizerError(
                f"profile {self.name!r} needs a chat template; put chat_template.jinja in the tokenizer folder"
            )
        return render_template(self.chat_template, **self.template_context(messages, tools))

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Tool] | None = None) -> list[int]:
        return self.tokenizer.encode(self.render_prompt(messages, tools))

    # -- generated suffix ---------------------------------------------------------------------------

    @property
    def suffix(self) -> tuple[Piece, ...]:
        return self.thinking_suffix if self.thinking else self.plain_suffix

    def end_token(self, content: str, finish_reason: str | None) -> str | None:
        """The control token that ends this turn, or None. Hook for formats with several (GLM, harmony)."""
        return self.end_of_turn[0] if self.end_of_turn else None

    def build_output(
        self,
        reasoning: str | None,
        content: str | None,
        finish_reason: str | None,
        *,
        reasoning_tokens: int = 0,
    ) -> Reconstruction:
        """Rebuild the generated ids from the text fields an API returned."""
        flags: list[str] = []
        content = content or ""
        reasoning = reasoning or ""
        truncated = finish_reason == "length"
        has_reasoning_field = any(isinstance(p, Field) and p.name == "reasoning" for p in self.suffix)
        in_reasoning = truncated and has_reasoning_field and content == ""
        if has_reasoning_field and reasoning == "" and reasoning_tokens > 0:
            flags.append("reasoning_dropped")
        if truncated:
            flags.append("truncated_in_reasoning" if in_reasoning else "truncated")

        segments: list[str | int] = []  # str: text run; int: control id
        run: list[str] = []
        restored = False
        tok = self.tokenizer
        for piece in self.suffix:
            if isinstance(piece, Special):
                if run:
                    segments.append("".join(run))
                    run = []
                segments.append(tok.special_tokens[piece.text])
            elif isinstance(piece, Lit):
                run.append(piece.text)
            else:
                text = reasoning if piece.name == "reasoning" else content
                if piece.name == "reasoning" and in_reasoning:
                    # Cut inside the reasoning: no trail junction, no end-of-think, nothing after.
                    if text and not text.startswith(piece.lead):
                        restored = True
                        run.append(piece.lead)
                    run.append(text)
                    break
                lead_ok = text.startswith(piece.lead)
                rest = text[len(piece.lead):] if lead_ok else text
                trail_ok = rest.endswith(piece.trail)
                if not (lead_ok and trail_ok):
                    restored = True
                run.append(piece.lead)
                run.append(rest)
                if not trail_ok:
                    run.append(piece.trail)
        if restored:
            flags.append("junction_restored")
        if run:
            segments.append("".join(run))
        if finish_reason in ("stop", "tool_calls"):
            end = self.end_token(content, finish_reason)
            if end is not None:
                segments.append(tok.special_tokens[end])

        ids: list[int] = []
        reasoning_count = 0
        think_end = self.think_end_id
        specials = tok.special_ids
        markup = 0
        for seg in segments:
            if isinstance(seg, int):
                ids.append(seg)
                if seg == think_end:
                    reasoning_count = len(ids)
                continue
            if not seg:
                continue
            enc = tok.encode(seg)
            if not specials.isdisjoint(enc):
                for t in enc:
                    if t in specials:
                        if t in self.generated_special_ids:
                            markup += 1
                        else:
                            flags.append(f"special_in_text:{tok.id_to_special[t]}")
            ids.extend(enc)
        if markup:
            flags.append("tool_markup")
        if in_reasoning:
            reasoning_count = len(ids)
        return Reconstruction(ids=ids, flags=flags, reasoning_token_count=reasoning_count)

    def parse_output(self, ids: Sequence[int]) -> ParsedOutput:
        """Split generated ids into the text fields a server returns (markers removed, text untouched)."""
        ids = list(ids)
        ended = bool(ids) and ids[-1] in self.end_of_turn_ids
        body = ids[:-1] if ended else ids
        # Skip leading control tokens and literals the suffix opens with (e.g. Qwen3 hybrid "<think>").
        start = 0
        tok = self.tokenizer
        if not self.thinking or self.think_end_id is None:
            return ParsedOutput(reasoning=None, content=tok.decode(body), ended=ended, in_reasoning=False)
        for piece in self.suffix:
            if isinstance(piece, Special) and start < len(body) and body[start] == tok.special_tokens[piece.text]:
                start += 1
                continue
            break
        try:
            close = body.index(self.think_end_id, start)
        except ValueError:
            return ParsedOutput(
                reasoning=tok.decode(body[start:]), content="", ended=ended, in_reasoning=True,
                reasoning_token_count=len(body),
            )
        return ParsedOutput(
            reasoning=tok.decode(body[start:close]),
            content=tok.decode(body[close + 1:]),
            ended=ended,
            in_reasoning=False,
            reasoning_token_count=close + 1,
        )
