"""The batch journal: ``openrouter-batches/journal.jsonl`` (``BatchEvent``), what ``endpoint.mode: batch``
did with each OpenRouter batch, and ``fold_batches``, the state of every batch it reads back. No I/O.

One batch's life, each step a line appended (and fsynced) before the next step starts, so a kill -9 at any
point leaves a journal that says what may have happened (``engine.batch``):

    prepared    its items (partition, max_tokens, the dollars each reserves; ``keyed``: each request's
                ``custom_id`` is ``<key>:<dataset>:<sample_id>``, else, in journals written before keys,
                ``<dataset>:<sample_id>``), the fingerprint of the submission body, the batch-level model and
                provider filter
    submitted   the id OpenRouter gave it (``adopted``: a restart that did not know whether its submission
                went through found it in the account's batches, its results carrying its custom_ids)
    status      a status read while polling (``validating``, ``in_progress``, ``finalizing``), with its counts
    finished    a terminal status, once every result it carried is durable in the raw logs (or it carried
                none: ``failed``, ``expired``, ``cancelled``); its ``usage.cost`` and counts
    abandoned   never submitted and never to be (its prompts changed, or it was superseded); no spend

A batch is *open* from ``prepared`` until ``finished`` or ``abandoned``: its items are neither generated
synchronously nor put into another batch, and its worst case stays reserved against the budgets.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from draftgen.records.base import SCHEMA_VERSION

__all__ = [
    "BatchEvent",
    "BatchEventKind",
    "BatchItem",
    "BatchView",
    "apply_event",
    "custom_id",
    "fold_batches",
]

BatchEventKind = Literal["prepared", "submitted", "status", "finished", "abandoned"]


def custom_id(dataset: str, sample_id: str, key: str | None = None) -> str:
    """The ``custom_id`` of a sample's request in batch ``key``: ``<key>:<dataset>:<sample_id>`` (keys and
    dataset names hold no ``:``). The key makes it unique to one batch, so results that carry it are that
    batch's and no other's (the Batch API echoes nothing else of a submission); without ``key``, the form of
    journals written before keys."""
    return f"{key}:{dataset}:{sample_id}" if key else f"{dataset}:{sample_id}"


class BatchItem(msgspec.Struct, frozen=True, array_like=True):
    """One request of a batch: its sample, its partition's max_tokens, and its worst case at batch prices."""

    dataset: str
    sample_id: str
    partition: str
    max_tokens: int
    usd: float



class BatchEvent(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of the journal (see the module docstring for which fields each event carries)."""

    key: str  # draftgen's own name of the batch, known before OpenRouter's id is; unique, no ``:``
    event: BatchEventKind
    at: float
    items: list[BatchItem] | None = None
    keyed: bool = False  # its custom_ids carry ``key``
    fingerprint: str | None = None  # sha256 of the submission body
    model: str | None = None
    provider_only: list[str] | None = None
    size_bytes: int = 0
    batch_id: str | None = None
    adopted: bool = False
    status: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    cost: float | None = None
    provider: str | None = None
    reason: str | None = None
    schema_version: int = SCHEMA_VERSION


class BatchView(msgspec.Struct, kw_only=True):
    """One batch as the journal tells it (``fold_batches``)."""

    key: str
    items: list[BatchItem] = msgspec.field(default_factory=list)
    keyed: bool = False
    fingerprint: str | None = None
    model: str | None = None
    provider_only: list[str] | None = None
    size_bytes: int = 0
    prepared_at: float = 0.0
    batch_id: str | None = None
    adopted: bool = False
    submitted_at: float | None = None
    status: str | None = None
    status_at: float | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    cost: float | None = None
    provider: str | None = None
    finished: bool = False
    abandoned: bool = False
    finished_at: float | None = None
    reason: str | None = None

    @property
    def open(self) -> bool:
        """Prepared and not yet finished or abandoned: its items belong to it, its worst case is reserved."""
        return not self.finished and not self.abandoned

    def custom_id(self, it: BatchItem) -> str:
        """The ``custom_id`` item ``it`` was (or will be) submitted with."""
        return custom_id(it.dataset, it.sample_id, self.key if self.keyed else None)

    @property
    def reserved_usd(self) -> float:
        return sum(it.usd for it in self.items)

    @property
    def state(self) -> str:
        """``prepared`` (not known to be submitted), the last status read, ``finished:<status>``, ``abandoned``."""
        if self.abandoned:
            return "abandoned"
        if self.finished:
            return f"finished:{self.status or '?'}"
        if self.batch_id is None:
            return "prepared"
        return self.status or "submitted"


def apply_event(v: BatchView, ev: BatchEvent) -> None:
    """Apply one journal event to its batch's view."""
    if ev.event == "prepared":
        v.items, v.keyed = list(ev.items or []), ev.keyed
        v.fingerprint, v.model, v.provider_only = ev.fingerprint, ev.model, ev.provider_only
        v.size_bytes, v.prepared_at = ev.size_bytes, ev.at
    elif ev.event == "submitted":
        v.batch_id, v.adopted, v.submitted_at = ev.batch_id, ev.adopted, ev.at
    elif ev.event in ("status", "finished"):
        v.status, v.status_at = ev.status, ev.at
        v.total, v.completed, v.failed = ev.total, ev.completed, ev.failed
        v.provider = ev.provider or v.provider
        if ev.event == "finished":
            v.finished, v.finished_at, v.cost, v.reason = True, ev.at, ev.cost, ev.reason
    elif ev.event == "abandoned":
        v.abandoned, v.finished_at, v.reason = True, ev.at, ev.reason


def fold_batches(events: Iterable[BatchEvent]) -> dict[str, BatchView]:
    """Every batch of the journal, in the order first prepared, with its latest state."""
    out: dict[str, BatchView] = {}
    for ev in events:
        v = out.get(ev.key)
        if v is None:
            v = out[ev.key] = BatchView(key=ev.key)
        apply_event(v, ev)
    return out
