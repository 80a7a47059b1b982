"""``draftgen train CONFIG --draft-lm``: the independent draft LM beside the run's trained drafter.

Reads ``train/train.json`` (the drafter's checkpoint and its global steps), the drafter's checkpoint (its
trainable parameter count and draft vocabulary), the merged train rows (``target.rows``) and the target
(``hidden_states.model``); trains ``drafter.draftlm`` for the same steps of ``train.total_seq_len`` tokens at
``train.lr`` from ``train.seed``; writes ``train/draft-lm/`` (a rerun replaces it: draftgen's own folder).
``draftgen accept --draft-lm RUN/train/draft-lm`` then replays it beside copy-last and lookup.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from draftgen.config import RunConfig
from draftgen.errors import InputError
from draftgen.phases import Echo
from draftgen.records import DraftLMInfo, TrainReport
from draftgen.rundir.claim import writer
from draftgen.store import read_json
from draftgen.target import model_ref_of
from draftgen.target.rows import read_merged_rows

__all__ = ["run_draft_lm"]


def run_draft_lm(cfg: RunConfig, *, echo: Echo = print, force: bool = False) -> DraftLMInfo:
    """Train the draft LM matched to the run's drafter (see the module docstring) under the writer lock."""
    from draftgen.drafter.draftlm import train_draft_lm

    with writer(cfg, "train", force=force) as rd:
        if not rd.train_report.is_file():
            raise InputError(f"{rd.train_report}: not found; train the drafter first (`draftgen train CONFIG`): "
                             "the draft LM is matched to it")
        rep = read_json(rd.train_report, TrainReport)
        if not rep.checkpoint or not Path(rep.checkpoint).is_dir():
            raise InputError(f"{rd.train_report}: names no drafter checkpoint that exists; train again")
        target = Path(model_ref_of(cfg))  # a ConfigError naming hidden_states.model when it is not set
        rows = [(r.input_ids.tolist(), r.loss_mask.tolist()) for r in read_merged_rows(rd)]
        out = rd.train_draft_lm
        if out.exists():
            shutil.rmtree(out)
        echo(f"draft LM: {len(rows):,} merged rows, {rep.last_step:,} steps of {cfg.train.total_seq_len:,} tokens, "
             f"matched to {rep.checkpoint}")
        info = train_draft_lm(target, Path(rep.checkpoint), rows, out, steps=rep.last_step,
                              batch_tokens=cfg.train.total_seq_len, lr=cfg.train.lr, seed=cfg.train.seed, echo=echo)
        echo(f"draft LM: {info.layers} layers, intermediate {info.intermediate_size}, {info.trainable_params:,} "
             f"trainable parameters (the drafter: {info.matched_to:,}); loss {info.loss_first:.3f} → "
             f"{info.loss_last:.3f} in {info.seconds:.0f} s → {out}")
        return info
