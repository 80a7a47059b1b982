"""``merged/README.md``: the Hugging Face dataset card. Its YAML ``configs`` list the shards of each split, so
``datasets.load_dataset("<run>/merged")`` loads every row and nothing else."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from draftgen.exporters.base import EXPORTERS, export_usage
from draftgen.exporters.parquet import file_entry
from draftgen.records import (
    MergedFile,
    parquet_columns,
)
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_bytes

# -- the dataset card ------------------------------------------------------------------------------------


def write_card(rd: RunDir, files: Sequence[MergedFile], *, model: str, profile: str, tokenizer_sha256: str,
               seed: int, mask_reasoning: bool) -> MergedFile:
    """Write merged/README.md, the Hugging Face dataset card: YAML front matter whose ``configs`` name
    each split's shards (so the folder loads with ``datasets.load_dataset``), then what the columns mean."""
    import yaml

    shards: dict[str, list[str]] = {}
    rows: Counter[str] = Counter()
    for f in files:
        if f.kind == "parquet":
            shards.setdefault(f.split, []).append(Path(f.path).name)
            rows[f.split] += f.rows
    front = {"configs": [{"config_name": "default", "default": True,
                          "data_files": [{"split": s, "path": names} for s, names in shards.items()]}]}
    exports = sorted({f.kind for f in files if f.kind in EXPORTERS})
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip("\n"),
        "---",
        "",
        "# draftgen training data",
        "",
        f"Drafter (EAGLE-3) training rows: prompts and `{model}`'s regenerated responses as exact token ids "
        f"(profile `{profile}`, tokenizer sha256 `{tokenizer_sha256}`), written by `draftgen merge` "
        f"(seed {seed}).",
        "",
        "| split | rows | shards |",
        "|---|---|---|",
        *(f"| {s} | {rows[s]:,} | {len(names)} |" for s, names in shards.items()),
        "",
        "Columns:",
        "",
        *(f"- `{c.name}` ({c.arrow}): " + c.doc.format(reasoning=" and the reasoning" if mask_reasoning else "")
          for c in parquet_columns()),
        "",
        "Load: `datasets.load_dataset(\"path/to/merged\")` or "
        "`datasets.load_dataset(\"parquet\", data_dir=\"path/to/merged\")`.",
        "",
        "`manifest.json` lists every file of this merge with its size and sha256; `stats.json` has the "
        "per-dataset counts and what was left out, and why.",
    ]
    if exports:
        lines += ["", "The same rows in peer trainers' formats (paths relative to the run directory):", ""]
        lines += [f"- `{k}`: {export_usage(rd, k)}" for k in exports]
    atomic_write_bytes(rd.dataset_card, ("\n".join(lines) + "\n").encode())
    return file_entry(rd, rd.dataset_card, "all", "card", sum(rows.values()))
