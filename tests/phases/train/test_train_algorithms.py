"""Every speculators algorithm from one capture (issue 25 item 2).

One real extraction (a merged run from the emulator pipeline, a tiny Qwen3 target, the hf backend) stores
the superset of layers ``[2, 3, 4, 5, 6]`` + 8: EAGLE-3's three and DFlash's five. From that one set,
``draftgen train`` trains P-EAGLE, DFlash, DFlash-2, DSpark and XPress with speculators 0.9 on the CPU (one
step each; eagle3 is tests/phases/train/test_train.py's, eagle3.1 tests/phases/train/test_train_online.py's),
each taking its own layers; speculators' own loader loads every result; draftgen's P-EAGLE drafter reproduces
speculators' own P-EAGLE forward; and ``draftgen emulate --drafter`` serves the P-EAGLE drafter (exactly plain
greedy output) while ``draftgen accept`` measures it; and speculators' own online client
(``generate_hidden_states``, its file transfer, ``check_hidden_states``) reads ``draftgen emulate --model``'s
extract mode as it reads ``vllm serve``. The sizes given to speculators (``extra_args``: one draft layer,
blocks of 4, few anchors, small heads) only make the CPU steps short; the algorithms are speculators' own.
The tests that train (the ``trained`` fixture) are marked slow: a plain pytest runs only the extraction's
check; scripts/test runs them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run  # noqa: E402
from _hidden_export_helpers import run_in_speculators, speculators_python  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.hidden.algorithms import algorithm  # noqa: E402
from draftgen.phases.extract.run import run_extract  # noqa: E402
from draftgen.phases.train.run import run_train  # noqa: E402
from draftgen.records import TrainReport  # noqa: E402

SMALL = ["--num-layers", "1", "--block-size", "4", "--max-anchors", "16"]
ALGS: dict[str, list[str]] = {
    "peagle": ["--num-depths", "3", "--max-anchors", "16"],
    "dflash": SMALL,
    "dflash2": SMALL,
    "dspark": [*SMALL, "--markov-rank", "8"],
    "xpress": [*SMALL, "--xpress-rank", "8"],
}


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.set_num_threads(1)
    speculators_python()
    tmp = tmp_path_factory.mktemp("algs")
    target = build_tiny_model(tmp / "target", layers=8, hidden=32)
    cfg_path = make_merged_run(tmp, n_chat=6, n_code=4, max_tokens=24, held_out=2, model=str(target), backend="hf",
                               device="cpu", layer_ids=[2, 3, 4, 5, 6], teacher_fraction=0.0, dtype="bf16")
    lines: list[str] = []
    run_extract(load_config(cfg_path), echo=lines.append)
    return {"tmp": tmp, "target": target, "cfg": cfg_path, "extract_lines": lines}


@pytest.fixture(scope="module")
def trained(capture: dict[str, Any]) -> dict[str, TrainReport]:
    base = yaml.safe_load(capture["cfg"].read_text())
    out: dict[str, TrainReport] = {}
    for name, extra in ALGS.items():
        data = {**base, "run_dir": str(capture["tmp"] / name / "run"),
                "train": {"speculators": str(speculators_python()), "hidden": str(capture["tmp"] / "run" / "hidden"),
                          "algorithm": name, "draft_vocab_size": 64, "total_seq_len": 96, "epochs": 1,
                          "max_steps": 1, "extra_args": extra}}
        out[name] = run_train(load_config(write_config(capture["tmp"] / name, data)), echo=lambda s: None)
    return out


def test_extract_says_which_algorithms_the_set_feeds(capture: dict[str, Any]) -> None:
    feeds = next(x for x in capture["extract_lines"] if "feeds" in x)
    assert "layers [2, 3, 4, 5, 6] + final 8: feeds eagle3, eagle3.1, peagle, dflash, dflash2, dspark, xpress" in feeds
    assert any("every algorithm from one capture: hidden_states.layer_ids [2, 3, 4, 5, 6]" in x
               for x in capture["extract_lines"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGS))
def test_each_algorithm_trains_on_its_own_layers_of_the_one_set(trained: dict[str, TrainReport], name: str) -> None:
    rep, alg = trained[name], algorithm(name)
    assert rep.algorithm == name and rep.speculator_type == alg.speculator_type and rep.steps_this_run == 1
    assert rep.layer_ids == ([2, 4, 5] if alg.rule == "eagle3" else [2, 3, 4, 5, 6])
    assert rep.checkpoint and rep.eagle_checkpoint is None  # no flat EAGLE-3 copy outside the EAGLE-3 family
    cfg = json.loads((Path(rep.checkpoint) / "config.json").read_text())
    assert cfg["speculators_model_type"] == alg.speculator_type
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("aux_hidden_state_layer_ids")
    assert ids == rep.layer_ids  # vLLM convention, unshifted
    assert rep.verifier_norm_sha256 is not None  # the trainer turned the final state post-norm with the target's norm
    assert rep.serve is not None and rep.serve.startswith("vllm serve ")
    if alg.vllm is not None:
        assert f'"method": "{json.loads(alg.vllm.replace("K", "1"))["method"]}"' in rep.serve
    if name in ("dflash", "dflash2", "dspark"):
        assert rep.offline_eal is not None and rep.offline_eal >= 1.0  # speculators' offline validation estimate
    if name == "dflash2":
        assert rep.draft_vocab_size == 151669  # over the whole target vocabulary


@pytest.mark.slow
def test_speculators_reads_what_draftgen_makes(capture: dict[str, Any], trained: dict[str, TrainReport],
                                              tmp_path: Path) -> None:
    """In speculators' own Python: its loader (``SpeculatorModel.from_pretrained``) loads each checkpoint;
    draftgen's P-EAGLE drafter gives the logits speculators' PEagleDraftModel gives for the same parallel
    group; its online client reads the emulator's extract mode (a file it loads, checks and deletes)."""
    from draftgen.drafter.eagle3 import load_drafter

    torch.manual_seed(0)
    n, k, H = 7, 3, 32
    aux, ids = torch.randn(n, 3 * H), torch.randint(0, 400, (n,))
    torch.save({"aux": aux, "ids": ids}, tmp_path / "in.pt")
    code = """
import json, sys, torch
from speculators.model import SpeculatorModel
import speculators.models.peagle.core as core
paths, inp, out = json.loads(sys.argv[1]), torch.load(sys.argv[2]), sys.argv[3]
loaded = {}
for name, path in paths.items():
    m = SpeculatorModel.from_pretrained(path)
    loaded[name] = type(m).__name__
cls = SpeculatorModel.registry["peagle"]
config = cls.config_class.from_pretrained(paths["peagle"])
config.transformer_layer_config._attn_implementation = "eager"  # as speculators' trainer sets it on a CPU
m = cls.from_pretrained(paths["peagle"], config=config).float().eval()
n, k = inp["ids"].shape[0], 3
anchor = torch.cat([torch.arange(n), torch.full((k - 1,), n - 1)])
depth = torch.cat([torch.zeros(n, dtype=torch.long), torch.arange(1, k)])
core.generate_cod_sample_indices = lambda **kw: (anchor, depth)
got = {}
def metrics(logits, **kw):
    got["logits"] = logits
    return torch.zeros(()), {}
core.compute_metrics = metrics
t = n + k - 1  # the rollout's rows index positions past the anchor (never read for them: mask token, mask_hidden)
aux = torch.cat([inp["aux"], torch.zeros(k - 1, inp["aux"].shape[1])])
ids = torch.cat([inp["ids"], torch.zeros(k - 1, dtype=inp["ids"].dtype)])
with torch.no_grad():
    m(hidden_states=aux[None], input_ids=ids[None], document_ids=torch.zeros(1, t, dtype=torch.long),
      loss_mask=torch.ones(1, t), verifier_last_hidden_states=torch.zeros(1, t, m.hidden_size), num_depths=k)
torch.save(got["logits"][0, n - 1:], out)
import openai
from pathlib import Path
from hs_connectors import FileTransfer
from speculators.data_generation.vllm_client import generate_hidden_states
from speculators.data_generation.offline import check_hidden_states
client = openai.OpenAI(base_url=sys.argv[4], api_key="EMPTY", max_retries=0)
ids = json.loads(sys.argv[5])
handle, params = generate_hidden_states(client, client.models.list().data[0].id, {"input_ids": ids}, timeout=60,
                                        max_retries=0)
transfer = FileTransfer(Path("unused"))
hs = transfer.get_generated(params)
check_hidden_states(hs, ids)
transfer.delete(handle)
loaded["online"] = [list(hs["hidden_states"].shape), Path(handle).exists()]
print(json.dumps(loaded))
"""
    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread

    paths = {name: rep.checkpoint for name, rep in trained.items()}
    prompt = list(range(3, 40))
    with start_in_thread(ModelServerOptions(model=str(capture["target"]), port=0, threads=1,
                                            extract_dir=str(tmp_path / "hs"))) as srv:
        out = run_in_speculators(code, json.dumps(paths), str(tmp_path / "in.pt"), str(tmp_path / "out.pt"),
                                 srv.base_url, json.dumps(prompt))
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded == {"peagle": "PEagleDraftModel", "dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel",
                      "dspark": "DSparkDraftModel", "xpress": "XPressDraftModel",
                      "online": [[len(prompt), 4, 32], False]}  # the emulator captures [2, 4, 5] + 8 by default
    want = torch.load(tmp_path / "out.pt").float()
    drafter = load_drafter(trained["peagle"].checkpoint or "")
    _, logits = drafter.parallel(aux, ids, k)  # type: ignore[attr-defined]
    torch.testing.assert_close(logits, want, rtol=2e-3, atol=2e-3)


@pytest.mark.slow
def test_the_peagle_drafter_is_served_exactly_and_accept_measures_it(capture: dict[str, Any],
                                                                     trained: dict[str, TrainReport]) -> None:
    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread
    from draftgen.phases.accept.run import run_accept

    drafter = Path(trained["peagle"].checkpoint or "")
    cfg = load_config(capture["cfg"], {"accept.prompts": 2, "accept.max_tokens": 12, "accept.server": "vllm"})
    with start_in_thread(ModelServerOptions(model=str(capture["target"]), port=0, threads=1, drafter=str(drafter),
                                            served_model_name=cfg.model.id, num_speculative_tokens=3)) as srv:
        rep = run_accept(cfg, drafter=drafter, base_url=srv.base_url, echo=lambda s: None)
        lm = srv.server.lm
        prompt = [5, 17, 99, 3, 250, 11]
        spec = srv.server.spec
        assert spec is not None
        res = spec.generate(prompt, max_new=10, eos_ids=lm.eos_ids)
    from draftgen.drafter.speculate import greedy_generate

    assert res.ids == greedy_generate(lm.model, prompt, max_new_tokens=len(res.ids), eos_ids=list(lm.eos_ids))
    a = rep.acceptance
    assert rep.k == 3 and a.drafts > 0 and 1.0 <= a.acceptance_length <= 4.0 and len(a.per_position) == 3
