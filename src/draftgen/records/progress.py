"""The live display's latest figures (``logs/progress.json``, ``ProgressRecord``), written by generate's display
every few seconds and read by ``status``: what a run in progress says of itself (its ETA and its pace)."""

from __future__ import annotations

import msgspec

from draftgen.records.base import SCHEMA_VERSION


class ProgressRecord(msgspec.Struct, kw_only=True):
    """One look at a running ``generate`` (``engine.progress.Snapshot``'s total row and pace)."""

    written_at: float
    """Wall-clock time it was written; an ETA is as of then."""
    pid: int
    """The process that wrote it (status trusts it only while that process holds the writer lock)."""
    elapsed_s: float
    """Since this run started (``engine.stats.RunStats.elapsed``)."""
    mean_tok_s: float
    """This run's completion tokens over ``elapsed_s``."""
    tok_s: float
    """Tokens received on the wire per second over the last ``engine.stats.RATE_WINDOW_S`` seconds."""
    done: int
    planned: int
    failed: int
    eta_s: float | None = None
    """Seconds left as of ``written_at`` (``engine.timemodel.eta``), None when not known yet."""
    eta_basis: str | None = None
    """What decides it: ``in flight`` (the streams on the wire), ``waves`` (samples not sent yet) or ``resp/s``."""
    finished: bool = False
    """Written at the end of the run (its ETA is then 0)."""
    schema_version: int = SCHEMA_VERSION
