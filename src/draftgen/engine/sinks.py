"""The engine's writers: each dataset's records and failures, the attempts log and the health log.

Writes ``raw_responses.jsonl`` and ``failures.jsonl`` per dataset (``DatasetPlan`` paths), and
``logs/attempts.jsonl`` / ``logs/health.jsonl`` where ``EngineOptions`` names them. One ``RecordSink``
task per file, started on first use (a dataset with prompts pending gets its record sink at ``open``);
``close`` drains every one of them, so everything put before it is on disk.

``claim`` is the one place that decides which response of a sample becomes its record: the first claim of a
``(dataset, sample_id)`` in this run wins, every later one is refused (a hedged sample may have two usable
responses; exactly one record is written).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from draftgen.engine.plans import DatasetPlan
from draftgen.engine.stats import RunStats
from draftgen.engine.writer import RecordSink
from draftgen.records import AttemptRecord, FailureRecord, HealthEvent, ResponseRecord

__all__ = ["Sinks"]


class Sinks:
    def __init__(self, datasets: Sequence[DatasetPlan], stats: RunStats, *, fsync: bool,
                 attempts_path: Path | None, health_path: Path | None) -> None:
        self.datasets = list(datasets)
        self.stats = stats
        self.fsync = fsync
        self.attempts_path = attempts_path
        self.health_path = health_path
        self.io: Executor | None = None
        self._responses: dict[str, RecordSink[ResponseRecord]] = {}
        self._failures: dict[str, RecordSink[FailureRecord]] = {}
        self.attempts: RecordSink[AttemptRecord] | None = None
        self._health: RecordSink[HealthEvent] | None = None
        self._claimed: dict[str, set[str]] = {}

    def open(self, io: Executor) -> None:
        """Start the record sinks of the datasets with prompts pending, and the attempts log."""
        self.io = io
        for ds in self.datasets:
            if sum(ds.pending.values()):
                self.responses(ds.name)
        if self.attempts_path is not None:
            self.attempts = RecordSink(self.attempts_path, executor=io, fsync=False)
            self.attempts.start()

    def claim(self, dataset: str, sample_id: str) -> bool:
        """True for the first response of ``sample_id`` in this run (write it), False for any later one."""
        ids = self._claimed.setdefault(dataset, set())
        if sample_id in ids:
            return False
        ids.add(sample_id)
        return True

    def responses(self, dataset: str) -> RecordSink[ResponseRecord]:
        sink = self._responses.get(dataset)
        if sink is None:
            plan = next(d for d in self.datasets if d.name == dataset)
            counts = self.stats.dataset(dataset)
            parts = self.stats.partitions

            def written(batch: Sequence[ResponseRecord]) -> None:  # durable on disk: done
                counts.done += len(batch)
                for rec in batch:
                    pc = parts.get(rec.partition)
                    if pc is not None:
                        pc.done += 1

            sink = RecordSink(plan.raw_path, executor=self.io, on_written=written, fsync=self.fsync)
            sink.start()
            self._responses[dataset] = sink
        return sink

    def failures(self, dataset: str) -> RecordSink[FailureRecord]:
        sink = self._failures.get(dataset)
        if sink is None:
            plan = next(d for d in self.datasets if d.name == dataset)
            sink = RecordSink(plan.failures_path, executor=self.io, fsync=self.fsync)
            sink.start()
            self._failures[dataset] = sink
        return sink

    def health(self, ev: HealthEvent) -> None:
        if self.health_path is not None:
            if self._health is None:
                self._health = RecordSink(self.health_path, executor=self.io, fsync=self.fsync)
                self._health.start()
            self._health.put(ev)

    async def flush(self) -> None:
        """Wait until every record and failure put so far is on disk."""
        sinks: list[RecordSink[Any]] = [*self._responses.values(), *self._failures.values()]
        for sink in sinks:
            await sink.flush()

    async def close(self) -> list[BaseException]:
        """Close every sink (each drains first); the errors of those that failed, in order."""
        errors: list[BaseException] = []
        sinks: list[RecordSink[Any]] = [*self._responses.values(), *self._failures.values()]
        sinks += [x for x in (self.attempts, self._health) if x is not None]
        for sink in sinks:
            try:
                await sink.close()
            except Exception as exc:  # StorageError: keep closing the others
                errors.append(exc)
        return errors
