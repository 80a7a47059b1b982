"""One tokenizer interface over Hugging Face ``tokenizers`` and ``tiktoken``.

``Tokenizer`` is what profiles, reconstruction, the audit and the emulator use. It never strips or
normalises text beyond what the model's own tokenizer does (Qwen3 applies NFC; that is the tokenizer's).

- ``encode(text)``: special-token strings inside ``text`` become their control ids, as the model's
  tokenizer does (HF always matches added tokens; Kimi's encode uses ``allowed_special="all"``).
- ``encode_ordinary(text)``: special-token strings are encoded as plain text.
- ``token_bytes(id)``: the raw bytes of a token (byte-level BPE), used for logprob recovery and by the
  emulator's non-canonical segmentation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
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
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_ordinary(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        raise NotImplementedError

    def token_str(self, token_id: int) -> str:
        """A readable form of one token, for mismatch reports (``' NOR'``)."""
        if token_id in self.special_ids:
            return self.id_to_special[token_id]
        return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self.special_tokens.values())

    @functools.cached_property
    def id_to_special(self) -> dict[int, str]:
        return {v: k for k, v in self.special_tokens.items()}

    def special_id(self, text: str) -> int:
        try:
            return self.special_tokens[text]
        except KeyError:
            from ..errors import TokenizerError

            raise TokenizerError(
                f"tokenizer {self.name!r} has no special token {text!r}; the tokenizer does not match the profile"
            ) from None

    @functools.cached_property
    def bytes_to_id(self) -> dict[bytes, int]:
        """Every non-special token's bytes → id (built once, on first use)."""
        out: dict[bytes, int] = {}
        for tid in range(self.vocab_size):
            if tid in self.special_ids:
                continue
            try:
                b = self.token_bytes(tid)
            except (KeyError, ValueError):
                continue
            out.setdefault(b, tid)
        return out


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (tokenizer.json). Byte-level BPE vocabularies only for token_bytes."""

    def __init__(self, tok: Any, *, name: str = "") -> None:
        self._tok = tok
        self.name = name
        added = tok.get_added_tokens_decoder()  # id -> AddedToken
        self.special_tokens = {a.content: i for i, a in added.items()}
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._vocab_rev: dict[int, str] | None = None

    @property
    def raw(self) -> Any:
        return self._tok

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def encode_ordinary(self, text: str) -> list[int]:
        self._tok.encode_special_tokens = True
        try:
            ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        finally:
            self._tok.encode_special_tokens = False
        return ids

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


class TiktokenTokenizer(Tokenizer):
    """A ``tiktoken.Encoding`` (Kimi's tiktoken.model, o200k). Specials are tiktoken specials."""

    def __init__(self, enc: Any, *, name: str = "") -> None:
        self._enc = enc
        self.name = name
        self.special_tokens = dict(enc._special_tokens)
        self.vocab_size = enc.n_vocab

    @property
    def raw(self) -> Any:
        return self._enc

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._enc.encode(text, allowed_special="all")
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = self._enc.encode_ordinary(text)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        data: bytes = self._enc.decode_bytes(list(ids))
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        b: bytes = self._enc.decode_single_token_bytes(token_id)
        return b
