"""The emulated model: deterministic token ids through a real tokenizer and model profile.

A request maps (by a hash of prompt, seed and sampling) onto one of ``scenario.pool_size`` samples.
Sample ``i`` is a pure function of (server seed, thinking, i): the model writes raw reasoning and
content text *with the profile's canonical junction whitespace* (Qwen3: reasoning ``"\\n…\\n"``, content
``"\\n\\n…"``; Kimi: a leading space on most rows), and

    ids = profile.build_output(raw_reasoning, raw_content, "stop").ids     # canonical, incl. end-of-turn

At ``scenario.non_canonical_rate`` one to three text tokens are then replaced by a split into two
tokens whose bytes concatenate to the same bytes: the text is identical, the ids are not what
re-encoding gives (the BPE effect). ``max_tokens`` truncates (``finish_reason: "length"``); runaway
samples never end and always reach it. What the API returns is ``profile.parse_output(ids)``: reasoning
= raw text between the markers, content = the rest (tool-call control tokens kept as text).

Everything a request needs is cached per (thinking, sample, max_tokens): ids, text fields, streaming
segments per chunk size, content logprobs; a request costs a hash and a dict lookup.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from draftgen.emulator import textgen
from draftgen.emulator.scenarios import Scenario
from draftgen.tokens.profile import Field, Profile, Special

__all__ = ["EmulatedModel", "Output", "Segment", "stable_hash"]

FieldName = Literal["reasoning", "content"]


def stable_hash(*parts: object) -> int:
    """A 64-bit hash stable across processes (Python's ``hash`` is salted)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(h.digest(), "little")


@dataclass
class Segment:
    """One streamed piece of a field: ``text`` covers ids[tok0:tok1] (cut at character boundaries)."""

    field: FieldName
    text: str
    tok0: int
    tok1: int


@dataclass
class Output:
    """One generation as the server sees it. ``ids`` are the true sampled ids (ground truth)."""

    ids: list[int]
    reasoning: str | None  # None: the profile/variant has no reasoning field
    content: str
    finish_reason: str  # "stop" | "length"
    reasoning_tokens: int
    non_canonical: bool
    ranges: list[tuple[FieldName, int, int]]  # token ranges of each text field, in order
    id_info: Callable[[int], TokenInfo]  # token id → (bytes, characters started, starts mid-character)
    _segments: dict[int, list[Segment]] = field(default_factory=dict)
    _logprobs: list[dict[str, object]] | None = None
    views: dict[tuple[object, ...], Any] = field(default_factory=dict)  # responses.View per quirk set

    def id_bytes(self, tid: int) -> bytes:
        return self.id_info(tid)[0]

    @property
    def content_range(self) -> tuple[int, int]:
        for name, a, b in self.ranges:
            if name == "content":
                return a, b
        return len(self.ids), len(self.ids)

    def segments(self, chunk_tokens: int) -> list[Segment]:
        """The fields split into pieces of about ``chunk_tokens`` tokens; texts concatenate to the fields."""
        segs = self._segments.get(chunk_tokens)
        if segs is None:
            segs = []
            for name, a, b in self.ranges:
                text = self.reasoning if name == "reasoning" else self.content
                segs.extend(_split_field(name, text or "", [self.id_info(t) for t in self.ids], a, b,
                                         chunk_tokens))
            self._segments[chunk_tokens] = segs
        return segs

    def content_logprobs(self) -> list[dict[str, object]]:
        """OpenAI-shaped logprob entries for the content tokens (``token``, ``bytes``, ``logprob``)."""
        if self._logprobs is None:
            a, b = self.content_range
            out: list[dict[str, object]] = []
            for i in range(a, b):
                raw = self.id_bytes(self.ids[i])
                lp = -((stable_hash(self.ids[i], i) % 4000) / 1000.0) ** 2 / 4.0
                out.append({"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw),
                            "logprob": round(lp, 6), "top_logprobs": []})
            self._logprobs = out
        return self._logprobs


def _is_cont(b: int) -> bool:
    return 0x80 <= b < 0xC0


TokenInfo = tuple[bytes, int, bool]


def token_info(raw: bytes) -> TokenInfo:
    """(bytes, how many UTF-8 characters start in them, whether they begin inside a character)."""
    return raw, sum(1 for x in raw if not _is_cont(x)), bool(raw) and _is_cont(raw[0])


def _split_field(name: FieldName, text: str, info: Sequence[TokenInfo], a: int, b: int,
                 chunk: int) -> list[Segment]:
    if a >= b:
        return []
    out: list[Segment] = []
    chars = 0  # character offset of the current group start within ``text``
    i = a
    while i < b:
        j = min(b, i + chunk)
        # Never cut inside a UTF-8 character: extend while the next token starts with a continuation byte.
        while j < b and info[j][2]:
            j += 1
        if j >= b:
            out.append(Segment(name, text[chars:], i, b))
            break
        n = sum(t[1] for t in info[i:j])
        out.append(Segment(name, text[chars:chars + n], i, j))
        chars += n
        i = j
    return out


_RUNAWAY_MARGIN = 64  # ids generated past the budget, so the cut never sees the text's end
_RUNAWAY_SPLIT_SPAN = 256


@dataclass
class _Sample:
    ids: list[int]
    non_canonical: bool
    runaway: bool
    rng_seed: int


class EmulatedModel:
    """Deterministic outputs for one profile. ``profiles[True]`` reasons, ``profiles[False]`` does not."""

    def __init__(self, profile: Profile, scenario: Scenario, seed: int, *, plain: Profile | None = None,
                 cache_size: int = 2048) -> None:
        self.scenario = scenario
        self.seed = seed
        self.tokenizer = profile.tokenizer
        self.profiles: dict[bool, Profile] = {profile.thinking: profile}
        if plain is not None:
            self.profiles[plain.thinking] = plain
        self._samples: dict[tuple[bool, int], _Sample] = {}
        self._runaways: dict[tuple[bool, int, bool], list[int]] = {}
        self._outputs: OrderedDict[tuple[bool, int, int], Output] = OrderedDict()
        self._cache_size = cache_size
        self._tinfo: dict[int, TokenInfo] = {}
        # Per-family behaviour is declared by the profile (``Profile.tool_markup``, ``reasoning_edge``,
        # ``content_edge``), never guessed from its name. Tool markup is written only when the tokenizer in
        # use has every control token of it (a profile on a foreign test tokenizer writes none).
        markup_ok = set(profile.generated_specials) <= set(self.tokenizer.special_tokens)
        self.tool_style: str | None = profile.tool_markup if markup_ok else None
        self.reasoning_edge = profile.reasoning_edge
        self.content_edge = profile.content_edge

    def profile(self, thinking: bool) -> Profile:
        p = self.profiles.get(thinking)
        if p is None:
            base = next(iter(self.profiles.values()))
            p = type(base)(base.tokenizer, base.chat_template, thinking=thinking, template_kwargs=base.template_kwargs,
                           config=base.config, options=base.options)
            self.profiles[thinking] = p
        return p

    # -- samples ------------------------------------------------------------------------------------

    def _lengths(self, rng: random.Random) -> tuple[int, int]:
        sc = self.scenario

        def draw(median: int) -> int:
            return max(1, min(sc.max_generated_tokens, int(median * math.exp(rng.gauss(0.0, sc.length_sigma)))))

        return draw(sc.reasoning_tokens_median), draw(sc.content_tokens_median)

    def _raw_fields(self, profile: Profile, rng: random.Random, n_reason: int, n_content: int,
                    tool_call: bool) -> tuple[str, str]:
        pieces = {p.name: p for p in profile.suffix if isinstance(p, Field)}
        reasoning = ""
        if "reasoning" in pieces:
            body = textgen.reasoning_text(rng, n_reason)
            if self.reasoning_edge and rng.random() < self.scenario.leading_space_rate:
                body = self.reasoning_edge + body
            f = pieces["reasoning"]
            reasoning = f.lead + body + f.trail
        body = textgen.content_text(rng, n_content)
        if self.content_edge and rng.random() < self.scenario.leading_space_rate:
            body = self.content_edge + body
        if tool_call and self.tool_style is not None:
            markup = textgen.tool_call_markup(rng, self.tool_style)
            body = markup if rng.random() < 0.3 else body + "\n\n" + markup
        f = pieces.get("content", Field("content"))
        return reasoning, f.lead + body + f.trail

    def _sample(self, thinking: bool, idx: int) -> _Sample:
        key = (thinking, idx)
        s = self._samples.get(key)
        if s is None:
            rng_seed = stable_hash("sample", self.seed, thinking, idx)
            rng = random.Random(rng_seed)
            sc = self.scenario
            runaway = rng.random() < sc.runaway_rate
            n_r, n_c = self._lengths(rng)
            tool = rng.random() < sc.tool_call_rate
            profile = self.profile(thinking)
            reasoning, content = self._raw_fields(profile, rng, n_r, n_c, tool)
            ids = profile.build_output(reasoning, content, "stop").ids
            non_canonical = rng.random() < sc.non_canonical_rate
            if non_canonical:
                non_canonical = self._make_non_canonical(ids, rng, rng.choice((1, 1, 1, 2, 3)))
            s = _Sample(ids, non_canonical, runaway, rng_seed)
            self._samples[key] = s
        return s

    def _runaway_ids(self, thinking: bool, idx: int, s: _Sample, need: int, *, ended: bool = False) -> list[int]:
        """A sample that does not end before ``need`` ids (``ended``: it then ends, with a short answer).
        Its text comes from one random stream that only grows with ``need``, so a smaller budget gets
        (up to the last few ids before the cut) a prefix of a larger one's ids."""
        key = (thinking, idx, ended)
        ids = self._runaways.get(key)
        if ids is None or len(ids) < need + _RUNAWAY_MARGIN:
            profile = self.profile(thinking)
            has_reasoning = any(isinstance(p, Field) and p.name == "reasoning" for p in profile.suffix)
            n = max(need, _RUNAWAY_SPLIT_SPAN) + 2 * _RUNAWAY_MARGIN
            while True:
                rng = random.Random(s.rng_seed ^ 0x5EED)  # same stream every time: text only grows
                if has_reasoning:
                    reasoning, content = self._raw_fields(profile, rng, n, 60, False)
                    ids = profile.build_output(reasoning, content if ended else "", "stop" if ended else "length").ids
                else:
                    _, content = self._raw_fields(profile, rng, 1, n, False)
                    ids = profile.build_output(None, content, "stop" if ended else "length").ids
                if ended or len(ids) >= need + _RUNAWAY_MARGIN:
                    break
                n = int(n * 1.5) + _RUNAWAY_MARGIN
            if s.non_canonical:
                # Splits only in a fixed leading span, so every length agrees on them.
                self._make_non_canonical(ids, random.Random(s.rng_seed), 1, limit=_RUNAWAY_SPLIT_SPAN)
            self._runaways[key] = ids
        return ids

    def _info(self, tid: int) -> TokenInfo:
        t = self._tinfo.get(tid)
        if t is None:
            t = token_info(self.tokenizer.token_bytes(tid))
            self._tinfo[tid] = t
        return t

    def _bytes(self, tid: int) -> bytes:
        return self._info(tid)[0]

    def _make_non_canonical(self, ids: list[int], rng: random.Random, n: int, *, limit: int | None = None) -> bool:
        """Replace ``n`` text tokens in place by two tokens with the same bytes. False if none could be."""
        specials = self.tokenizer.special_ids
        b2id = self.tokenizer.bytes_to_id
        span = len(ids) if limit is None else min(limit, len(ids))
        candidates = [i for i in range(span) if ids[i] not in specials and len(self._bytes(ids[i])) >= 2]
        rng.shuffle(candidates)
        done = 0
        offset = 0  # each split inserts one id; candidates are shifted accordingly
        for i in sorted(candidates[: n * 4]):
            if done >= n:
                break
            pos = i + offset
            raw = self._bytes(ids[pos])
            cuts = [k for k in range(1, len(raw)) if raw[:k] in b2id and raw[k:] in b2id]
            if not cuts:
                continue
            k = rng.choice(cuts)
            ids[pos:pos + 1] = [b2id[raw[:k]], b2id[raw[k:]]]
            offset += 1
            done += 1
        return done > 0

    # -- outputs ------------------------------------------------------------------------------------

    def pool_index(self, key: int) -> int:
        return key % self.scenario.pool_size

    def lookup(self, key: int, *, thinking: bool, max_tokens: int) -> Output | None:
        """The cached output for request hash ``key``, or None (call on the server's loop only)."""
        ck = (thinking, self.pool_index(key), max_tokens)
        out = self._outputs.get(ck)
        if out is not None:
            self._outputs.move_to_end(ck)
        return out

    def remember(self, key: int, *, thinking: bool, max_tokens: int, out: Output) -> None:
        self._outputs[(thinking, self.pool_index(key), max_tokens)] = out
        if len(self._outputs) > self._cache_size:
            self._outputs.popitem(last=False)

    def produce(self, key: int, *, thinking: bool, max_tokens: int) -> Output:
        """Generate the output for ``key`` (may run in a worker thread; touches only the sample caches)."""
        idx = self.pool_index(key)
        s = self._sample(thinking, idx)
        cap = self.scenario.max_runaway_tokens
        if s.runaway and max_tokens <= cap:
            ids = self._runaway_ids(thinking, idx, s, max_tokens)[:max_tokens]
        elif s.runaway:  # a budget beyond the runaway cap: this long sample ends after about cap ids
            ids = self._runaway_ids(thinking, idx, s, cap, ended=True)
        else:
            ids = s.ids
        finish = "stop"
        if len(ids) > max_tokens or (s.runaway and max_tokens <= cap):
            ids = ids[:max_tokens]
            finish = "length"
        return self.build(list(ids), thinking=thinking, finish_reason=finish, non_canonical=s.non_canonical)

    def output(self, key: int, *, thinking: bool, max_tokens: int) -> Output:
        """The output for request hash ``key`` under ``max_tokens`` (cached), synchronously."""
        out = self.lookup(key, thinking=thinking, max_tokens=max_tokens)
        if out is None:
            out = self.produce(key, thinking=thinking, max_tokens=max_tokens)
            self.remember(key, thinking=thinking, max_tokens=max_tokens, out=out)
        return out

    def build(self, ids: list[int], *, thinking: bool, finish_reason: str, non_canonical: bool) -> Output:
        """Parse true ids into the fields a server returns."""
        profile = self.profile(thinking)
        parsed = profile.parse_output(ids)
        ended = parsed.ended
        body_end = len(ids) - 1 if ended else len(ids)
        ranges: list[tuple[FieldName, int, int]] = []
        if parsed.reasoning is None:
            ranges.append(("content", 0, body_end))
        else:
            start = 0
            tok = self.tokenizer
            for piece in profile.suffix:
                if isinstance(piece, Special) and start < body_end and ids[start] == tok.special_tokens[piece.text]:
                    start += 1
                    continue
                break
            if parsed.in_reasoning:
                ranges.append(("reasoning", start, body_end))
            else:
                close = ids.index(profile.think_end_id, start) if profile.think_end_id is not None else start
                ranges.append(("reasoning", start, close))
                ranges.append(("content", close + 1, body_end))
        return Output(
            ids=ids,
            reasoning=parsed.reasoning,
            content=parsed.content,
            finish_reason=finish_reason,
            reasoning_tokens=parsed.reasoning_token_count,
            non_canonical=non_canonical,
            ranges=ranges,
            id_info=self._info,
        )

    def cut_at_stop(self, out: Output, stops: Sequence[str], *, thinking: bool) -> Output:
        """Apply stop strings to the content: the content ends before the first match; the true ids
        run through the token that completed the match (no end-of-turn). Unchanged if none matches."""
        content = out.content
        best: tuple[int, int] | None = None
        for s in stops:
            if not s:
                continue
            p = content.find(s)
            if p >= 0 and (best is None or p < best[0]):
                best = (p, p + len(s))
        if best is None:
            return out
        a, b = out.content_range
        chars = 0
        end = a
        for i in range(a, b):
            if chars >= best[1]:
                break
            chars += out.id_info(out.ids[i])[1]
            end = i + 1
        cut = self.build(out.ids[:end], thinking=thinking, finish_reason="stop", non_canonical=out.non_canonical)
        # Segments slice the field text consecutively, so they still concatenate to the cut content.
        cut.content = content[: best[0]]
        cut.views.clear()
        return cut
