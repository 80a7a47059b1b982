"""The ``datasets`` list and the ``prepare`` section: where prompts come from and how they are cut. Pure data."""

from __future__ import annotations

from typing import Literal

from draftgen.config.base import Section


class DatasetConfig(Section):
    """One prompt source."""

    name: str
    """Unique plain dataset name (a letter or digit, then letters, digits, ``_ - .``); used in sample ids and paths."""
    path: str | None = None
    """Local JSONL/JSON/Parquet file or folder, or ``bundled:<name>`` for a prompt set shipped with draftgen."""
    hf: str | None = None
    """Hugging Face dataset name (needs ``datasets``)."""
    hf_subset: str | None = None
    """Hugging Face dataset configuration (subset) name."""
    split: str = "train"
    """Split to read (HF datasets and split-named files in a folder)."""
    format: Literal["auto", "messages", "sharegpt", "alpaca", "prompt", "glaive"] = "auto"
    """Row format; ``auto`` detects messages, ShareGPT, Alpaca, plain prompts and glaive rows."""
    field: str | None = None
    """Column holding the conversation or prompt, when not the format's usual one."""
    tags_field: str | None = None
    """Column holding each prompt's tags (a string or a list of strings, e.g. ``category``): accept's acceptance
    and ``plan --next-round``'s proposal go per tag as well. Unset: no tags; a row without the column: none."""
    partition: Literal["auto", "short", "long"] = "auto"
    """``short``/``long`` for the whole dataset, or ``auto`` by prompt length (prepare.long_prompt_tokens)."""
    max_samples: int | None = None
    """At most this many samples, drawn with prepare.seed."""
    token_budget: int | None = None
    """Completion-token budget for this dataset (done + in flight)."""
    multi_turn: Literal["last", "all"] | None = None
    """Overrides prepare.multi_turn for this dataset."""
    weight: float = 1.0
    """Merge weight: the share of this dataset's samples kept is weight (<= 1) or it is repeated (> 1)."""
    cap: int | None = None
    """Merge cap: at most this many samples of the dataset in the merged output."""
    traffic: float = 1.0
    """Its weight in the traffic the drafter will serve (any scale; 0: not served). ``plan --next-round``
    weighs each dataset's acceptance by its share."""


class PrepareConfig(Section):
    long_prompt_tokens: int = 4096
    """Prompts at least this long go to the long partition (when a dataset's partition is auto)."""
    multi_turn: Literal["last", "all"] = "last"
    """``last``: regenerate the last assistant turn; ``all``: one sample per assistant turn."""
    skip_bad: bool = False
    """Skip and count malformed input lines instead of stopping (``--skip-bad``)."""
    dedupe: bool = True
    """Drop prompts whose content hash was already seen in the dataset."""
    seed: int = 0
    """Seed for drawing max_samples."""
