"""A speculators EAGLE-3 checkpoint in the flat EAGLE-3 format SGLang (and vLLM) load.

Reads a speculators 0.9 checkpoint folder (``config.json`` with ``speculators_model_type: eagle3`` and
``transformer_layer_config``; ``model.safetensors``) and writes ``config.json`` + ``model.safetensors``:

- config: ``architectures ["LlamaForCausalLMEagle3"]``, ``model_type llama``, the draft layer's shape
  (hidden/intermediate size, heads, head_dim, rope, eps), ``num_hidden_layers 1``, ``vocab_size`` (target),
  ``draft_vocab_size``, the norm options speculators trained with (``norm_before_fc``, ``fc_norm``,
  ``norm_output``, ``norm_before_residual``), top-level ``eagle_aux_hidden_state_layer_ids`` in the vLLM
  convention and ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's (vLLM id - 1: SGLang adds 1
  to explicit ids and reads them only from ``eagle_config``);
- weights: ``layers.0.*`` renamed ``midlayer.*``; ``fc``, ``norm``, ``lm_head``, ``embed_tokens``,
  ``input_norm`` kept; ``d2t`` kept as OFFSETS (target id = i + d2t[i]) and ``t2d`` (bool) kept.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from draftgen.errors import InputError
from draftgen.store import encode_json_pretty, read_json_object

__all__ = ["EAGLE_ARCH", "REQUIRED_TENSORS", "to_eagle3"]

EAGLE_ARCH = "LlamaForCausalLMEagle3"
REQUIRED_TENSORS = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "hidden_act", "rms_norm_eps", "max_position_embeddings", "attention_bias", "mlp_bias",
               "rope_parameters", "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")
_NORM_KEYS = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual", "target_hidden_size")


def to_eagle3(spec_dir: Path, out: Path) -> Path:
    """Convert the speculators checkpoint in ``spec_dir`` into ``out`` (replaced whole); returns ``out``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    try:
        spec = read_json_object(spec_dir / "config.json")
    except (OSError, ValueError):
        raise InputError(f"{spec_dir}: no readable speculators config.json") from None
    if spec.get("speculators_model_type") != "eagle3":
        raise InputError(f"{spec_dir}/config.json: speculators_model_type is "
                         f"{spec.get('speculators_model_type')!r}, expected 'eagle3'")
    layer: dict[str, Any] = spec["transformer_layer_config"]
    vllm_ids = [int(i) for i in spec["eagle_aux_hidden_state_layer_ids"]]
    cfg: dict[str, Any] = {"architectures": [EAGLE_ARCH], "model_type": "llama"}
    cfg.update({k: layer[k] for k in _LAYER_KEYS if k in layer})
    rope = layer.get("rope_parameters") or {}
    cfg["rope_theta"] = rope.get("rope_theta", layer.get("rope_theta", 10000.0))
    cfg.update(num_hidden_layers=1, draft_vocab_size=int(spec["draft_vocab_size"]), tie_word_embeddings=False,
               torch_dtype="bfloat16")
    cfg.update({k: spec[k] for k in _NORM_KEYS if spec.get(k) is not None})
    cfg["eagle_aux_hidden_state_layer_ids"] = vllm_ids
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in vllm_ids],
                           "use_aux_hidden_state": True}

    tensors: dict[str, Any] = {}
    with safe_open(str(spec_dir / "model.safetensors"), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118 (safe_open has no iterator)
            new = "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name
            tensors[new] = fh.get_tensor(name).contiguous()
    missing = [n for n in REQUIRED_TENSORS if n not in tensors]
    if missing or any(n.startswith("layers.") for n in tensors):
        raise InputError(f"{spec_dir}/model.safetensors: not a one-layer EAGLE-3 draft (missing {missing})")

    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_bytes(encode_json_pretty(cfg))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
