"""A run's rounds of generation read back: ``rounds/round-<n>.json`` (``records.RoundPlan``) and the round
each prepared prompt was drawn in (``PromptRecord.round``), counted against the raw logs.

Reads ``rounds/``, ``prepared/<dataset>/prompts.jsonl`` and ``raw/<dataset>/raw_responses.jsonl``; writes
nothing. ``prepare`` asks ``started_draws`` how many prompts each started round adds to a dataset (in all, and
per tag where the round's line has tags); ``status``, ``merge`` and the report show ``round_counts``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import msgspec

from draftgen.errors import InputError
from draftgen.records import PromptIdView, RoundPlan
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, read_json

__all__ = ["RoundCount", "RoundDraw", "read_rounds", "round_counts", "round_of_ids", "started_adds", "started_draws"]

_NAME = re.compile(r"round-([0-9]+)\.json")


def read_rounds(run_dir: Path) -> list[RoundPlan]:
    """Every round file of the run, by round number. A file whose name and ``round`` disagree, or a round
    started after a later one was not, is an InputError naming it."""
    folder = RunDir(run_dir).rounds
    found: list[RoundPlan] = []
    for path in sorted(folder.glob("round-*.json")) if folder.is_dir() else []:
        m = _NAME.fullmatch(path.name)
        if m is None:
            continue
        plan = read_json(path, RoundPlan)
        if plan.round != int(m.group(1)) or plan.round < 2:
            raise InputError(f"{path}: holds round {plan.round}, its name says {m.group(1)}; restore the file "
                             "plan --next-round wrote or remove it")
        found.append(plan)
    found.sort(key=lambda p: p.round)
    return found


def started_adds(rounds: list[RoundPlan], dataset: str) -> list[int]:
    """The prompts each started round adds to ``dataset``, in round order (round 2 first)."""
    return [r.adds(dataset) for r in rounds if r.started_at is not None]


class RoundDraw(msgspec.Struct, frozen=True):
    """What one started round draws from a dataset: ``added`` prompts in all, and per tag when ``by_tag`` is
    not empty (else the next ``added`` by sample key)."""

    added: int
    by_tag: dict[str, int]


def started_draws(rounds: list[RoundPlan], dataset: str) -> list[RoundDraw]:
    """What each started round draws from ``dataset``, in round order (round 2 first)."""
    return [RoundDraw(r.adds(dataset), r.tag_adds(dataset)) for r in rounds if r.started_at is not None]


class _Id(msgspec.Struct):
    sample_id: str


class RoundCount(msgspec.Struct, kw_only=True):
    """One round's prompts over the whole run: how many were drawn, and how many have a response."""

    round: int
    prepared: int = 0
    done: int = 0
    by_dataset: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """dataset → [prepared, done]."""


def _rounds_of(rd: RunDir, dataset: str) -> dict[str, int] | None:
    """sample id → the round that drew it, for the prepared prompts of ``dataset`` (None: not prepared)."""
    path = rd.prepared(dataset)
    return {v.sample_id: v.round for _, v in iter_jsonl(path, PromptIdView)} if path.is_file() else None


def round_of_ids(run_dir: Path, datasets: list[str]) -> dict[str, int]:
    """sample id → the round that drew it, for every prepared prompt of ``datasets``."""
    rd = RunDir(run_dir)
    out: dict[str, int] = {}
    for name in datasets:
        out.update(_rounds_of(rd, name) or {})
    return out


def round_counts(run_dir: Path, datasets: list[str]) -> list[RoundCount]:
    """Per round (1 first), the prepared prompts and those with a response; [] when every prompt is round
    1's (a run with one round shows no rounds)."""
    rd = RunDir(run_dir)
    if not any(r.started_at is not None for r in read_rounds(run_dir)):
        return []  # one round: no second pass over the raw logs (status runs this on every refresh)
    rounds: dict[int, RoundCount] = {}
    for name in datasets:
        of = _rounds_of(rd, name)
        if of is None:
            continue
        done: set[str] = set()
        raw = rd.raw(name)
        if raw.is_file():
            done = {r.sample_id for _, r in iter_jsonl(raw, _Id) if r.sample_id in of}
        prepared = Counter(of.values())
        finished = Counter(of[s] for s in done)
        for n, count in prepared.items():
            rc = rounds.setdefault(n, RoundCount(round=n))
            rc.prepared += count
            rc.done += finished[n]
            rc.by_dataset[name] = [count, finished[n]]
    if set(rounds) <= {1}:
        return []
    return [rounds[n] for n in sorted(rounds)]
