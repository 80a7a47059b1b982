"""One sample's file of the hidden-state format ``draftgen.hidden/1`` (``hidden.format``: the layout, the store):
what a backend hands over (``Captured``, staged or not: ``Staged``), the values as stored (``storage_tensors``:
bf16 / fp16 / fp32, or fp8 ``quantize_fp8`` with per-token float32 scales), the safetensors bytes (``sample_parts``:
a deterministic header then the tensors' own memory, uncopied; ``encode_sample`` joins them), a file read back
(``decode_sample`` → ``LoadedSample``, dequantized), and the digests the index records (``row_digest`` of a
merged row, ``bytes_digest`` of a file). Reads and writes no file; torch, numpy and safetensors are imported on
use.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftgen.errors import ConfigError, InputError
from draftgen.hidden.files import REDO_HINT, require, storage_faults
from draftgen.store import decode_json_object, encode_json

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["FP8_MAX", "SCHEMA", "STORAGE_DTYPES", "Captured", "LoadedSample", "Staged", "bytes_digest",
           "decode_sample", "encode_sample", "quantize_fp8", "row_digest", "sample_parts", "storage_tensors"]

SCHEMA = "draftgen.hidden/1"
STORAGE_DTYPES = ("bf16", "fp16", "fp32", "fp8")
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass
class Staged:
    """A sample's states as they will be stored, staged where they were captured: ``tensors`` is
    ``storage_tensors``' output (aux, final; fp8 also aux_scale, final_scale) in host memory, and ``stats``
    (float32, host) the numbers ``target.checks.state_stats`` computed on those same values on the capture
    device. The host copies may still be in flight (a GPU's non-blocking copy into pinned memory): ``wait()``
    before reading either; it also lets go of the device tensors the copies read."""

    dtype: str
    tensors: dict[str, torch.Tensor]
    stats: torch.Tensor
    pending: Any = None  # what the copies wait on (a ``torch.cuda.Event``), None once done
    keep: Any = None  # the device tensors the copies read, held until they are done

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.synchronize()
        self.pending = self.keep = None


@dataclass
class Captured:
    """What a backend hands to the core, one per sample (CPU tensors, any float dtype). With ``staged`` (a
    backend that stages on its device, ``target.staging``), ``aux`` and ``final`` are ``staged.tensors``'
    (in the storage dtype; fp8 before its scales) and ``encode_sample`` writes exactly those."""

    sample_id: str
    input_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # uint8 [T]
    aux: torch.Tensor  # [T, n_aux*H]
    final: torch.Tensor  # [T, H] pre-norm
    staged: Staged | None = None


@dataclass
class LoadedSample:
    """A stored sample read back; ``aux`` and ``final`` dequantized to float32."""

    sample_id: str
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # uint8 [T]
    aux: torch.Tensor  # float32 [T, n_aux*H]
    final: torch.Tensor  # float32 [T, H]
    dtype: str = "bf16"


def row_digest(input_ids: Any, loss_mask: Any) -> str:
    """sha256 of a row's ``input_ids`` as int64 bytes then ``loss_mask`` as uint8 bytes (the index records it;
    a sample is done only while its merged row still has this digest)."""
    np_ = require("numpy")
    h = hashlib.sha256(np_.ascontiguousarray(input_ids, dtype=np_.int64).tobytes())
    h.update(b"|")
    h.update(np_.ascontiguousarray(loss_mask, dtype=np_.uint8).tobytes())
    return h.hexdigest()


def bytes_digest(data: bytes | list[Any]) -> str:
    """sha256 of a stored file's bytes (index record and manifest entry ``file_sha256``): ``data``, or the
    buffers it is made of in order (``sample_parts``)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return hashlib.sha256(data).hexdigest()
    h = hashlib.sha256()
    for part in data:
        h.update(part)
    return h.hexdigest()


def _torch_dtype(dtype: str) -> Any:
    torch = require("torch")
    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
    if dtype not in table:
        raise ConfigError(f"hidden_states.dtype: unknown dtype {dtype!r}; one of {', '.join(STORAGE_DTYPES)}")
    return table[dtype]


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row) fp8 e4m3: (values, float32 scales [T, 1]); an all-zero row has scale 1.0."""
    torch = require("torch")
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.contiguous(), scale.contiguous()


def storage_tensors(aux: torch.Tensor, final: torch.Tensor, dtype: str) -> dict[str, torch.Tensor]:
    """``aux`` and ``final`` as stored in ``dtype``, on their own device (rows independent: a batch's packed
    rows give each sample's exactly): fp8 ``quantize_fp8``'s values and scales, else the rounded tensors."""
    tdt = _torch_dtype(dtype)
    if dtype == "fp8":
        (qa, sa), (qf, sf) = quantize_fp8(aux.detach()), quantize_fp8(final.detach())
        return {"aux": qa, "aux_scale": sa, "final": qf, "final_scale": sf}
    return {"aux": aux.detach().to(tdt).contiguous(), "final": final.detach().to(tdt).contiguous()}


def encode_sample(c: Captured, dtype: str) -> bytes:
    """The safetensors bytes of one sample in storage dtype ``dtype`` (a staged sample: its staged tensors):
    ``sample_parts`` joined."""
    return b"".join(sample_parts(c, dtype))


def sample_parts(c: Captured, dtype: str) -> list[Any]:
    """``encode_sample``'s bytes as the buffers they are made of, in order, uncopied: the header, then each
    tensor's own memory (``bytes_digest`` hashes them and ``HiddenStore.publish`` writes them as one file)."""
    torch = require("torch")
    np_ = require("numpy")
    ids = torch.from_numpy(np_.ascontiguousarray(c.input_ids, dtype=np_.int64))
    mask = torch.from_numpy(np_.ascontiguousarray(c.loss_mask, dtype=np_.uint8))
    t = int(ids.shape[0])
    if tuple(c.final.shape[:1]) != (t,) or tuple(c.aux.shape[:1]) != (t,) or c.aux.dim() != 2 or c.final.dim() != 2:
        raise ValueError(f"{c.sample_id}: aux {tuple(c.aux.shape)} / final {tuple(c.final.shape)} do not match "
                         f"{t} tokens")
    if c.staged is not None:
        if c.staged.dtype != dtype:
            raise ValueError(f"{c.sample_id}: staged as {c.staged.dtype}, asked for {dtype}")
        c.staged.wait()
        stored = c.staged.tensors
    else:
        stored = {k: v.cpu() for k, v in storage_tensors(c.aux.detach().cpu(), c.final.detach().cpu(), dtype).items()}
    return _safetensors_parts({"input_ids": ids, "loss_mask": mask, **stored},
                              {"schema": SCHEMA, "sample_id": c.sample_id, "dtype": dtype})


_ST_DTYPES = {"int64": "I64", "uint8": "U8", "bfloat16": "BF16", "float16": "F16", "float32": "F32",
              "float8_e4m3fn": "F8_E4M3"}


def _safetensors_parts(tensors: dict[str, Any], metadata: dict[str, str]) -> list[Any]:
    """The safetensors serialisation with a deterministic header (keys sorted; the library's own writer
    orders ``__metadata__`` differently from one process to the next, and resume compares bytes), as the
    header's bytes then views of the tensors' own bytes (no copy)."""
    torch = require("torch")
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs: list[Any] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else memoryview(b"")
        header[name] = {"dtype": _ST_DTYPES[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + raw.nbytes]}
        blobs.append(raw)
        offset += raw.nbytes
    head = encode_json(header)
    head += b" " * (-len(head) % 8)
    return [struct.pack("<Q", len(head)) + head, *blobs]


def _header_metadata(data: bytes, where: str) -> dict[str, str]:
    if len(data) < 8:
        raise InputError(f"{where}: truncated (no safetensors header); {REDO_HINT}")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = decode_json_object(data[8:8 + n])
    except ValueError:
        raise InputError(f"{where}: unreadable safetensors header (truncated or corrupt); {REDO_HINT}") from None
    meta = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}


def decode_sample(data: bytes, where: str = "hidden-state file") -> LoadedSample:
    """A stored sample from its bytes, dequantized (aux/final float32); ``where`` names it in errors."""
    torch = require("torch")
    st = require("safetensors.torch")
    meta = _header_metadata(data, where)
    if meta.get("schema") != SCHEMA:
        raise InputError(f"{where}: schema {meta.get('schema')!r}, expected {SCHEMA!r}")
    with storage_faults(where):
        t = st.load(data)
    missing = [k for k in ("input_ids", "loss_mask", "aux", "final") if k not in t]
    if missing:
        raise InputError(f"{where}: no {', '.join(missing)} tensor; not a {SCHEMA} sample: {REDO_HINT}")
    aux, final = t["aux"].float(), t["final"].float()
    if "aux_scale" in t:
        aux = aux * t["aux_scale"].float()
        final = final * t["final_scale"].float()
    return LoadedSample(sample_id=meta.get("sample_id", ""), input_ids=t["input_ids"].to(torch.int64),
                        loss_mask=t["loss_mask"].to(torch.uint8), aux=aux, final=final,
                        dtype=meta.get("dtype", "bf16"))
