"""Reference token ids for the BPE audit, indexed without holding them in memory.

Reads a JSONL file of reference records (``records.ReferenceRow``, through the store's readers), one per
line, either the emulator's ground truth (``GroundTruthRecord``: ``generation_id``, ``output_ids``,
``prompt_ids``, ``non_canonical``) or records with exact ids keyed by ``sample_id`` (e.g. ``raw_responses.jsonl`` of a vLLM/SGLang run). The index keeps,
per key, a 16-byte digest of the ids and the line's byte offset; a record whose ids hash equal is an exact
match without reading anything back, and only mismatches are re-read from disk.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.errors import InputError
from draftgen.records import ReferenceRow
from draftgen.store import JsonlReader, iter_jsonl_offsets

__all__ = ["RefEntry", "ReferenceIndex", "ids_digest", "load_reference"]


def ids_digest(ids: Sequence[int]) -> bytes:
    """A 16-byte digest of a token-id sequence (equal digests ⇔ equal sequences, for our purposes)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


@dataclass(frozen=True)
class RefEntry:
    offset: int
    digest: bytes
    prompt_digest: bytes | None
    non_canonical: bool


@dataclass
class ReferenceIndex:
    path: Path
    by_generation: dict[str, RefEntry] = field(default_factory=dict)
    by_sample: dict[str, RefEntry] = field(default_factory=dict)
    _reader: JsonlReader | None = None

    def lookup(self, generation_id: str | None, sample_id: str) -> RefEntry | None:
        if generation_id and generation_id in self.by_generation:
            return self.by_generation[generation_id]
        return self.by_sample.get(sample_id)

    def ids(self, entry: RefEntry) -> tuple[list[int], list[int] | None]:
        """The reference output ids (and prompt ids) of one entry, read back from disk."""
        if self._reader is None:
            self._reader = JsonlReader(self.path, ReferenceRow)  # held for the audit, closed by close()
        row: ReferenceRow = self._reader.at(entry.offset)
        return row.output_ids or [], row.prompt_ids

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __len__(self) -> int:
        return len(self.by_generation) + len(self.by_sample)


def load_reference(path: Path) -> ReferenceIndex:
    """Index a reference JSONL file. A corrupt complete line is an InputError naming file:line."""
    index = ReferenceIndex(path=path)
    if not path.is_file():
        raise InputError(f"{path}: reference file not found; pass --reference PATH or set audit.reference")
    for lineno, start, row in iter_jsonl_offsets(path, ReferenceRow):  # a partial last line is skipped
        if row.output_ids is None:
            raise InputError(f"{path}:{lineno}: reference record without output_ids")
        entry = RefEntry(
            offset=start,
            digest=ids_digest(row.output_ids),
            prompt_digest=ids_digest(row.prompt_ids) if row.prompt_ids is not None else None,
            non_canonical=row.non_canonical,
        )
        if row.generation_id:
            index.by_generation[row.generation_id] = entry
        elif row.sample_id:
            index.by_sample[row.sample_id] = entry
        else:
            raise InputError(f"{path}:{lineno}: reference record has neither generation_id nor sample_id")
    return index
