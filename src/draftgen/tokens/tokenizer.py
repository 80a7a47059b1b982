"""One tokenizer interface over Hugging Face ``tokenizers`` and ``tiktoken``.

``Tokenizer`` is what profiles, reconstruction, the audit and the emulator use. It never strips or
normalises text beyond what the model's own tokenizer does (Qwen3 applies NFC; that is the tokenizer's).

- ``encode(text)``: special-token strings inside ``text`` become their control ids, as the model's
  tokenizer does (HF always matches added tokens; Kimi's encode uses ``allowed_special="all"``).
- ``encode_ordinary(text)``: special-token strings are encoded as plain text.
- ``token_bytes(id)``: the raw bytes of a token (byte-level BPE), used for logprob recovery and by the
  emulator's non-canonical segmentation.
- ``special_tokens``: every control token (text → id), whatever its HF ``special`` flag;
  ``hf_special_ids``: the subset whose HF flag is true, i.e. the ones a server's detokenizer drops
  with ``skip_special_tokens`` (a literal one found in returned text cannot be a generated control id).
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["HFTokenizer", "TiktokenTokenizer", "Tokenizer", "bytes_to_unicode"]


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    return {v: k for k, v in bytes_to_unicode().items()}


class Tokenizer:
    """Common interface. Subclasses wrap a concrete library."""

    name: str = ""
    #: special token text → id (every control token the model knows, HF "special" flag or not)
    special_tokens: dict[str, int]
    #: ids whose HF ``special`` flag is true (dropped by ``skip_special_tokens``)
    hf_special_ids: frozenset[int] = frozenset()
    vocab_size: int
    #: the Unicode normal form the tokenizer applies before encoding ("NFC" for Qwen3), or None
    normalization: str | None = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_ordinary(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        raise NotImplementedError

    def normalize(self, text: str) -> str:
        """``text`` as the tokenizer sees it (``decode(encode(text))`` for text without specials)."""
        return unicodedata.normalize(self.normalization, text) if self.normalization else text  # type: ignore[arg-type]

    def token_str(self, token_id: int) -> str:
        """A readable form of one token, for mismatch reports (``' NOR'``)."""
        if token_id in self.special_ids:
            return self.id_to_special[token_id]
        try:
            return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")
        except (KeyError, ValueError, IndexError):
            return f"<unknown:{token_id}>"

    def token_strs(self, ids: Iterable[int]) -> list[str]:
        return [self.token_str(t) for t in ids]

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self.special_tokens.values())

    @functools.cached_property
    def special_pattern(self) -> re.Pattern[str]:
        """Matches any control-token string (longest first, like the tokenizers' own matchers)."""
        names = sorted(self.special_tokens, key=len, reverse=True)
        return re.compile("|".join(re.escape(n) for n in names) if names else r"(?!x)x")

    @functools.cached_property
    def id_to_special(self) -> dict[int, str]:
        return {v: k for k, v in self.special_tokens.items()}

    def special_id(self, text: str) -> int:
        try:
            return self.special_tokens[text]
        except KeyError:
            from draftgen.errors import TokenizerError

            raise TokenizerError(
                f"tokenizer {self.name!r} has no special token {text!r}; the tokenizer does not match the profile"
            ) from None

    @functools.cached_property
    def bytes_to_id(self) -> dict[bytes, int]:
        """Every non-special token's bytes → id (built once, on first use)."""
        out: dict[bytes, int] = {}
        specials = self.special_ids
        for tid in range(self.vocab_size):
            if tid in specials:
                continue
            try:
                b = self.token_bytes(tid)
            except (KeyError, ValueError, IndexError):
                continue
            out.setdefault(b, tid)
        return out


_ORDINARY_LOCK = threading.Lock()


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (tokenizer.json). Byte-level BPE vocabularies only for token_bytes."""

    def __init__(self, tok: Any, *, name: str = "") -> None:
        self._tok = tok
        self.name = name
        added = tok.get_added_tokens_decoder()  # id -> AddedToken
        self.special_tokens = {a.content: i for i, a in added.items()}
        self.hf_special_ids = frozenset(i for i, a in added.items() if a.special)
        self._soft_ids = frozenset(i for i, a in added.items() if not a.special)
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._normalizer = tok.normalizer
        if self._normalizer is not None and self._normalizer.normalize_str("e\u0301") != "e\u0301":
            self.normalization = "NFC" if self._normalizer.normalize_str("e\u0301") == "\u00e9" else "custom"
        self._vocab_rev: dict[int, str] | None = None

    @property
    def raw(self) -> Any:
        return self._tok

    def normalize(self, text: str) -> str:
        if self.normalization is None:
            return text
        out: str = self._normalizer.normalize_str(text)
        return out

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def _ordinary(self) -> Any:
        # ``encode_special_tokens`` is a setting of the tokenizer object: flipping it on the shared one
        # races with encode() in other threads (the generate engine encodes in a thread pool), so
        # ordinary encoding uses its own copy with the setting fixed on.
        t = self.__dict__.get("_tok_ordinary")
        if t is None:
            with _ORDINARY_LOCK:
                t = self.__dict__.get("_tok_ordinary")
                if t is None:
                    t = type(self._tok).from_str(self._tok.to_str())
                    t.encode_special_tokens = True
                    self.__dict__["_tok_ordinary"] = t
        return t

    def encode_ordinary(self, text: str) -> list[int]:
        if self.special_pattern.search(text) is None:
            return self.encode(text)  # nothing to treat differently (and no copy of the tokenizer needed)
        ids: list[int] = self._ordinary().encode(text, add_special_tokens=False).ids
        if self._soft_ids.isdisjoint(ids):
            return ids
        # Added tokens without the HF special flag (<think>, <tool_call>) are matched even with
        # encode_special_tokens; run the pipeline without the added vocabulary instead.
        norm = self._normalizer.normalize_str(text) if self._normalizer is not None else text
        pre = self._tok.pre_tokenizer
        pieces = [p for p, _ in pre.pre_tokenize_str(norm)] if pre is not None else [norm]
        model = self._tok.model
        return [t.id for piece in pieces for t in model.tokenize(piece)]

    def decode(self, ids: Sequence[int]) -> str:
        out: str = self._tok.decode(list(ids), skip_special_tokens=False)
        return out

    def _rev(self) -> dict[int, str]:
        if self._vocab_rev is None:
            self._vocab_rev = {i: t for t, i in self._tok.get_vocab(with_added_tokens=True).items()}
        return self._vocab_rev

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self.special_ids:
            return self.id_to_special[token_id].encode("utf-8")
        tok = self._rev()[token_id]
        u2b = _unicode_to_byte()
        try:
            return bytes(u2b[c] for c in tok)
        except KeyError:
            # Not a byte-level token (e.g. a sentencepiece vocabulary): fall back to decoding it.
            return self.decode([token_id]).encode("utf-8")


# Kimi's tokenizer (like Llama 3's) hands tiktoken at most 400k characters at a time, each cut further
# so that no run of whitespace or of non-whitespace exceeds 25k characters.
_TIKTOKEN_MAX_ENCODE_CHARS = 400_000
_MAX_NO_WHITESPACE_CHARS = 25_000


def _split_long_runs(s: str, max_run: int) -> Iterable[str]:
    run = 0
    is_space = s[0].isspace() if s else False
    start = 0
    for i, ch in enumerate(s):
        now = ch.isspace()
        if is_space ^ now:
            run = 1
            is_space = now
        else:
            run += 1
            if run > max_run:
                yield s[start:i]
                start = i
                run = 1
    yield s[start:]


class TiktokenTokenizer(Tokenizer):
    """A ``tiktoken.Encoding`` (Kimi's tiktoken.model, o200k). Specials are tiktoken specials.

    ``chunked``: split long inputs the way Kimi's tokenizer does before calling tiktoken (only inputs
    with a run of more than 25,000 (non-)whitespace characters are affected).
    """

    def __init__(self, enc: Any, *, name: str = "", hf_special_ids: Iterable[int] = (), chunked: bool = False) -> None:
        self._enc = enc
        self.name = name
        self.special_tokens = dict(enc._special_tokens)
        self.hf_special_ids = frozenset(hf_special_ids)
        self.vocab_size = enc.n_vocab
        self.chunked = chunked

    @property
    def raw(self) -> Any:
        return self._enc

    def _chunks(self, text: str) -> Iterable[str]:
        for i in range(0, len(text), _TIKTOKEN_MAX_ENCODE_CHARS):
            yield from _split_long_runs(text[i:i + _TIKTOKEN_MAX_ENCODE_CHARS], _MAX_NO_WHITESPACE_CHARS)

    def encode(self, text: str) -> list[int]:
        if self.chunked and len(text) > _MAX_NO_WHITESPACE_CHARS:
            out: list[int] = []
            for chunk in self._chunks(text):
                out.extend(self._enc.encode(chunk, allowed_special="all"))
            return out
        ids: list[int] = self._enc.encode(text, allowed_special="all")
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        if self.chunked and len(text) > _MAX_NO_WHITESPACE_CHARS:
            out: list[int] = []
            for chunk in self._chunks(text):
                out.extend(self._enc.encode_ordinary(chunk))
            return out
        ids: list[int] = self._enc.encode_ordinary(text)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        data: bytes = self._enc.decode_bytes(list(ids))
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        b: bytes = self._enc.decode_single_token_bytes(token_id)
        return b
