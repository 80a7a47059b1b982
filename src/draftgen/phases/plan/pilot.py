"""``plan``'s pilot: the first N pending prompts of each dataset sent through the normal generate path into a
side run directory (``<run_dir>/plan/pilot``, claimed as its own run directory), with generate's plain status
line on stderr every 10 s (unless ``progress: off``), then its records (and its emulator ground truth) appended
to the run's raw logs, each sample once, so ``draftgen run`` does not send them again.

Reads the run's and the pilot's prepared prompts and raw logs; writes the pilot's run directory and appends
to the run's raw logs and ground truth.
"""

from __future__ import annotations

import msgspec

from draftgen.config import RunConfig
from draftgen.phases import Echo
from draftgen.records import GroundTruthRecord, PromptRecord
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.store import (
    JsonlWriter,
    atomic_write_bytes,
    encode_json,
    iter_jsonl,
    iter_responses,
    scan_responses,
)
from draftgen.tokens import Profile

__all__ = ["send_pilot"]


def _pilot_prompts(cfg: RunConfig, name: str, n: int) -> list[PromptRecord]:
    rd = RunDir(cfg.run_path)
    done = scan_responses(rd.raw(name)).done
    need = n - len(done)
    picked: list[PromptRecord] = []
    if need <= 0:
        return picked
    for _, rec in iter_jsonl(rd.prepared(name), PromptRecord):
        if rec.sample_id not in done:
            picked.append(rec)
            if len(picked) == need:
                break
    return picked


def _adopt(pilot: RunDir, run: RunDir, names: list[str]) -> int:
    """Append the pilot's records (and ground truth) to the run's logs, each sample once."""
    added = 0
    for name in names:
        src = pilot.raw(name)
        if not src.is_file():
            continue
        dst = run.raw(name)
        done = scan_responses(dst).done
        new = []
        for r in iter_responses(src):
            if r.sample_id not in done:
                done.add(r.sample_id)
                new.append(r)
        if new:
            with JsonlWriter(dst) as w:
                w.write_many(new)
            added += len(new)
    gt_src = pilot.ground_truth
    if gt_src.is_file():
        gt_dst = run.ground_truth
        have = {g.generation_id for _, g in iter_jsonl(gt_dst, GroundTruthRecord)}
        gts = [g for _, g in iter_jsonl(gt_src, GroundTruthRecord) if g.generation_id not in have]
        if gts:
            with JsonlWriter(gt_dst) as w:
                w.write_many(gts)
    return added


def send_pilot(cfg: RunConfig, n: int, *, echo: Echo = print, profile: Profile | None = None,
               force: bool = False) -> tuple[int, str | None]:
    """Generate up to ``n`` responses per dataset through ``run_generate`` and keep them in the run's raw
    logs. Returns the number of records added to the run, and why the pilot stopped early (or None).
    ``profile``: the command's already loaded profile of ``cfg.model`` (default: generate loads it).
    ``force``: plan's ``--force``, handed to the pilot's run directory and generate."""
    pilot_dir = RunDir(cfg.run_path).pilot
    # Plain status lines while it runs (on a terminal too: a live display would be drawn over by the plan).
    pilot_cfg = msgspec.structs.replace(cfg, run_dir=str(pilot_dir.resolve()),
                                        progress="off" if cfg.progress == "off" else "plain")
    with writer(pilot_cfg, "plan --pilot", force=force):
        return _pilot(cfg, pilot_cfg, RunDir(pilot_dir), n, echo, profile, force)


def _pilot(cfg: RunConfig, pilot_cfg: RunConfig, pilot: RunDir, n: int, echo: Echo,
           profile: Profile | None, force: bool) -> tuple[int, str | None]:
    from draftgen.phases.generate.run import run_generate

    run = RunDir(cfg.run_path)
    names: list[str] = []
    stopped: str | None = None
    for d in cfg.datasets:
        prompts = _pilot_prompts(cfg, d.name, n)
        if not prompts:
            continue
        atomic_write_bytes(pilot.prepared(d.name), b"".join(encode_json(p) + b"\n" for p in prompts))
        names.append(d.name)
    if names:
        if cfg.budget.max_spend_usd is not None:
            # The pilot's own governor sees only the pilot's spend; leave it what the run has not spent.
            spent_run = sum(scan_responses(run.raw(d.name)).spend_usd for d in cfg.datasets)
            spent_pilot = sum(scan_responses(pilot.raw(d.name)).spend_usd for d in cfg.datasets)
            left = max(0.0, cfg.budget.max_spend_usd - max(0.0, spent_run - spent_pilot))
            pilot_cfg = msgspec.structs.replace(
                pilot_cfg, budget=msgspec.structs.replace(cfg.budget, max_spend_usd=left))
        echo(f"pilot: {n} prompts per dataset ({', '.join(names)})")
        rep = run_generate(pilot_cfg, echo=lambda line: echo(f"  pilot: {line}"), profile=profile, datasets=names,
                           argv=["draftgen", "plan", "--pilot", str(n)], force=force)
        if rep.exit_code:
            stopped = rep.message or f"exit code {rep.exit_code}"
            echo("  pilot: planning with what came back")
    # Adopt also what an interrupted earlier pilot left behind.
    return _adopt(pilot, run, [d.name for d in cfg.datasets]), stopped
