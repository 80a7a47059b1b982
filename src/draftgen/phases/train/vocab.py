"""The draft vocabulary: the ``draft_vocab_size`` most frequent target tokens under the loss mask.

Exactly speculators 0.9's ``build_vocab_mappings_from_distribution``: sort token ids by (-count, id), keep
the first ``draft_vocab_size``, pad with the lowest ids not yet chosen when fewer tokens were seen, sort the
chosen ids ascending; ``d2t[i] = chosen[i] - i`` (int64 OFFSETS: target id = i + d2t[i], what vLLM's
``draft_id_to_target_id`` and SGLang's ``hot_token_id = d2t + arange`` expect) and ``t2d`` = bool mask over
the target vocabulary. Written as ``d2t.npy`` / ``t2d.npy`` (speculators' ``--d2t-path/--t2d-path``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["D2T", "T2D", "build_vocab_mapping", "count_tokens", "save_vocab_mapping"]

D2T, T2D = "d2t.npy", "t2d.npy"


def count_tokens(rows: Iterable[tuple[Iterable[int], Iterable[int]]]) -> dict[int, int]:
    """{token id: count} over the positions whose loss mask is 1, from (input_ids, loss_mask) rows."""
    freq: dict[int, int] = {}
    for ids, mask in rows:
        for t, m in zip(ids, mask, strict=True):
            if m:
                freq[int(t)] = freq.get(int(t), 0) + 1
    return freq


def build_vocab_mapping(freq: Mapping[int, int], draft_vocab_size: int,
                        target_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t int64 [draft_vocab_size] offsets, t2d bool [target_vocab_size]); see the module docstring."""
    import numpy as np

    if not 0 < draft_vocab_size <= target_vocab_size:
        raise ConfigError(f"train.draft_vocab_size {draft_vocab_size} must be in 1..{target_vocab_size} "
                          "(the target's vocabulary size)")
    bad = [t for t in freq if not 0 <= t < target_vocab_size]
    if bad:
        raise ConfigError(f"token id {bad[0]} is outside the target vocabulary (0..{target_vocab_size - 1})")
    chosen = sorted(freq, key=lambda t: (-freq[t], t))[:draft_vocab_size]
    if len(chosen) < draft_vocab_size:
        have = set(chosen)
        for t in range(draft_vocab_size):
            if t not in have:
                chosen.append(t)
            if len(chosen) >= draft_vocab_size:
                break
    chosen.sort()
    ids = np.asarray(chosen, dtype=np.int64)
    d2t = ids - np.arange(draft_vocab_size, dtype=np.int64)
    t2d = np.zeros(target_vocab_size, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def save_vocab_mapping(folder: Path, d2t: Any, t2d: Any) -> tuple[Path, Path]:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / D2T, folder / T2D
    for path, arr in zip(paths, (d2t, t2d), strict=True):
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, arr)
        tmp.replace(path)
    return paths
