"""Synthetic run directories for the report, status and pipeline tests (written through store)."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

from draftgen import rundir
from draftgen.config import RunConfig, config_from_mapping
from draftgen.records import (
    AuditReport,
    DatasetAudit,
    DatasetStats,
    FailureRecord,
    Message,
    MismatchExample,
    PromptRecord,
    ResponseRecord,
    Usage,
)
from draftgen.store import JsonlWriter, atomic_write_json
from draftgen.tokens import profile_from_config

T0 = 1_760_000_000.0


def make_config(tmp: Path, run_dir: Path, datasets: tuple[str, ...] = ("chat", "code")) -> Path:
    lines = [f"run_dir: {run_dir}", "endpoint: emulator", "datasets:"]
    for name in datasets:
        lines += [f"  - name: {name}", f"    path: {name}.jsonl"]
    path = tmp / "cfg.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_config(run_dir: Path, datasets: tuple[str, ...] = ("chat", "code")) -> RunConfig:
    """The config ``make_config`` writes, as a RunConfig (the default model: qwen/qwen3-8b, qwen3)."""
    return config_from_mapping({"run_dir": str(run_dir), "endpoint": "emulator",
                                "datasets": [{"name": n, "path": f"{n}.jsonl"} for n in datasets]},
                               where="test", base_dir=run_dir.parent)


def write_run_dir(
    run_dir: Path,
    *,
    datasets: dict[str, int] | None = None,
    done_fraction: float = 0.8,
    seed: int = 1,
    audit: bool = True,
    failures: bool = True,
    manifest: bool = True,
) -> dict[str, list[ResponseRecord]]:
    """prepared/, raw/ (responses + failures), audit/audit.json. Returns the responses written.

    ``manifest``: claim the folder first, as draftgen does (``rundir.writer`` writes run.json), and write
    under its lock; without it the folder has no run.json (one that only readers such as status accept).
    Responses carry the provenance of ``run_config``.
    """
    datasets = datasets or {"chat": 40, "code": 25}
    cfg = run_config(run_dir, tuple(datasets))
    with rundir.writer(cfg, "test") if manifest else contextlib.nullcontext():
        return _write_run_dir(cfg, datasets, done_fraction=done_fraction, seed=seed, audit=audit,
                              failures=failures)


def _write_run_dir(cfg: RunConfig, datasets: dict[str, int], *, done_fraction: float, seed: int, audit: bool,
                   failures: bool) -> dict[str, list[ResponseRecord]]:
    run_dir = cfg.run_path
    provenance = rundir.expected_provenance(cfg, profile_from_config(cfg).tokenizer_sha256)
    rng = random.Random(seed)
    providers = ["SiliconFlow", "DeepInfra", "Chutes"]
    written: dict[str, list[ResponseRecord]] = {}
    audits: list[DatasetAudit] = []
    t = T0
    for name, n in datasets.items():
        prompts = [
            PromptRecord(sample_id=f"{name}-{i:04d}", dataset=name,
                         messages=[Message(role="user", content=f"question {i} of {name}")], prompt_tokens=12 + i)
            for i in range(n)
        ]
        with JsonlWriter(run_dir / "prepared" / name / "prompts.jsonl", fsync=False) as w:
            w.write_many(prompts)
        atomic_write_json(run_dir / "prepared" / name / "stats.json",
                          DatasetStats(dataset=name, samples=n, prompt_tokens=sum(p.prompt_tokens or 0 for p in prompts),
                                       short=n, source=f"{name}.jsonl"))
        done = int(n * done_fraction)
        rows: list[ResponseRecord] = []
        for i in range(done):
            reasoning = rng.randint(50, 900)
            content = rng.randint(20, 300)
            completion = reasoning + content
            t += rng.uniform(0.2, 3.0)
            rows.append(ResponseRecord(
                sample_id=prompts[i].sample_id, dataset=name, reasoning="r" * 5, content="c" * 5,
                reasoning_field="reasoning", finish_reason="length" if i % 9 == 0 else "stop",
                provider=providers[i % len(providers)], model="qwen/qwen3-8b", generation_id=f"gen-{name}-{i}",
                usage=Usage(prompt_tokens=prompts[i].prompt_tokens or 0, completion_tokens=completion,
                            reasoning_tokens=reasoning, cost=completion * 2.25e-6),
                output_ids=list(range(completion)), ids_source="reconstructed",
                recon_flags=["junction_restored"] if i % 7 == 0 else [],
                latency_s=rng.uniform(1, 20), created_at=t, provenance=provenance,
            ))
        with JsonlWriter(run_dir / "raw" / name / "raw_responses.jsonl", fsync=False) as w:
            w.write_many(rows)
        written[name] = rows
        if failures:
            fails = [
                FailureRecord(sample_id=prompts[i].sample_id, dataset=name,
                              kind="rate_limited" if i % 2 else "context_length_exceeded",
                              reason="synthetic", created_at=t + i)
                for i in range(done, min(n, done + 3))
            ]
            # A failure later followed by a response does not count as failed.
            if rows:
                fails.append(FailureRecord(sample_id=rows[0].sample_id, dataset=name, kind="server_error",
                                           reason="synthetic", created_at=T0 - 10))
            with JsonlWriter(run_dir / "raw" / name / "failures.jsonl", fsync=False) as w:
                w.write_many(fails)
        billed = sum(r.usage.completion_tokens for r in rows if r.usage)
        audits.append(DatasetAudit(dataset=name, records=done, billed_completion_tokens=billed,
                                   rebuilt_completion_tokens=billed - 3, billing_mismatched_samples=1,
                                   reference_compared=done, exact_match=done - 1, tokenization_mismatch=1,
                                   ids_source={"reconstructed": done},
                                   examples=[MismatchExample(sample_id=f"{name}-0000", kind="tokenization",
                                                             position=7, ours=["Ġa", "b"], reference=["Ġab"])]))
    if audit:
        overall = DatasetAudit(dataset="all", records=sum(a.records for a in audits),
                               billed_completion_tokens=sum(a.billed_completion_tokens for a in audits),
                               rebuilt_completion_tokens=sum(a.rebuilt_completion_tokens for a in audits),
                               reference_compared=sum(a.reference_compared for a in audits),
                               exact_match=sum(a.exact_match for a in audits),
                               tokenization_mismatch=sum(a.tokenization_mismatch for a in audits),
                               examples=[e for a in audits for e in a.examples])
        atomic_write_json(run_dir / "audit" / "audit.json",
                          AuditReport(profile="qwen3", datasets=audits, overall=overall, created_at=t))
    return written
