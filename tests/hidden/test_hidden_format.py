"""The draftgen.hidden/1 format: encode/decode per dtype (fp8 with per-token scales, stated tolerance),
paths, and HiddenStore's atomic publish, index union (a batch written again replaces its own part; pruning
leaves each sample listed once), temp files and manifest on local and memory:// URLs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from draftgen.errors import InputError
from draftgen.hidden.codec import FP8_MAX, SCHEMA, Captured, decode_sample, encode_sample
from draftgen.hidden.format import HiddenStore, open_hidden, sample_key, sample_path, temp_name
from draftgen.records import (
    HiddenCounts,
    HiddenIndexRecord,
    HiddenLayerIds,
    HiddenManifest,
    HiddenSampleEntry,
    HiddenTarget,
)
from draftgen.store import encode_json

torch.set_num_threads(1)


def captured(sid: str = "s-1", T: int = 7, H: int = 16, n_aux: int = 3, seed: int = 0) -> Captured:
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(T, n_aux * H, generator=g) * 5
    aux[1] = 0.0  # an all-zero row: fp8 scale 1.0
    return Captured(sample_id=sid, input_ids=np.arange(100, 100 + T, dtype=np.int64),
                    loss_mask=np.array([0] * 3 + [1] * (T - 3), dtype=np.uint8), aux=aux,
                    final=torch.randn(T, H, generator=g) * 50)


def test_paths_are_sha256_sharded() -> None:
    k = sample_key("chat-0001")
    assert len(k) == 24 and sample_path("chat-0001") == f"states/{k[:2]}/{k}.safetensors"


@pytest.mark.parametrize(("dtype", "tdt"), [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_round_trip_is_the_cast(dtype: str, tdt: torch.dtype) -> None:
    c = captured()
    s = decode_sample(encode_sample(c, dtype))
    assert s.sample_id == "s-1" and s.dtype == dtype
    assert s.input_ids.dtype == torch.int64 and s.input_ids.tolist() == c.input_ids.tolist()
    assert s.loss_mask.dtype == torch.uint8 and s.loss_mask.tolist() == c.loss_mask.tolist()
    assert torch.equal(s.aux, c.aux.to(tdt).float()) and torch.equal(s.final, c.final.to(tdt).float())


def test_fp8_round_trip_within_its_stated_tolerance_and_half_the_bytes() -> None:
    """fp8 e4m3 keeps 3 mantissa bits: |x - dequant(x)| <= 2^-4 |x| + 2^-9 scale per element (round to
    nearest; the second term covers subnormals); an all-zero row stays exactly zero."""
    c = captured(T=64, H=64)
    data = encode_sample(c, "fp8")
    s = decode_sample(data)
    for got, want in ((s.aux, c.aux), (s.final, c.final)):
        scale = want.abs().amax(-1, keepdim=True) / FP8_MAX
        assert torch.all((got - want).abs() <= 2 ** -4 * want.abs() + 2 ** -9 * scale + 1e-12)
    assert torch.equal(s.aux[1], torch.zeros_like(s.aux[1]))
    bf16 = len(encode_sample(c, "bf16"))
    # half the tensor bytes, plus 4 bytes of scale per token and slot group
    assert len(data) < 0.56 * bf16


def test_metadata_and_schema_are_checked() -> None:
    from safetensors import safe_open

    data = encode_sample(captured(), "bf16")
    p = Path(os.environ.get("TMPDIR", "/tmp")) / f"dg-{os.getpid()}.safetensors"
    p.write_bytes(data)
    try:
        with safe_open(str(p), "pt") as f:
            assert f.metadata() == {"schema": SCHEMA, "sample_id": "s-1", "dtype": "bf16"}
    finally:
        p.unlink()
    with pytest.raises(InputError):
        decode_sample(b"\x00" * 4)


def manifest(entries: list[HiddenSampleEntry]) -> HiddenManifest:
    return HiddenManifest(schema=SCHEMA, target=HiddenTarget(name="m"),
                          layer_ids=HiddenLayerIds(aux=[2, 4, 5], final=8, convention="vllm-layer-input",
                                                   sglang_aux=[1, 3, 4], hf_hidden_states_index=[2, 4, 5]),
                          hidden_size=16, num_layers=8, vocab_size=10, dtype="bf16", norm_weight_sha256="x",
                          norm_eps=1e-6, counts=HiddenCounts(samples=len(entries), tokens=0, flagged=0),
                          samples=entries)


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_store_done_needs_file_and_index(tmp_path: Path, kind: str) -> None:
    url = str(tmp_path / "h") if kind == "local" else f"memory://dg-{os.getpid()}-{tmp_path.name}"
    st = HiddenStore(url)
    assert st.done() == {}
    a, b, c = captured("a"), captured("b", seed=1), captured("c", seed=2)
    ra = st.publish("a", encode_sample(a, "bf16"))
    st.publish("b", encode_sample(b, "bf16"))  # published, never indexed: not done
    recs = [HiddenIndexRecord(sample_id=x, file=sample_path(x), length=7, n_loss=4) for x in ("a", "c")]
    st.write_index_part(recs)  # c is indexed but its file is missing: not done
    assert set(st.done()) == {"a"} and ra == sample_path("a")
    st.publish("c", encode_sample(c, "bf16"))
    assert set(st.done()) == {"a", "c"}
    st.write_index_part([HiddenIndexRecord(sample_id="a", file=ra, length=7, n_loss=4, failed=["norm"])])
    assert len(st.index_parts()) == 2 and set(st.done()) == {"a", "c"}  # union by sample_id, once each
    st.write_manifest(manifest([HiddenSampleEntry(sample_id=x, file=sample_path(x), length=7) for x in ("c", "a")]))
    hs = open_hidden(url)
    got = list(hs.samples())
    assert [s.sample_id for s in got] == ["c", "a"] and len(hs) == 2
    assert torch.equal(got[1].aux, a.aux.to(torch.bfloat16).float())


def test_local_publish_is_atomic_and_temps_never_count(tmp_path: Path) -> None:
    st = HiddenStore(str(tmp_path))
    st.claim()  # the owner marker: clean_temps works only in a destination that holds it
    rel = st.publish("a", encode_sample(captured("a"), "bf16"))
    folder = (tmp_path / rel).parent
    assert [p.name for p in folder.iterdir()] == [Path(rel).name]  # no temp file left behind
    # a killed writer's temp file (draftgen's temp pattern): never read as a sample, removed by clean_temps;
    # a dot file ending in .tmp that is not draftgen's pattern is left alone
    (folder / temp_name(Path(sample_path("z")).name)).write_bytes(b"partial")
    (folder / ".notes.tmp").write_bytes(b"mine")
    st.write_index_part([HiddenIndexRecord(sample_id="a", file=rel, length=7, n_loss=4)])
    assert set(st.done()) == {"a"}
    assert st.clean_temps() == 1 and sorted(p.name for p in folder.iterdir()) == [".notes.tmp", Path(rel).name]


def test_missing_manifest_says_run_extract(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="run draftgen extract first"):
        open_hidden(str(tmp_path / "nothing"))


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_batch_written_again_replaces_its_part_and_prune_keeps_one_record(tmp_path: Path, kind: str) -> None:
    """Issue 31 item 14 at the store: a batch written again (a retried task) replaces its own index part
    (named by its sample ids); ``prune_index`` leaves each kept sample listed once (its last record) and drops
    every other record, removing a part left empty."""
    from draftgen.hidden.format import index_part_name
    from draftgen.hidden.stream import StreamSample

    url = str(tmp_path / "h") if kind == "local" else f"memory://dg-prune-{os.getpid()}-{tmp_path.name}"
    st = HiddenStore(url)

    def batch(*sids: str, failed: list[str] | None = None) -> list[StreamSample]:
        out = []
        for i, sid in enumerate(sids):
            data = encode_sample(captured(sid, seed=i), "bf16")
            rec = HiddenIndexRecord(sample_id=sid, file=sample_path(sid), length=7, n_loss=4, failed=failed or [])
            out.append(StreamSample(sample_id=sid, file=sample_path(sid), data=data, length=7, record=rec))
        return out

    st.write(batch("a", "b"))
    st.write(batch("c"))
    st.write(batch("b", "a"))  # the same batch again, in another order: the same part, replaced
    assert len(st.index_parts()) == 2 and any(p.endswith(index_part_name(["a", "b"])) for p in st.index_parts())
    assert set(st.done()) == {"a", "b", "c"} and st.listed == 3
    # an older draftgen's second listing of a and c, in a later time-named part
    legacy = "index/part-99991231T235959-deadbeef.jsonl"
    st.fs.pipe_file(st.path(legacy), b"".join(encode_json(s.record) + b"\n" for s in batch("a", "c", failed=["x"])))
    done = st.done()
    assert st.listed == 5 and done["a"].failed == ["x"]
    assert st.prune_index({"a": done["a"], "c": done["c"]}) == 3  # a's and c's first records, b's only one
    assert st.done() == {"a": done["a"], "c": done["c"]} and st.listed == 2
    assert [p.rsplit("/", 1)[1] for p in st.index_parts()] == [legacy.rsplit("/", 1)[1]]  # the emptied parts went
