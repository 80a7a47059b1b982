"""Deterministic text for the emulated model: prose, code, numbers, CJK, emoji, whitespace runs.

``reasoning_text(rng, n)`` and ``content_text(rng, n)`` write about ``n`` tokens of text (estimated,
not counted) from a ``random.Random``; the same generator state always gives the same text. Output is
NFC-normalised (Qwen's tokenizer applies NFC, so text that is not NFC would not survive a round trip).
``tool_call_markup(rng, style)`` writes one raw tool call in the model's own markup, the style a profile
declares in ``Profile.tool_markup`` (``TOOL_MARKUP_STYLES``: Qwen3 ``<tool_call>``, GLM's
``<arg_key>``/``<arg_value>`` or Kimi's section tokens), as providers without a tool parser return it
inside ``content``.
Nothing here knows token ids; the model module encodes the text with the profile's tokenizer.
"""

from __future__ import annotations

import json
import random
import unicodedata
from collections.abc import Callable

__all__ = ["TOOL_MARKUP_STYLES", "content_text", "reasoning_text", "tool_call_markup"]

_WORD_TEXT = (
    "the a an of to and in that is for it as with was on be by this are from at or which have not but "
    "model token data value result function answer question problem step first second then next because "
    "therefore however since while each every number list string system user input output between "
    "compute check verify assume consider example case simple small large fast slow correct wrong "
    "matrix vector graph tree node edge path cost price rate time memory cache server request response "
    "energy mass light speed distance force field wave particle theory experiment measure observe "
    "river mountain city village market garden library window bridge journey history language music "
    "quickly carefully probably exactly roughly almost really actually clearly maybe perhaps indeed "
    "calculate derive estimate approximate evaluate simplify expand integrate differentiate sum total "
    "café naïve résumé Zürich façade coöperate jalapeño São Paulo Kraków"
)
_WORDS = tuple(_WORD_TEXT.split())

_OPENERS = (
    "Okay, let me think about this.", "Let me work through it step by step.", "Hmm, wait.",
    "First, I need to understand what is being asked.", "So the user wants", "Alternatively,",
    "Let me double-check that.", "Actually, that's not quite right.", "Now,", "Right, so",
)

_CJK = (
    "我们需要先理解这个问题的核心。", "这个函数的时间复杂度是线性的。", "答案是正确的，但是可以更简单。",
    "数据集包含一万个样本。", "首先计算总和，然后求平均值。", "日本語のテキストも少し含めます。",
    "これはテストの文章です。", "한국어 문장도 포함됩니다.", "모델의 출력은 결정적입니다。",
)

_EMOJI = ("😀", "🚀", "✨", "👍🏽", "👩‍💻", "🇫🇷", "🔥", "✅", "❌", "🤔", "📈", "🧪", "❤️", "½", "∑", "≈", "→", "°C")

_CODE = (
    ("python", "def {f}({a}, {b}):\n    \"\"\"Return the {w} of {a} and {b}.\"\"\"\n    if {a} < 0:\n"
     "        raise ValueError(\"{a} must be >= 0\")\n    return {a} * {n} + {b}\n"),
    ("python", "for i in range({n}):\n    total += values[i] ** 2\nprint(f\"total={{total:.3f}}\")\n"),
    ("javascript", "const {f} = ({a}) => {{\n  return {a}.map((x) => x + {n});\n}};\n"),
    ("rust", "fn {f}({a}: u64) -> u64 {{\n    {a}.wrapping_mul({n})\n}}\n"),
    ("bash", "for f in *.jsonl; do\n\twc -l \"$f\"\ndone\n"),
    ("json", "{{\n  \"{w}\": {n},\n  \"items\": [1, 2, 3],\n  \"ok\": true\n}}\n"),
    ("sql", "SELECT {w}, COUNT(*) AS n\nFROM events\nWHERE ts > '2024-01-01'\nGROUP BY {w};\n"),
)

_IDENT = ("compute", "scale", "merge_rows", "parse", "fold", "norm", "score")
_ARGS = ("x", "y", "count", "items", "left", "right", "n")


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


def _number(rng: random.Random) -> str:
    k = rng.randrange(9)
    if k == 0:
        return str(rng.randrange(10, 100000))
    if k == 1:
        return f"{rng.uniform(0, 1000):.{rng.randrange(1, 5)}f}"
    if k == 2:
        return f"{rng.randrange(1, 100)}%"
    if k == 3:
        return f"{rng.randrange(1990, 2031)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if k == 4:
        return f"{rng.randrange(1, 1000):,}{rng.randrange(1000):03d}"
    if k == 5:
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        return f"{a} × {b} = {a * b}"
    if k == 6:
        return f"$x^{rng.randrange(2, 5)} + {rng.randrange(1, 9)}x - {rng.randrange(1, 9)} = 0$"
    if k == 7:
        return f"-{rng.uniform(0, 10):.2e}"
    return f"0x{rng.randrange(16**4):04X}"


def _sentence(rng: random.Random) -> str:
    n = rng.randrange(5, 18)
    parts: list[str] = []
    for i in range(n):
        r = rng.random()
        if r < 0.12:
            parts.append(_number(rng))
        elif r < 0.15:
            parts.append(f"**{_word(rng)}**")
        elif r < 0.18:
            parts.append(f"`{rng.choice(_IDENT)}()`")
        elif r < 0.20:
            parts.append(f"({_word(rng)} {_word(rng)})")
        elif r < 0.22:
            parts.append(f"“{_word(rng)}”")
        else:
            parts.append(_word(rng))
        if i < n - 1 and rng.random() < 0.08:
            parts[-1] += rng.choice((",", ";", ":", " —"))
    s = " ".join(parts)
    s = s[0].upper() + s[1:]
    return s + rng.choice((".", ".", ".", "?", "!", "...", ":"))


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randrange(1, 5)))


def _code_block(rng: random.Random) -> str:
    lang, tmpl = rng.choice(_CODE)
    body = tmpl.format(f=rng.choice(_IDENT), a=rng.choice(_ARGS), b=rng.choice(_ARGS), w=_word(rng),
                       n=rng.randrange(2, 999))
    return f"```{lang}\n{body}```"


def _cjk(rng: random.Random) -> str:
    return "".join(rng.choice(_CJK) for _ in range(rng.randrange(1, 4)))


def _emoji_line(rng: random.Random) -> str:
    return f"{_sentence(rng)} {rng.choice(_EMOJI)}{rng.choice(_EMOJI) if rng.random() < 0.3 else ''}"


def _list_block(rng: random.Random) -> str:
    ordered = rng.random() < 0.5
    return "\n".join((f"{i + 1}. " if ordered else "- ") + _sentence(rng) for i in range(rng.randrange(2, 6)))


def _table(rng: random.Random) -> str:
    rows = ["| name | value |", "|------|-------|"]
    rows += [f"| {_word(rng)} | {_number(rng)} |" for _ in range(rng.randrange(2, 5))]
    return "\n".join(rows)


def _whitespace_run(rng: random.Random) -> str:
    return rng.choice(("   ", "\t", "  \n", "\n\n\n", " \t ", "    "))


# (weight, writer)
_REASONING_BLOCKS: tuple[tuple[float, Callable[[random.Random], str]], ...] = (
    (0.55, _paragraph),
    (0.12, lambda rng: f"{rng.choice(_OPENERS)} {_paragraph(rng)}"),
    (0.08, lambda rng: " ".join(_number(rng) for _ in range(rng.randrange(3, 9)))),
    (0.08, _code_block),
    (0.07, _cjk),
    (0.05, _emoji_line),
    (0.05, lambda rng: _sentence(rng) + _whitespace_run(rng) + _sentence(rng)),
)

_CONTENT_BLOCKS: tuple[tuple[float, Callable[[random.Random], str]], ...] = (
    (0.40, _paragraph),
    (0.10, lambda rng: f"### {_word(rng).capitalize()} {_word(rng)}"),
    (0.12, _list_block),
    (0.12, _code_block),
    (0.06, _table),
    (0.08, _cjk),
    (0.07, _emoji_line),
    (0.05, lambda rng: _sentence(rng) + _whitespace_run(rng) + _sentence(rng)),
)


def _pick(rng: random.Random, blocks: tuple[tuple[float, Callable[[random.Random], str]], ...]) -> str:
    r = rng.random() * sum(w for w, _ in blocks)
    for w, fn in blocks:
        r -= w
        if r < 0:
            return fn(rng)
    return blocks[-1][1](rng)


def _estimate_tokens(text: str) -> int:
    ascii_chars = sum(1 for c in text if c < "\x80")
    return ascii_chars // 4 + (len(text) - ascii_chars) + 1


def _write(rng: random.Random, n_tokens: int, blocks: tuple[tuple[float, Callable[[random.Random], str]], ...],
           seps: tuple[str, ...]) -> str:
    out: list[str] = []
    est = 0
    while est < n_tokens:
        block = _pick(rng, blocks)
        out.append(block)
        out.append(rng.choice(seps))
        est += _estimate_tokens(block) + 1
    if out:
        out.pop()  # no separator after the last block
    text = "".join(out)
    if rng.random() < 0.15:
        text += rng.choice(("\n", " ", "  ", "\n\n"))  # models sometimes end a field with whitespace
    return unicodedata.normalize("NFC", text)


def reasoning_text(rng: random.Random, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of first-person reasoning (never empty)."""
    return _write(rng, max(1, n_tokens), _REASONING_BLOCKS, ("\n\n", "\n\n", " ", "\n"))


def content_text(rng: random.Random, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of a markdown answer (never empty)."""
    return _write(rng, max(1, n_tokens), _CONTENT_BLOCKS, ("\n\n", "\n\n", "\n"))


_TOOL_NAMES = ("get_weather", "search_web", "run_sql", "read_file")


def _qwen3_markup(name: str, args: dict[str, object], index: int) -> str:
    call = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def _glm_markup(name: str, args: dict[str, object], index: int) -> str:
    kv = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                 for k, v in args.items())
    return f"<tool_call>{name}\n{kv}</tool_call>"


def _kimi_markup(name: str, args: dict[str, object], index: int) -> str:
    payload = json.dumps(args, ensure_ascii=False)
    return ("<|tool_calls_section_begin|><|tool_call_begin|>"
            f"functions.{name}:{index}<|tool_call_argument_begin|>{payload}<|tool_call_end|>"
            "<|tool_calls_section_end|>")


#: ``Profile.tool_markup`` style → writer of one raw call (``name``, ``args``, call index). One line per
#: style; a profile declaring a style not listed here gets a ValueError when the emulator writes a call.
TOOL_MARKUP_STYLES: dict[str, Callable[[str, dict[str, object], int], str]] = {
    "qwen3": _qwen3_markup,
    "glm": _glm_markup,
    "kimi": _kimi_markup,
}


def tool_call_markup(rng: random.Random, style: str, index: int = 0) -> str:
    """One raw tool call as the model writes it, in a ``TOOL_MARKUP_STYLES`` style (NFC)."""
    name = rng.choice(_TOOL_NAMES)
    args: dict[str, object] = {"query": _sentence(rng), "limit": rng.randrange(1, 50),
                               "city": rng.choice(("Florence", "東京", "São Paulo"))}
    writer = TOOL_MARKUP_STYLES.get(style)
    if writer is None:
        raise ValueError(f"unknown tool-call markup style {style!r}; known: {', '.join(TOOL_MARKUP_STYLES)}")
    return unicodedata.normalize("NFC", writer(name, args, index))
