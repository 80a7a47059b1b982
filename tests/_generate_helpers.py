"""Helpers for the generate/backend/engine tests: prepared prompts, configs, emulators, readers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common_helpers import FAKE_KEY, config_dict
from draftgen.config import RunConfig, config_from_mapping
from draftgen.emulator import EmulatorOptions, RunningEmulator, Scenario, builtin_scenario, start_in_thread
from draftgen.provenance import expected_provenance
from draftgen.records import (
    FailureRecord,
    Message,
    PromptRecord,
    Provenance,
    ResponseRecord,
    Tool,
    ToolFunction,
)
from draftgen.rundir.claim import writer
from draftgen.store import JsonlWriter, iter_jsonl
from draftgen.tokens import profile_from_config

SECRET_KEY = FAKE_KEY  # the one fake key (_common_helpers), recognisable in a scan

TOOLS = [Tool(function=ToolFunction(name="lookup_order", description="Find an order by id",
                                    parameters={"type": "object", "properties": {"id": {"type": "string"}}}))]


def prompt(dataset: str, i: int, partition: str = "short", tools: bool = False) -> PromptRecord:
    return PromptRecord(
        sample_id=f"{dataset}-{i:05d}", dataset=dataset, partition=partition,
        messages=[Message(role="user", content=f"Question {i} of {dataset}: explain something interesting.")],
        tools=TOOLS if tools else None, prompt_tokens=30,
    )


def claim(cfg: RunConfig) -> Path:
    """Claim ``cfg``'s run directory the way every writing phase does (``rundir.claim.writer`` writes run.json)
    and return it, so prompts written into it by hand land in a folder that is draftgen's.

    generate refuses a run made by another config: claim with one whose model, reasoning, sampling and
    datasets are the ones the test then runs (endpoint, routing, budgets and the like may differ)."""
    with writer(cfg, "test") as rd:
        return rd.root


def provenance(cfg: RunConfig) -> Provenance:
    """The provenance generate stamps on (and expects of) the records of ``cfg``."""
    return expected_provenance(cfg, profile_from_config(cfg).tokenizer_sha256)


def write_prompts(run_dir: Path, dataset: str, n: int, *, long_every: int = 0, tools_every: int = 0) -> list[str]:
    """prepared/<dataset>/prompts.jsonl with ``n`` prompts; returns their ids."""
    path = run_dir / "prepared" / dataset / "prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = [prompt(dataset, i, "long" if long_every and i % long_every == 0 else "short",
                   tools=bool(tools_every) and i % tools_every == 0) for i in range(n)]
    with JsonlWriter(path, fsync=False) as w:
        w.write_many(recs)
    return [r.sample_id for r in recs]


def make_config(tmp: Path, datasets: list[str], *, base_url: str | None = None, kind: str = "emulator",
                **sections: Any) -> RunConfig:
    """A config over prepared datasets in ``tmp/run`` (paths are placeholders: prompts are prepared):
    ``_common_helpers.config_dict`` with short timeouts, fast retries and no display; ``sections`` merge in."""
    endpoint: dict[str, Any] = {"kind": kind, "idle_timeout_s": 5.0, "connect_timeout_s": 5.0}
    if base_url:
        endpoint["base_url"] = base_url
    endpoint.update(sections.pop("endpoint", {}))
    defaults: dict[str, Any] = {
        "partitions": {"short": {"concurrency": 16, "max_tokens": 2048}, "long": {"concurrency": 4, "max_tokens": 4096}},
        "retry": {"max_attempts": 8, "base_delay_s": 0.01, "max_delay_s": 0.2, "shutdown_grace_s": 5.0},
        "progress": "off",
    }
    data = config_dict(tmp, datasets, endpoint=endpoint, **defaults)
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return config_from_mapping(data, where="test", base_dir=tmp)


def fast(**changes: Any) -> Scenario:
    return builtin_scenario("fast").replace(**changes) if changes else builtin_scenario("fast")


@contextlib.contextmanager
def emulator(scenario: Scenario | None = None, **opts: Any) -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(scenario_obj=scenario or fast(), **opts)) as emu:
        yield emu


def responses(run_dir: Path, dataset: str) -> list[ResponseRecord]:
    return [r for _, r in iter_jsonl(run_dir / "raw" / dataset / "raw_responses.jsonl", ResponseRecord)]


def failures(run_dir: Path, dataset: str) -> list[FailureRecord]:
    return [r for _, r in iter_jsonl(run_dir / "raw" / dataset / "failures.jsonl", FailureRecord)]
