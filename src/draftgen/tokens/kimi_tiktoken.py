"""Kimi's tokenizer (K2, K2-Thinking, K2.5, K2.6 …) rebuilt on plain ``tiktoken`` from documented facts.

Reads ``tiktoken.model`` (``base64(token_bytes) rank`` per line, 163,584 ranks in the real file, sha256
``b6c497a7…``) and ``tokenizer_config.json`` (``added_tokens_decoder``). No remote code, no transformers.

Layout: ``n = len(ranks)`` ordinary tokens, then 256 reserved control ids ``n … n+255``, each named by
``added_tokens_decoder[str(id)].content`` or ``<|reserved_token_{id}|>`` → vocabulary 163,840 with
``[BOS]`` 163584, ``[EOS]`` 163585, ``<|im_end|>`` 163586, ``<think>`` 163606, ``</think>`` 163607.
All 256 are tiktoken specials; ``encode`` allows them in text (``allowed_special="all"``) as Kimi does.
The split pattern uses ``&&`` class intersections, which tiktoken's Rust regex supports (Python's
``regex`` only in V1 mode).

``write_synthetic_kimi_folder`` writes a stand-in ``tiktoken.model`` for offline tests: the 256 byte
ranks, merges trained on a fixed sample text, and unreachable filler ranks up to 163,584 lines, so that
every control id lands exactly where the real one is. It sits next to the real config and template.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from draftgen.errors import TokenizerError
from draftgen.tokens.tokenizer import TiktokenTokenizer

__all__ = [
    "KIMI_NUM_BASE_TOKENS",
    "KIMI_PAT_STR",
    "KIMI_PAT_STR_SHA256",
    "KIMI_TIKTOKEN_SHA256",
    "NUM_RESERVED_SPECIAL_TOKENS",
    "kimi_special_tokens",
    "load_kimi_tiktoken",
    "parse_tiktoken_ranks",
    "synthetic_kimi_ranks",
    "write_synthetic_kimi_folder",
]

KIMI_TIKTOKEN_SHA256 = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"
KIMI_NUM_BASE_TOKENS = 163_584
NUM_RESERVED_SPECIAL_TOKENS = 256

KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# sha256 of KIMI_PAT_STR, as pinned for K2.5's tokenization_kimi.py
KIMI_PAT_STR_SHA256 = "de5781783b193d5ccf5b1b28edfa70fa816ce78d54603fdc422cfd8d4ea4411f"


def parse_tiktoken_ranks(data: bytes, *, where: str) -> dict[bytes, int]:
    """Parse a ``tiktoken.model`` file. Every problem is a TokenizerError naming the line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenizerError(f"{where}:{lineno}: expected 'base64 rank', got {line[:40]!r}; not a tiktoken ranks file")
        try:
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except (binascii.Error, ValueError):
            raise TokenizerError(f"{where}:{lineno}: bad token or rank {line[:40]!r}; not a tiktoken ranks file") from None
        if token in ranks:
            raise TokenizerError(f"{where}:{lineno}: token listed twice; the ranks file is damaged")
        ranks[token] = rank
    if not ranks:
        raise TokenizerError(f"{where}: empty ranks file")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise TokenizerError(f"{where}: {len(missing)} single-byte tokens missing (first: {missing[0]}); not a byte-level BPE file")
    values = set(ranks.values())
    if len(values) != len(ranks) or min(values) != 0 or max(values) != len(ranks) - 1:
        raise TokenizerError(f"{where}: ranks are not exactly 0..{len(ranks) - 1}; the ranks file is damaged")
    return ranks


def kimi_special_tokens(num_base: int, cfg: dict[str, Any]) -> tuple[dict[str, int], frozenset[int]]:
    """The 256 reserved control tokens (text → id) and the ids whose HF ``special`` flag is true."""
    decoder = cfg.get("added_tokens_decoder") or {}
    specials: dict[str, int] = {}
    hf_special: set[int] = set()
    for i in range(num_base, num_base + NUM_RESERVED_SPECIAL_TOKENS):
        entry = decoder.get(str(i))
        content = entry.get("content") if isinstance(entry, dict) else None
        name = content if isinstance(content, str) and content else f"<|reserved_token_{i}|>"
        specials[name] = i
        if not isinstance(entry, dict) or entry.get("special", True):
            hf_special.add(i)
    return specials, frozenset(hf_special)


def load_kimi_tiktoken(data: bytes, cfg: dict[str, Any], *, where: str, name: str) -> TiktokenTokenizer:
    """Build Kimi's tokenizer from ``tiktoken.model`` bytes and the parsed ``tokenizer_config.json``."""
    import tiktoken

    ranks = parse_tiktoken_ranks(data, where=where)
    specials, hf_special = kimi_special_tokens(len(ranks), cfg)
    try:
        enc = tiktoken.Encoding(name=f"kimi:{name}", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
    except ValueError as exc:
        raise TokenizerError(f"{where}: tiktoken rejected the vocabulary ({exc})") from None
    return TiktokenTokenizer(enc, name=name, hf_special_ids=hf_special, chunked=True)


# -- synthetic stand-in for tests ------------------------------------------------------------------

_SAMPLE_TEXT = """\
You are a helpful assistant. Who are you? My name is Qwen2. How old are you? 11 years old.
Can you recommend a good restaurant in Shanghai? Sure! I think I can help with that.
Where is the Peace Hotel? The Peace Hotel is located at the intersection of Nanjing East Road and the Bund.
The user asks a question about the weather in Paris. Let me think step by step about what they need.
First, I should consider the context. Then I will answer clearly and concisely, and I won't guess.
It's a good idea to check the numbers: 1234 + 5678 = 6912, and 3.14159 is roughly pi.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(f"value {i}: {fibonacci(i)}")
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
The answer is 42. Therefore the final result is correct. However, we should double-check it.
我们来看一下这个问题。你好，世界！今天的天气很好。上海是一个美丽的城市。
こんにちは、世界。東京は大きな都市です。
Emoji test: 😀 🎉 👍 🚀 — done.
Summary:
- point one
- point two

In conclusion, the model should produce accurate, helpful and safe answers.
"""


@functools.cache
def _trained_merges(n_merges: int = 1200) -> tuple[bytes, ...]:
    """Byte-pair merges learnt on the sample text (deterministic), most frequent first."""
    import regex

    words = Counter(regex.findall(KIMI_PAT_STR, _SAMPLE_TEXT * 2, flags=regex.V1))
    seqs: dict[tuple[bytes, ...], int] = {}
    for w, c in words.items():
        key = tuple(bytes([b]) for b in w.encode("utf-8"))
        seqs[key] = seqs.get(key, 0) + c
    known = {bytes([b]) for b in range(256)}
    merges: list[bytes] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[bytes, bytes]] = Counter()
        for seq, c in seqs.items():
            for a, b in itertools.pairwise(seq):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), count = min(pairs.items(), key=lambda kv: (-kv[1], kv[0][0] + kv[0][1]))
        if count < 2:
            break
        new = a + b
        if new not in known:
            known.add(new)
            merges.append(new)
        merged: dict[tuple[bytes, ...], int] = {}
        for seq, c in seqs.items():
            out: list[bytes] = []
            i = 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        seqs = merged
    return tuple(merges)


@functools.cache
def synthetic_kimi_ranks() -> bytes:
    """A ``tiktoken.model`` with exactly 163,584 ranks: bytes, trained merges, unreachable filler.

    Filler tokens start with 0xF8 0xFF, bytes that never occur in UTF-8 text, so no input reaches them.
    """
    tokens: list[bytes] = [bytes([b]) for b in range(256)]
    tokens.extend(_trained_merges())
    i = 0
    while len(tokens) < KIMI_NUM_BASE_TOKENS:
        tokens.append(b"\xf8\xff" + i.to_bytes(3, "big"))
        i += 1
    lines = [base64.b64encode(t) + b" " + str(rank).encode() for rank, t in enumerate(tokens)]
    return b"\n".join(lines) + b"\n"


def write_synthetic_kimi_folder(dest: Path, *, shared_kimi_dir: Path) -> Path:
    """Write a Kimi tokenizer folder into ``dest``: synthetic ``tiktoken.model`` plus the real
    ``tokenizer_config.json`` and ``chat_template.jinja`` read from ``shared_kimi_dir``. Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tiktoken.model").write_bytes(synthetic_kimi_ranks())
    for fname in ("tokenizer_config.json", "chat_template.jinja"):
        src = shared_kimi_dir / fname
        if not src.is_file():
            raise TokenizerError(f"{src}: missing; point shared_kimi_dir at shared/assets/tokenizers/kimi-k2.5")
        shutil.copyfile(src, dest / fname)
    return dest
