"""Build small run directories for the prepare/merge/export tests: a config, prompt files, prepared prompts
and raw responses whose ids are rebuilt with the bundled Qwen3 profile (as generate would write them,
provenance included)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from _common_helpers import config_dict, load, write_config
from draftgen import rundir
from draftgen.config import RunConfig
from draftgen.phases.importer.run import run_import
from draftgen.phases.prepare.run import run_prepare
from draftgen.provenance import expected_provenance
from draftgen.records import PromptRecord, ResponseRecord, Usage
from draftgen.rundir.claim import writer
from draftgen.store import JsonlWriter, iter_jsonl
from draftgen.tokens import profile_from_config


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def make_config(tmp: Path, datasets: list[dict[str, Any]], **sections: Any) -> RunConfig:
    """``tmp/cfg.yaml`` over ``datasets`` with run_dir ``run`` (relative to it), loaded; every section given
    replaces its default whole (``_common_helpers.config_dict`` with ``replace``)."""
    sections = {"run_dir": "run", "model": {"profile": "qwen3", "tokenizer": "bundled:qwen3"}, **sections}
    return load(write_config(tmp, config_dict(tmp, datasets, replace=True, **sections)))


def chat_rows(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"{prefix} question number {i}: why is {i} interesting?"}]}
            for i in range(n)]


def fake_generate(cfg: RunConfig, *, seed: int = 0, truncate_every: int = 0, with_prompt_ids: bool = True,
                  legacy: bool = False, long_every: int = 0) -> dict[str, list[ResponseRecord]]:
    """Write raw/<dataset>/raw_responses.jsonl for every prepared prompt (under the run directory's writer,
    stamped with the config's provenance); returns the records written.

    ``legacy``: local-SGLang rows (``sample_id`` and ``output_ids`` only), brought in the one way they come
    in, ``draftgen import`` (which stamps them); the records returned are the imported ones."""
    with writer(cfg, "test"):
        return _fake_generate(cfg, seed=seed, truncate_every=truncate_every, with_prompt_ids=with_prompt_ids,
                              legacy=legacy, long_every=long_every)


def _fake_generate(cfg: RunConfig, *, seed: int, truncate_every: int, with_prompt_ids: bool, legacy: bool,
                   long_every: int) -> dict[str, list[ResponseRecord]]:
    prof = profile_from_config(cfg)
    provenance = expected_provenance(cfg, prof.tokenizer_sha256)
    rng = random.Random(seed)
    written: dict[str, list[ResponseRecord]] = {}
    for ds in cfg.datasets:
        out = rundir.RunDir(cfg.run_path).raw(ds.name)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        recs: list[ResponseRecord] = []
        for i, (_, p) in enumerate(iter_jsonl(rundir.RunDir(cfg.run_path).prepared(ds.name), PromptRecord)):
            words = rng.randint(3, 40) * (50 if long_every and i % long_every == 0 else 1)
            reasoning = f"\nThe user asks about item {i}; think it through.\n"
            content = "\n\nAnswer: " + " ".join(rng.choice(["red", "green", "blue", "sky"]) for _ in range(words))
            finish = "length" if truncate_every and i % truncate_every == 0 else "stop"
            if finish == "length":
                content = content[:20]
            rec = prof.build_output(reasoning, content, finish)
            if legacy:
                r = ResponseRecord(sample_id=p.sample_id, output_ids=rec.ids)
            else:
                r = ResponseRecord(
                    sample_id=p.sample_id, dataset=ds.name, reasoning=reasoning, content=content,
                    finish_reason=finish, provider="Emu", output_ids=rec.ids,
                    prompt_ids=prof.prompt_ids(p.messages, p.tools) if with_prompt_ids else None,
                    ids_source="reconstructed", recon_flags=rec.flags,
                    usage=Usage(completion_tokens=len(rec.ids), reasoning_tokens=rec.reasoning_token_count),
                    provenance=provenance,
                )
            recs.append(r)
        if legacy:
            source = cfg.run_path.parent / "sglang" / f"{ds.name}.jsonl"
            source.parent.mkdir(parents=True, exist_ok=True)
            source.unlink(missing_ok=True)
            with JsonlWriter(source, fsync=False) as w:
                w.write_many(recs)
            run_import(cfg, echo=lambda s: None, dataset=ds.name, source=source)
            recs = [r for _, r in iter_jsonl(out, ResponseRecord)]
        else:
            with JsonlWriter(out, fsync=False) as w:
                w.write_many(recs)
        written[ds.name] = recs
    return written


def prepared_run(tmp: Path, datasets: dict[str, list[Any]], *, merge: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None, **gen: Any) -> RunConfig:
    """Prompt files → prepare → fake generate. ``datasets`` maps names to JSONL rows."""
    specs = []
    for name, rows in datasets.items():
        write_jsonl(tmp / "data" / f"{name}.jsonl", rows)
        specs.append({"name": name, "path": f"data/{name}.jsonl"})
    sections: dict[str, Any] = dict(extra or {})
    if merge is not None:
        sections["merge"] = merge
    cfg = make_config(tmp, specs, **sections)
    run_prepare(cfg, echo=lambda s: None)
    fake_generate(cfg, **gen)
    return cfg
