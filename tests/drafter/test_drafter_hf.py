"""``drafter.hf``: ``logprobs_through`` (a state fed into a layer of the target, run to the end) and
``token_logprobs`` (log-softmax at the target ids only), on a tiny seeded Qwen3 built here.

``logprobs_through`` must give a plain forward's log-probs when fed the plain forward's own states, run
none of the layers before the fed one, change nothing on the model (no hook registered: a capture another
thread runs meanwhile is untouched), and give a batch of states what it gives each alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from _extract_helpers import build_tiny_model
from draftgen.drafter.hf import logprobs_through, token_logprobs

torch.set_num_threads(1)
LAYERS = 6


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path_factory.mktemp("target"), layers=LAYERS, hidden=32, vocab=512)
    m: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return m.eval()


def _plain(model: Any, ids: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """A plain forward: hidden states, the last layer's pre-norm output (by hook), the logits."""
    grabbed: list[torch.Tensor] = []
    h = model.model.layers[-1].register_forward_hook(
        lambda _m, _a, out: grabbed.append(out[0] if isinstance(out, tuple) else out))
    try:
        with torch.inference_mode():
            out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    finally:
        h.remove()
    return tuple(x[0] for x in out.hidden_states), grabbed[0][0], out.logits[0]


def test_a_fed_state_gives_the_plain_forwards_logprobs_without_the_layers_before(
        model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (40,), generator=gen)
    pos = torch.arange(10, 39, 2)
    hidden, pre_final, logits = _plain(model, ids)
    want = torch.log_softmax(logits[pos].float(), -1).gather(-1, ids[1:][pos][:, None])[:, 0]
    layer_cls = type(model.model.layers[0])
    calls: list[int] = []
    real_forward = layer_cls.forward

    def counted(self: Any, *a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real_forward(self, *a, **kw)

    def no_hooks(*_a: Any, **_kw: Any) -> Any:
        raise AssertionError("logprobs_through registered a hook on the shared model")

    monkeypatch.setattr(layer_cls, "forward", counted)
    monkeypatch.setattr(torch.nn.Module, "register_forward_pre_hook", no_hooks)
    monkeypatch.setattr(torch.nn.Module, "register_forward_hook", no_hooks)
    for k in range(1, LAYERS + 1):
        state = hidden[k] if k < LAYERS else pre_final
        calls.clear()
        got = logprobs_through(model, ids, k, state, pos)
        assert len(calls) == LAYERS - k, (k, len(calls))  # only layers k..L-1 ran
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        both = logprobs_through(model, ids, k, torch.stack([state, state * 1.5]), pos)
        assert both.shape == (2, pos.numel())
        torch.testing.assert_close(both[0], got, atol=1e-5, rtol=0)
        torch.testing.assert_close(both[1], logprobs_through(model, ids, k, state * 1.5, pos), atol=1e-5, rtol=0)
    assert all(isinstance(m, layer_cls) for m in model.model.layers) and len(model.model.layers) == LAYERS


def test_token_logprobs_equals_log_softmax_and_leaves_the_logits_alone() -> None:
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(3, 5, 1000, generator=gen) * 4).to(dtype)
        kept = logits.clone()
        targets = torch.randint(0, 1000, (3, 5), generator=gen)
        want = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]
        got = token_logprobs(logits, targets)
        assert got.dtype == torch.float32 and got.shape == (3, 5)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert torch.equal(logits, kept)
