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
- The samples a drafter saw, counted where the trainer takes its batches: the dataset (``RowDataset``) hands
  each batch's rows (training-split indices) to the collate function (``RowCollate``), which puts under
  ``ROWS_KEY`` the rows the batch asked for and those with at least one loss-mask token inside it (a sample
  speculators left out, unavailable online or dropped by its NaN guard, or one cut before its first loss
  token, is asked for and not trained); the trainer's batch consumer (``BatchRecoveryCoordinator.consume``,
  just before the step) takes the key out and adds training batches' rows to ``SeenRows``. At every save all
  ranks add theirs up (one all-reduce) and the marker holds ``samples``: the training rows, how many were
  asked for and trained on since the drafter's first step (a resumed checkpoint's own rows carried over), as
  counts and bitmaps; None when that is not known: the checkpoint resumed from has none (an older
  draftgen's), or a training batch came without its rows.
- Several processes on a CPU (``torchrun``, ``LOCAL_RANK`` set, no accelerator): speculators 0.9 initialises
  its process group with the accelerator's backend and refuses without one; here it uses gloo and the
  trainer's DistributedDataParallel runs on the CPU.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import sys
from collections.abc import Iterable
from typing import Any

PREFIX = "@@draftgen-metrics "
NORM_PREFIX = "@@draftgen-verifier-norm "
STATES_FLAG = "--draftgen-states"
SELECT_FLAG = "--draftgen-select"
ONLINE_FLAG = "--draftgen-online"
COMPLETE = "draftgen-complete.json"
FETCH_THREADS = 8  # samples generated at once by one trainer process online (a batch holds about as many)
ROWS_KEY = "__draftgen_rows__"  # a batch's rows; speculators' consume refuses any "__" key left in a batch


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
    Must equal draftgen's speculators export byte for byte (tests/phases/train/test_train.py checks it)."""
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


def pack_rows(rows: Iterable[int], n: int) -> str:
    """Rows (0 .. n-1) as a bitmap (bit r of byte r // 8), base64: the marker's form."""
    bits = bytearray((n + 7) // 8)
    for r in rows:
        bits[r >> 3] |= 1 << (r & 7)
    return base64.b64encode(bytes(bits)).decode("ascii")


def unpack_rows(text: str, n: int) -> set[int]:
    bits = base64.b64decode(text)
    return {i * 8 + j for i, byte in enumerate(bits) if byte for j in range(8) if byte >> j & 1 and i * 8 + j < n}


class RowList(list):  # type: ignore[type-arg]
    """A batch's samples as the dataset returns them, with the rows (dataset indices) they are of."""

    def __init__(self, items: list[Any], rows: list[int]) -> None:
        super().__init__(items)
        self.rows = rows


def batch_rows(items: list[Any], rows: list[int], batch: dict[str, Any]) -> dict[str, list[int]]:
    """The rows a collated ``batch`` asked for, and those with a loss-mask token in it: its samples that
    arrived (dicts, in order) are its documents 0, 1, ... (``document_ids``; -1 is padding)."""
    arrived = [r for item, r in zip(items, rows, strict=True) if isinstance(item, dict)]
    docs = batch["document_ids"][0]
    keep = docs >= 0
    if "loss_mask" in batch:
        keep &= batch["loss_mask"][0].bool()
    trained = {arrived[d] for d in docs[keep].unique().tolist() if 0 <= d < len(arrived)}
    return {"asked": list(rows), "trained": sorted(trained)}


class RowCollate:
    """speculators' collate function (``inner``) that also says which rows the batch holds (``ROWS_KEY``).
    Module-level and holding only picklable state, for the spawned DataLoader workers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        batch: dict[str, Any] = self.inner(items)
        rows = getattr(items, "rows", None)
        if rows is not None:
            batch[ROWS_KEY] = batch_rows(list(items), rows, batch)
        return batch


def _row_dataset() -> type:
    """speculators' ArrowDataset whose batches (``__getitems__``) carry their rows (``RowList``). Built on first
    use (it needs speculators) and kept as this module's ``RowDataset``, so that pickle finds it, in a spawned
    DataLoader worker too (the module ``__getattr__`` below builds it there)."""
    from speculators.train import data  # type: ignore[import-not-found]

    class RowDataset(data.ArrowDataset):  # type: ignore[misc]
        def __getitems__(self, indices: list[int]) -> RowList:
            base = getattr(super(), "__getitems__", None)  # online: the patched prefetching fetch
            items = base(list(indices)) if base is not None else [self[i] for i in indices]
            return RowList(list(items), [int(i) for i in indices])

    RowDataset.__module__, RowDataset.__qualname__ = __name__, "RowDataset"
    globals()["RowDataset"] = RowDataset
    return RowDataset


def __getattr__(name: str) -> Any:
    if name == "RowDataset":
        return _row_dataset()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SeenRows:
    """The training rows this process's consumed training batches asked for and trained on, from the
    drafter's first step (``resume``: the checkpoint resumed from brings its own); ``known`` is False once the
    history is not counted (an older draftgen's checkpoint)."""

    def __init__(self) -> None:
        self.asked: set[int] = set()
        self.trained: set[int] = set()
        self.batches = 0  # training batches consumed by this process
        self.counted = 0  # of them, those that said their rows
        self.known = True

    def add(self, rows: dict[str, list[int]] | None) -> None:
        self.batches += 1
        if rows is not None:
            self.counted += 1
            self.asked.update(rows["asked"])
            self.trained.update(rows["trained"])

    def resume(self, folder: Any, n: int) -> None:
        marker = folder / COMPLETE
        samples = json.loads(marker.read_text(encoding="utf-8")).get("samples") if marker.is_file() else None
        if not isinstance(samples, dict) or samples.get("rows") != n:
            self.known = False
            return
        self.asked |= unpack_rows(samples["asked_bits"], n)
        self.trained |= unpack_rows(samples["trained_bits"], n)

    def gathered(self, n: int, device: Any, distributed: bool) -> dict[str, Any] | None:
        """Every rank's rows together (a collective: every rank calls it at the same point); None when not
        known on some rank."""
        import torch
        import torch.distributed as dist

        t = torch.zeros(2 * n + 1, dtype=torch.int32)
        t[list(self.asked)] = 1
        t[[n + r for r in self.trained]] = 1
        t[2 * n] = int(not self.known or self.counted < self.batches)
        if distributed:
            t = t.to(device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t = t.cpu()
        if int(t[2 * n]):
            return None
        asked = t[:n].nonzero().flatten().tolist()
        trained = t[n:2 * n].nonzero().flatten().tolist()
        return {"rows": n, "asked": len(asked), "trained": len(trained), "asked_bits": pack_rows(asked, n),
                "trained_bits": pack_rows(trained, n)}


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


def _patch_rows(seen: SeenRows) -> None:
    """Every batch says its rows (``RowDataset``, ``RowCollate``); the trainer's consumer counts the training
    batches' (module docstring)."""
    from speculators.train import dataloader, recovery, trainer  # type: ignore[import-not-found]

    dataloader.ArrowDataset = _row_dataset()
    collate = dataloader.CollateFn
    dataloader.CollateFn = lambda *args, **kwargs: RowCollate(collate(*args, **kwargs))

    class Consumer(recovery.BatchRecoveryCoordinator):  # type: ignore[misc]
        def consume(self, batch: dict[str, Any], *, synchronize: bool = False) -> None:
            rows = batch.pop(ROWS_KEY, None)
            if self.phase == "training":
                seen.add(rows)
            super().consume(batch, synchronize=synchronize)

    trainer.BatchRecoveryCoordinator = Consumer


def _trainer(base: type, cpu: bool, seen: SeenRows) -> type:
    """speculators' Trainer (``base``) with the runner's additions (module docstring): the CPU device type, the
    completeness marker after each save with the samples seen (all ranks), and no extra epoch past max_steps."""

    class Trainer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if cpu:
                self.device_type = "cpu"
            self.draftgen_rows = len(self.train_loader.dataset)
            prev = self.checkpointer.prev_path if self.resume_from_checkpoint else None
            if prev is not None:
                seen.resume(prev, self.draftgen_rows)

        def maybe_save_checkpoint(self, epoch: Any, local_step: int = 0) -> None:
            folder = self.checkpointer.path / str(epoch)
            before = (folder / "model.safetensors").stat().st_mtime_ns if (folder / "model.safetensors").exists() else None
            super().maybe_save_checkpoint(epoch, local_step=local_step)
            # every rank reaches each save with an epoch number at the same point: one collective
            samples = seen.gathered(self.draftgen_rows, self.local_rank, self.is_distributed) \
                if isinstance(epoch, int) else None
            saved = (folder / "model.safetensors").exists() and (
                before is None or (folder / "model.safetensors").stat().st_mtime_ns != before)
            if saved and self.rank == 0:  # invariant: written after every file of the checkpoint
                state = {"epoch": epoch, "local_step": local_step, "global_step": self.global_step,
                         "samples": samples}
                (folder / COMPLETE).write_text(json.dumps(state), encoding="utf-8")

        def train_epoch(self, epoch: int, **kwargs: Any) -> None:
            if self.config.max_steps is not None and self.global_step >= self.config.max_steps:
                return
            super().train_epoch(epoch, **kwargs)

    return Trainer


def _patch(cli: Any, seen: SeenRows) -> None:
    import torch
    from speculators.train import checkpointer, trainer  # type: ignore[import-not-found]

    cpu = on_cpu()
    if cpu:
        trainer.get_local_rank = lambda: "cpu"
        torch.accelerator.synchronize = lambda *a, **k: None  # nothing to wait for on the CPU
        checkpointer.get_current_device = lambda: "cpu"
    cli.Trainer = _trainer(trainer.Trainer, cpu, seen)
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
    seen = SeenRows()
    _patch_rows(seen)
    _patch(cli, seen)
    cli.main(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
