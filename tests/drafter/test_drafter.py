"""``drafter.model`` computes exactly speculators 0.9.0's Eagle3 draft forward.

speculators lives in its own environment (its pins conflict with draftgen's), so a subprocess run by that
environment's Python builds random ``Eagle3DraftModel``s for several switch combinations, saves each with its
own ``save_pretrained`` and runs its own teacher-forced forward (eager attention, 3 TTT steps) on random aux
states, recording the logits of every step (a hook on ``lm_head``). draftgen's drafter loads the same folder
and must give the same logits, both through its teacher-forced forward and through its inference path
(step 0 over a prefix, then chain steps fed the teacher tokens). The flat EAGLE/SGLang format (``midlayer.*``)
of the same weights must load to the same model. ``DRAFTGEN_SPECULATORS_PYTHON`` names that Python
(default: ``<checkout>/.venv-speculators/bin/python``); without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

from _common_helpers import CHECKOUT  # noqa: E402
from draftgen.drafter.eagle3 import load_drafter, read_drafter_config  # noqa: E402
from draftgen.errors import InputError  # noqa: E402

SPEC_PY = Path(os.environ.get("DRAFTGEN_SPECULATORS_PYTHON") or CHECKOUT / ".venv-speculators" / "bin" / "python")

CASES = {
    "llama_nbr": {"seed": 1, "arch": "llama", "nbr": True, "nbf": False, "fcn": False, "no": False},
    "qwen3_nbf_out_2l": {"seed": 2, "arch": "qwen3", "nbr": False, "nbf": True, "fcn": False, "no": True, "layers": 2},
    "llama_fcnorm": {"seed": 3, "arch": "llama", "nbr": False, "nbf": False, "fcn": True, "no": False},
}

SCRIPT = r'''
import json, sys, torch
from pathlib import Path
from transformers import LlamaConfig, Qwen3Config
from safetensors.torch import save_file
from speculators.models.eagle3 import Eagle3SpeculatorConfig
from speculators.models.eagle3.core import Eagle3DraftModel
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig

torch.set_num_threads(1)
out = Path(sys.argv[1])
for name, case in json.loads(sys.argv[2]).items():
    torch.manual_seed(case["seed"])
    H, V, DV, T = 32, 96, 48, 12
    common = dict(hidden_size=H, intermediate_size=64, num_hidden_layers=case.get("layers", 1), num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=V, max_position_embeddings=256, rms_norm_eps=1e-6, head_dim=8)
    tl = (Qwen3Config if case["arch"] == "qwen3" else LlamaConfig)(**common)
    tl._attn_implementation = "eager"
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tl, draft_vocab_size=DV, norm_before_residual=case["nbr"],
        norm_before_fc=case["nbf"], fc_norm=case["fcn"], norm_output=case["no"], eagle_aux_hidden_state_layer_ids=[2, 4, 5],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=VerifierConfig(name_or_path=None, architectures=["Qwen3ForCausalLM"])))
    m = Eagle3DraftModel(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
        ids = torch.sort(torch.randperm(V)[:DV]).values
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
    m.load_vocab_mappings(t2d, ids - torch.arange(DV))
    d = out / name
    m.save_pretrained(str(d))
    aux, inp = torch.randn(1, T, 3 * H), torch.randint(0, V, (1, T))
    logits = []
    hook = m.lm_head.register_forward_hook(lambda mod, a, o: logits.append(o.detach().clone()))
    m.eval()
    with torch.no_grad():
        drafted = m(hidden_states=aux, input_ids=inp, document_ids=torch.zeros(1, T, dtype=torch.long), ttt_steps=3)
    hook.remove()
    save_file({"aux": aux[0].contiguous(), "input_ids": inp[0].contiguous(),
               **{f"logits{j}": l[0].contiguous() for j, l in enumerate(logits)},
               **{f"drafted{j}": t[0].contiguous() for j, t in enumerate(drafted)}}, str(d.parent / f"{name}.io.safetensors"))
print("ok")
'''


@pytest.fixture(scope="module")
def spec_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SPEC_PY.is_file():
        pytest.skip(f"speculators environment not found at {SPEC_PY}: set DRAFTGEN_SPECULATORS_PYTHON")
    out = tmp_path_factory.mktemp("spec")
    (out / "run.py").write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
    res = subprocess.run([str(SPEC_PY), str(out / "run.py"), str(out), json.dumps(CASES)], capture_output=True,
                         text=True, timeout=300, env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_teacher_forced_forward_equals_speculators(spec_out: Path, name: str) -> None:
    torch.set_num_threads(1)
    m = load_drafter(spec_out / name)
    io = load_file(str(spec_out / f"{name}.io.safetensors"))
    mine = m.ttt_forward(io["aux"], io["input_ids"], 3)
    for j in range(3):
        torch.testing.assert_close(mine[j], io[f"logits{j}"], atol=2e-5, rtol=1e-5)
        # speculators' drafted ids are draft-vocabulary argmaxes
        assert torch.equal(mine[j].argmax(-1), io[f"drafted{j}"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_inference_chain_equals_speculators_at_every_position(spec_out: Path, name: str) -> None:
    """The KV path (step 0 over a prefix, chain steps at its last position) is speculators' forward at t."""
    m = load_drafter(spec_out / name)
    io = load_file(str(spec_out / f"{name}.io.safetensors"))
    aux, ids = io["aux"], io["input_ids"]
    for t in range(len(ids) - 2):
        toks, logits = m.chain(aux[: t + 1], ids[: t + 1], 3, forced=[int(ids[t + 1]), int(ids[t + 2])])
        for j in range(3):
            torch.testing.assert_close(logits[j], io[f"logits{j}"][t], atol=2e-5, rtol=1e-5)
        first = int(io["logits0"][t].argmax())
        assert toks[0] == int(m.to_target(torch.tensor([first]))[0])  # mapped to the target vocabulary


def _to_flat(src: Path, dst: Path) -> None:
    """The same weights in the flat EAGLE/SGLang layout (as SpecForge / to_sglang write it)."""
    d = json.loads((src / "config.json").read_text())
    tl = d["transformer_layer_config"]
    flat = {**tl, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": d["draft_vocab_size"],
            "norm_before_residual": d["norm_before_residual"], "norm_before_fc": d["norm_before_fc"],
            "fc_norm": d["fc_norm"], "norm_output": d["norm_output"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": d["eagle_aux_hidden_state_layer_ids"],
                             "use_aux_hidden_state": True}}
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(flat))
    sd = load_file(str(src / "model.safetensors"))
    out = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in sd.items()
           if k != "embed_tokens.weight"}
    save_file(out, str(dst / "model.safetensors"))


def test_flat_eagle_format_loads_to_the_same_model(spec_out: Path, tmp_path: Path) -> None:
    name = "llama_nbr"
    _to_flat(spec_out / name, tmp_path / "flat")
    ref = load_drafter(spec_out / name)
    with pytest.raises(InputError, match="embed_tokens"):
        load_drafter(tmp_path / "flat")
    flat = load_drafter(tmp_path / "flat", embed_weight=ref.embed_tokens.weight.detach().clone())
    c = read_drafter_config(tmp_path / "flat")
    assert (c.format, c.aux_layer_ids, c.norm_before_residual) == ("eagle", [2, 4, 5], True)
    io = load_file(str(spec_out / f"{name}.io.safetensors"))
    for a, b in zip(flat.ttt_forward(io["aux"], io["input_ids"], 3), ref.ttt_forward(io["aux"], io["input_ids"], 3),
                    strict=True):
        assert torch.equal(a, b)


def test_bad_checkpoint_folders_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"config\.json"):
        load_drafter(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(InputError, match="missing key"):
        read_drafter_config(tmp_path)
