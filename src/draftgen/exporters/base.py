"""The exporter registry and what merge hands every exporter.

``MergedRow``: where a selected sample's ids sit in one Arrow list array, its lengths and metadata, and the byte
offsets of its raw response and prepared prompt lines; ``RowReaders`` reads those lines back for the formats that
need text. ``EXPORTERS`` (a ``draftgen.registry.Registry``) maps a format name (``merge.exports``) to its
``Exporter``: the built-in formats are registered here as lazy ``"module:attr"`` entries (their modules are
imported on first use, so this registry does not depend on importing the ``exporters`` face first); a
plugin's format is a builder plus one ``@register_exporter`` line. No file is written here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from draftgen.records import (
    PromptRecord,
    ResponseRecord,
    row_id,
)
from draftgen.registry import Registry
from draftgen.rundir import RunDir
from draftgen.store import JsonlReader
from draftgen.tokens import Profile


@dataclass(slots=True)
class MergedRow:
    dataset: str
    sample_id: str
    buf_index: int  # row of the shared Arrow list array holding prompt + (capped) completion ids
    prompt_len: int
    completion_len: int  # after the cap
    reasoning_len: int  # after the cap
    uncapped_len: int  # prompt + completion before the cap
    capped: bool
    finish_reason: str | None
    provider: str | None
    ids_source: str
    is_tool_call: bool
    raw_offset: int  # byte offset of the response line in raw_responses.jsonl
    prompt_offset: int  # byte offset in prepared prompts.jsonl; -1 when there is none
    key: str  # dedupe key
    copy: int = 0  # > 0 for repeats made by weight > 1

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.completion_len

    @property
    def row_id(self) -> str:
        return row_id(self.sample_id, self.copy)


@dataclass
class RowSource:
    """Where a dataset's lines are, for the exports that need text."""

    raw_path: Path
    prompts_path: Path | None


def loss_mask_bytes(row: MergedRow, mask_reasoning: bool) -> bytes:
    r = row.reasoning_len
    return (b"\x00" * row.prompt_len + (b"\x00" if mask_reasoning else b"\x01") * r
            + b"\x01" * (row.completion_len - r))


class RowReaders:
    """One open reader per file, opened on first use."""

    def __init__(self, sources: dict[str, RowSource]) -> None:
        self.sources = sources
        self._open: dict[Path, JsonlReader] = {}

    def get(self, path: Path, type: type[Any]) -> JsonlReader:
        r = self._open.get(path)
        if r is None:
            r = self._open[path] = JsonlReader(path, type)
        return r

    def response(self, row: MergedRow) -> ResponseRecord:
        rec: ResponseRecord = self.get(self.sources[row.dataset].raw_path, ResponseRecord).at(row.raw_offset)
        return rec

    def prompt(self, row: MergedRow) -> PromptRecord | None:
        path = self.sources[row.dataset].prompts_path
        if path is None or row.prompt_offset < 0:
            return None
        rec: PromptRecord = self.get(path, PromptRecord).at(row.prompt_offset)
        return rec

    def close(self) -> None:
        for r in self._open.values():
            r.close()


# -- the export formats ----------------------------------------------------------------------------------


@dataclass
class ExportContext:
    """What a row builder may use besides the row: the target's profile, and the row's response and prompt
    records read back from disk by byte offset (only when asked: most formats need the ids alone)."""

    profile: Profile
    readers: RowReaders

    def response(self, row: MergedRow) -> ResponseRecord:
        return self.readers.response(row)

    def prompt(self, row: MergedRow) -> PromptRecord | None:
        return self.readers.prompt(row)


# A builder turns one merged row (its ids and loss mask as lists) into the format's record, or returns the
# reason it is left out of that format.
Builder = Callable[[ExportContext, MergedRow, list[int], list[int]], "msgspec.Struct | str"]


@dataclass(frozen=True)
class Exporter:
    """One peer format (registered in ``EXPORTERS`` under its ``merge.exports`` name, also its folder under
    exports/): its row builder and how its consumer reads it."""

    build: Builder
    pretokenized: bool  # rows carry input_ids + loss_mask: rows without a supervised token are left out
    usage: str  # how the consumer reads it; {dir} and {file} are the train split's folder and file


#: The export formats by ``merge.exports`` name, in registration order: the one list of them (config
#: validation, docs/config.md, merge and the dataset card read it). Each doc is one line for docs/config.md.
EXPORTERS: Registry[Exporter] = Registry("merge.exports", "export format")  # built-ins: the face registers them

def register_exporter(name: str, *, pretokenized: bool, usage: str, doc: str = "") -> Callable[[Builder], Builder]:
    """Register the decorated builder as export format ``name`` (written to ``exports/<name>/<split>.jsonl``).

    ``pretokenized``: its rows carry ``input_ids`` + ``loss_mask``, so rows without a supervised token are
    left out. ``usage``: how its consumer reads it (``{dir}``/``{file}``: the train split's folder and file).
    A name already registered is a ConfigError; ``EXPORTERS.unregister(name)`` removes it again."""
    def deco(build: Builder) -> Builder:
        EXPORTERS.register(name, Exporter(build, pretokenized, usage), doc=doc)
        return build

    return deco


def check_exports(names: Sequence[str]) -> None:
    """Every name is a registered format (a ConfigError naming the registered ones); merge calls this before
    it removes anything."""
    for name in names:
        EXPORTERS.get(name)


def export_usage(rd: RunDir, kind: str) -> str:
    """How the consumer of an export format reads the train split, with this run's paths."""
    return EXPORTERS.get(kind).usage.format(dir=rd.export_dir(kind).relative_to(rd.root).as_posix(),
                                        file=rd.export_file(kind, "train").relative_to(rd.root).as_posix())
