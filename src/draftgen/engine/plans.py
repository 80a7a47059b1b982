"""What the engine is given and what it returns: partition and dataset plans, its options, its result.

Plain values, built once by the caller (``phases.generate.run``) from the config and the run directory; the
engine (``scheduler``, ``sample``) reads them and never writes them back, except ``DatasetPlan.done``
and ``pending``, which are the caller's view of the run before it starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftgen.engine.intake import IntakeRules
from draftgen.engine.tail import TailPolicy

__all__ = ["DatasetPlan", "EngineOptions", "EngineResult", "PartitionPlan"]


@dataclass
class PartitionPlan:
    name: str
    concurrency: int
    max_tokens: int


@dataclass
class DatasetPlan:
    """One dataset's work: where its prompts are read and its records and failures written (the caller
    spells the paths, ``rundir.RunDir``; the engine sees plans, not the run directory)."""

    name: str
    prompts_path: Path
    raw_path: Path
    failures_path: Path
    done: set[str] = field(default_factory=set)
    pending: dict[str, int] = field(default_factory=dict)  # partition → prompts left


@dataclass
class EngineResult:
    exit_code: int = 0
    stop_reason: str | None = None


@dataclass(frozen=True)
class EngineOptions:
    """The engine's scalar knobs (``retry.*``, ``quality.*``, the endpoint's capabilities, the log paths).

    ``adaptive``: AIMD concurrency per partition; ``grace_s``: how long an interrupt lets the requests in
    flight finish; ``needs_prompt_ids``: send the prompt's token ids (SGLang); ``cpu_workers``: threads
    that build records; ``fsync``: records and failures are fsynced per batch; ``connect_failure_limit``:
    connect failures in a row (with no success for a minute, or none yet) that stop the run; ``ramp_s``:
    the first ``concurrency`` requests of a partition are spread over it; ``attempts_path`` /
    ``health_path``: ``logs/attempts.jsonl`` and ``logs/health.jsonl`` (None: not written);
    ``keep_unusable``: an unusable response is a sample's record when its retries run out;
    ``intake``: what every response is held to (``intake.IntakeRules``: the model and its aliases,
    completeness, reasoning; ``IntakeRules()`` checks no model); ``avoid``: (dataset, sample id) →
    providers its requests avoid from the first attempt (a sample regenerated because the audit excluded
    the record a provider served, or whose batch result was unusable); ``tail``: stalls, the rate floor and
    hedges (``tail.*``).
    """

    adaptive: bool = True
    grace_s: float = 30.0
    needs_prompt_ids: bool = False
    cpu_workers: int = 2
    fsync: bool = True
    connect_failure_limit: int = 50
    ramp_s: float = 1.0
    attempts_path: Path | None = None
    health_path: Path | None = None
    keep_unusable: bool = False
    intake: IntakeRules = field(default_factory=IntakeRules)
    avoid: Mapping[tuple[str, str], Sequence[str]] = field(default_factory=dict)
    tail: TailPolicy = field(default_factory=TailPolicy)
