"""One writer task per output file, with group commit.

``RecordSink.put`` queues a record (never blocks: at most one record per sample in flight is ever
queued). The sink's task takes everything queued, writes it with one ``JsonlWriter.write_many`` (one
``write`` + one ``fsync``) in a worker thread, then calls ``on_written`` for the batch on the event loop.
A record counts as done only after that call, i.e. once it is durable on disk. ``close`` drains the
queue first, so everything ``put`` before it reaches the file; ``flush`` waits for that without closing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Generic, TypeVar

from draftgen.store import JsonlWriter

__all__ = ["RecordSink"]

R = TypeVar("R")


class RecordSink(Generic[R]):
    def __init__(
        self,
        path: Path,
        *,
        executor: Executor | None = None,
        on_written: Callable[[Sequence[R]], None] | None = None,
        fsync: bool = True,
        max_batch: int = 4096,
    ) -> None:
        self.path = path
        self.writer = JsonlWriter(path, fsync=fsync)
        self.executor = executor
        self.on_written = on_written
        self.max_batch = max_batch
        self.written = 0
        self.queued = 0
        self.batches = 0
        self._queue: asyncio.Queue[R | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"writer:{self.path.name}")

    def put(self, record: R) -> None:
        if self.error is not None:
            raise self.error
        self.queued += 1
        self._queue.put_nowait(record)

    async def flush(self) -> None:
        """Wait until every record ``put`` so far is on disk (re-raises a write error)."""
        target = self.queued
        while self.written < target:
            if self.error is not None:
                raise self.error
            if self._task is None or self._task.done():
                raise RuntimeError(f"the writer of {self.path} stopped with records queued")
            await asyncio.sleep(0.002)
        if self.error is not None:
            raise self.error

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        q = self._queue
        closing = False
        while not closing:
            first = await q.get()
            batch: list[R] = []
            if first is None:
                closing = True
            else:
                batch.append(first)
            while not q.empty() and len(batch) < self.max_batch:
                item = q.get_nowait()
                if item is None:
                    closing = True
                    continue
                batch.append(item)
            if not batch:
                continue
            try:
                await loop.run_in_executor(self.executor, self.writer.write_many, batch)
            except BaseException as exc:
                self.error = exc
                raise
            self.written += len(batch)
            self.batches += 1
            if self.on_written is not None:
                self.on_written(batch)

    async def close(self) -> None:
        """Write everything queued, then close the file. Re-raises a write error (StorageError)."""
        if self._task is not None:
            self._queue.put_nowait(None)
            try:
                await self._task
            finally:
                self._task = None
                self.writer.close()
        else:
            self.writer.close()
        if self.error is not None:
            raise self.error

    @property
    def pending(self) -> int:
        return self._queue.qsize()
