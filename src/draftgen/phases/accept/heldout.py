"""The held-out prompts of ``draftgen accept``: prepared prompts that no merged row saw, by id or by content.

Reads ``merged/manifest.json`` → the row ids of its Parquet shards (train and validation; through the one
reader, ``exporters.parquet.read_merged``), and ``prepared/<dataset>/prompts.jsonl`` of every dataset of the
merge and of the config, streamed: only sample ids, content keys and byte offsets are held, and only the chosen
prompts are decoded whole. Writes nothing.

A prepared prompt is held out iff its sample id is in no merged row (``#repN`` dropped) and its content is in
no merged row either. The content key is merge's prompt dedupe key: the prepared record's ``content_hash``,
which prepare sets to ``datasets.content_hash`` of its messages and tools (recomputed the same way for a
record without one). So the same prompt prepared under a second dataset name, which merge removed as a
duplicate, is not held out; such candidates are counted (``HeldOut.excluded_by_content``).

Candidates are ordered by sha256 of the sample id and taken round-robin over ``accept.datasets`` until
``accept.prompts``; a candidate whose content repeats one already taken is skipped (each prompt is sent once).
With no merge yet every prepared prompt is eligible (a note says so).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgspec

from draftgen.config import RunConfig
from draftgen.datasets import content_hash
from draftgen.errors import InputError
from draftgen.exporters.parquet import merged_shards, read_merged
from draftgen.records import MergedRowId, MergeManifest, Message, PromptRecord, Tool, parse_row_id
from draftgen.rundir import RunDir
from draftgen.store import JsonlReader, iter_jsonl, iter_jsonl_offsets, read_json

__all__ = ["HeldOut", "held_out_prompts", "prompt_key"]


@dataclass(frozen=True)
class HeldOut:
    """The chosen prompts, the notes for the report, and the candidates left out because their content is in
    a merged row (under another sample id)."""

    prompts: list[PromptRecord]
    notes: list[str] = field(default_factory=list)
    excluded_by_content: int = 0


class _KeyView(msgspec.Struct):
    """``PromptRecord``: what the content key needs; messages and tools stay undecoded unless needed."""

    sample_id: str
    content_hash: str = ""
    messages: msgspec.Raw = msgspec.Raw(b"[]")
    tools: msgspec.Raw = msgspec.Raw(b"null")


_messages = msgspec.json.Decoder(list[Message])
_tools = msgspec.json.Decoder(list[Tool] | None)


def prompt_key(view: _KeyView) -> str:
    """Merge's prompt dedupe key of a prepared prompt: its ``content_hash``, else ``datasets.content_hash``
    of its messages and tools (what prepare would have written)."""
    if view.content_hash:
        return view.content_hash
    return content_hash(_messages.decode(view.messages), _tools.decode(view.tools))


def _merged(rd: RunDir) -> tuple[set[str], list[str]] | None:
    """Bare sample ids of every merged row and the datasets the merge read, or None when nothing was merged."""
    if not rd.merged_manifest.is_file():
        return None
    man = read_json(rd.merged_manifest, MergeManifest)
    ids = {parse_row_id(r.sample_id)[0] for r in read_merged(merged_shards(rd, man), MergedRowId)}
    return ids, list(man.datasets)


def _merged_keys(rd: RunDir, ids: set[str], names: list[str]) -> set[str]:
    """The content keys of the merged rows: each merged sample id looked up in every dataset's prepared prompts."""
    keys: set[str] = set()
    for name in names:
        for _, view in iter_jsonl(rd.prepared(name), _KeyView):  # a missing file yields nothing
            if view.sample_id in ids:
                keys.add(prompt_key(view))
    return keys


def _candidates(rd: RunDir, name: str, ids: set[str], keys: set[str]) -> tuple[list[tuple[str, str, int]], int]:
    """(sort key, content key, byte offset) of one dataset's candidates in the fixed order, and how many were
    left out by content."""
    path = rd.prepared(name)
    if not path.is_file():
        raise InputError(f"{path}: no prepared prompts for dataset {name!r}; run `draftgen prepare` first")
    pool: list[tuple[str, str, int]] = []
    excluded = 0
    for _, off, view in iter_jsonl_offsets(path, _KeyView):
        if view.sample_id in ids:
            continue
        key = prompt_key(view)
        if key in keys:
            excluded += 1
            continue
        pool.append((hashlib.sha256(view.sample_id.encode()).hexdigest(), key, off))
    pool.sort()
    return pool, excluded


def held_out_prompts(cfg: RunConfig, rd: RunDir, n: int) -> HeldOut:
    """Up to ``n`` prepared prompts that no merged row saw (see the module docstring)."""
    notes: list[str] = []
    names = cfg.accept.datasets or [d.name for d in cfg.datasets]
    for name in names:
        cfg.dataset(name)  # a ConfigError naming the datasets when unknown
    merged = _merged(rd)
    ids: set[str] = set()
    keys: set[str] = set()
    if merged is None:
        notes.append("no merged/ in the run: every prepared prompt counted as held out")
    else:
        ids = merged[0]
        keys = _merged_keys(rd, ids, list(dict.fromkeys([*merged[1], *(d.name for d in cfg.datasets)])))
    pools: list[list[tuple[str, str, int]]] = []
    excluded = 0
    for name in names:
        pool, out_by_content = _candidates(rd, name, ids, keys)
        pools.append(pool)
        excluded += out_by_content
    chosen: list[tuple[int, int]] = []  # (pool index, byte offset)
    taken: set[str] = set()
    i = 0
    while len(chosen) < n and any(i < len(p) for p in pools):
        for j, p in enumerate(pools):
            if i < len(p) and len(chosen) < n and p[i][1] not in taken:
                taken.add(p[i][1])
                chosen.append((j, p[i][2]))
        i += 1
    if not chosen:
        raise InputError(f"no held-out prompts: every prepared prompt of {', '.join(names)} is in a merged row (by "
                         "sample id or by content); prepare more prompts (or a held-out dataset) and pass it in "
                         "accept.datasets")
    if excluded:
        notes.append(f"{excluded} candidates left out: their content is in a merged row under another sample id")
    if len(chosen) < n:
        notes.append(f"only {len(chosen)} held-out prompts available ({n} asked)")
    readers = [JsonlReader(rd.prepared(name), PromptRecord) for name in names]
    try:
        prompts: list[PromptRecord] = [readers[j].at(off) for j, off in chosen]
    finally:
        for r in readers:
            r.close()
    return HeldOut(prompts=prompts, notes=notes, excluded_by_content=excluded)
