"""EAGLE-3 drafters in plain torch: load a trained checkpoint, draft tokens, verify them against a target.

- ``drafter.eagle3``: ``Eagle3Drafter`` and ``load_drafter(dir)``, reading a speculators 0.9.0 checkpoint
  (``config.json`` with ``speculators_model_type: eagle3`` + ``model.safetensors``) or the flat EAGLE/SGLang
  format (``LlamaForCausalLMEagle3``, ``midlayer.*`` tensors); its forward is speculators' Eagle3 draft forward.
- ``drafter.speculate``: ``greedy_speculative_generate``: chain drafting + greedy verification by a
  transformers target, with vLLM-meaning acceptance counters; its output equals plain greedy decoding.
- ``drafter.hf``: ``decoder_layers``, ``rms_norm``: leaf helpers over a transformers LM, also used by
  hidden-state capture (``phases.extract``), which imports them from here.
- ``drafter.tiny``: ``build_tiny_target(dir)``: the learnable tiny Qwen3 target of the CPU chain test.

torch (and transformers for the target) are optional dependencies: this package imports nothing heavy until
one of its modules is imported.
"""

from __future__ import annotations
