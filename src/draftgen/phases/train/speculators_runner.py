"""Runs speculators' EAGLE-3 trainer for ``draftgen train``, inside speculators' own environment.

This file is executed as a script by the Python of the environment speculators is installed in
(``python speculators_runner.py <speculators train flags>``); it imports only the standard library, torch
and speculators, never draftgen, so it runs where draftgen is not installed. It calls speculators'
``speculators.train.cli.main`` with the flags as given, and adds two things:

- Metrics: every training/validation metric record speculators logs (``speculators.metrics``: loss,
  ``full_acc_k``, ``cond_acc_k`` per TTT step, lr, epoch, global_step) is also printed to stdout as one line
  ``@@draftgen-metrics {json}``, which draftgen turns into ``train/log.jsonl`` and console progress.
- CPU (no usable accelerator, ``on_cpu``: a CUDA build of torch without a GPU counts): speculators
  0.9.0's Trainer sends batches to ``local_rank`` 0 (a CUDA device), autocasts on device type "cuda", its
  step timer calls ``torch.accelerator.synchronize`` and its checkpointer loads to "cuda:0". Here those
  resolve to the CPU (the synchronize is a no-op). Its training loop also takes one step per further epoch
  once ``--max-steps`` is reached; here an epoch starts only while steps remain. Nothing else of the
  trainer is changed.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

PREFIX = "@@draftgen-metrics "


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return str(obj)


class _MetricsHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "hparams", False) or not isinstance(record.msg, dict):
            return
        payload = {"step": getattr(record, "step", None), **_plain(record.msg)}
        sys.stdout.write(PREFIX + json.dumps(payload) + "\n")
        sys.stdout.flush()


def on_cpu() -> bool:
    """No usable accelerator. ``check_available=True``: a CUDA build of torch on a host without a GPU is on
    the CPU (without it torch names the compiled-in backend and the CPU fixes below would be skipped)."""
    import torch

    return torch.accelerator.current_accelerator(check_available=True) is None


def _patch(cli: Any) -> None:
    import torch
    from speculators.train import checkpointer, trainer  # type: ignore[import-not-found]

    base = trainer.Trainer
    cpu = on_cpu()
    if cpu:
        trainer.get_local_rank = lambda: "cpu"
        torch.accelerator.synchronize = lambda *a, **k: None  # nothing to wait for on the CPU
        checkpointer.get_current_device = lambda: "cpu"

    class Trainer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if cpu:
                self.device_type = "cpu"

        def train_epoch(self, epoch: int, **kwargs: Any) -> None:
            if self.config.max_steps is not None and self.global_step >= self.config.max_steps:
                return
            super().train_epoch(epoch, **kwargs)

    cli.Trainer = Trainer
    setup = cli.setup_metric_logger

    def setup_metric_logger(*args: Any, **kwargs: Any) -> None:
        setup(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(_MetricsHandler())

    cli.setup_metric_logger = setup_metric_logger


def main(argv: list[str]) -> None:
    from speculators.train import cli  # type: ignore[import-not-found]
    from speculators.train.config import TrainConfig  # type: ignore[import-not-found]

    _patch(cli)
    cli.main(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
