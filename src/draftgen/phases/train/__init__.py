"""``draftgen train``: an EAGLE-3 drafter trained by speculators, on the extracted hidden states or online.

Modules: ``run`` (the one entry: ``run_train(cfg, ...) -> TrainReport`` and the phase table's ``phase_run``,
dispatching to one of the two halves), ``offline`` (the stored hidden set as speculators' inputs), ``online``
(``train.online``: states generated on demand by the vLLM extract servers) and its checking ``proxy``,
``trainer`` (one training run on what either half prepared: the speculators subprocess, the sample floor, the
published drafter, train.json), ``inputs`` (``train/inputs/``: the index of a set read in place), ``launch``
(the speculators command, one process or torchrun, the checkpoints' markers), ``guards`` (verifier identity,
complete set, loadable checkpoints, the log once per step, the trainer child's lifetime), ``vocab`` (the draft
vocabulary, d2t/t2d), ``convert`` (the flat EAGLE-3 / SGLang format), ``speculators_runner`` (executed by
speculators' own Python; never imported here). The target itself (capture backend, checks, merged rows) is
``draftgen.target``'s; speculators' inputs are written by ``hidden.speculators``. Imported on use, so
``import draftgen.phases.train`` stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["build_vocab_mapping", "run_train", "to_eagle3"]

_HOME = {"run_train": "run", "build_vocab_mapping": "vocab", "to_eagle3": "convert"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
