"""The small synthetic language of the learned chain target: four tasks whose answers depend on the whole prompt.

A sample is one user message and the assistant's answer, in the bundled Qwen3 tokenizer's ids. The learned
target (``drafter.tiny.build_learned_target``) is trained on samples drawn with one seed; the CPU chain
(scripts/tiny-chain) sends prompts of the same tasks drawn with other seeds, one dataset per task. Every
answer is what ``solve`` computes from the prompt, and ends with "." (then the end token): no answer loops,
and copying the last token or looking the next tokens up earlier in the text predicts little of it.

- ``walk``: "walk north: river" → the words after "river" along the fixed order "north" (one of four fixed
  orders of the 60 words, seeded by ``PATH_SEED``), to the order's end. The next word depends on the rule named
  at the start of the prompt, not on the last word alone.
- ``sort``: "sort: river bird stone …" (8 to 20 distinct words) → the same words in alphabetical order.
- ``count``: "count: 318 to 331" → "318 319 … 331" (digits are single tokens: the carries matter).
- ``close``: "close: ( [ { …" (10 to 30 brackets) → the matching closing brackets, innermost first.

Each word of ``WORDS`` is one token with its leading space (tests/drafter/test_learned_target.py checks it).
Pure Python; ``write_prompts`` writes JSONL files, nothing else does I/O.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

from draftgen.store import atomic_write_bytes, encode_json

__all__ = ["PATH_SEED", "RULES", "TASKS", "WORDS", "draw", "paths", "solve", "write_prompts"]

WORDS: tuple[str, ...] = (
    "apple", "river", "stone", "bird", "cloud", "tree", "house", "light", "water", "fire", "green", "black", "white",
    "table", "chair", "horse", "garden", "window", "music", "paper", "glass", "silver", "market", "island", "forest",
    "winter", "summer", "spring", "autumn", "castle", "bridge", "mountain", "valley", "ocean", "desert", "planet",
    "rocket", "engine", "signal", "letter", "number", "circle", "square", "corner", "pocket", "button", "candle",
    "mirror",
)
RULES: tuple[str, ...] = ("north", "south", "east", "west")
TASKS: tuple[str, ...] = ("walk", "sort", "count", "close")
PATH_SEED = 1234
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def paths() -> dict[str, list[str]]:
    """The four fixed word orders, one per rule (seeded by ``PATH_SEED``)."""
    rng = random.Random(PATH_SEED)
    return {r: rng.sample(WORDS, len(WORDS)) for r in RULES}


_PATHS = paths()


def _walk(rng: random.Random) -> str:
    rule = rng.choice(RULES)
    return f"walk {rule}: {_PATHS[rule][rng.randrange(len(WORDS) - 20)]}"


def _sort(rng: random.Random) -> str:
    return "sort: " + " ".join(rng.sample(WORDS, rng.randint(8, 20)))


def _count(rng: random.Random) -> str:
    a = rng.randint(100, 880)
    return f"count: {a} to {a + rng.randint(5, 12)}"


def _close(rng: random.Random) -> str:
    return "close: " + " ".join(rng.choice("([{") for _ in range(rng.randint(8, 20)))


_DRAW = {"walk": _walk, "sort": _sort, "count": _count, "close": _close}
_PATTERNS = {
    "walk": re.compile(r"walk (\w+): (\w+)"),
    "sort": re.compile(r"sort: ([\w ]+)"),
    "count": re.compile(r"count: (\d+) to (\d+)"),
    "close": re.compile(r"close: ([(\[{ ]+)"),
}


def solve(prompt: str) -> str:
    """The answer to a prompt of the language (ValueError for text that is not one)."""
    task = prompt.split(":", 1)[0].split(" ", 1)[0]
    m = _PATTERNS[task].fullmatch(prompt) if task in _PATTERNS else None
    if m is None:
        raise ValueError(f"not a prompt of the tiny language: {prompt[:60]!r}")
    if task == "walk":
        order = _PATHS[m.group(1)]
        return " " + " ".join(order[order.index(m.group(2)) + 1:]) + "."
    if task == "sort":
        return " " + " ".join(sorted(m.group(1).split())) + "."
    if task == "count":
        return " ".join(str(x) for x in range(int(m.group(1)), int(m.group(2)) + 1)) + "."
    return " " + " ".join(_CLOSE[c] for c in reversed(m.group(1).split())) + "."


def draw(task: str, rng: random.Random) -> str:
    """One prompt of ``task``."""
    return _DRAW[task](rng)


def write_prompts(folder: Path, per_task: int, seed: int, tasks: Sequence[str] = TASKS) -> dict[str, Path]:
    """``<folder>/<task>.jsonl`` for each task: ``per_task`` distinct prompts drawn with ``seed``, as chat
    messages (one user turn). Returns the files by task."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for i, task in enumerate(tasks):
        rng = random.Random(f"{seed}:{i}:{task}")
        seen: dict[str, None] = {}
        while len(seen) < per_task:
            seen.setdefault(draw(task, rng), None)
        path = folder / f"{task}.jsonl"
        atomic_write_bytes(path, b"".join(encode_json({"messages": [{"role": "user", "content": p}]}) + b"\n"
                                          for p in seen))
        out[task] = path
    return out
