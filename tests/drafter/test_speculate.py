"""``drafter.speculate``: speculative output equals plain greedy decoding; counters keep vLLM's meaning.

Uses the real tiny Qwen3 target (``drafter.tiny``), an untrained EAGLE-3 drafter (random layers, the target's
embedding and first 2048 lm_head rows, seeded) and a "perfect" proposer that drafts with the target itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from draftgen.drafter.eagle3 import DrafterConfig, Eagle3Drafter  # noqa: E402
from draftgen.drafter.speculate import (  # noqa: E402
    AuxCapture,
    greedy_generate,
    greedy_speculative_generate,
    target_forward,
)
from draftgen.drafter.tiny import build_tiny_target  # noqa: E402
from draftgen.errors import ConfigError  # noqa: E402

AUX = [2, 4, 5]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.set_num_threads(1)
    path = build_tiny_target(tmp_path_factory.mktemp("tiny") / "target")
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def drafter(target: Any) -> Eagle3Drafter:
    torch.manual_seed(100)
    c = DrafterConfig(arch="llama", hidden_size=128, num_heads=4, num_kv_heads=4, head_dim=32, rope_dim=32,
                      intermediate_size=256, num_layers=1, vocab_size=target.config.vocab_size, draft_vocab_size=2048)
    d = Eagle3Drafter(c, fc_in=3 * 128).eval()
    with torch.no_grad():
        d.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        d.lm_head.weight.copy_(target.lm_head.weight[:2048])
    return d


class Perfect:
    def __init__(self, target: Any) -> None:
        self.target = target

    def propose(self, context: Sequence[int], aux: Any, k: int) -> list[int]:
        assert aux.shape == (len(context) - 1, 3 * 128)
        return greedy_generate(self.target, context, max_new_tokens=k)


PROMPTS = [[151644, 872, 198, 785, 3974, 13876, 38835, 34208, 916, 279, 151645, 198, 151644, 77091, 198],
           [151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198]]


def test_greedy_reference_equals_transformers_generate(target: Any) -> None:
    p = PROMPTS[0]
    ref = target.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False)[0, len(p):].tolist()
    assert greedy_generate(target, p, max_new_tokens=24) == ref


@pytest.mark.parametrize("k", [1, 3])
def test_random_drafter_output_is_greedy_and_al_near_one(target: Any, drafter: Eagle3Drafter, k: int) -> None:
    for p in PROMPTS:
        res = greedy_speculative_generate(target, drafter, p, k=k, max_new_tokens=40, aux_layer_ids=AUX)
        assert res.ids == greedy_generate(target, p, max_new_tokens=40)
        assert res.drafts == res.verify_calls and res.draft_tokens == k * res.drafts
        assert res.accepted == sum(res.accepted_per_pos)
        assert res.acceptance_length is not None and res.acceptance_length < 1.15
        # every verification emits accepted + 1 tokens; the prefill emitted the first
        assert len(res.ids) <= 1 + res.accepted + res.verify_calls


def test_perfect_drafter_is_accepted_fully(target: Any) -> None:
    p, k = PROMPTS[1], 3
    res = greedy_speculative_generate(target, Perfect(target), p, k=k, max_new_tokens=33, aux_layer_ids=AUX)
    assert res.ids == greedy_generate(target, p, max_new_tokens=33)
    assert res.acceptance_length == k + 1
    assert res.accepted_per_pos == [res.drafts] * k and res.verify_calls == 8  # 1 + 8 * 4 = 33


def test_eos_stops_output_and_acceptance(target: Any) -> None:
    p = PROMPTS[0]
    plain = greedy_generate(target, p, max_new_tokens=30)
    eos = plain[9]
    want = greedy_generate(target, p, max_new_tokens=30, eos_ids=[eos])
    assert want[-1] == eos and len(want) <= 10
    res = greedy_speculative_generate(target, Perfect(target), p, k=3, max_new_tokens=30, eos_ids=[eos],
                                      aux_layer_ids=AUX)
    assert res.ids == want


def test_hooks_capture_vllm_convention(target: Any) -> None:
    """id k < L = HF hidden_states[k] (input of layer k); id L = pre-norm, i.e. not HF's post-norm [L]."""
    p = PROMPTS[0]
    cap = AuxCapture(target, [2, 4, 5, 8])
    try:
        _, aux = target_forward(target, p, 1, cap)
    finally:
        cap.close()
    assert aux is not None
    hs = target(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states
    for i, lid in enumerate([2, 4, 5]):
        torch.testing.assert_close(aux[:, i * 128:(i + 1) * 128], hs[lid][0])
    final = aux[:, 3 * 128:]
    assert not torch.allclose(final, hs[8][0])
    torch.testing.assert_close(target.model.norm(final), hs[8][0])


def test_bad_arguments_are_config_errors(target: Any, drafter: Eagle3Drafter) -> None:
    with pytest.raises(ConfigError, match="k"):
        greedy_speculative_generate(target, drafter, PROMPTS[0], k=0, max_new_tokens=4, aux_layer_ids=AUX)
    with pytest.raises(ConfigError, match="outside"):
        greedy_speculative_generate(target, drafter, PROMPTS[0], k=2, max_new_tokens=4, aux_layer_ids=[2, 9])


def test_runs_from_a_saved_drafter(target: Any, drafter: Eagle3Drafter, tmp_path: Path) -> None:
    """A drafter saved in the flat EAGLE layout loads and drafts the same tokens."""
    import json

    from safetensors.torch import save_file

    from draftgen.drafter.eagle3 import load_drafter

    sd = {("midlayer." + k[9:] if k.startswith("layers.0.") else k): v.contiguous()
          for k, v in drafter.state_dict().items()}
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 256,
        "num_hidden_layers": 1, "vocab_size": target.config.vocab_size, "draft_vocab_size": 2048,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0}))
    loaded = load_drafter(tmp_path)
    a = greedy_speculative_generate(target, drafter, PROMPTS[0], k=2, max_new_tokens=12, aux_layer_ids=AUX)
    b = greedy_speculative_generate(target, loaded, PROMPTS[0], k=2, max_new_tokens=12, aux_layer_ids=AUX)
    assert a == b
