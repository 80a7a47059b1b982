"""Runs speculators' trainer for ``draftgen train``, inside speculators' own environment.

This file is executed as a script by the Python of the environment speculators is installed in
(``python speculators_runner.py <speculators train flags>``); it imports only the standard library, torch,
safetensors and speculators (with its ``hs_connectors``), never draftgen, so it runs where draftgen is not
installed. It calls speculators' ``speculators.train.cli.main`` with the flags as given, and adds three
things:

- Metrics: every training/validation metric record speculators logs (``speculators.metrics``: loss,
  ``full_acc_k``, ``cond_acc_k`` per TTT step, lr, epoch, global_step) is also printed to stdout as one line
  ``@@draftgen-metrics {json}``, which draftgen turns into ``train/log.jsonl`` and console progress.
- CPU (no usable accelerator, ``on_cpu``: a CUDA build of torch without a GPU counts): speculators
  0.9.0's Trainer sends batches to ``local_rank`` 0 (a CUDA device), autocasts on device type "cuda", its
  step timer calls ``torch.accelerator.synchronize`` and its checkpointer loads to "cuda:0". Here those
  resolve to the CPU (the synchronize is a no-op). Its training loop also takes one step per further epoch
  once ``--max-steps`` is reached; here an epoch starts only while steps remain.
- ``--draftgen-states FILE`` (a runner flag, removed before speculators parses the rest): the hidden states
  are read where draftgen's extract wrote them, never copied. FILE is ``draftgen_states.json`` (root, the
  per-sample ``draftgen.hidden/1`` files in dataset order with their sha256, n_aux, dtype; draftgen's
  phases/train/inputs.py writes it next to the Arrow dataset). speculators' file backend
  (``hs_connectors.transfer.FileBackend``) then returns a transfer whose ``get_cached(i)`` reads
  ``root/files[i]``, verifies its bytes against the recorded sha256 (``verify``: a changed file stops
  training with one line naming it and the fix) and builds in memory exactly what
  draftgen's speculators export writes to ``hs_{i}.safetensors`` (``to_speculators``: aux dequantized with
  ``aux_scale`` for fp8, split into n_aux slots in ascending layer order, the PRE-norm final last, cast to
  dtype; ``token_ids`` int64). Nothing else of the trainer is changed.
- ``--draftgen-select I,J,K`` (a runner flag): the stored set holds more aux layers than the algorithm takes;
  every sample speculators loads (from ``--draftgen-states``, a file export, or generated online) keeps aux
  slots I, J, K (ascending) and the final state, in that order.
- ``--draftgen-online``: every sample is generated through ``--vllm-endpoint`` (draftgen's checking proxy in
  front of the vLLM extract servers): no cached file is looked up, the server's file is read once (the ``.lock``
  protocol of hs_connectors' file transfer), trimmed by ``--draftgen-select`` and deleted.
- Online fetching (``--draftgen-online`` with in-process loading, ``--num-workers 0``): speculators asks for
  a batch's samples one after the other and only when the trainer wants the batch, so the trainer waits a
  server round trip per sample. Here a batch's samples are asked for at once (``FETCH_THREADS`` threads; the
  server batches them) and the next batch's while this one trains (``OnlineFetch``). Each sample goes through
  speculators' own ``__getitem__`` (its request, recovery, file read and delete) and a batch holds the same
  samples in the same order as before.
- The verifier norm: once the draft model is built, its frozen ``verifier_norm`` weight (what turns the
  pre-norm final state into the target's post-norm distribution) is hashed (sha256 of float32 bytes) and
  printed as ``@@draftgen-verifier-norm {"sha256": ..., "kind": ...}``; draftgen compares it with the target's
  own final norm and stops a trainer that trains against another (speculators falls back to ones when it
  cannot find the norm: TorchSpec#169's class of bug).
- Checkpoints: after speculators saved an epoch's checkpoint (every rank done), rank 0 writes
  ``<epoch>/draftgen-complete.json`` last; draftgen resumes only from a checkpoint that has it.
- Several processes on a CPU (``torchrun``, ``LOCAL_RANK`` set, no accelerator): speculators 0.9 initialises
  its process group with the accelerator's backend and refuses without one; here it uses gloo and the
  trainer's DistributedDataParallel runs on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
from typing import Any

PREFIX = "@@draftgen-metrics "
NORM_PREFIX = "@@draftgen-verifier-norm "
STATES_FLAG = "--draftgen-states"
SELECT_FLAG = "--draftgen-select"
ONLINE_FLAG = "--draftgen-online"
COMPLETE = "draftgen-complete.json"
FETCH_THREADS = 8  # samples generated at once by one trainer process online (a batch holds about as many)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN or Infinity (a metric over no tokens is NaN)
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


def to_speculators(t: dict[str, Any], n_aux: int, dtype: Any) -> dict[str, Any]:
    """speculators' cached-sample tensors from a ``draftgen.hidden/1`` sample's tensors ``t``: ``hidden_states``
    [T, n_aux+1, H] (aux slots ascending, then the pre-norm final) in ``dtype``, ``token_ids`` int64 [T].
    Must equal draftgen's speculators export byte for byte (tests/test_train.py checks it)."""
    import torch

    aux, final = t["aux"].float(), t["final"].float()
    if "aux_scale" in t:  # fp8: value = fp8.float() * per-token scale
        aux = aux * t["aux_scale"].float()
        final = final * t["final_scale"].float()
    n, width = aux.shape
    if width % n_aux:
        raise ValueError(f"aux width {width} is not a multiple of {n_aux} layers")
    hs = torch.cat([aux.reshape(n, n_aux, width // n_aux), final[:, None, :]], dim=1).to(dtype).contiguous()
    return {"hidden_states": hs, "token_ids": t["input_ids"].to(torch.int64).contiguous()}


class ChangedStateFile(RuntimeError):
    """A state file whose bytes are not the ones extract indexed (its message names the file and the fix)."""


def verify(data: bytes, sha256: str, path: str) -> None:
    """``data`` (read from ``path``) must have the recorded ``sha256`` ("" = not recorded: not checked)."""
    got = hashlib.sha256(data).hexdigest()
    if sha256 and got != sha256:
        raise ChangedStateFile(f"{path}: changed after extraction (sha256 {got[:12]}…, the index recorded "
                               f"{sha256[:12]}…); rerun draftgen extract (it redoes that sample)")


def keep_slots(sample: dict[str, Any] | None, select: list[int] | None) -> dict[str, Any] | None:
    """``sample`` with only aux slots ``select`` (then the final state) of its ``hidden_states``."""
    if sample is None or select is None:
        return sample
    hs = sample["hidden_states"]
    return {**sample, "hidden_states": hs[:, [*select, hs.shape[1] - 1]].contiguous()}


class StatesTransfer:
    """speculators' hidden-states transfer (``get_cached(i)``, the only call with ``--on-missing raise``) over
    draftgen's state files: row i is ``root/files[i]``. A plain module-level class holding strings, so that
    speculators' spawned DataLoader workers can unpickle it (spawn re-imports this file as ``__mp_main__``)."""

    def __init__(self, map_path: str, select: list[int] | None = None) -> None:
        with open(map_path, encoding="utf-8") as fh:
            smap = json.load(fh)
        self.root, self.files = str(smap["root"]), [str(f) for f in smap["files"]]
        self.sha256 = [str(h) for h in smap.get("sha256") or [""] * len(self.files)]
        self.n_aux, self.dtype = int(smap["n_aux"]), str(smap["dtype"])
        self.select = select

    def setup(self) -> None:
        return None

    def get_cached(self, file_idx: int) -> dict[str, Any] | None:
        import torch
        from safetensors.torch import load  # type: ignore[import-not-found]

        if not 0 <= file_idx < len(self.files):
            return None
        path = f"{self.root}/{self.files[file_idx]}"
        with open(path, "rb") as fh:
            data = fh.read()
        verify(data, self.sha256[file_idx], path)
        return keep_slots(to_speculators(load(data), self.n_aux, getattr(torch, self.dtype)), self.select)

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> None:
        raise RuntimeError("draftgen's hidden states are read from files, never generated")

    def delete(self, handle: str) -> None:
        raise RuntimeError("draftgen's hidden-state files are never deleted by the trainer")


class SelectingTransfer:
    """Another transfer (speculators' file transfer) whose samples keep only the ``select`` aux slots; with
    ``online`` nothing cached is looked up (every sample is generated through the endpoint). Module-level
    and holding only picklable state, for the spawned DataLoader workers."""

    def __init__(self, inner: Any, select: list[int] | None, online: bool) -> None:
        self.inner, self.select, self.online = inner, select, online

    def setup(self) -> None:
        self.inner.setup()

    def get_cached(self, file_idx: int) -> dict[str, Any] | None:
        return None if self.online else keep_slots(self.inner.get_cached(file_idx), self.select)

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, Any] | None:
        return keep_slots(self.inner.get_generated(hs_transfer_params), self.select)

    def delete(self, handle: str) -> None:
        self.inner.delete(handle)


def _patch_transfer(map_path: str | None, select: list[int] | None, online: bool) -> None:
    from hs_connectors.transfer import FileBackend  # type: ignore[import-not-found]

    if map_path is not None:
        transfer: Any = StatesTransfer(map_path, select)
        FileBackend.from_train_args = staticmethod(lambda args, data_path: transfer)
        return
    make = FileBackend.from_train_args
    FileBackend.from_train_args = staticmethod(
        lambda args, data_path: SelectingTransfer(make(args, data_path), select, online))


class OnlineFetch:
    """A batch's samples generated at once, and the next batch's while this one trains (module docstring).
    ``ahead`` is called by the batch sampler with the batch after the one it yields; ``take`` by the dataset's
    ``__getitems__`` with the batch the loader wants. Futures are keyed by (dataset, index)."""

    def __init__(self, threads: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="draftgen-online-fetch")
        self.pending: dict[tuple[int, int], Any] = {}

    def ahead(self, dataset: Any, indices: list[int]) -> None:
        if getattr(dataset, "client", None) is None:
            return  # the first sample sets speculators' client up, in the loader's own thread
        for i in indices:
            key = (id(dataset), int(i))
            if key not in self.pending:
                self.pending[key] = self.pool.submit(dataset.__getitem__, i)

    def take(self, dataset: Any, indices: list[int]) -> list[Any]:
        out: list[Any] = []
        rest = list(indices)
        if getattr(dataset, "client", None) is None and rest:
            out.append(dataset[rest.pop(0)])
        self.ahead(dataset, rest)
        keys = {(id(dataset), int(i)) for i in rest}
        futures = {k: self.pending.pop(k) for k in keys if k in self.pending}
        for i in rest:
            f = futures.get((id(dataset), int(i)))
            out.append(f.result() if f is not None else dataset[i])
        return out


def _patch_online_fetch(fetch: OnlineFetch) -> None:
    from speculators.train import data, dataloader  # type: ignore[import-not-found]

    sampler_cls = dataloader.MultipackDistributedBatchSamplerV2
    plain_iter = sampler_cls.__iter__

    def sampler_iter(self: Any) -> Any:
        dataset = getattr(self, "draftgen_dataset", None)
        it = plain_iter(self)
        cur = next(it, None)
        while cur is not None:
            nxt = next(it, None)
            if nxt is not None and dataset is not None:
                fetch.ahead(dataset, list(nxt))
            yield cur
            cur = nxt

    sampler_cls.__iter__ = sampler_iter
    data.ArrowDataset.__getitems__ = lambda self, indices: fetch.take(self, list(indices))
    setup = dataloader._setup_dataloader

    def setup_dataloader(dataset: Any, *args: Any, **kwargs: Any) -> Any:
        loader = setup(dataset, *args, **kwargs)
        if loader.num_workers == 0:  # spawned workers import speculators afresh: none of this is there
            loader.batch_sampler.draftgen_dataset = dataset
        return loader

    dataloader._setup_dataloader = setup_dataloader


def _verifier_norm_line(model: Any) -> None:
    import hashlib

    norm = getattr(model, "verifier_norm", None)
    if norm is None:
        return
    weight = norm.weight.detach().float().cpu().contiguous().numpy().tobytes()
    payload = {"sha256": hashlib.sha256(weight).hexdigest(), "kind": type(norm).__name__}
    sys.stdout.write(NORM_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _cpu_distributed(cli: Any) -> None:
    """speculators' ``maybe_setup_distributed`` for processes on a CPU: gloo, no device index."""
    import os

    import torch.distributed as dist
    from speculators.train import distributed  # type: ignore[import-not-found]

    def setup(sp_size: int = 1) -> None:
        if "LOCAL_RANK" not in os.environ:
            return
        dist.init_process_group("gloo")
        distributed._local_rank = int(os.environ["LOCAL_RANK"])
        distributed._is_distributed = True
        distributed._rank, distributed._world_size = dist.get_rank(), dist.get_world_size()
        distributed._init_sp_process_groups(distributed._rank, distributed._world_size, sp_size)

    distributed.maybe_setup_distributed = setup
    cli.maybe_setup_distributed = setup


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

        def maybe_save_checkpoint(self, epoch: Any, local_step: int = 0) -> None:
            folder = self.checkpointer.path / str(epoch)
            before = (folder / "model.safetensors").stat().st_mtime_ns if (folder / "model.safetensors").exists() else None
            super().maybe_save_checkpoint(epoch, local_step=local_step)
            saved = (folder / "model.safetensors").exists() and (
                before is None or (folder / "model.safetensors").stat().st_mtime_ns != before)
            if saved and self.rank == 0:  # invariant: written after every file of the checkpoint
                state = {"epoch": epoch, "local_step": local_step, "global_step": self.global_step}
                (folder / COMPLETE).write_text(json.dumps(state), encoding="utf-8")

        def train_epoch(self, epoch: int, **kwargs: Any) -> None:
            if self.config.max_steps is not None and self.global_step >= self.config.max_steps:
                return
            super().train_epoch(epoch, **kwargs)

    cli.Trainer = Trainer
    if cpu:
        _cpu_distributed(cli)
    build = cli.build_draft_model

    def build_draft_model(*args: Any, **kwargs: Any) -> Any:
        model = build(*args, **kwargs)
        from speculators.train.distributed import get_rank  # type: ignore[import-not-found]

        if get_rank() == 0:
            _verifier_norm_line(model)
        return model

    cli.build_draft_model = build_draft_model
    setup = cli.setup_metric_logger

    def setup_metric_logger(*args: Any, **kwargs: Any) -> None:
        import os

        setup(*args, **kwargs)
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank logs the same (all-reduced) metrics
            logging.getLogger("speculators.metrics").addHandler(_MetricsHandler())

    cli.setup_metric_logger = setup_metric_logger


def _take(argv: list[str], flag: str, value: bool = True) -> str | None:
    """Remove ``flag`` (and its value) from ``argv``; its value, "" for a bare flag, None when absent."""
    if flag not in argv:
        return None
    at = argv.index(flag)
    got = argv[at + 1] if value else ""
    del argv[at:at + (2 if value else 1)]
    return got


def main(argv: list[str]) -> None:
    from speculators.train import cli  # type: ignore[import-not-found]
    from speculators.train.config import TrainConfig  # type: ignore[import-not-found]

    argv = list(argv)
    states = _take(argv, STATES_FLAG)
    picked = _take(argv, SELECT_FLAG)
    online = _take(argv, ONLINE_FLAG, value=False) is not None
    select = [int(i) for i in picked.split(",")] if picked else None
    if states is not None or select is not None or online:
        _patch_transfer(states, select, online)
    if online:
        _patch_online_fetch(OnlineFetch(FETCH_THREADS))
    _patch(cli)
    cli.main(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
