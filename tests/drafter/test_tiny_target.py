"""``drafter.tiny``: the learnable tiny target is a plain transformers Qwen3 folder with the bundled tokenizer.

Loads with ``AutoModelForCausalLM``/``AutoTokenizer`` offline and no custom code; greedy decoding emits only
ids < 2048 (lm_head rows >= 2048 are zero, the others scaled); the chat template renders; the same seed gives
the same weights; the module runs from a shell.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from draftgen.drafter.speculate import greedy_generate  # noqa: E402
from draftgen.drafter.tiny import QWEN3_VOCAB, build_tiny_target  # noqa: E402
from draftgen.errors import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_target(tmp_path_factory.mktemp("tiny") / "t")


@pytest.fixture(scope="module")
def model(folder: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


def test_folder_is_a_plain_qwen3_checkpoint(folder: Path, model: Any) -> None:
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert type(model).__name__ == "Qwen3ForCausalLM"
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
            c.vocab_size, c.tie_word_embeddings) == (8, 128, 4, 4, 256, QWEN3_VOCAB, False)
    w = model.lm_head.weight
    assert torch.count_nonzero(w[2048:]) == 0
    assert 0.6 < float(w[:2048].detach().std()) < 1.0  # 0.05 * 16
    assert 0.04 < float(model.model.embed_tokens.weight.detach().std()) < 0.06


def test_chat_template_and_greedy_stays_below_2048(folder: Path, model: Any) -> None:
    env_offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        tok = transformers.AutoTokenizer.from_pretrained(folder)
    finally:
        if env_offline is None:
            os.environ.pop("HF_HUB_OFFLINE")
        else:
            os.environ["HF_HUB_OFFLINE"] = env_offline
    text = tok.apply_chat_template([{"role": "user", "content": "Name three colours."}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n")
    for content in ("Name three colours.", "Why is the sea salty? Answer briefly."):
        ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                      tokenize=True)["input_ids"]
        out = greedy_generate(model, ids, max_new_tokens=48, eos_ids=[151645, 151643])
        assert len(out) == 48 and max(out) < 2048
        assert len(set(out)) > 3  # peaked, yet not one token forever


def test_same_seed_same_weights(folder: Path, tmp_path: Path) -> None:
    again = build_tiny_target(tmp_path / "again")
    digest = [hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest() for p in (folder, again)]
    assert digest[0] == digest[1]
    with pytest.raises(ConfigError, match="emit_vocab"):
        build_tiny_target(tmp_path / "bad", emit_vocab=0)


def test_module_runs_from_a_shell(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "draftgen.drafter.tiny", str(tmp_path / "cli"), "extra"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "usage" in res.stderr
