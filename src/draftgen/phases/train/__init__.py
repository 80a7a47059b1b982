"""``draftgen train``: an EAGLE-3 drafter trained by speculators on the extracted hidden states.

Modules: ``run`` (``run_train(cfg, ...) -> TrainReport``: export, vocabulary, the speculators subprocess,
checkpoints), ``guards`` (verifier identity, complete set, loadable checkpoints, the log once per step, the
trainer child's lifetime), ``vocab`` (the draft vocabulary, d2t/t2d), ``convert`` (the flat EAGLE-3 / SGLang format),
``speculators_runner`` (executed by speculators' own Python; never imported here). Imported on use, so
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
