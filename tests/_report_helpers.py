"""Synthetic run directories for the report, status and pipeline tests (written through store)."""

from __future__ import annotations

import contextlib
import html as htmllib
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import yaml

from _common_helpers import config_dict, write_config
from draftgen import rundir
from draftgen.config import RunConfig, config_from_mapping
from draftgen.provenance import expected_provenance
from draftgen.records import (
    AttemptRecord,
    AuditReport,
    DatasetAudit,
    DatasetStats,
    FailureRecord,
    HealthEvent,
    Message,
    MismatchExample,
    PromptRecord,
    ResponseRecord,
    Usage,
)
from draftgen.rundir.claim import writer
from draftgen.store import JsonlWriter, atomic_write_json
from draftgen.tokens import profile_from_config

T0 = 1_760_000_000.0
QUANT = {"SiliconFlow": "fp8", "DeepInfra": "bf16"}  # Chutes: quantization unknown


def make_config(tmp: Path, run_dir: Path, datasets: tuple[str, ...] = ("chat", "code"), extra: str = "") -> Path:
    """cfg.yaml for ``run_dir`` (``_common_helpers.config_dict``); ``extra``: more top-level YAML keys
    (e.g. a ``merge:`` section), each replacing the default of its key."""
    data = config_dict(tmp, datasets, run_dir=str(run_dir))
    if extra:
        data.update(yaml.safe_load(extra) or {})
    return write_config(tmp, data)


def run_config(run_dir: Path, datasets: tuple[str, ...] = ("chat", "code")) -> RunConfig:
    """The config ``make_config`` writes, as a RunConfig (the default model: qwen/qwen3-8b, qwen3)."""
    return config_from_mapping(config_dict(run_dir.parent, datasets, run_dir=str(run_dir)),
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

    ``manifest``: claim the folder first, as draftgen does (``rundir.claim.writer`` writes run.json), and write
    under its lock; without it the folder has no run.json (one that only readers such as status accept).
    Responses carry the provenance of ``run_config``.
    """
    datasets = datasets or {"chat": 40, "code": 25}
    cfg = run_config(run_dir, tuple(datasets))
    with writer(cfg, "test") if manifest else contextlib.nullcontext():
        return _write_run_dir(cfg, datasets, done_fraction=done_fraction, seed=seed, audit=audit,
                              failures=failures)


def _write_run_dir(cfg: RunConfig, datasets: dict[str, int], *, done_fraction: float, seed: int, audit: bool,
                   failures: bool) -> dict[str, list[ResponseRecord]]:
    run_dir = cfg.run_path
    provenance = expected_provenance(cfg, profile_from_config(cfg).tokenizer_sha256)
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
            latency = rng.uniform(1, 20)
            provider = providers[i % len(providers)]
            rows.append(ResponseRecord(
                # sample 4 of each dataset: reasoning billed, no reasoning text (dropped by the provider)
                sample_id=prompts[i].sample_id, dataset=name, reasoning="" if i == 4 else "r" * 5, content="c" * 5,
                reasoning_field="reasoning", finish_reason="length" if i % 9 == 0 else "stop",
                provider=provider, model="qwen/qwen3-8b", generation_id=f"gen-{name}-{i}",
                usage=Usage(prompt_tokens=prompts[i].prompt_tokens or 0, completion_tokens=completion,
                            reasoning_tokens=reasoning, cost=completion * 2.25e-6),
                output_ids=list(range(completion)), ids_source="reconstructed",
                recon_flags=["junction_restored"] if i % 7 == 0 else [],
                latency_s=latency, ttft_s=round(latency / 10, 3), quantization=QUANT.get(provider),
                created_at=t, provenance=provenance,
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


def response(cfg: RunConfig, sample_id: str, dataset: str, **fields: object) -> ResponseRecord:
    """A response record with the provenance of ``cfg`` (``fields`` override the defaults)."""
    provenance = expected_provenance(cfg, profile_from_config(cfg).tokenizer_sha256)
    base: dict[str, object] = {"reasoning": "r", "content": "c", "finish_reason": "stop", "ids_source": "reconstructed",
                               "output_ids": [1, 2, 3], "created_at": T0}
    base.update(fields)
    return ResponseRecord(sample_id=sample_id, dataset=dataset, provenance=provenance, **base)  # type: ignore[arg-type]


def write_logs(cfg: RunConfig, *, prompts: dict[str, int] | None = None,
               responses: list[ResponseRecord] | None = None, failures: list[FailureRecord] | None = None,
               attempts: list[AttemptRecord] | None = None, health: list[HealthEvent] | None = None) -> None:
    """Write exactly these rows (under the run directory's writer): ``prompts`` maps a dataset to how many
    prepared samples ``<dataset>-NNNN`` it has; responses and failures go to their dataset's raw logs."""
    rd = rundir.RunDir(cfg.run_path)
    with writer(cfg, "test"):
        for name, n in (prompts or {}).items():
            rows = [PromptRecord(sample_id=f"{name}-{i:04d}", dataset=name,
                                 messages=[Message(role="user", content=f"q{i}")], prompt_tokens=10) for i in range(n)]
            with JsonlWriter(rd.prepared(name), fsync=False) as w:
                w.write_many(rows)
        by_path: dict[Path, list[object]] = {}
        for path, rec in ([(rd.raw(r.dataset), r) for r in responses or []]
                          + [(rd.failures(f.dataset), f) for f in failures or []]
                          + [(rd.attempts, a) for a in attempts or []]
                          + [(rd.health, h) for h in health or []]):
            by_path.setdefault(path, []).append(rec)
        for path, recs in by_path.items():
            with JsonlWriter(path, fsync=False) as w:
                w.write_many(recs)  # type: ignore[arg-type]


def synthetic_attempts(written: dict[str, list[ResponseRecord]], *, seed: int = 2,
                       fail_kinds: tuple[str, ...] = ("rate_limited", "server_error", "reasoning_dropped"),
                       ) -> list[AttemptRecord]:
    """logs/attempts.jsonl for the responses ``write_run_dir`` wrote: each response ends an "ok" attempt of
    ``latency_s`` seconds; every third sample had a failed attempt first (kind cycling through
    ``fail_kinds``), served by the next provider of the rotation."""
    rng = random.Random(seed)
    providers = ["SiliconFlow", "DeepInfra", "Chutes"]
    out: list[AttemptRecord] = []
    for rows in written.values():
        for i, r in enumerate(rows):
            latency = r.latency_s or 1.0
            start = r.created_at - latency
            n = 1
            if i % 3 == 0:
                failed_provider = providers[(providers.index(r.provider or "Chutes") + 1) % 3]
                begin = start - rng.uniform(0.5, 2.0)
                out.append(AttemptRecord(sample_id=r.sample_id, dataset=r.dataset, attempt=1, started_at=begin,
                                         ended_at=begin + 0.4, outcome=fail_kinds[(i // 3) % len(fail_kinds)],
                                         provider=failed_provider, quantization=QUANT.get(failed_provider)))
                n = 2
            out.append(AttemptRecord(sample_id=r.sample_id, dataset=r.dataset, attempt=n, started_at=start,
                                     ended_at=r.created_at, outcome="ok", provider=r.provider,
                                     quantization=r.quantization, ttft_s=r.ttft_s,
                                     completion_tokens=r.usage.completion_tokens if r.usage else 0,
                                     cost=r.usage.cost if r.usage else 0.0))
    return out


def write_attempts_and_health(cfg: RunConfig, written: dict[str, list[ResponseRecord]]) -> list[AttemptRecord]:
    """``synthetic_attempts`` into logs/attempts.jsonl, and one cool-down of DeepInfra into logs/health.jsonl."""
    attempts = synthetic_attempts(written)
    health = [HealthEvent(at=T0 + 30, provider="DeepInfra", event="cooldown", reason="6 of 10 recent outcomes bad",
                          until=T0 + 330),
              HealthEvent(at=T0 + 330, provider="DeepInfra", event="restored")]
    write_logs(cfg, attempts=attempts, health=health)
    return attempts


@contextlib.contextmanager
def held_lock(run: Path, command: str, datasets: tuple[str, ...]) -> Iterator[None]:
    """Hold the run directory's writer lock from another thread, as a running ``draftgen <command>`` does."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer(run_config(run, datasets), command):
            taken.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert taken.wait(10)
        yield
    finally:
        release.set()
        t.join(10)


def html_table(page: str, table_id: str) -> list[list[str]]:
    """The cells of ``<table id="table_id">`` in ``page``, row by row, as text (tags dropped, entities
    unescaped)."""
    m = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S)
    assert m is not None, table_id
    return [[htmllib.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", m.group(1), re.S)]
