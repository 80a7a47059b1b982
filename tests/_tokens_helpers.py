"""Helpers for the token tests: cached profiles over the tokenizer assets (``DRAFTGEN_TEST_ASSETS``), a
synthetic Kimi folder, adversarial text, and a synthetic run directory with ground truth for the audit tests."""

from __future__ import annotations

import functools
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from _common_helpers import ASSETS, need_assets
from draftgen.config import RunConfig, load_config
from draftgen.provenance import expected_provenance
from draftgen.records import GroundTruthRecord, Message, PromptRecord, ResponseRecord, Usage
from draftgen.rundir.claim import writer
from draftgen.store import JsonlWriter
from draftgen.tokens import LoadedTokenizer, Profile, load_tokenizer, profile_class
from draftgen.tokens.kimi_tiktoken import write_synthetic_kimi_folder

# ASSETS: the tokenizer assets folder (DRAFTGEN_TEST_ASSETS; see _common_helpers).
# profile name -> (tokenizer folder under ASSETS or a spec, chat template override under ASSETS or None)
PROFILE_SOURCES: dict[str, tuple[str, str | None]] = {
    "qwen3": ("qwen3", None),
    "qwen3-thinking-2507": ("qwen3", None),
    "deepseek-r1": ("deepseek-r1", None),
    "deepseek-v3.1": ("deepseek-v3.1", None),
    "glm-4.5": ("glm-4.5", None),
    "gpt-oss": ("gpt-oss", None),
    "kimi-k2.5": ("kimi:synthetic", None),
    "kimi-k2-thinking": ("kimi:synthetic", "kimi-k2-thinking/chat_template.jinja"),
}
ALL_PROFILES = tuple(PROFILE_SOURCES)


def need_shared() -> None:
    """Skip the calling test when the tokenizer assets are not on this machine (counted at the end)."""
    need_assets()


@functools.cache
def synthetic_kimi_dir() -> Path:
    """One synthetic Kimi tokenizer folder per test process (written under the system temp dir)."""
    need_shared()
    dest = Path(tempfile.mkdtemp(prefix="draftgen-kimi-")) / "kimi-k2.5"
    return write_synthetic_kimi_folder(dest, shared_kimi_dir=ASSETS / "kimi-k2.5")


@functools.cache
def _loaded(name: str) -> LoadedTokenizer:
    need_shared()
    folder, template = PROFILE_SOURCES[name]
    spec = str(synthetic_kimi_dir()) if folder == "kimi:synthetic" else str(ASSETS / folder)
    cls = profile_class(name)
    loaded = load_tokenizer(spec, template_names=cls.template_names, config_names=cls.config_names)
    if template:
        loaded.chat_template = (ASSETS / template).read_text(encoding="utf-8")
    return loaded


def profile_with(name: str, **kwargs: Any) -> Profile:
    """A profile over the cached tokenizer (one load per tokenizer per test process), with the
    ``tokenizer_sha256`` that ``tokens.load_profile`` sets (phases check record provenance against it)."""
    loaded = _loaded(name)
    prof = profile_class(name)(loaded.tokenizer, loaded.chat_template, config=loaded.config, **kwargs)
    prof.tokenizer_sha256 = loaded.sha256
    return prof


@functools.cache
def profile(name: str, thinking: bool = True) -> Profile:
    return profile_with(name, thinking=thinking)


# -- text -----------------------------------------------------------------------------------------

ADVERSARIAL = [
    "Hello, world.",
    "Done.\n",
    "  leading and trailing spaces  ",
    "\n\nstarts with newlines",
    "line one\r\nline two\r\n",
    "中文文本，没有空格。日本語のテキストです。",
    "emoji 😀👍🏽 and ZWJ 👨‍👩‍👧 family",
    "tabs\tand\u00a0nbsp and\u2028separator",
    "a literal <|im_end|> and <think> and </think> inside text",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
    "code:\n```python\ndef f(x):\n    return x * 2\n```\n",
    "numbers 1234567890 3.14159 -42 1e10",
    "   ",
    "\n",
    "trailing newline after punctuation!\n\n",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
    "<｜end▁of▁sentence｜> <|return|> <|user|> [BOS] <|endoftext|>",
]

_WORDS = ["the", "model", "token", "NORTH", "reason", "answer", "Paris", "weather", "because", "x", "1024", "3.5",
          "def", "return", "(", ")", "{", "}", ":", ",", ".", "!", "?", "中文", "测试", "東京", "😀", "🎉", "naïve", "café"]
_SEPS = [" ", " ", " ", " ", "\n", "\n\n", "  ", "\t", ""]


def random_text(rng: random.Random, n_words: int) -> str:
    out: list[str] = []
    for _ in range(n_words):
        out.append(rng.choice(_WORDS))
        out.append(rng.choice(_SEPS))
    return "".join(out)


# -- synthetic run directory ------------------------------------------------------------------------


@dataclass
class Sample:
    sample_id: str
    expected: str  # "exact" | "tokenization" | "semantic"
    cause: str = ""  # the expected MismatchExample.cause for mismatches
    structural: str = ""  # an expected structural failure kind
    billing: str = ""  # expected billing cause ("" when billed == rebuilt)


@dataclass
class SyntheticRun:
    cfg: RunConfig
    samples: dict[str, Sample] = field(default_factory=dict)


def _noncanonical(prof: Profile, ids: list[int], rng: random.Random, start: int) -> list[int] | None:
    """Replace one multi-byte token after ``start`` by two vocabulary tokens spelling the same bytes."""
    tok = prof.tokenizer
    table = tok.bytes_to_id
    specials = tok.special_ids
    # Never the last token: a split there in a truncated output reads as a truncation boundary.
    positions = [i for i in range(start, len(ids) - 1) if ids[i] not in specials and len(tok.token_bytes(ids[i])) >= 2]
    rng.shuffle(positions)
    for i in positions:
        b = tok.token_bytes(ids[i])
        for cut in range(1, len(b)):
            left, right = table.get(b[:cut]), table.get(b[cut:])
            if left is not None and right is not None:
                return [*ids[:i], left, right, *ids[i + 1:]]
    return None


NO_THRESHOLDS: dict[str, Any] = {"max_structural_failure_rate": None, "max_billing_disagreement": None,
                                 "max_semantic_mismatch_rate": None, "max_tokenization_mismatch_rate": None,
                                 "max_excluded_share": None}


def write_synthetic_run(
    tmp: Path,
    profile_name: str,
    n: int = 40,
    *,
    seed: int = 0,
    noncanonical_rate: float = 0.0,
    trim_rate: float = 0.0,
    drop_rate: float = 0.0,
    junction_rate: float = 0.0,
    corrupt_rate: float = 0.0,
    audit: dict[str, Any] | None = None,
) -> SyntheticRun:
    """A run directory whose raw records are what generate writes (ids rebuilt from the returned text,
    stamped with the config's provenance) and whose ground truth is what the model 'sampled'. The folder
    is claimed (run.json) and written under ``rundir.claim.writer``. Deliberate deviations, each with its label:

    - noncanonical: the true ids split one token in two (same text)      → tokenization mismatch
    - trim: the provider trimmed junction whitespace (canonical truth)   → exact, flagged junction_restored
    - junction: the model wrote a non-canonical junction, provider trimmed → semantic (junction_restored)
    - drop: the provider dropped the reasoning, billing it               → semantic (reasoning_dropped)
    - corrupt: the stored ids lost their end-of-turn token               → structural end_of_turn_missing
    """
    prof = profile(profile_name)
    rng = random.Random(seed)
    folder, template = PROFILE_SOURCES[profile_name]
    spec = str(synthetic_kimi_dir()) if folder == "kimi:synthetic" else str(ASSETS / folder)
    model: dict[str, Any] = {"profile": profile_name, "tokenizer": spec}
    if template:
        model["chat_template"] = str(ASSETS / template)
    data: dict[str, Any] = {
        "run_dir": "run",
        "endpoint": "emulator",
        "model": model,
        "datasets": [{"name": "alpha", "path": "a.jsonl"}, {"name": "beta", "path": "b.jsonl"}],
    }
    # The deliberate deviations break the default thresholds: a run states the thresholds it is judged by
    # (``audit=None`` keeps the defaults, ``{}`` switches them all off).
    if audit is not None:
        data["audit"] = {**NO_THRESHOLDS, **audit}
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    cfg = load_config(tmp / "cfg.yaml")
    with writer(cfg, "test"):
        return _write_synthetic_run(cfg, prof, rng, n, noncanonical_rate=noncanonical_rate,
                                    trim_rate=trim_rate, drop_rate=drop_rate, junction_rate=junction_rate,
                                    corrupt_rate=corrupt_rate)


def _write_synthetic_run(cfg: RunConfig, prof: Profile, rng: random.Random, n: int, *,
                         noncanonical_rate: float, trim_rate: float, drop_rate: float, junction_rate: float,
                         corrupt_rate: float) -> SyntheticRun:
    run = cfg.run_path
    out = SyntheticRun(cfg=cfg)
    provenance = expected_provenance(cfg, prof.tokenizer_sha256)
    reasoning_field = next((p for p in prof.thinking_suffix if getattr(p, "name", "") == "reasoning"), None)
    content_field = next((p for p in prof.suffix if getattr(p, "name", "") == "content"), None)
    lead = getattr(content_field, "lead", "") or getattr(reasoning_field, "trail", "") or ""
    gt = JsonlWriter(run / "emulator" / "ground_truth.jsonl", fsync=False)
    for ds in cfg.datasets:
        pw = JsonlWriter(run / "prepared" / ds.name / "prompts.jsonl", fsync=False)
        rw = JsonlWriter(run / "raw" / ds.name / "raw_responses.jsonl", fsync=False)
        for i in range(n):
            sid = f"{ds.name}-{i:04d}"
            msgs = [Message(role="user", content=random_text(rng, 6) + f" #{i}")]
            pw.write(PromptRecord(sample_id=sid, dataset=ds.name, messages=msgs))
            reasoning = random_text(rng, rng.randint(3, 30)).strip() or "r"
            content = random_text(rng, rng.randint(3, 30)).strip() or "c"
            finish = "stop" if rng.random() > 0.15 else "length"
            r = rng.random()
            kind = ""
            for name, rate in (("noncanonical", noncanonical_rate), ("trim", trim_rate), ("junction", junction_rate),
                               ("drop", drop_rate), ("corrupt", corrupt_rate)):
                if r < rate:
                    kind = name
                    break
                r -= rate
            if kind in ("trim", "junction") and not lead:
                kind = ""
            true_c = lead + "\n" + content if kind == "junction" else content  # junction: an extra newline
            truth = prof.build_output(reasoning, true_c, finish)
            # What a server returns: the raw text between the markers (vLLM reasoning-parser semantics).
            canon = prof.parse_output(truth.ids)
            ret_r: str | None = canon.reasoning
            ret_c = canon.content
            sample = Sample(sid, "exact")
            if kind in ("trim", "junction"):
                ret_r = (canon.reasoning or "").strip("\n") if canon.reasoning is not None else None
                ret_c = canon.content.strip("\n")
            if kind == "junction":
                sample = Sample(sid, "semantic", cause="junction_restored", billing="junction_restored")
            true_ids = list(truth.ids)
            reasoning_tokens = truth.reasoning_token_count
            if kind == "noncanonical":
                split = _noncanonical(prof, true_ids, rng, 0)
                if split is not None:
                    true_ids = split
                    sample = Sample(sid, "tokenization", cause="non_canonical_segmentation",
                                    billing="non_canonical_segmentation")
            if kind == "drop" and prof.thinking and reasoning_field is not None and reasoning_tokens > 0:
                ret_r = None
                sample = Sample(sid, "semantic", cause="reasoning_dropped", billing="reasoning_dropped")
            gen_id = f"gen-{sid}"
            prompt_ids = prof.prompt_ids(msgs)
            gt.write(GroundTruthRecord(generation_id=gen_id, output_ids=true_ids, prompt_ids=prompt_ids,
                                       non_canonical=sample.expected == "tokenization"))
            rebuilt = prof.build_output(ret_r, ret_c, finish, reasoning_tokens=reasoning_tokens)
            ids = list(rebuilt.ids)
            if kind == "corrupt" and rebuilt.ended:
                ids = ids[:-1]
                sample = Sample(sid, "semantic", cause="end_of_turn", structural="end_of_turn_missing",
                                billing="end_of_turn")
            rw.write(ResponseRecord(
                sample_id=sid, dataset=ds.name, reasoning=ret_r, content=ret_c, finish_reason=finish,
                generation_id=gen_id, output_ids=ids, prompt_ids=prompt_ids, ids_source="reconstructed",
                recon_flags=rebuilt.flags, usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(true_ids),
                                                       reasoning_tokens=reasoning_tokens),
                provenance=provenance,
            ))
            out.samples[sid] = sample
        pw.close()
        rw.close()
    gt.close()
    return out
