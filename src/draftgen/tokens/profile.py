"""Model profiles: how a target model's prompt is rendered and how its generated tokens are laid out.

A profile describes the generated assistant suffix as a sequence of pieces:

    Special("<think>")            a control token the model emits
    Lit("analysis")               fixed text the model emits (between two control tokens)
    Field("reasoning", lead, trail)   the text an API returns in one field; ``lead``/``trail`` are the
                                  canonical junction whitespace the model writes at the field's edges

``build_output`` turns the API's text fields back into token ids. It never strips or normalises model
text: a field that already carries its junction is used as is; one whose junction a provider trimmed gets
the canonical junction (only the missing part) and the record is flagged ``junction_restored``. Text
between two control tokens is encoded as one string (never per field: BPE merges across ``"Done." + "\\n"``).

Control-token strings found inside model text: tool-call markup the profile declares
(``generated_specials``) and tokens whose HF ``special`` flag is false (``<think>``…) become control ids,
as the model's tokenizer encodes them; tokens whose HF flag is true (``<|im_end|>``…) are encoded as
plain text, because a server's detokenizer drops such a token when the model generates it, so a literal
one in returned text was written as text. The end-of-think marker inside the reasoning field is text too
(the server's reasoning parser would have split there). Every such string is flagged.

``parse_output`` is the inverse: ids → the fields an OpenAI-compatible server returns (reasoning parser
semantics: the raw text between the markers, control tokens of tool-call markup kept as text).

Flags written into ``ResponseRecord.recon_flags``:

    junction_restored       a provider trimmed junction whitespace; the canonical junction was used
    reasoning_dropped       reasoning_tokens > 0 but no reasoning text came back
    reasoning_unused        reasoning text came back for a profile run without thinking; not encoded
    replacement_char        the text holds U+FFFD, likely undecodable bytes a server replaced (not recoverable)
    truncated_in_reasoning  finish_reason=length with no content: no end-of-think, no end-of-turn
    truncated               finish_reason=length: no end-of-turn
    special_in_text:<tok>   a control-token string inside model text (not tool-call markup)
    tool_markup             tool-call control tokens inside model text (allowed for this profile)
    tool_calls_rendered     structured tool calls were rendered into the model's markup (ids, argument
                            spacing and numbering are the canonical ones, not necessarily the sampled ones)
    assumed_end_token       the end-of-turn token is a documented guess (GLM: <|user|> / <|observation|>)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from draftgen.errors import TokenizerError
from draftgen.records import Message, Tool, ToolCall
from draftgen.tokens.template import render_template
from draftgen.tokens.tokenizer import Tokenizer

__all__ = [
    "Field",
    "Lit",
    "ParsedOutput",
    "Piece",
    "Profile",
    "Reconstruction",
    "Special",
    "call_name_args",
    "render_template",
    "restore_lead",
    "restore_trail",
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
    #: the reasoning / content text exactly as encoded (junctions restored, tool markup appended)
    reasoning_text: str | None = None
    content_text: str = ""
    #: everything the ids decode to (control tokens as their strings): what ``decode(ids)`` must give
    text: str = ""
    ended: bool = False
    ids_source: str = "reconstructed"


@dataclass
class _Layout:
    """A suffix filled with the returned fields: each part a control id or (text, kind), kind "r"
    (reasoning), "c" (content) or "l" (literal); the texts as encoded; whether a junction was restored."""

    parts: list[int | tuple[str, str]] = field(default_factory=list)
    reasoning_text: str | None = None
    content_text: str = ""
    restored: bool = False


@dataclass
class ParsedOutput:
    reasoning: str | None
    content: str
    ended: bool  # the end-of-turn token was generated
    in_reasoning: bool  # the output stopped before the end-of-think marker
    reasoning_token_count: int = 0


def restore_lead(text: str, lead: str) -> tuple[str, bool]:
    """``text`` with the missing head of ``lead`` put back (only the part a provider trimmed)."""
    if not lead or text.startswith(lead):
        return text, False
    for k in range(1, len(lead) + 1):
        if text.startswith(lead[k:]):
            return lead[:k] + text, True
    return lead + text, True  # pragma: no cover - k == len(lead) always matches


def restore_trail(text: str, trail: str) -> tuple[str, bool]:
    if not trail or text.endswith(trail):
        return text, False
    for j in range(len(trail) - 1, -1, -1):
        if text.endswith(trail[:j]):
            return text + trail[j:], True
    return text + trail, True  # pragma: no cover


def _arguments_value(arguments: str) -> Any:
    """Tool-call arguments as a server passes them to the template: a mapping when the JSON parses."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def call_name_args(call: ToolCall) -> tuple[str, str]:
    """(function name, arguments text) of a structured tool call; arguments verbatim."""
    fn = call.function
    if fn is None:
        return "", ""
    return fn.name, fn.arguments


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
    #: control-token ids this model is known to use; a tokenizer that disagrees is the wrong one
    expected_special_ids: Mapping[str, int] = {}
    #: file names of this family's chat template / tokenizer config in a tokenizer folder
    template_names: tuple[str, ...] = ()
    config_names: tuple[str, ...] = ()
    #: pass tool-call arguments to the template as mappings (what vLLM/SGLang do) rather than strings
    tool_arguments_as_dict: bool = True
    #: lower-case pieces of the model ids of this family (``qwen3`` in ``qwen/qwen3-8b``); probe and plan warn
    #: when ``model.id`` holds none of them (empty: any model id fits, as for ``generic``)
    model_families: tuple[str, ...] = ()
    #: documented guesses this profile makes, for probe/audit output
    assumptions: tuple[str, ...] = ()
    #: the end-of-turn token is a guess (flag ``assumed_end_token`` on every ended output)
    end_token_assumed: bool = False
    #: an output has at most one end-of-think token (harmony's ``<|end|>`` also ends other messages)
    think_end_unique: bool = True
    #: sha256 of the vocabulary file this profile was loaded with (set by ``tokens.load_profile``)
    tokenizer_sha256: str = ""
    #: How the emulator writes this family's outputs (``emulator.model``; nothing else reads these).
    #: ``tool_markup``: the raw tool-call markup style of ``emulator.textgen.tool_call_markup``
    #: (``"qwen3"``, ``"glm"``, ``"kimi"``), None for a family whose tool calls the emulator does not
    #: write. The emulator writes it only when every ``generated_specials`` token is a control token of the
    #: tokenizer in use. ``reasoning_edge``/``content_edge``: whitespace real models write at the start of
    #: the reasoning / content field beyond the profile's junctions (at ``scenario.leading_space_rate``).
    tool_markup: str | None = None
    reasoning_edge: str = ""
    content_edge: str = ""

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None = None,
        *,
        thinking: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.thinking = thinking
        self.template_kwargs = dict(template_kwargs or {})
        self.config = dict(config or {})
        self.options = dict(options or {})
        self.configure(self.options)
        tok = tokenizer
        # Resolve every control token now, so a tokenizer that does not match fails at load time.
        needed = [p.text for p in (*self.thinking_suffix, *self.plain_suffix) if isinstance(p, Special)]
        needed += list(self.end_of_turn) + ([self.think_end] if self.think_end else [])
        for text in needed:
            if text not in tok.special_tokens:
                raise TokenizerError(
                    f"profile {self.name!r} needs control token {text!r} but tokenizer {tok.name!r} has none; "
                    "the tokenizer does not match model.profile (check model.tokenizer)"
                )
        for text, want in self.expected_special_ids.items():
            got = tok.special_tokens.get(text)
            if got != want:
                raise TokenizerError(
                    f"profile {self.name!r}: {text!r} is id {got} in tokenizer {tok.name!r}, expected {want}; "
                    "wrong tokenizer files for this model"
                )
        self.end_of_turn_ids = tuple(tok.special_tokens[t] for t in self.end_of_turn)
        self.think_end_id = tok.special_tokens[self.think_end] if self.think_end else None
        self.generated_special_ids = frozenset(
            tok.special_tokens[t] for t in self.generated_specials if t in tok.special_tokens
        )
        self._lit_cache: dict[str, list[int]] = {}

    def configure(self, options: Mapping[str, Any]) -> None:
        """Hook: read ``model.profile_options`` (the generic profile does; others accept none)."""
        if options:
            raise TokenizerError(
                f"profile {self.name!r} takes no profile_options (got {', '.join(sorted(options))}); "
                "only the generic profile is configured that way"
            )

    # -- prompt -----------------------------------------------------------------------------------

    def _special_text(self, key: str) -> str:
        value = self.config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else ""

    def message_dict(self, message: Message) -> dict[str, Any]:
        """A message as an OpenAI-compatible server (vLLM, SGLang) hands it to the template: ``content``
        always present (a null content becomes ""), tool calls with ``id``/``type``, arguments as
        mappings where the profile's servers convert them."""
        d: dict[str, Any] = {"role": message.role, "content": ""}
        d.update(msgspec.to_builtins(message))
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                c: dict[str, Any] = {"id": call.id, "type": call.type}
                if call.function is not None:
                    args: Any = call.function.arguments
                    if self.tool_arguments_as_dict:
                        args = _arguments_value(args)
                    c["function"] = {"name": call.function.name, "arguments": args}
                calls.append(c)
            d["tool_calls"] = calls
        return d

    def tool_dict(self, tool: Tool) -> dict[str, Any]:
        d: dict[str, Any] = {"type": tool.type}
        d.update(msgspec.to_builtins(tool))
        return d

    def template_context(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None,
        *,
        add_generation_prompt: bool = True,
        when: float | None = None,
    ) -> dict[str, Any]:
        ctx: dict[str, Any] = {
            "messages": [self.message_dict(m) for m in messages],
            "tools": [self.tool_dict(t) for t in tools] if tools else None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._special_text("bos_token"),
            "eos_token": self._special_text("eos_token"),
            "strftime_now": lambda fmt: time.strftime(fmt, time.localtime(when) if when else time.localtime()),
        }
        if self.thinking_kwarg:
            ctx[self.thinking_kwarg] = self.thinking
        ctx.update(self.template_kwargs)
        return ctx

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None = None,
        *,
        add_generation_prompt: bool = True,
        when: float | None = None,
    ) -> str:
        """The prompt text the server renders (``when``: request time, for templates that print a date)."""
        if not self.chat_template:
            raise TokenizerError(
                f"profile {self.name!r} needs a chat template; put chat_template.jinja in the tokenizer folder "
                "or set model.chat_template"
            )
        ctx = self.template_context(messages, tools, add_generation_prompt=add_generation_prompt, when=when)
        return render_template(self.chat_template, **ctx)

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[Tool] | None = None, *, when: float | None = None
    ) -> list[int]:
        """Ids of the rendered prompt; control-token strings in it become control ids, no BOS is added."""
        return self.tokenizer.encode(self.render_prompt(messages, tools, when=when))

    # -- generated suffix ---------------------------------------------------------------------------

    @property
    def suffix(self) -> tuple[Piece, ...]:
        return self.thinking_suffix if self.thinking else self.plain_suffix

    def suffix_for(
        self, reasoning: str, content: str, reasoning_tokens: int, tool_calls: Sequence[ToolCall] | None
    ) -> tuple[Piece, ...]:
        """Hook: the suffix used for one output (harmony picks channels by what came back)."""
        return self.suffix

    def repair_fields(self, reasoning: str | None, content: str | None, flags: list[str]) -> tuple[str | None, str | None]:
        """Hook: undo a known provider parsing failure that moved markup into the text (flagged).
        Never edits the model's own text."""
        return reasoning, content

    def end_token(self, content: str, finish_reason: str | None, tool_calls: Sequence[ToolCall] | None = None) -> str | None:
        """The control token that ends this turn, or None. Hook for formats with several (GLM, harmony)."""
        return self.end_of_turn[0] if self.end_of_turn else None

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str, flags: list[str]) -> str:
        """Hook: structured tool calls as the model writes them after ``content`` (control tokens as
        their strings). The base profile cannot and says so."""
        flags.append("tool_calls_unrendered")
        return ""

    @property
    def allowed_output_special_ids(self) -> frozenset[int]:
        """Control ids that may appear in a generated suffix of this profile."""
        tok = self.tokenizer
        ids = {tok.special_tokens[p.text] for p in (*self.thinking_suffix, *self.plain_suffix) if isinstance(p, Special)}
        ids.update(self.end_of_turn_ids)
        ids.update(self.generated_special_ids)
        if self.think_end_id is not None:
            ids.add(self.think_end_id)
        return frozenset(ids)

    def build_output(
        self,
        reasoning: str | None,
        content: str | None,
        finish_reason: str | None,
        *,
        reasoning_tokens: int = 0,
        tool_calls: Sequence[ToolCall] | None = None,
        content_ids: Sequence[int] | None = None,
    ) -> Reconstruction:
        """Rebuild the generated ids from the text fields an API returned.

        ``content_ids``: exact ids of the content run (from logprobs); used instead of encoding it.
        Only valid where the content run is bounded by control tokens (see ``logprobs``).
        """
        flags: list[str] = []
        reasoning, content = self.repair_fields(reasoning, content, flags)
        content = content or ""
        reasoning = reasoning or ""
        suffix = self.suffix_for(reasoning, content, reasoning_tokens, tool_calls)
        in_reasoning = self._output_flags(suffix, reasoning, content, finish_reason, reasoning_tokens, tool_calls, flags)
        tool_text = self.render_tool_calls(tool_calls, content, flags) if tool_calls else ""
        layout = self._lay_out(suffix, reasoning, content, tool_text, in_reasoning)
        if layout.restored:
            flags.append("junction_restored")
        end = self.end_token(content, finish_reason, tool_calls) if finish_reason in ("stop", "tool_calls") else None
        if end is not None:
            layout.parts.append(self.tokenizer.special_tokens[end])
            if self.end_token_assumed:
                flags.append("assumed_end_token")
        exact_content = None if tool_text else content_ids
        ids, texts, reasoning_count = self._encode_parts(layout.parts, in_reasoning, exact_content, flags)
        return Reconstruction(
            ids=ids,
            flags=flags,
            reasoning_token_count=reasoning_count,
            reasoning_text=layout.reasoning_text,
            content_text=layout.content_text,
            text="".join(texts),
            ended=end is not None,
        )

    def _output_flags(
        self,
        suffix: Sequence[Piece],
        reasoning: str,
        content: str,
        finish_reason: str | None,
        reasoning_tokens: int,
        tool_calls: Sequence[ToolCall] | None,
        flags: list[str],
    ) -> bool:
        """Append the flags the returned fields alone imply; True when the output was cut inside the
        reasoning (finish_reason=length, a reasoning suffix, no content and no tool calls)."""
        has_reasoning = any(isinstance(p, Field) and p.name == "reasoning" for p in suffix)
        truncated = finish_reason == "length"
        in_reasoning = truncated and has_reasoning and content == "" and not tool_calls
        if has_reasoning and reasoning == "" and reasoning_tokens > 0:
            flags.append("reasoning_dropped")
        if not has_reasoning and reasoning:
            flags.append("reasoning_unused")
        if truncated:
            flags.append("truncated_in_reasoning" if in_reasoning else "truncated")
        if "\ufffd" in reasoning or "\ufffd" in content:
            # U+FFFD usually stands for bytes the server could not decode (a cut inside a character):
            # the sampled bytes are lost and re-encoding gives the replacement character's own bytes.
            flags.append("replacement_char")
        return in_reasoning

    def _lay_out(
        self, suffix: Sequence[Piece], reasoning: str, content: str, tool_text: str, in_reasoning: bool
    ) -> _Layout:
        """The suffix's pieces filled with the fields, junctions restored (only the missing part)."""
        tok = self.tokenizer
        out = _Layout()
        for piece in suffix:
            if isinstance(piece, Special):
                out.parts.append(tok.special_tokens[piece.text])
            elif isinstance(piece, Lit):
                out.parts.append((piece.text, "l"))
            elif piece.name == "reasoning":
                text, r1 = restore_lead(reasoning, piece.lead)
                if in_reasoning:
                    # Cut inside the reasoning: no trail junction, no end-of-think, nothing after.
                    out.restored |= r1 and reasoning != ""
                    out.reasoning_text = text if reasoning else ""
                    out.parts.append((out.reasoning_text, "r"))
                    break
                text, r2 = restore_trail(text, piece.trail)
                out.restored |= r1 or r2
                out.reasoning_text = text
                out.parts.append((text, "r"))
            else:
                text, r1 = restore_lead(content, piece.lead)
                text, r2 = restore_trail(text, piece.trail)
                out.restored |= r1 or r2
                out.content_text = text + tool_text
                out.parts.append((out.content_text, "c"))
        return out

    def _encode_parts(
        self,
        parts: Sequence[int | tuple[str, str]],
        in_reasoning: bool,
        content_ids: Sequence[int] | None,
        flags: list[str],
    ) -> tuple[list[int], list[str], int]:
        """(ids, decoded texts, reasoning token count) of laid-out parts. Adjacent text parts form one
        run, encoded as one string; ``content_ids`` replace the encoding of a run that is content only."""
        ids: list[int] = []
        texts: list[str] = []
        reasoning_count = 0
        think_end = self.think_end_id
        id_to_special = self.tokenizer.id_to_special
        run: list[str] = []
        run_kinds = ""
        for part in (*parts, None):
            if isinstance(part, tuple):
                run.append(part[0])
                run_kinds += part[1]
                continue
            if run:
                text = "".join(run)
                texts.append(text)
                if content_ids is not None and run_kinds == "c":
                    ids.extend(content_ids)
                elif text:
                    ids.extend(self.encode_run(text, "r" in run_kinds, flags))
                run = []
                run_kinds = ""
            if part is None:
                break
            ids.append(part)
            texts.append(id_to_special[part])
            if part == think_end and not in_reasoning:
                reasoning_count = len(ids)
        if in_reasoning:
            reasoning_count = len(ids)
        return ids, texts, reasoning_count

    def encode_run(self, text: str, in_reasoning: bool, flags: list[str]) -> list[int]:
        """Encode one text run between control tokens (see the module docstring for literal specials)."""
        tok = self.tokenizer
        pattern = tok.special_pattern
        if pattern.search(text) is None:
            return tok.encode(text)
        out: list[int] = []
        buf: list[str] = []
        pos = 0
        markup = False
        for m in pattern.finditer(text):
            sid = tok.special_tokens[m.group(0)]
            if sid in self.generated_special_ids:
                control = True
                markup = True
            else:
                control = sid not in tok.hf_special_ids and not (in_reasoning and sid == self.think_end_id)
                flag = f"special_in_text:{m.group(0)}"
                if flag not in flags:
                    flags.append(flag)
            if control:
                buf.append(text[pos:m.start()])
                chunk = "".join(buf)
                if chunk:
                    out.extend(tok.encode_ordinary(chunk))
                buf = []
                out.append(sid)
            else:
                buf.append(text[pos:m.end()])
            pos = m.end()
        buf.append(text[pos:])
        chunk = "".join(buf)
        if chunk:
            out.extend(tok.encode_ordinary(chunk))
        if markup and "tool_markup" not in flags:
            flags.append("tool_markup")
        return out

    # -- parsing ----------------------------------------------------------------------------------------

    def _lit_ids(self, text: str) -> list[int]:
        ids = self._lit_cache.get(text)
        if ids is None:
            ids = self._lit_cache[text] = self.tokenizer.encode_ordinary(text)
        return ids

    def _match(self, body: Sequence[int], pos: int, pieces: Sequence[Piece]) -> int | None:
        """Position after ``pieces`` (control tokens and literals) if ``body`` has them at ``pos``."""
        tok = self.tokenizer
        for piece in pieces:
            if isinstance(piece, Special):
                if pos < len(body) and body[pos] == tok.special_tokens[piece.text]:
                    pos += 1
                    continue
                return None
            if isinstance(piece, Lit):
                lit = self._lit_ids(piece.text)
                if list(body[pos:pos + len(lit)]) == lit:
                    pos += len(lit)
                    continue
                # A non-canonical segmentation of the literal ("anal" "ysis") still spells it.
                want = piece.text.encode("utf-8")
                got = b""
                end = pos
                while len(got) < len(want) and end < len(body) and body[end] not in tok.special_ids:
                    got += tok.token_bytes(body[end])
                    end += 1
                if got != want:
                    return None
                pos = end
                continue
            return None
        return pos

    def parse_with(self, suffix: Sequence[Piece], body: list[int], ended: bool) -> ParsedOutput | None:
        """Parse ``body`` (end-of-turn removed) against one suffix layout; None if it does not fit."""
        tok = self.tokenizer
        names = [p.name if isinstance(p, Field) else None for p in suffix]
        if "reasoning" not in names or self.think_end_id is None:
            c_at = names.index("content") if "content" in names else len(suffix)
            pos = self._match(body, 0, suffix[:c_at])
            if pos is None:
                return None
            return ParsedOutput(reasoning=None, content=tok.decode(body[pos:]), ended=ended, in_reasoning=False)
        r_at = names.index("reasoning")
        pos = self._match(body, 0, suffix[:r_at])
        if pos is None:
            return None
        try:
            close = body.index(self.think_end_id, pos)
        except ValueError:
            return ParsedOutput(
                reasoning=tok.decode(body[pos:]), content="", ended=ended, in_reasoning=True,
                reasoning_token_count=len(body),
            )
        end_at = next(i for i in range(r_at + 1, len(suffix)) if suffix[i] == Special(self.think_end or ""))
        c_at = names.index("content") if "content" in names else len(suffix)
        cpos = self._match(body, close + 1, suffix[end_at + 1:c_at])
        return ParsedOutput(
            reasoning=tok.decode(body[pos:close]),
            content=tok.decode(body[(close + 1 if cpos is None else cpos):]),
            ended=ended,
            in_reasoning=False,
            reasoning_token_count=close + 1,
        )

    def parse_output(self, ids: Sequence[int]) -> ParsedOutput:
        """Split generated ids into the text fields a server returns (markers removed, text untouched)."""
        ids = list(ids)
        ended = bool(ids) and ids[-1] in self.end_of_turn_ids
        body = ids[:-1] if ended else ids
        for suffix in (self.suffix, self.plain_suffix):
            parsed = self.parse_with(suffix, body, ended)
            if parsed is not None:
                return parsed
        return ParsedOutput(reasoning=None, content=self.tokenizer.decode(body), ended=ended, in_reasoning=False)
