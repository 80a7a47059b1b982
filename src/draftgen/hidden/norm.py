"""The target's identity, read from its model folder: its final RMSNorm and a digest of its weights.

``load_final_norm(model_dir, manifest)`` reads ``config.json`` (``rms_norm_eps``) and the ``model.norm`` weight
from the folder's safetensors; with a manifest, the weight's sha256 (``norm_weight_digest``: float32 bytes,
also as rounded to bf16/fp16 as the target computed with it) must equal the set's ``norm_weight_sha256`` and
its eps the set's ``norm_eps``. ``FinalNorm.apply`` turns stored PRE-norm final states into POST-norm ones
(the specforge and modelopt exports); ``train.guards`` compares a verifier with the set by the same digest.

``weights_digest(folder)`` identifies every weight that shapes the stored states, cheaply (``WeightsDigest``):

- ``sampled`` (a set's ``weights_sha256``): sha256 over every tensor of the folder's ``*.safetensors``, in name
  order whatever the shard: its name, dtype, shape and size, then slices of ``SLICE`` (4 KiB) bytes of its
  data: one at its start, and one more per ``SPREAD`` (16 MiB) of it, up to ``SLICES`` (4), spread evenly to
  its end (a tensor of at most ``SLICE`` bytes: all of it). It reads the headers and at most 16 KiB per
  tensor, whatever the tensor's size (reads of one file closer than ``GAP`` merged, ``READERS`` at once):
  0.4 MB per GB of a dense target, 0.8-3.7 MB per GB of an MoE one of many small expert tensors, in
  milliseconds per GB (docs/extract.md has the measurement). A fine-tune or a merged adapter changes
  (nearly) every element of a tensor it touches, so it changes the digest, as does any change of a name,
  dtype or shape; a change confined to bytes no slice covers is not seen. The same weights re-sharded digest
  the same;
- ``files`` (``files_sha256``): in a Hugging Face cache snapshot, whose files are links to blobs named by
  their sha256, the digest of (file name, blob name) over every file: the files' full contents, for free;
  None for any other folder.

``WeightsDigest.differs`` compares two digests field by field where both have one; ``WeightsDigest.of`` reads
a recorded ``HiddenTarget``'s (a set made before digests has none: nothing to compare).
Reads the model folder; writes nothing. torch and safetensors are imported on use.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftgen.errors import InputError
from draftgen.hidden.format import require, storage_faults
from draftgen.store import decode_json_object, read_json_object

if TYPE_CHECKING:
    import torch

    from draftgen.records import HiddenManifest, HiddenTarget

__all__ = ["FinalNorm", "WeightsDigest", "load_final_norm", "norm_digests", "norm_weight_digest", "weights_digest"]

SLICE = 4096  # bytes per sampled slice of a tensor's data
SLICES = 4  # slices of a tensor at most: its start, its end, and evenly between
SPREAD = 16 << 20  # one slice more per this many bytes of a tensor (up to SLICES)
GAP = 4096  # sampled reads of one file closer than this are one read
MAX_READ = 8 << 20  # ... up to this many bytes
READERS = 16  # reads at once (a network filesystem's latency)
_BLOB = re.compile(r"[0-9a-f]{64}")


@dataclass
class FinalNorm:
    """The target's final RMSNorm: weight (float32) and eps."""

    weight: torch.Tensor
    eps: float

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        th = require("torch")
        xf = x.float()
        out: torch.Tensor = self.weight * (xf * th.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))
        return out


def norm_weight_digest(weight: torch.Tensor) -> str:
    """sha256 of the norm weight as float32 little-endian bytes (the manifest's ``norm_weight_sha256``)."""
    return hashlib.sha256(weight.detach().float().contiguous().numpy().tobytes()).hexdigest()


def norm_digests(model_dir: Path) -> list[str]:
    """The sha256s the final norm weight in ``model_dir`` may be recorded under (``norm_weight_digest``): as
    the folder stores it, and rounded to bf16 / fp16, as a target computing in that dtype hashes it."""
    torch = require("torch")
    w = load_final_norm(model_dir).weight
    return [norm_weight_digest(x) for x in (w, w.to(torch.bfloat16).float(), w.to(torch.float16).float())]


def load_final_norm(model_dir: Path, manifest: HiddenManifest | None = None) -> FinalNorm:
    """The final RMSNorm of the target model in ``model_dir`` (config.json + safetensors weights)."""
    st = require("safetensors")
    cfg_path = model_dir / "config.json"
    try:
        cfg = read_json_object(cfg_path)
    except (OSError, ValueError):
        raise InputError(f"{cfg_path}: no readable config.json; give the target model's local folder") from None
    text = cfg.get("text_config") or cfg
    eps = float(text.get("rms_norm_eps", text.get("layer_norm_epsilon", 1e-6)))
    names = ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight")
    weight = None
    for f in sorted(model_dir.glob("*.safetensors")):
        with st.safe_open(str(f), framework="pt") as fh:
            hit = next((n for n in names if n in fh.keys()), None)  # noqa: SIM118 (safe_open has no __contains__)
            if hit:
                weight = fh.get_tensor(hit).float()
                break
    if weight is None:
        raise InputError(f"{model_dir}: no final norm weight ({names[0]}) in its safetensors files")
    if manifest is not None and manifest.norm_weight_sha256:
        # the extractor hashes the weight as the target computed with it (the file's, or rounded to bf16/fp16)
        torch = require("torch")
        cands = [weight, weight.to(torch.bfloat16).float(), weight.to(torch.float16).float()]
        match = next((w for w in cands if norm_weight_digest(w) == manifest.norm_weight_sha256), None)
        digest = norm_weight_digest(weight)
        if match is not None:
            weight = match
        else:
            raise InputError(f"{model_dir}: its final norm weight (sha256 {digest[:12]}…) is not the one the "
                             f"hidden states were extracted with ({manifest.norm_weight_sha256[:12]}…); give "
                             "the same target model folder")
    if manifest is not None and abs(manifest.norm_eps - eps) > 1e-12 * max(1.0, abs(eps)):
        raise InputError(f"{cfg_path}: rms_norm_eps {eps} differs from the manifest's {manifest.norm_eps}")
    return FinalNorm(weight=weight, eps=eps)


@dataclass(frozen=True)
class WeightsDigest:
    """The digest of a target's weights (module docstring); ``tensors``, ``read`` (bytes read), ``total``
    (bytes of its safetensors files) and ``seconds`` say what it cost."""

    sampled: str | None
    files: str | None = None
    tensors: int = 0
    read: int = 0
    total: int = 0
    seconds: float = 0.0

    @classmethod
    def of(cls, target: HiddenTarget) -> WeightsDigest:
        """The digest a set records for its target (None fields: recorded by an older draftgen)."""
        return cls(sampled=target.weights_sha256, files=target.files_sha256)

    def differs(self, other: WeightsDigest) -> str | None:
        """None when the two may be the same weights (every field both have is equal); else the first field
        that differs, named with both values (``other``'s first)."""
        for name, mine, theirs in (("weights_sha256", self.sampled, other.sampled),
                                   ("files_sha256", self.files, other.files)):
            if mine and theirs and mine != theirs:
                return f"{name} {theirs[:12]}… (not {mine[:12]}…)"
        return None


_CACHE: dict[tuple[Any, ...], WeightsDigest] = {}


def weights_digest(folder: str | os.PathLike[str]) -> WeightsDigest:
    """The digest of the weights in ``folder`` (module docstring); ``WeightsDigest(None)`` when it holds no
    safetensors file (a hub id not resolved to a local folder). Computed once per process for the same
    files (name, size, modification time, inode)."""
    root = Path(folder)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return WeightsDigest(sampled=None)
    with storage_faults(str(root)):
        key = (str(root.resolve()), *((f.name, *_stamp(f)) for f in files))
    if key not in _CACHE:
        _CACHE[key] = _digest(files)
    return _CACHE[key]


def _stamp(f: Path) -> tuple[int, int, int]:
    st = f.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _digest(files: list[Path]) -> WeightsDigest:
    t0 = time.monotonic()
    # each tensor: (name, dtype, shape, bytes, its slices' (start, end) in its file, the file's index)
    tensors: list[tuple[str, str, list[int], int, list[tuple[int, int]], int]] = []
    wanted: dict[int, list[tuple[int, int]]] = {}  # file index → every slice to read there
    read = total = 0
    for k, f in enumerate(files):
        header, base, size = _header(f)
        read, total = read + base, total + size
        for name, meta in sorted(header.items()):
            if name == "__metadata__":
                continue
            try:
                b, e = (int(x) for x in meta["data_offsets"])
                dtype, shape = str(meta["dtype"]), [int(x) for x in meta["shape"]]
                if not 0 <= b <= e <= size - base:
                    raise ValueError("offsets outside the file")
            except (KeyError, TypeError, ValueError):
                raise InputError(f"{f}: tensor {name!r} has an unreadable safetensors header entry; give the "
                                 "target model's own folder") from None
            slices = _slices(base + b, e - b)
            wanted.setdefault(k, []).extend(slices)
            tensors.append((name, dtype, shape, e - b, slices, k))
    got, sampled = _read_all(files, wanted)
    h = hashlib.sha256()
    for name, dtype, shape, nbytes, slices, k in sorted(tensors, key=lambda t: (t[0], t[5])):
        h.update(f"{name}\0{dtype}\0{shape}\0{nbytes}\n".encode())
        for s in slices:
            h.update(got[k][s])
    read += sampled
    blobs = [_blob(f) for f in files]
    whole = None
    if all(blobs):
        whole = hashlib.sha256("".join(f"{f.name}\0{b}\n" for f, b in zip(files, blobs, strict=True)).encode()).hexdigest()
    return WeightsDigest(sampled=h.hexdigest(), files=whole, tensors=len(tensors), read=read, total=total,
                         seconds=time.monotonic() - t0)


def _header(f: Path) -> tuple[dict[str, Any], int, int]:
    """(header, where its data begins, file size) of a safetensors file."""
    why = "not a safetensors file (no header)"
    with storage_faults(str(f)), open(f, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) == 8:
            (n,) = struct.unpack("<Q", head)
            if n <= size - 8:
                try:
                    return decode_json_object(fh.read(n)), 8 + n, size
                except ValueError as exc:
                    why = f"unreadable safetensors header ({exc})"
    raise InputError(f"{f}: {why}; give the target model's own folder")


def _slices(start: int, nbytes: int) -> list[tuple[int, int]]:
    """The (start, end) file offsets sampled of a tensor's data (module docstring)."""
    if nbytes <= SLICE:
        return [(start, start + nbytes)] if nbytes else []
    k = 1 + min(SLICES - 1, nbytes // SPREAD)
    step = (nbytes - SLICE) // max(k - 1, 1)
    return [(start + i * step, start + i * step + SLICE) for i in range(k)]


def _read_all(files: list[Path], wanted: dict[int, list[tuple[int, int]]],
              ) -> tuple[dict[int, dict[tuple[int, int], bytes]], int]:
    """The bytes of every wanted slice, file by file (nearby slices merged into one read; ``READERS`` threads,
    each with its share of the reads), and the bytes read."""
    jobs: list[tuple[int, list[int], list[tuple[int, int]]]] = []  # file, [start, end], its slices
    for k, slices in wanted.items():
        for s in sorted(set(slices)):
            last = jobs[-1] if jobs else None
            if last is not None and last[0] == k and s[0] - last[1][1] < GAP and s[1] - last[1][0] <= MAX_READ:
                last[1][1] = max(last[1][1], s[1])
                last[2].append(s)
            else:
                jobs.append((k, [s[0], s[1]], [s]))
    fds: dict[int, int] = {}
    try:
        for k in wanted:
            with storage_faults(str(files[k])):
                fds[k] = os.open(files[k], os.O_RDONLY)

        def run(share: list[tuple[int, list[int], list[tuple[int, int]]]]) -> None:
            for k, (lo, hi), slices in share:
                with storage_faults(str(files[k])):
                    data = os.pread(fds[k], hi - lo, lo)
                if len(data) != hi - lo:
                    raise InputError(f"{files[k]}: shorter than its safetensors header says (truncated); give "
                                     "the target model's own folder")
                got = out[k]
                for a, b in slices:
                    got[(a, b)] = data[a - lo:b - lo]

        out: dict[int, dict[tuple[int, int], bytes]] = {k: {} for k in wanted}
        with ThreadPoolExecutor(READERS, thread_name_prefix="draftgen-weights") as ex:
            list(ex.map(run, [jobs[i::READERS] for i in range(READERS)]))
        return out, sum(hi - lo for _, (lo, hi), _ in jobs)
    finally:
        for fd in fds.values():
            os.close(fd)


def _blob(f: Path) -> str | None:
    """The sha256 a Hugging Face cache blob is named by, when ``f`` links to one (else None)."""
    if not f.is_symlink():
        return None
    real = Path(os.path.realpath(f))
    return real.name if real.parent.name == "blobs" and _BLOB.fullmatch(real.name) else None
