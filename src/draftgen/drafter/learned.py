"""The learned tiny target of the CPU chain: a small Qwen3 trained on the CPU on ``drafter.tinylang``.

``build_learned_target(out_dir)`` gives a transformers model folder that ``AutoModelForCausalLM`` and
``AutoTokenizer`` load with no custom code (``config.json``, ``model.safetensors``, ``generation_config.json``,
the bundled Qwen3 ``tokenizer.json`` / ``tokenizer_config.json``) and ``draftgen-target.json``
(``LearnedTargetInfo``: the recipe, the weights' checksum, the greedy accuracy per task, the loop check).
A folder that already holds this recipe's target, with a model file matching its recorded digest, is
reused as it is (the cache of a test session, of ``scripts/tiny-chain --target``); else the target is trained
there by ``drafter.learned_train`` in a child process (about three CPU-minutes: 400 steps of 64 samples; 1,565 s
of wall time on a two-core machine shared at load 5–8).

The recipe (``RECIPE``, seeds included) is all in code. The child runs with fixed torch threads and fixed CPU
kernels (``_CHILD_ENV``: torch's and MKL's AVX2 code paths), so that one torch version gives the same weights
on most x86-64 machines with AVX2: their sha256 is compared with ``RECORDED`` (recorded with one torch version;
under another the comparison is reported as unknown, not refused). Some CPUs still round differently under those
paths; the weights each known family gives are all in ``RECORDED``, and the chain's tests hold bounds, not
digits, so they pass on any of them.

Also here, for the chain and its checks: the language's ids (``chat_ids`` renders a prompt as the chat
template does, ``answer_ids``, ``language_ids``) and ``periodic_tail``, the loop check. No torch at import.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from draftgen.drafter import tinylang
from draftgen.errors import ConfigError, InputError, ThresholdBroken
from draftgen.store import read_json

__all__ = ["ENDOFTEXT", "IM_END", "INFO_FILE", "RECIPE", "RECORDED", "LearnedRecipe", "LearnedTargetInfo",
           "answer_ids", "build_learned_target", "chat_ids", "compared", "file_sha256", "language_ids", "learned_tokenizer",
           "periodic_tail", "read_info"]

INFO_FILE = "draftgen-target.json"
IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643


@dataclass(frozen=True)
class LearnedRecipe:
    """Everything that decides the learned target's weights."""

    seed: int = 0
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    intermediate: int = 256
    rope_theta: float = 1_000_000.0
    steps: int = 400
    batch: int = 64
    lr: float = 4e-3
    warmup: int = 30
    weight_decay: float = 0.0
    threads: int = 2
    eval_per_task: int = 48
    eval_seed: int = 999


RECIPE = LearnedRecipe()
#: the sha256 of the weights ``RECIPE`` gives, and the torch version it was recorded with: ``sha256`` is the one
#: bench/RESULTS.md's chain was measured with; ``also`` the other weights the same torch gives on CPUs whose AVX2
#: paths still round differently (one is known: b11419… on AVX-512/AMX Xeons of the Sapphire Rapids family, the
#: CI machine's and the dev machine's since 2026-12; its chain holds the same bounds, test_chain)
RECORDED: dict[str, Any] = {"torch": "2.13.0+cpu",
                            "sha256": "7afba66654181662a6883db6baeda2403429c6aea90ab66da4c113dfa429b230",
                            "also": ("b11419e0fa2b5d39c5f8055a68d3eab510e8859cdb50e9eb2e2efa57faf96f62",)}


class LearnedTargetInfo(msgspec.Struct, kw_only=True):
    """``draftgen-target.json``: how the target was made and what it does on fresh prompts."""

    recipe: dict[str, Any]
    sha256: str  # of the trained weights (compact state, names sorted)
    model_sha256: str  # of model.safetensors as written (the cache check)
    recorded_sha256: str
    matches_recorded: bool | None  # None: recorded for another torch version
    torch: str
    train_seconds: float
    final_loss: float
    accuracy: dict[str, float]  # exact greedy answers on fresh prompts, per task
    unended: int  # fresh prompts whose greedy continuation ran past the answer without ending (loops)


# -- the language in ids ------------------------------------------------------------------------------------


def learned_tokenizer() -> Any:
    """The bundled Qwen3 tokenizer as a ``tokenizers.Tokenizer`` (the language's ids)."""
    from tokenizers import Tokenizer

    from draftgen.drafter.tiny import qwen3_tokenizer_json

    return Tokenizer.from_str(qwen3_tokenizer_json().decode("utf-8"))


#: the chat template's ids around a user message, as ``apply_chat_template(add_generation_prompt=True,
#: enable_thinking=False)`` renders them (checked by ``_check_template`` at every build)
_HEAD = [IM_START, 872, 198]  # <|im_start|>user\n
_TAIL = [IM_END, 198, IM_START, 77091, 198, 151667, 271, 151668, 271]  # ...assistant\n<think>\n\n</think>\n\n


def chat_ids(tok: Any, prompt: str) -> list[int]:
    """The prompt's ids as the chain's server renders them (Qwen3 chat template, thinking off)."""
    return [*_HEAD, *tok.encode(prompt, add_special_tokens=False).ids, *_TAIL]


def answer_ids(tok: Any, answer: str) -> list[int]:
    """An answer's ids as the target emits them: its text's, then the end token."""
    return [*tok.encode(answer, add_special_tokens=False).ids, IM_END]


def language_ids(tok: Any) -> list[int]:
    """Every id the language uses (template, prompts, answers, the end token), ascending."""
    rng = random.Random("language-ids")
    used = {*_HEAD, *_TAIL, IM_END}
    for task in tinylang.TASKS:
        for _ in range(400):
            p = tinylang.draw(task, rng)
            used.update(chat_ids(tok, p))
            used.update(answer_ids(tok, tinylang.solve(p)))
    return sorted(used)


def periodic_tail(ids: Sequence[int], *, span: int = 12, max_period: int = 6) -> bool:
    """The last ``span`` ids repeat a pattern of at most ``max_period`` ids (a loop: n-gram lookup's best case).
    The language's answers never do (words do not repeat in walk and sort, numbers grow in count; twelve closing
    brackets in a period of six or fewer is a 1-in-10^5 draw)."""
    if len(ids) < span:
        return False
    tail = list(ids[-span:])
    return any(all(tail[i] == tail[i - p] for i in range(p, span)) for p in range(1, max_period + 1))


# -- the cached build ------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: the child's environment: the same CPU kernels on every x86-64 machine with AVX2 (torch's own and MKL's), so
#: one torch version trains the same weights
_CHILD_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": str(RECIPE.threads),
              "MKL_NUM_THREADS": str(RECIPE.threads), "PYTHONHASHSEED": "0"}


def read_info(folder: Path) -> LearnedTargetInfo:
    """The ``draftgen-target.json`` of a learned target folder, compared with ``RECORDED`` as the code now holds
    it (not as it was when the folder was trained)."""
    return compared(read_json(folder / INFO_FILE, LearnedTargetInfo))


def compared(info: LearnedTargetInfo) -> LearnedTargetInfo:
    """``info`` with ``recorded_sha256`` and ``matches_recorded`` from ``RECORDED`` (None: another torch)."""
    same_torch = info.torch == RECORDED["torch"]
    known = (RECORDED["sha256"], *RECORDED["also"])
    return msgspec.structs.replace(info, recorded_sha256=RECORDED["sha256"],
                                   matches_recorded=(info.sha256 in known) if same_torch else None)


def _cached(out: Path, recipe: LearnedRecipe) -> LearnedTargetInfo | None:
    path = out / INFO_FILE
    if not path.is_file() or not (out / "model.safetensors").is_file():
        return None
    try:
        info = read_info(out)
    except (InputError, OSError):  # an unreadable manifest is no cache: the folder is trained again
        return None
    if info.recipe != asdict(recipe) or file_sha256(out / "model.safetensors") != info.model_sha256:
        return None
    return info


def build_learned_target(out_dir: str | Path, *, recipe: LearnedRecipe = RECIPE, echo: Any = print,
                         strict: bool = True) -> Path:
    """The learned target in ``out_dir`` (reused when it already holds this recipe's; else trained there in a
    child process, about three CPU-minutes). ``strict``: refuse weights that differ from
    ``RECORDED`` under the recorded torch version (a changed recipe or numerics: the chain's figures would no
    longer be those of bench/RESULTS.md). Returns the folder."""
    out = Path(out_dir)
    info = _cached(out, recipe)
    if info is None:
        if out.exists() and any(out.iterdir()) and not (out / INFO_FILE).is_file():
            raise ConfigError(f"{out}: not empty and not a learned tiny target; give an empty or new folder")
        env = {**os.environ, **_CHILD_ENV}
        echo(f"learned target: training in {out} (recipe {recipe.steps} steps of {recipe.batch}, "
             f"{recipe.threads} threads)")
        _train_child(out, recipe, env, echo)
        info = read_info(out)
    echo(f"learned target {out}: sha256 {info.sha256[:16]}… accuracy "
         + ", ".join(f"{t} {a:.2f}" for t, a in info.accuracy.items()) + f"; {info.unended} unended")
    if strict and info.matches_recorded is False and recipe == RECIPE:
        raise ThresholdBroken(f"{out}: the learned target's weights (sha256 {info.sha256[:16]}…) differ from the "
                              f"recorded ones ({RECORDED['sha256'][:16]}…, torch {RECORDED['torch']}): the recipe "
                              "or the numerics changed; record the new checksum in drafter.learned.RECORDED "
                              "(and rerun python -m bench --only chain)")
    return out


def _train_child(out: Path, recipe: LearnedRecipe, env: dict[str, str], echo: Any) -> None:
    """``learned_train`` in a child process; its progress lines (``learned target: step …``, on its stderr)
    are echoed as they come, so minutes of training are not minutes of silence."""
    proc = subprocess.Popen([sys.executable, "-m", "draftgen.drafter.learned_train", str(out), *_recipe_args(recipe)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tail: list[str] = []
    with proc.stderr:
        for raw in proc.stderr:
            line = raw.rstrip("\n")
            tail = [*tail[-19:], line]
            if line.startswith("learned target: step "):
                echo(line)
    code = proc.wait()
    if code != 0:
        said = "\n".join(tail)[-800:]
        raise ConfigError(f"training the learned target failed (exit {code}): {said}")


def _recipe_args(recipe: LearnedRecipe) -> list[str]:
    return [f"--{k}={v}" for k, v in asdict(recipe).items() if v != getattr(RECIPE, k)]
