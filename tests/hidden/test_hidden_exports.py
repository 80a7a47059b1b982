"""The hidden-state exports (draftgen.hidden.exports), each read back by its consumer's own reader.

A real hidden set: a tiny seeded Qwen3 target (8 layers) run over random ids, stored with extract.format.
- speculators: read by speculators 0.9's ``ArrowDataset`` (``speculators.train.data``) in its own
  environment (a subprocess of .venv-speculators); aux, pre-norm final, ids and mask must be what was stored.
- SpecForge: read by ``specforge.data.preprocessing.build_offline_eagle3_dataset``; its target
  (``hidden_state``) must equal the target's own post-norm ``output_hidden_states[L]``.
- Model-Optimizer: read by ``modelopt.torch.speculative.eagle.utils.OfflineSupervisedDataset``, loaded from
  the installed wheel's files (importing the ``modelopt`` package needs scipy and more; the reader module
  itself needs only torch, transformers and ``modelopt.torch.utils.loss_mask``).

A rerun into an export folder verifies what its export.json lists and repairs it (issue 31 item 13): a deleted
and an overwritten sample file rewritten from the set, a broken aggregate file by exporting again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _extract_helpers import build_tiny_model  # noqa: E402
from _hidden_export_helpers import make_hidden_set, run_in_speculators  # noqa: E402
from draftgen.errors import ConfigError, InputError  # noqa: E402
from draftgen.hidden.exports import (  # noqa: E402
    EXPORT_REPORT,
    HIDDEN_EXPORTERS,
    SAMPLE_IDS,
    export_hidden,
    modelopt_name,
)
from draftgen.records import HiddenExportReport  # noqa: E402
from draftgen.store import read_json  # noqa: E402

BF16_TOL = 2e-2


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any], list[Any]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hx")
    model_dir = build_tiny_model(root / "target", layers=8, hidden=64)
    dest, rows = make_hidden_set(model_dir, root / "hidden", n=8)
    # independent post-norm reference: HF output_hidden_states[L] is the final norm's output
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    post = []
    with torch.no_grad():
        for _sid, ids, _mask, _aux, _final in rows:
            post.append(model(torch.tensor([ids]), output_hidden_states=True).hidden_states[8][0])
    return model_dir, dest, rows, post


def _close(a: Any, b: Any, tol: float = BF16_TOL) -> None:
    a, b = a.float(), b.float()
    assert a.shape == b.shape
    assert float((a - b).norm() / b.norm()) < tol


def test_registry_has_the_three_formats() -> None:
    assert {"speculators", "specforge", "modelopt"} <= set(HIDDEN_EXPORTERS.names())
    with pytest.raises(ConfigError, match=r"export-hidden --format: hidden export format 'nope' is not registered; "
                                          r"use one of speculators, specforge, modelopt"):
        export_hidden("/nowhere", ["nope"], "/tmp/x")


def test_speculators_export_reads_back_with_speculators_arrowdataset(hidden: Any, tmp_path: Path) -> None:
    _model_dir, dest, rows, _post = hidden
    out = tmp_path / "spec"
    rep = export_hidden(str(dest), ["speculators"], out)[0]
    assert rep.samples == len(rows) and rep.layer_ids == [2, 4, 5] and rep.final_layer_id == 8
    dump = tmp_path / "dump.pt"
    code = (
        "import sys, torch\n"
        "from speculators.train.data import ArrowDataset\n"
        "ds = ArrowDataset(max_len=4096, datapath=sys.argv[1], on_missing='raise', train_ratio=1.0, split='train')\n"
        "out = [ds[i] for i in range(len(ds))]\n"
        "freq = torch.load(sys.argv[1] + '/token_freq.pt', weights_only=True)\n"
        "torch.save({'rows': out, 'freq': freq, 'lens': ds.approx_lengths}, sys.argv[2])\n"
    )
    run_in_speculators(code, str(out), str(dump))
    got = torch.load(dump, weights_only=False)
    assert len(got["rows"]) == len(rows)
    freq: dict[int, int] = {}
    for item, (_sid, ids, mask, aux, final) in zip(got["rows"], rows, strict=True):
        assert item["input_ids"].tolist() == ids
        assert item["loss_mask"].tolist() == mask
        _close(item["hidden_states"], aux)  # [T, 3H], aux slots ascending
        _close(item["verifier_last_hidden_states"], final)  # pre-norm final
        for t, m in zip(ids, mask, strict=True):
            if m:
                freq[t] = freq.get(t, 0) + 1
    assert got["freq"] == freq
    assert got["lens"] == [len(r[1]) for r in rows]
    # provenance: index i -> sample_id, in manifest order
    lines = [json.loads(x) for x in (out / SAMPLE_IDS).read_text().splitlines()]
    assert [x["sample_id"] for x in lines] == [r[0] for r in rows]
    assert [x["file"] for x in lines] == [f"hidden_states/hs_{i}.safetensors" for i in range(len(rows))]
    # a second export of the same set is up to date (nothing rewritten)
    mtime = (out / "hidden_states" / "hs_0.safetensors").stat().st_mtime_ns
    again = export_hidden(str(dest), ["speculators"], out)[0]
    assert again.seconds == rep.seconds
    assert (out / "hidden_states" / "hs_0.safetensors").stat().st_mtime_ns == mtime


def test_specforge_export_reads_back_with_specforge_offline_dataset(hidden: Any, tmp_path: Path) -> None:
    from specforge.data.preprocessing import build_offline_eagle3_dataset

    model_dir, dest, rows, post = hidden
    out = tmp_path / "sf"
    export_hidden(str(dest), ["specforge"], out, target_dir=model_dir)
    ds = build_offline_eagle3_dataset(str(out), max_len=4096)
    assert len(ds) == len(rows)
    by_index = {int(Path(p).stem.removeprefix("data_")): k for k, p in enumerate(ds.datapaths)}
    for i, (_sid, ids, mask, aux, _final) in enumerate(rows):
        item = ds[by_index[i]]
        assert Path(ds.datapaths[by_index[i]]).parent.name == "rows_0-2000"
        assert item["input_ids"][0].tolist() == ids
        assert item["loss_mask"][0].tolist() == [*mask[:-1], 0]  # SpecForge zeroes the last position
        _close(item["hidden_state"][0], aux)
        _close(item["target"][0], post[i])  # POST-norm, as SpecForge's own capture stores it


def _modelopt_reader() -> Any:
    spec = importlib.util.find_spec("modelopt")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("nvidia-modelopt is not installed (pip install --no-deps nvidia-modelopt==0.47.0)")
    root = Path(next(iter(spec.submodule_search_locations)))

    def load(name: str, path: Path) -> types.ModuleType:
        s = importlib.util.spec_from_file_location(name, path)
        assert s is not None and s.loader is not None
        mod = importlib.util.module_from_spec(s)
        sys.modules[name] = mod
        s.loader.exec_module(mod)
        return mod

    saved = {k: sys.modules.get(k) for k in ("modelopt.torch.utils.loss_mask", "_modelopt_eagle_utils")}
    try:
        load("modelopt.torch.utils.loss_mask", root / "torch" / "utils" / "loss_mask.py")
        return load("_modelopt_eagle_utils", root / "torch" / "speculative" / "eagle" / "utils.py")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_modelopt_export_reads_back_with_modelopt_offline_dataset(hidden: Any, tmp_path: Path) -> None:
    utils = _modelopt_reader()
    model_dir, dest, rows, post = hidden
    out = tmp_path / "mo"
    export_hidden(str(dest), ["modelopt"], out, target_dir=model_dir)
    files = sorted(str(p) for p in out.rglob("*.pt"))  # what Model-Optimizer's launcher globs
    assert len(files) == len(rows)
    ds = utils.OfflineSupervisedDataset(files, answer_only_loss=True)
    by_name = {Path(f).stem: k for k, f in enumerate(files)}
    for i, (sid, ids, mask, aux, _final) in enumerate(rows):
        item = ds[by_name[modelopt_name(sid)]]
        assert item["input_ids"].tolist() == ids
        assert item["loss_mask"].tolist() == mask
        assert item["labels"][:-1].tolist() == ids[1:]
        assert item["base_hidden_prenorm"] is False
        _close(item["aux_hidden_states"], aux)
        _close(item["base_model_hidden_states"], post[i])
        raw = torch.load(files[by_name[modelopt_name(sid)]], weights_only=True)
        assert raw["conversation_id"] == sid
    assert modelopt_name("chat/0001") != "chat/0001" and modelopt_name("code-0002") == "code-0002"


def test_norm_from_another_model_is_refused(hidden: Any, tmp_path: Path) -> None:
    _model_dir, dest, _rows, _post = hidden
    other = build_tiny_model(tmp_path / "other", layers=8, hidden=64, seed=1)
    with pytest.raises(InputError, match="final norm weight"):
        export_hidden(str(dest), ["specforge"], tmp_path / "sf", target_dir=other)
    assert not (tmp_path / "sf" / EXPORT_REPORT).exists()


def test_several_formats_one_folder_each_with_reports(hidden: Any, tmp_path: Path) -> None:
    model_dir, dest, rows, _post = hidden
    reps = export_hidden(str(dest), ["specforge", "modelopt"], tmp_path / "all", target_dir=model_dir)
    for rep in reps:
        on_disk = read_json(tmp_path / "all" / rep.format / EXPORT_REPORT, type(rep))
        assert on_disk.samples == len(rows) and on_disk.format == rep.format


def test_export_hidden_command(hidden: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from _common_helpers import config_dict, write_config
    from draftgen.cli import cli

    model_dir, dest, rows, _post = hidden
    cfg = write_config(tmp_path, config_dict(tmp_path, hidden_states={"model": str(model_dir), "output": str(dest)}))
    res = CliRunner().invoke(cli, ["export-hidden", str(cfg), "--format", "specforge"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "run" / "hidden-exports" / "specforge"
    assert len(list(out.rglob("*.ckpt"))) == len(rows) and (out / EXPORT_REPORT).is_file()
    bad = CliRunner().invoke(cli, ["export-hidden", str(cfg), "--format", "modelopt", "--target", str(tmp_path)])
    assert bad.exit_code != 0 and "config.json" in bad.output and "Traceback" not in bad.output


def _bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_rerun_verifies_a_damaged_export_and_repairs_it(hidden: Any, tmp_path: Path) -> None:
    """Issue 31 item 13: ``hs_3`` deleted and ``hs_4`` overwritten (same size) in a real speculators export; the
    rerun the user tries as a repair finds both (existence; the digest of a file changed since the export),
    rewrites exactly those from the set, says so, and leaves the folder as the first export wrote it."""
    from click.testing import CliRunner

    from _common_helpers import config_dict, write_config
    from draftgen.cli import cli

    model_dir, dest, rows, _post = hidden
    cfg = write_config(tmp_path, config_dict(tmp_path, hidden_states={"model": str(model_dir), "output": str(dest)}))
    out = tmp_path / "spec"
    first = CliRunner().invoke(cli, ["export-hidden", str(cfg), "--format", "speculators", "--out", str(out)])
    assert first.exit_code == 0, first.output
    rep = read_json(out / EXPORT_REPORT, HiddenExportReport)
    assert rep.sha256 and set(rep.sha256) == set(rep.files) - {EXPORT_REPORT}
    clean = _bytes(out)
    hs3, hs4, hs5 = (out / "hidden_states" / f"hs_{i}.safetensors" for i in (3, 4, 5))
    hs3.unlink()
    data = bytearray(hs4.read_bytes())
    data[-64:] = bytes(64)  # zeros over the last states: same size, other bytes
    hs4.write_bytes(bytes(data))
    keep5 = hs5.stat().st_mtime_ns

    again = CliRunner().invoke(cli, ["export-hidden", str(cfg), "--format", "speculators", "--out", str(out)])
    assert again.exit_code == 0, again.output
    said = again.output.strip().splitlines()
    assert len(said) == 1 and "2 of" in said[0] and "missing: hidden_states/hs_3.safetensors" in said[0], said
    assert "changed: hidden_states/hs_4.safetensors" in said[0] and "rewrote them" in said[0], said
    assert _bytes(out) == clean  # the same bytes as the first export, and nothing else
    assert hs5.stat().st_mtime_ns == keep5  # only the broken files were rewritten
    third = CliRunner().invoke(cli, ["export-hidden", str(cfg), "--format", "speculators", "--out", str(out)])
    assert third.exit_code == 0 and f"is up to date ({len(rows)} samples)" in third.output, third.output


def test_a_broken_file_made_from_every_sample_rewrites_the_whole_export(hidden: Any, tmp_path: Path) -> None:
    """token_freq.pt (every sample's counts) truncated: what cannot be rewritten file by file makes the rerun
    write the whole export again. An export.json from before sizes and digests: existence is still checked
    (a missing hs file, rewritten)."""
    _model_dir, dest, _rows, _post = hidden
    out = tmp_path / "spec"
    export_hidden(str(dest), ["speculators"], out)
    clean = _bytes(out)
    (out / "token_freq.pt").write_bytes(b"trunc")
    lines: list[str] = []
    export_hidden(str(dest), ["speculators"], out, echo=lines.append)
    assert any("changed: token_freq.pt" in ln and "writing the whole export again" in ln for ln in lines), lines
    after = _bytes(out)
    assert after["token_freq.pt"] == clean["token_freq.pt"] and set(after) == set(clean)
    # an export.json written before sizes and digests (schema 2): a missing file is still found and rewritten
    obj = json.loads((out / EXPORT_REPORT).read_text())
    for key in ("sizes", "sha256"):
        obj.pop(key)
    obj["schema_version"] = 2
    (out / EXPORT_REPORT).write_text(json.dumps(obj))
    (out / "hidden_states" / "hs_0.safetensors").unlink()
    lines.clear()
    export_hidden(str(dest), ["speculators"], out, echo=lines.append)
    assert any("missing: hidden_states/hs_0.safetensors" in ln and "rewrote them" in ln for ln in lines), lines
    assert (out / "hidden_states" / "hs_0.safetensors").read_bytes() == clean["hidden_states/hs_0.safetensors"]
    assert read_json(out / EXPORT_REPORT, HiddenExportReport).sha256 == {
        "hidden_states/hs_0.safetensors": hashlib.sha256(clean["hidden_states/hs_0.safetensors"]).hexdigest()}
