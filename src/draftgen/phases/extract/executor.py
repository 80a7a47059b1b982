"""Where ``draftgen extract``'s worker runs: the ``Executor`` protocol, and ``InProcess`` (this process).

The driver (``run``) cuts the pending rows into batches (``batches.split_batches``) and hands them to ONE
executor, then loops over the ``BatchResult``s it yields (progress, each sample counted once, the manifest
last). Three executors, each running the same ``worker.Worker``:

- ``InProcess``: one Worker here (the default; ``run_extract(backend=...)`` hands it a loaded backend);
- ``proc_pool.Processes``: one spawned process per ``hidden_states.devices`` entry, fed by one queue;
- ``ray_pool.RayPool``: a Ray Data actor pool (``hidden_states.ray``).

An executor: ``start()`` (load the target, start processes or Ray), ``describe(head, url)`` (its opening
line(s)), ``results(batches)`` (each batch's result as it completes, in any order; a retried task's repeat
may come twice: the driver counts a sample once), ``target()`` (the target's ``TargetInfo``, also when no
batch ran), ``close()`` (always called; stops what ``start`` started), and ``timings`` (its own seconds, e.g.
``ray_init``). ``label`` tags its lines (``extract (ray): ...``); ``unit`` names its workers in the
per-worker summary lines ("" for none). Reads and writes nothing itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from draftgen.phases.extract.worker import BatchResult, Worker

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.hidden.format import HiddenStore
    from draftgen.records import HiddenIndexRecord
    from draftgen.target import ExtractBackend, ExtractRow, TargetInfo

__all__ = ["Executor", "InProcess"]


class Executor(Protocol):
    """See the module docstring."""

    label: str
    unit: str
    timings: dict[str, float]

    def start(self) -> None: ...

    def describe(self, head: str, url: str) -> list[str]: ...

    def results(self, batches: Sequence[Sequence[ExtractRow]]) -> Iterator[BatchResult]: ...

    def target(self) -> TargetInfo: ...

    def close(self) -> None: ...


class InProcess:
    """The Worker in this process (see the module docstring)."""

    label = ""
    unit = ""

    def __init__(self, cfg: RunConfig, store: HiddenStore, probe: dict[str, HiddenIndexRecord],
                 backend: ExtractBackend | None = None) -> None:
        self.cfg, self.store, self.probe, self.backend = cfg, store, probe, backend
        self.worker: Worker | None = None
        self.timings: dict[str, float] = {}

    def start(self) -> None:
        self.worker = Worker.open(self.cfg, self.store, self.probe, self.backend)

    def _worker(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("InProcess: start() first")
        return self.worker

    def describe(self, head: str, url: str) -> list[str]:
        info = self.target()
        return [f"extract: {head} → {url}; target {info.name} ({info.num_layers} layers, hidden {info.hidden_size}), "
                f"aux layers {list(info.layers.aux)} + final {info.layers.final} (vLLM convention), "
                f"{self.cfg.hidden_states.dtype}"]

    def results(self, batches: Sequence[Sequence[ExtractRow]]) -> Iterator[BatchResult]:
        return self._worker().run(batches)

    def target(self) -> TargetInfo:
        return self._worker().backend.info

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
