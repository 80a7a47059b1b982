"""One target per hidden set (issue 31 item 12): the target's identity covers every weight, not only the final
norm and config.json.

A real tiny target folder and a copy of it with one layer's ``mlp.down_proj`` changed (a fine-tune or a merged
adapter: the final norm and config.json byte for byte the same):

- a resume of the first target's set with the copy is refused before any write, in one line naming
  ``weights_sha256`` and the fix; ``--force`` accepts it and the set records it (``forced``);
- ``draftgen train`` with ``train.verifier`` set to the copy is refused before training;
- a set made before weights digests (none in identity.json and the manifest) still resumes, saying it is
  checked by its final norm and config.json only, and records the target's digest from then on;
- the digest is the same for an identical copy, for the same tensors in other shards, and for the same files
  laid out as a Hugging Face cache snapshot (links to blobs named by their sha256, which add the files' full
  digests); what it reads is the headers and at most 16 KiB per tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import config_dict, write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run, with_hidden  # noqa: E402
from _hidden_export_helpers import speculators_python  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.errors import ConfigError, RunDirError  # noqa: E402
from draftgen.hidden.format import open_hidden  # noqa: E402
from draftgen.hidden.norm import GAP, SLICE, SLICES, weights_digest  # noqa: E402
from draftgen.phases.extract.run import run_extract  # noqa: E402

CHANGED = "model.layers.3.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny target, and a copy whose layer 3 down_proj got a small dense change (norm, config equal)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("targets")
    a = build_tiny_model(root / "target", layers=8, hidden=32)
    b = root / "tuned"
    shutil.copytree(a, b)
    weights = load_file(str(b / "model.safetensors"))
    delta = torch.randn(weights[CHANGED].shape, generator=torch.Generator().manual_seed(7)) * 1e-3
    weights[CHANGED] = weights[CHANGED] + delta
    with safe_open(str(a / "model.safetensors"), "pt") as fh:
        meta = fh.metadata()
    save_file(weights, str(b / "model.safetensors"), metadata=meta)
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    na, nb = (load_file(str(d / "model.safetensors"))["model.norm.weight"] for d in (a, b))
    assert torch.equal(na, nb)
    return a, b


@pytest.fixture(scope="module")
def run_cfg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_merged_run(tmp_path_factory.mktemp("run"), n_chat=4, n_code=3)


def _cfg(run_cfg: Path, model: Path, out: Path, name: str) -> Path:
    return with_hidden(run_cfg, name, model=str(model), output=str(out), teacher_min_margin=None,
                       teacher_fraction=0.0)


def _extract(cfg_path: Path, **kw: object) -> tuple[object, list[str]]:
    lines: list[str] = []
    rep = run_extract(load_config(cfg_path), echo=lines.append, **kw)  # type: ignore[arg-type]
    return rep, lines


def _state(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name not in (".lock", ".lock.json")}


def test_a_target_with_one_layer_changed_is_refused_by_resume_and_by_train(targets: tuple[Path, Path], run_cfg: Path,
                                                                            tmp_path: Path) -> None:
    a, b = targets
    out = tmp_path / "h"
    _extract(_cfg(run_cfg, a, out, "cfg-a.yaml"), limit=3)
    man = open_hidden(str(out)).manifest
    want = weights_digest(a)
    assert man.target.weights_sha256 == want.sampled and want.sampled != weights_digest(b).sampled
    before = _state(out)
    with pytest.raises(RunDirError) as err:
        _extract(_cfg(run_cfg, b, out, "cfg-b.yaml"))
    msg = str(err.value)
    assert "\n" not in msg and f"hidden_states.model {b}" in msg and "weights_sha256" in msg, msg
    assert "use another hidden_states.output, or pass --force" in msg, msg
    assert _state(out) == before  # refused before any write

    # train: the copy as train.verifier is refused before any training step
    data = config_dict(tmp_path / "train", progress="off", hidden_states={"model": str(a), "output": str(out)},
                       train={"speculators": str(speculators_python()), "verifier": str(b), "allow_partial": True,
                              "draft_vocab_size": 256, "total_seq_len": 64, "epochs": 1})
    from draftgen.phases.train.run import run_train
    from draftgen.rundir import RunDir

    cfg = load_config(write_config(tmp_path / "train", data, "train.yaml"))
    with pytest.raises(ConfigError) as err:
        run_train(cfg, echo=lambda s: None, argv=["draftgen", "train"])
    msg = str(err.value)
    assert "\n" not in msg and "train.verifier" in msg and "weights_sha256" in msg and str(b) in msg, msg
    assert not RunDir(cfg.run_path).train_checkpoints.exists()

    # --force: accepted, said, and recorded by the set
    rep, lines = _extract(_cfg(run_cfg, b, out, "cfg-b.yaml"), limit=1, force=True)
    assert rep.extracted == 1 and any("--force" in ln and "weights_sha256" in ln for ln in lines), lines  # type: ignore[attr-defined]
    man = open_hidden(str(out)).manifest
    assert man.forced == ["weights"] and man.target.weights_sha256 == weights_digest(b).sampled
    ident = json.loads((out / "identity.json").read_text())
    assert ident["forced"] == ["weights"] and ident["target"]["weights_sha256"] == weights_digest(b).sampled


def test_a_set_made_before_weights_digests_resumes_and_records_them(targets: tuple[Path, Path], run_cfg: Path,
                                                                     tmp_path: Path) -> None:
    a, _ = targets
    out = tmp_path / "h"
    cfg_a = _cfg(run_cfg, a, out, "cfg-a.yaml")
    _extract(cfg_a, limit=2)
    for name in ("identity.json", "manifest.json"):  # as an older draftgen wrote them
        obj = json.loads((out / name).read_text())
        for key in ("weights_sha256", "files_sha256"):
            obj["target"].pop(key, None)
        obj["schema_version"] = 2
        (out / name).write_text(json.dumps(obj))
    rep, lines = _extract(cfg_a)
    assert rep.done_before == 2 and rep.complete  # type: ignore[attr-defined]
    assert any("records no weights digest" in ln and "final norm and config.json" in ln for ln in lines), lines
    assert json.loads((out / "identity.json").read_text())["target"]["weights_sha256"] == weights_digest(a).sampled
    assert open_hidden(str(out)).manifest.target.weights_sha256 == weights_digest(a).sampled


def _hf_cache(src: Path, cache: Path, rev: str = "0" * 40) -> Path:
    """``src``'s files as the Hugging Face cache lays a snapshot out: ``blobs/<sha256>`` and
    ``snapshots/<rev>/<name>`` a relative link to its blob."""
    snap = cache / "snapshots" / rev
    (cache / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = cache / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return snap


def test_the_digest_is_the_same_for_a_copy_a_resharding_and_a_relinked_hf_cache(targets: tuple[Path, Path],
                                                                                tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    a, b = targets
    da, db = weights_digest(a), weights_digest(b)
    assert da.sampled and da.sampled != db.sampled and da.files is None
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    assert (weights_digest(copy).sampled, weights_digest(copy).files) == (da.sampled, None)

    # the same tensors in two shards (and an index) digest the same
    shards = tmp_path / "shards"
    shutil.copytree(a, shards, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(str(a / "model.safetensors"))
    names = sorted(tensors)
    half = {n: tensors[n] for n in names[: len(names) // 2]}
    rest = {n: tensors[n] for n in names[len(names) // 2:]}
    save_file(half, str(shards / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(rest, str(shards / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    assert weights_digest(shards).sampled == da.sampled

    # a Hugging Face cache snapshot of the same files: the same sampled digest, plus the blobs' full digests
    snap = _hf_cache(a, tmp_path / "hub" / "models--t--a")
    relinked = _hf_cache(copy, tmp_path / "hub2" / "models--t--a", rev="1" * 40)
    hs, hr = weights_digest(snap), weights_digest(relinked)
    assert hs.sampled == da.sampled and hs.files and (hr.sampled, hr.files) == (hs.sampled, hs.files)
    assert da.differs(hs) is None and hs.differs(da) is None  # a plain folder and a snapshot: the same target
    tuned = weights_digest(_hf_cache(b, tmp_path / "hub3" / "models--t--b"))
    assert tuned.sampled == db.sampled and tuned.files != hs.files and "weights_sha256" in str(hs.differs(tuned))

    # what it costs: the headers and a few slices per tensor (here 91 tensors, the largest 19 MB)
    assert da.tensors == len(tensors) and da.read < da.total / 50
    assert da.read <= da.tensors * SLICES * (SLICE + GAP)
