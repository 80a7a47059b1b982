"""``draftgen prepare``: prompt datasets → ``prepared/<dataset>/prompts.jsonl`` + ``stats.json``.

Per dataset (in config order):

1. read rows from the source (``datasets.sources``) and adapt each to a conversation (``datasets.formats``);
2. cut the prompt(s) to regenerate (``multi_turn``: ``last`` or ``all``, see ``datasets.conversation``);
3. key each prompt by the sha256 of its canonical (messages, tools); ``sample_id = <dataset>-<hash[:16]>``,
   so ids are stable across runs and machines; repeated prompts are dropped (``prepare.dedupe``);
4. with ``max_samples``, keep the N prompts with the smallest ``sha256(seed, hash)`` (a seeded bottom-k
   sample: stable when the source grows) in source order;
5. count prompt tokens with the target tokenizer and chat template, and pick the partition (the dataset's
   ``partition``, else ``long`` when the prompt has at least ``prepare.long_prompt_tokens`` tokens).

Files: ``prompts.jsonl`` (``records.PromptRecord``) is written to a temp file and renamed; ``stats.json``
(``records.DatasetStats``) is written last and marks the dataset complete. Its ``fingerprint`` hashes
everything that decides the output (source files' size and mtime, dataset and prepare settings, the
tokenizer); a rerun with an equal fingerprint does nothing, and a rerun after a change rewrites the file
with the same ids for the same prompts.

A row that cannot be read or adapted (or that the chat template rejects) stops the run with
``file:line: what is wrong; fix or pass --skip-bad``; with ``prepare.skip_bad`` it is skipped and counted.
"""

from __future__ import annotations

import hashlib
import heapq
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from .config import DatasetConfig, RunConfig
from .datasets import (
    CutPrompt,
    RowError,
    content_hash,
    iter_rows,
    prompts_from,
    source_fingerprint,
    source_label,
    to_conversation,
)
from .errors import DraftgenError, InputError, TokenizerError
from .records import DatasetStats, PromptRecord
from .store import JsonlWriter, atomic_write_json, read_json
from .tokens import Profile, profile_from_config

__all__ = ["PrepareReport", "prepare_dataset", "prepared_prompts_path",
           "prepared_stats_path", "run_prepare"]

Echo = Callable[[str], object]


@dataclass
class PrepareReport:
    run_dir: Path
    datasets: list[DatasetStats] = field(default_factory=list)
    #: datasets whose stats.json fingerprint matched: nothing was rewritten
    unchanged: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.datasets)


def prepared_prompts_path(run_dir: Path, dataset: str) -> Path:
    return run_dir / "prepared" / dataset / "prompts.jsonl"


def prepared_stats_path(run_dir: Path, dataset: str) -> Path:
    return run_dir / "prepared" / dataset / "stats.json"




def _fingerprint(cfg: RunConfig, ds: DatasetConfig) -> str:
    keyed = {
        "source": source_fingerprint(ds, Path(cfg.base_dir or ".")),
        "dataset": msgspec.to_builtins(ds),
        "prepare": {
            "long_prompt_tokens": cfg.prepare.long_prompt_tokens,
            "multi_turn": cfg.prepare.multi_turn,
            "dedupe": cfg.prepare.dedupe,
            "seed": cfg.prepare.seed,
        },
        "model": {k: v for k, v in msgspec.to_builtins(cfg.model).items() if k != "id"},
    }
    # Merge-time knobs do not change prompts.jsonl.
    for k in ("weight", "cap", "token_budget"):
        keyed["dataset"].pop(k, None)
    return hashlib.sha256(msgspec.json.encode(keyed, order="sorted")).hexdigest()[:16]


@dataclass(order=True)
class _Picked:
    neg_key: int
    order: int
    where: str = field(compare=False)
    hash: str = field(compare=False)
    cut: CutPrompt = field(compare=False)


def _sample_key(seed: int, h: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{h}".encode()).digest()[:8], "big")


class _Bad:
    def __init__(self, skip: bool, echo: Echo, name: str) -> None:
        self.skip, self.echo, self.name, self.count = skip, echo, name, 0

    def __call__(self, where: str, what: str) -> None:
        if not self.skip:
            raise InputError(f"{where}: {what}; fix or pass --skip-bad")
        self.count += 1
        if self.count <= 3:
            self.echo(f"  {self.name}: skipped {where}: {what}")


def prepare_dataset(cfg: RunConfig, ds: DatasetConfig, profile: Profile, *, echo: Echo = print) -> DatasetStats:
    """Prepare one dataset and write its files (see the module docstring). Returns its stats."""
    base = Path(cfg.base_dir or ".")
    mode = ds.multi_turn or cfg.prepare.multi_turn
    bad = _Bad(cfg.prepare.skip_bad, echo, ds.name)
    stats = DatasetStats(dataset=ds.name, source=source_label(ds), multi_turn=mode,
                         fingerprint=_fingerprint(cfg, ds))
    seen: dict[str, int] = {}
    heap: list[_Picked] = []  # max-heap on key (neg_key) when max_samples is set; else all prompts
    order = 0
    limit = ds.max_samples
    for row in iter_rows(ds, base):
        stats.rows_read += 1
        if row.error is not None:
            bad(row.where, row.error)
            continue
        try:
            cuts = prompts_from(to_conversation(row.data, ds.format, ds.field), mode)
        except RowError as exc:
            bad(row.where, str(exc))
            continue
        for cut in cuts:
            h = content_hash(cut.messages, cut.tools)
            n_seen = seen.get(h, 0)
            seen[h] = n_seen + 1
            if n_seen and cfg.prepare.dedupe:
                stats.duplicates_removed += 1
                continue
            # Without dedupe a repeated prompt keeps a distinct, still stable, id.
            ident = h if not n_seen else f"{h}-{n_seen}"
            item = _Picked(-_sample_key(cfg.prepare.seed, ident), order, row.where, ident, cut)
            order += 1
            if limit is None:
                heap.append(item)
            elif len(heap) < limit:
                heapq.heappush(heap, item)
            elif item.neg_key > heap[0].neg_key:
                heapq.heapreplace(heap, item)
    if limit is not None:
        stats.not_selected = order - len(heap)
    picked = sorted(heap, key=lambda p: p.order)
    del heap, seen

    out = prepared_prompts_path(cfg.run_path, ds.name)
    stats_path = prepared_stats_path(cfg.run_path, ds.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    stats_path.unlink(missing_ok=True)  # the dataset is incomplete until the new stats.json exists
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.unlink(missing_ok=True)
    long_at = cfg.prepare.long_prompt_tokens
    try:
        with JsonlWriter(tmp, fsync=False) as w:
            batch: list[PromptRecord] = []
            for p in picked:
                try:
                    n_tok = len(profile.prompt_ids(p.cut.messages, p.cut.tools))
                except TokenizerError as exc:
                    bad(p.where, f"the chat template rejected this prompt ({exc})")
                    continue
                part = ds.partition if ds.partition != "auto" else ("long" if n_tok >= long_at else "short")
                batch.append(PromptRecord(
                    sample_id=f"{ds.name}-{p.hash[:16]}" + (p.hash[64:] if len(p.hash) > 64 else ""),
                    dataset=ds.name,
                    messages=p.cut.messages,
                    tools=p.cut.tools,
                    partition=part,
                    prompt_tokens=n_tok,
                    content_hash=p.hash[:64],
                    source=p.where,
                    turn_index=p.cut.turn_index,
                ))
                stats.samples += 1
                stats.prompt_tokens += n_tok
                stats.max_prompt_tokens = max(stats.max_prompt_tokens, n_tok)
                if part == "long":
                    stats.long += 1
                else:
                    stats.short += 1
                if len(batch) >= 512:
                    w.write_many(batch)
                    batch = []
            w.write_many(batch)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    stats.bad_lines_skipped = bad.count
    atomic_write_json(stats_path, stats)
    return stats


def _is_current(cfg: RunConfig, ds: DatasetConfig) -> DatasetStats | None:
    stats_path = prepared_stats_path(cfg.run_path, ds.name)
    if not (stats_path.is_file() and prepared_prompts_path(cfg.run_path, ds.name).is_file()):
        return None
    try:
        st = read_json(stats_path, DatasetStats)
    except DraftgenError:
        return None
    return st if st.fingerprint == _fingerprint(cfg, ds) else None


def run_prepare(cfg: RunConfig, *, echo: Echo = print) -> PrepareReport:
    """Prepare every dataset of the config whose prepared files are missing or out of date."""
    report = PrepareReport(run_dir=cfg.run_path)
    profile: Profile | None = None
    for ds in cfg.datasets:
        current = _is_current(cfg, ds)
        if current is not None:
            report.datasets.append(current)
            report.unchanged.append(ds.name)
            echo(f"{ds.name}: already prepared ({current.samples} prompts); unchanged")
            continue
        if profile is None:
            profile = profile_from_config(cfg)
        st = prepare_dataset(cfg, ds, profile, echo=echo)
        report.datasets.append(st)
        extra = [f"{st.duplicates_removed} duplicates removed"]
        if st.bad_lines_skipped:
            extra.append(f"{st.bad_lines_skipped} bad rows skipped")
        if st.not_selected:
            extra.append(f"{st.not_selected} left out by max_samples")
        echo(
            f"{ds.name}: {st.samples} prompts ({', '.join(extra)}), {st.prompt_tokens:,} prompt tokens, "
            f"{st.short} short / {st.long} long → {prepared_prompts_path(cfg.run_path, ds.name)}"
        )
    return report
