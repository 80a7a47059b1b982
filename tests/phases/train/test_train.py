"""``draftgen train`` (draftgen.phases.train): speculators 0.9 trains a drafter on a tiny target's real hidden
states on the CPU, resumes from its last checkpoint, and the result loads with speculators' own loader and
carries what vLLM's speculators config parser and SGLang's EAGLE-3 loader read.

speculators runs in its own environment (.venv-speculators, or ``DRAFTGEN_SPECULATORS``), as in production.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import config_dict, write_config  # noqa: E402
from _extract_helpers import build_tiny_model  # noqa: E402
from _hidden_export_helpers import make_hidden_set, run_in_speculators, speculators_python  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.errors import ConfigError  # noqa: E402
from draftgen.phases.train.convert import EAGLE_ARCH, REQUIRED_TENSORS  # noqa: E402
from draftgen.phases.train.launch import offline_al, parse_metrics  # noqa: E402
from draftgen.phases.train.run import run_train  # noqa: E402
from draftgen.phases.train.trainer import read_report  # noqa: E402
from draftgen.phases.train.vocab import build_vocab_mapping  # noqa: E402
from draftgen.records import TrainLogRecord, TrainOnlineReport  # noqa: E402
from draftgen.rundir import RunDir  # noqa: E402
from draftgen.store import iter_jsonl  # noqa: E402

DRAFT_VOCAB = 256


def _config(tmp: Path, model_dir: Path, hidden: Path, **train: Any) -> Path:
    data = config_dict(tmp, progress="off",
                       hidden_states={"model": str(model_dir), "output": str(hidden)},
                       train={"speculators": str(speculators_python()), "draft_vocab_size": DRAFT_VOCAB,
                              "total_seq_len": 256, "epochs": 1, "ttt_steps": 3, **train})
    return write_config(tmp, data, "train.yaml")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training run of 1 epoch (its samples loaded by a spawned DataLoader worker), then a rerun asking for 2
    epochs (which must resume; loaded in the trainer's process)."""
    torch.set_num_threads(1)
    speculators_python()
    root = tmp_path_factory.mktemp("train")
    model_dir = build_tiny_model(root / "target", layers=8, hidden=64)
    hidden, rows = make_hidden_set(model_dir, root / "hidden", n=12)
    cfg1 = load_config(_config(root, model_dir, hidden, num_workers=1))
    lines: list[str] = []
    first = run_train(cfg1, echo=lines.append, argv=["draftgen", "train"])
    log1 = [r for _, r in iter_jsonl(RunDir(cfg1.run_path).train_log, TrainLogRecord)]
    cfg2 = load_config(_config(root, model_dir, hidden, epochs=2))
    second = run_train(cfg2, echo=lines.append, argv=["draftgen", "train"])
    log2 = [r for _, r in iter_jsonl(RunDir(cfg2.run_path).train_log, TrainLogRecord)]
    return {"rd": RunDir(cfg2.run_path), "first": first, "second": second, "log1": log1, "log2": log2,
            "lines": lines, "rows": rows, "model_dir": model_dir, "root": root, "hidden": hidden}


def test_train_streams_loss_and_per_step_accuracy(trained: dict[str, Any]) -> None:
    first, log1 = trained["first"], trained["log1"]
    steps = [r for r in log1 if r.kind == "train"]
    assert first.first_step == 0 and first.steps_this_run == len(steps) > 0
    assert [r.global_step for r in steps] == list(range(len(steps)))
    assert all(len(r.loss_k) == 3 and len(r.cond_acc_k) == 3 and len(r.full_acc_k) == 3 for r in steps)
    assert all(r.loss > 0 for r in steps)
    vals = [r for r in log1 if r.kind == "val"]
    assert len(vals) == 1 and len(vals[0].cond_acc_k) == 3
    assert first.final_val == vals[0] and first.offline_al == round(offline_al(vals[0].cond_acc_k), 4)
    assert any("validation loss" in x for x in trained["lines"])
    assert first.steps_per_s and first.steps_per_s > 0
    print(f"\ntrain steps/s on CPU (incl. speculators start-up): {first.steps_per_s}, "
          f"{first.steps_this_run} steps in {first.seconds} s")


def test_rerun_resumes_from_the_last_checkpoint(trained: dict[str, Any]) -> None:
    first, second, log2 = trained["first"], trained["second"], trained["log2"]
    n1 = first.last_step
    assert second.first_step == n1 > 0
    new = [r for r in log2 if r.kind == "train"][first.steps_this_run:]
    assert new and new[0].global_step == n1 and new[0].epoch == 1  # continues: no restart at step 0 / epoch 0
    assert second.last_step == n1 + second.steps_this_run
    ckpts = trained["rd"].train_checkpoints
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["0", "1"]
    assert read_report(trained["rd"]) == second


def test_checkpoint_loads_with_speculators_and_has_what_vllm_reads(trained: dict[str, Any]) -> None:
    drafter = trained["rd"].train_drafter
    cfg = json.loads((drafter / "config.json").read_text())
    # the keys vLLM's speculators config parser reads (transformers_utils/configs/speculators)
    assert cfg["speculators_model_type"] == "eagle3"
    sc = cfg["speculators_config"]
    assert sc["proposal_methods"][0]["speculative_tokens"] == 3
    assert sc["default_proposal_method"] == "greedy" and sc["algorithm"] == "eagle3"
    assert sc["verifier"]["name_or_path"] == str(trained["model_dir"])
    assert sc["verifier"]["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    assert cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # vLLM convention, unshifted
    assert "norm_before_residual" in cfg and "target_hidden_size" in cfg
    code = (
        "import sys, json, torch\n"
        "from speculators.models.eagle3 import Eagle3DraftModel\n"
        "m = Eagle3DraftModel.from_pretrained(sys.argv[1])\n"
        "sd = m.state_dict()\n"
        "print(json.dumps({'ids': list(m.config.eagle_aux_hidden_state_layer_ids),"
        " 'vocab': m.config.draft_vocab_size, 'd2t': sd['d2t'].tolist(), 't2d': int(sd['t2d'].sum()),"
        " 'fc': list(sd['fc.weight'].shape)}))\n"
    )
    got = json.loads(run_in_speculators(code, str(drafter)).strip().splitlines()[-1])
    assert got["ids"] == [2, 4, 5] and got["vocab"] == DRAFT_VOCAB and got["fc"] == [64, 192]
    import numpy as np

    d2t = np.load(trained["rd"].train_vocab / "d2t.npy")
    assert got["d2t"] == d2t.tolist() and got["t2d"] == DRAFT_VOCAB


def test_eagle3_flat_export_has_the_names_sglang_and_vllm_map(trained: dict[str, Any]) -> None:
    import numpy as np
    from safetensors import safe_open

    out = trained["rd"].train_eagle
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [EAGLE_ARCH] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == DRAFT_VOCAB
    assert cfg["vocab_size"] == json.loads((trained["model_dir"] / "config.json").read_text())["vocab_size"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang: vLLM id - 1
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["hidden_size"] == 64 and cfg["head_dim"] == 16
    with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
        d2t = fh.get_tensor("d2t").numpy()
        t2d = fh.get_tensor("t2d").numpy()
    assert set(REQUIRED_TENSORS) <= names
    midlayer = {"midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
                "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
                "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
                "midlayer.mlp.down_proj.weight"}
    assert midlayer <= names and not any(n.startswith("layers.") for n in names)
    # d2t holds OFFSETS: target id = i + d2t[i], exactly the ids t2d marks
    target_ids = np.arange(DRAFT_VOCAB) + d2t
    assert t2d.dtype == bool and int(t2d.sum()) == DRAFT_VOCAB and t2d[target_ids].all()
    assert (np.diff(target_ids) > 0).all()


def test_vocab_mapping_equals_speculators_own() -> None:
    import random

    rnd = random.Random(3)
    freq = {rnd.randrange(0, 5000): rnd.choice([1, 1, 2, 3, 7]) for _ in range(400)}  # many ties
    drafts = (64, 300, 600)  # 600 > distinct tokens seen: padded with the lowest free ids
    code = (
        "import sys, json\n"
        "from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution as b\n"
        "f = {int(k): v for k, v in json.loads(sys.argv[1]).items()}\n"
        "out = [b(f, n, 5000) for n in json.loads(sys.argv[2])]\n"
        "print(json.dumps([[d.tolist(), t.nonzero().flatten().tolist()] for d, t in out]))\n"
    )
    got = json.loads(run_in_speculators(code, json.dumps(freq), json.dumps(drafts)).strip().splitlines()[-1])
    for draft, (theirs_d2t, theirs_t2d) in zip(drafts, got, strict=True):
        d2t, t2d = build_vocab_mapping(freq, draft, 5000)
        assert d2t.tolist() == theirs_d2t
        assert t2d.nonzero()[0].tolist() == theirs_t2d
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        build_vocab_mapping(freq, 6000, 5000)


def test_parse_metrics_and_offline_al() -> None:
    line = ('@@draftgen-metrics {"step": 4, "train": {"loss_0": 0.5, "full_acc_0": 0.4, "cond_acc_0": 0.4, '
            '"loss_1": 0.6, "full_acc_1": 0.2, "cond_acc_1": 0.5, "loss": 1.1}, "profile": {"tokens_per_s": 9.0},'
            ' "epoch": 1, "lr": {"Muon": 0.001, "AdamW": 0.001}, "global_step": 4}')
    rec = parse_metrics(line)
    assert rec is not None and rec.kind == "train" and rec.global_step == 4 and rec.epoch == 1
    assert rec.loss_k == [0.5, 0.6] and rec.cond_acc_k == [0.4, 0.5] and rec.lr == 0.001
    assert parse_metrics("Epoch 0 100%") is None
    assert offline_al([0.4, 0.5]) == pytest.approx(1 + 0.4 + 0.2)
    assert offline_al([]) == 1.0


def test_missing_speculators_is_a_config_error(trained: dict[str, Any], tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, trained["model_dir"], trained["hidden"], speculators=str(tmp_path / "no")))
    with pytest.raises(ConfigError, match="does not exist"):
        run_train(cfg, echo=lambda s: None, argv=["draftgen", "train"])


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_train_reads_the_states_in_place_no_second_copy(trained: dict[str, Any]) -> None:
    """train/inputs/ holds the index speculators needs, never a state: the runner reads the set's own files."""
    import datasets

    from draftgen.phases.train.inputs import INDEX_FORMAT, STATES_MAP, StatesMap
    from draftgen.records import HiddenExportReport
    from draftgen.store import read_json

    rd, hidden = trained["rd"], trained["hidden"]
    inputs = rd.train_inputs
    assert not [p for p in rd.root.joinpath("train").rglob("hs_*.safetensors")]
    assert not (inputs / "hidden_states").exists()
    sizes = {p.name: p.stat().st_size for p in inputs.rglob("*") if p.is_file()}
    assert sizes and max(sizes.values()) <= 64 * 1024, sizes  # the 12-sample index; the set's files are ~34 KB each
    set_bytes = _tree_bytes(hidden / "states")
    fraction = sum(sizes.values()) / set_bytes
    assert fraction < 0.1, fraction  # the copy this replaces was ~0.9 of the set here (H=64: tiny states)
    smap = read_json(inputs / STATES_MAP, StatesMap)
    assert Path(smap.root) == hidden.resolve() and len(smap.files) == len(trained["rows"])
    assert all((hidden / f).is_file() for f in smap.files) and smap.dtype == "bfloat16" and smap.n_aux == 3
    assert read_json(inputs / "export.json", HiddenExportReport).format == INDEX_FORMAT
    # 5 bytes a token on disk: int32 ids, int8 masks; speculators gets them as int64 (datasets' torch format)
    ds = datasets.load_from_disk(str(inputs))
    assert (ds.features["input_ids"].feature.dtype, ds.features["loss_mask"].feature.dtype) == ("int32", "int8")
    assert ds[0]["input_ids"].dtype == torch.int64 and ds[0]["loss_mask"].dtype == torch.int64
    print(f"\ntrain/inputs/: {sum(sizes.values())} B for a {set_bytes} B set (fraction {fraction:.4f})")


def test_index_replaces_an_earlier_full_copy(trained: dict[str, Any], tmp_path: Path) -> None:
    from draftgen.hidden.format import open_hidden
    from draftgen.phases.train.inputs import STATES_MAP, build_index

    out = tmp_path / "inputs"
    (out / "hidden_states").mkdir(parents=True)
    (out / "hidden_states" / "hs_0.safetensors").write_bytes(b"x" * 1000)
    (out / "export.json").write_text('{"format": "speculators"}')
    rep = build_index(open_hidden(str(trained["hidden"])), out)
    assert rep is not None and rep.samples == len(trained["rows"]) and (out / STATES_MAP).is_file()
    assert not (out / "hidden_states").exists()
    assert build_index(open_hidden(str(trained["hidden"])), out) == rep  # up to date: reused as it is


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_runner_states_equal_the_speculators_export_byte_for_byte(trained: dict[str, Any], tmp_path: Path,
                                                                  dtype: str) -> None:
    """What the runner builds in memory from a state file is exactly the speculators export's hs_{i} file."""
    from draftgen.hidden.exports import export_hidden
    from draftgen.hidden.format import open_hidden
    from draftgen.phases.train.inputs import STATES_MAP, build_index
    from draftgen.phases.train.launch import RUNNER

    hidden = trained["hidden"] if dtype == "bf16" else make_hidden_set(trained["model_dir"], tmp_path / "h8",
                                                                       n=4, dtype=dtype)[0]
    export_hidden(str(hidden), ["speculators"], tmp_path / "copy")
    build_index(open_hidden(str(hidden)), tmp_path / "index")
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(RUNNER.parent)!r})\n"
        "import speculators_runner as r\n"
        "from safetensors.torch import load_file\n"
        "t = r.StatesTransfer(sys.argv[1])\n"
        "n = 0\n"
        "for i in range(len(t.files)):\n"
        "    got, want = t.get_cached(i), load_file(f'{sys.argv[2]}/hs_{i}.safetensors')\n"
        "    assert sorted(got) == sorted(want), (sorted(got), sorted(want))\n"
        "    for k in want:\n"
        "        a, b = got[k], want[k]\n"
        "        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)\n"
        "        assert a.contiguous().view(torch.uint8).equal(b.view(torch.uint8)), (i, k)\n"
        "    n += 1\n"
        "assert t.get_cached(len(t.files)) is None\n"
        "print('same', n)\n"
    )
    out = run_in_speculators(code, str(tmp_path / "index" / STATES_MAP), str(tmp_path / "copy" / "hidden_states"))
    assert out.strip().splitlines()[-1] == f"same {4 if dtype == 'fp8' else len(trained['rows'])}"


def test_the_runner_refuses_a_state_file_changed_after_extraction(tmp_path: Path) -> None:
    """The in-place read path checks each file's bytes against the manifest's sha256 (as every Source read
    does): a state file overwritten after extraction stops it with a line naming the file and the fix."""
    import importlib.util

    from draftgen.hidden.format import open_hidden
    from draftgen.phases.train.inputs import STATES_MAP, build_index
    from draftgen.phases.train.launch import RUNNER

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "target", layers=8, hidden=32)
    hidden, _rows = make_hidden_set(model_dir, tmp_path / "hidden", n=3, digests=True)
    build_index(open_hidden(str(hidden)), tmp_path / "index")
    spec = importlib.util.spec_from_file_location("speculators_runner", RUNNER)
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)  # standard library only at import: speculators is imported on use
    transfer = runner.StatesTransfer(str(tmp_path / "index" / STATES_MAP))
    assert len(transfer.sha256) == 3 and all(transfer.sha256)
    assert set(transfer.get_cached(1)) == {"hidden_states", "token_ids"}  # unchanged: read as it is
    victim = hidden / transfer.files[1]
    data = bytearray(victim.read_bytes())
    data[-4:] = b"\xff\xff\xff\x7f"  # the last value of the last tensor, overwritten in place
    victim.write_bytes(bytes(data))
    with pytest.raises(runner.ChangedStateFile) as info:
        transfer.get_cached(1)
    msg = str(info.value)
    assert msg.startswith(f"{hidden.resolve() / transfer.files[1]}: changed after extraction") and "\n" not in msg
    assert "rerun draftgen extract" in msg


# -- no drafter from nothing (issue 31 item 5) ---------------------------------------------------------------


def _bits(text: str) -> set[int]:
    """A marker's row bitmap (base64, bit r of byte r // 8) as a set of rows."""
    import base64

    return {i * 8 + j for i, byte in enumerate(base64.b64decode(text)) for j in range(8) if byte >> j & 1}


def test_train_json_says_how_many_samples_the_drafter_saw(trained: dict[str, Any]) -> None:
    """Both runs of the fixture trained on every row of the training split (10 of 12; 2 validate), the first
    through a spawned DataLoader worker (the rows cross the process with the batch). The resumed run's drafter
    saw the same 10 rows again: distinct samples, carried over from the checkpoint it resumed, not 20 and not
    only the second run's."""
    first, second, rd = trained["first"], trained["second"], trained["rd"]
    assert (first.train_rows, first.samples_asked, first.samples_trained) == (10, 10, 10)
    assert (second.train_rows, second.samples_asked, second.samples_trained) == (10, 10, 10)
    assert first.min_trained_fraction == 0.5 and first.exit_code == 0 and read_report(rd).samples_trained == 10
    for epoch in ("0", "1"):
        samples = json.loads((rd.train_checkpoints / epoch / "draftgen-complete.json").read_text())["samples"]
        assert samples["rows"] == 10 and _bits(samples["asked_bits"]) == _bits(samples["trained_bits"]) == set(range(10))
    assert any("it trained on 10 of the 10 samples its batches asked for (100%; a training split of 10 of 12 rows)"
               in x for x in trained["lines"])


def test_the_count_is_of_every_ranks_training_batches(trained: dict[str, Any], tmp_path: Path) -> None:
    """Two trainer processes (torchrun, gloo), stopped after 2 steps: the rows counted are exactly those of the
    first 2 batches of each rank, as speculators' own sampler deals them (asked here in speculators' Python,
    from the set's lengths and the seed): rank 1's are not lost."""
    from _common_helpers import free_port

    cfg = load_config(_config(tmp_path, trained["model_dir"], trained["hidden"], nproc_per_node=2, max_steps=2,
                              total_seq_len=128, master_port=free_port()))
    rep = run_train(cfg, echo=lambda s: None, argv=["draftgen", "train"])
    lengths = [len(r[1]) for r in trained["rows"]][:10]  # the training split: the first 10 rows
    code = (
        "import sys, json\n"
        "from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2 as S\n"
        "lengths, rows = json.loads(sys.argv[1]), set()\n"
        "for rank in range(2):\n"
        "    s = S(batch_max_length=128, lengths=lengths, num_replicas=2, rank=rank, seed=0)\n"
        "    s.set_epoch(0)\n"
        "    for b in list(s)[:2]:\n"
        "        rows.update(int(i) for i in b)\n"
        "print(json.dumps(sorted(rows)))\n"
    )
    dealt = set(json.loads(run_in_speculators(code, json.dumps(lengths)).strip().splitlines()[-1]))
    assert rep.processes == 2 and rep.steps_this_run == 2 and 0 < len(dealt) < 10
    marker = RunDir(cfg.run_path).train_checkpoints / "0" / "draftgen-complete.json"
    samples = json.loads(marker.read_text())["samples"]
    assert _bits(samples["asked_bits"]) == _bits(samples["trained_bits"]) == dealt  # every sample has loss tokens
    assert (rep.samples_asked, rep.samples_trained, rep.train_rows) == (len(dealt), len(dealt), 10)


def test_a_drafter_that_trained_on_nothing_is_not_published(trained: dict[str, Any], tmp_path: Path) -> None:
    """Batches of 8 tokens cut every sample before its first loss token (the masks start at token 10): 10 steps
    on no data, validation loss 0 (issue 31 item 1's drafter, offline). ``train --restart`` in a copy of the
    fixture's run exits 3 with one line; the drafter published before moves to train/previous/ with its
    train.json; this run's train.json says why and what it trained on. A rerun resumes the same drafter and
    is refused again."""
    from click.testing import CliRunner

    from draftgen.cli import cli

    shutil.copytree(trained["root"] / "run", tmp_path / "run", symlinks=True)
    rd = RunDir(tmp_path / "run")
    before = {p.relative_to(rd.train): p.read_bytes() for d in (rd.train_drafter, rd.train_eagle) for p in d.rglob("*")}
    old_report = (rd.train / "train.json").read_bytes()
    cfg = _config(tmp_path, trained["model_dir"], trained["hidden"], total_seq_len=8)
    res = CliRunner().invoke(cli, ["train", str(cfg), "--restart"])
    assert res.exit_code == 3, res.output
    errors = [x for x in res.output.splitlines() if x.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    assert ("it trained on 0 of the 10 samples its batches asked for (0%; a training split of 10 of 12 rows), "
            "under train.min_trained_fraction 0.5") in errors[0] and str(rd.train_speculators_log) in errors[0]
    assert not rd.train_drafter.exists() and not rd.train_eagle.exists()
    prev = rd.train_previous
    assert {p.relative_to(prev): p.read_bytes() for d in (prev / "drafter", prev / "eagle3") for p in d.rglob("*")} \
        == before
    assert (prev / "train.json").read_bytes() == old_report
    rep = read_report(rd)
    assert rep.exit_code == 3 and rep.message == errors[0].removeprefix("Error: ")
    assert rep.checkpoint is None and rep.eagle_checkpoint is None and rep.serve is None
    assert (rep.samples_trained, rep.samples_asked, rep.train_rows, rep.first_step) == (0, 10, 10, 0)
    again = CliRunner().invoke(cli, ["train", str(cfg)])
    assert again.exit_code == 3 and "it trained on 0 of the 10 samples" in again.output, again.output
    assert not rd.train_drafter.exists() and (prev / "train.json").read_bytes() == old_report


class _Refusing:
    """A session with its own reason to refuse the drafter (online: the checking proxy's gate)."""

    def __init__(self, why: str) -> None:
        self.why, self.asked = why, 0

    def report(self) -> TrainOnlineReport:
        return TrainOnlineReport(servers=["http://127.0.0.1:1"], server_models=["m"], rows=12, rows_sha256="",
                                 preflight_rows=0, preflight_checks=[], requests=10, excluded=10)

    def refusal(self) -> str | None:
        self.asked += 1
        return self.why


def test_a_session_that_refuses_keeps_the_drafter_unpublished(trained: dict[str, Any], tmp_path: Path) -> None:
    """train_prepared asks its session once training ended: a refusal is handled as the floor's (train.json
    with exit_code 3 and the session's line, nothing published, ThresholdBroken), though the floor passed."""
    from draftgen.errors import ThresholdBroken
    from draftgen.phases.train.offline import prepare_offline
    from draftgen.phases.train.trainer import train_prepared
    from draftgen.rundir.claim import writer

    cfg = load_config(_config(tmp_path, trained["model_dir"], trained["hidden"], max_steps=1, total_seq_len=128))
    session = _Refusing("train --online: 10 of 10 samples failed a check; see train.json")
    with pytest.raises(ThresholdBroken) as err, writer(cfg, "train") as rd:
        prep = prepare_offline(cfg, rd, lambda s: None, False)
        train_prepared(cfg, rd, lambda s: None, prep, restart=False, session=session)
    assert str(err.value) == session.why and err.value.exit_code == 3 and session.asked == 1
    rd = RunDir(cfg.run_path)
    assert not rd.train_drafter.exists() and not rd.train_eagle.exists() and not rd.train_previous.exists()
    rep = read_report(rd)
    assert rep.exit_code == 3 and rep.message == session.why and rep.checkpoint is None
    assert rep.online is not None and rep.online.excluded == 10
    assert rep.samples_trained is not None and rep.samples_trained == rep.samples_asked > 0  # the floor passed


def test_the_floor_is_a_share(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train.min_trained_fraction 1.5 must be in \[0, 1\]"):
        load_config(write_config(tmp_path, config_dict(tmp_path, train={"min_trained_fraction": 1.5})))
