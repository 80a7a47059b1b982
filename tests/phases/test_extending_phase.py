"""Adding a phase: its own code plus one registration line, run by ``draftgen run``'s loop like the others.

A toy phase writes a small file into a folder ``RunDir`` declares (``hidden/``) after merge. It runs once,
is fingerprinted in ``pipeline.json``, is skipped on an unchanged rerun, runs again when its output is
gone, and registering it in a copy of the table (or registering then unregistering) leaves the default
table as it was.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec

from draftgen.config import load_config
from draftgen.phases import (
    PHASES,
    Phase,
    PhaseContext,
    PhaseOutcome,
    dataset_logs,
    register_phase,
    unregister_phase,
)
from draftgen.phases.pipeline import PipelineState, run_pipeline
from draftgen.records import MergeManifest
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_bytes, read_json

DEFAULT = ["prepare", "generate", "audit", "merge", "extract", "train", "accept", "report"]


def _config(tmp: Path, n: int = 6) -> Path:
    rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Name fact {i}."}]}) for i in range(n)]
    (tmp / "prompts.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    cfg = tmp / "cfg.yaml"
    cfg.write_text(
        "run_dir: run\n"
        "endpoint: {kind: emulator, emulator: {scenario: fast}}\n"
        "partitions: {short: {concurrency: 4, max_tokens: 128}, long: {concurrency: 2, max_tokens: 128}}\n"
        "progress: \"off\"\n"
        "datasets:\n  - {name: facts, path: prompts.jsonl}\n",
        encoding="utf-8",
    )
    return cfg


def _toy_output(rd: RunDir) -> Path:
    return rd.hidden / "toy.txt"


class _Toy:
    """The toy phase: counts the merged files into hidden/toy.txt. Counts its own runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, ctx: PhaseContext) -> PhaseOutcome:
        self.runs += 1
        manifest = read_json(ctx.rd.merged_manifest, MergeManifest)
        atomic_write_bytes(_toy_output(ctx.rd), f"{len(manifest.files)} files\n".encode())
        ctx.echo(f"toy: wrote {_toy_output(ctx.rd)}")
        return PhaseOutcome()


def _toy_phase(toy: _Toy) -> Phase:
    return Phase("toy", toy, inputs=lambda cfg, rd: [*dataset_logs(cfg, rd), rd.merged_manifest],
                 output=_toy_output, skippable=True)


def test_a_registered_phase_runs_is_fingerprinted_and_skipped_when_unchanged(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    rd = RunDir(cfg.run_path)
    toy = _Toy()
    table = PHASES.copy()
    table.add(_toy_phase(toy), after="merge")  # the one registration line
    assert table.names() == ["prepare", "generate", "audit", "merge", "toy", "extract", "train", "accept", "report"]
    assert PHASES.names() == DEFAULT  # the copy is the test's own

    lines: list[str] = []
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lines.append, phases=table)
    assert rep.exit_code == 0, lines
    assert rep.phases_run == ["prepare", "generate", "audit", "merge", "toy", "report"]
    assert toy.runs == 1 and _toy_output(rd).read_text(encoding="utf-8").endswith(" files\n")
    assert "toy" in read_json(rd.pipeline, PipelineState).phases  # fingerprinted
    assert lines.index(f"toy: wrote {_toy_output(rd)}") < lines.index(f"report: {rd.report_html}")

    lines.clear()
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lines.append, phases=table)
    assert rep.exit_code == 0, lines
    assert rep.phases_skipped == ["audit", "merge", "toy"] and toy.runs == 1
    assert "toy: up to date" in lines

    _toy_output(rd).unlink()  # its output is what "done" means
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lines.append, phases=table)
    assert "toy" in rep.phases_run and toy.runs == 2 and _toy_output(rd).is_file()


def test_the_default_table_is_left_as_it_was() -> None:
    toy = _Toy()
    register_phase(_toy_phase(toy), after="merge")
    try:
        assert PHASES.names() == ["prepare", "generate", "audit", "merge", "toy", "extract", "train", "accept", "report"]
    finally:
        unregister_phase("toy")
    assert PHASES.names() == DEFAULT
    # Without a place, a phase goes before the final one (the report stays last).
    table = PHASES.copy()
    table.add(_toy_phase(toy))
    assert table.names() == ["prepare", "generate", "audit", "merge", "extract", "train", "accept", "toy", "report"]
    assert PHASES.names() == DEFAULT and toy.runs == 0


def test_an_output_its_phase_refuses_is_run_again_not_skipped(tmp_path: Path) -> None:
    """A phase's ``refused`` says why an output that exists is not done (train: a drafter refused): an unchanged
    rerun runs it again instead of calling it up to date."""
    cfg = load_config(_config(tmp_path))
    toy = _Toy()
    verdict: list[str | None] = [None]
    table = PHASES.copy()
    table.add(dataclasses.replace(_toy_phase(toy), refused=lambda rd: verdict[0]), after="merge")
    assert run_pipeline(cfg, argv=["draftgen", "run"], echo=lambda s: None, phases=table).exit_code == 0
    assert toy.runs == 1
    verdict[0] = "refused by a later direct run"  # the output is still there, the fingerprint unchanged
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lambda s: None, phases=table)
    assert "toy" in rep.phases_run and toy.runs == 2
    verdict[0] = None
    rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lambda s: None, phases=table)
    assert "toy" in rep.phases_skipped and toy.runs == 2
