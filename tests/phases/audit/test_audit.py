"""``draftgen audit`` on synthetic run directories whose ground truth we wrote ourselves: every mismatch
must be labelled correctly, structural faults found, billing disagreements explained, thresholds enforced."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from _tokens_helpers import profile, write_synthetic_run
from draftgen.cli import cli
from draftgen.config import load_config
from draftgen.errors import InputError, RunDirError, ThresholdBroken
from draftgen.phases.audit.run import first_diff_span, run_audit
from draftgen.phases.importer.run import run_import
from draftgen.records import AuditReport, ResponseRecord
from draftgen.store import JsonlWriter, iter_jsonl, read_json

QUIET = {"echo": lambda s: None}


@pytest.mark.parametrize("name", ["qwen3", "kimi-k2.5", "deepseek-r1", "deepseek-v3.1", "glm-4.5", "gpt-oss"])
def test_canonical_run_matches_ground_truth_exactly(tmp_path: Path, name: str) -> None:
    run = write_synthetic_run(tmp_path, name, 15, seed=3)
    report = run_audit(run.cfg, profile=profile(name), **QUIET)
    o = report.overall
    assert o.records == 30 and o.reference_compared == 30
    assert o.exact_match == 30, (o.examples, o.structural_examples)
    assert o.structural_failures == {} and o.failed_sample_ids == []
    assert o.billed_completion_tokens == o.rebuilt_completion_tokens and o.billing_mismatched_samples == 0
    assert o.prompt_checked == 30 and o.prompt_reference_mismatch == 0
    saved = read_json(run.cfg.run_path / "audit" / "audit.json", AuditReport)
    assert saved.overall.exact_match == 30 and [d.dataset for d in saved.datasets] == ["alpha", "beta"]


@pytest.mark.parametrize("name", ["qwen3", "kimi-k2.5", "glm-4.5", "gpt-oss"])
def test_every_mismatch_is_labelled(tmp_path: Path, name: str) -> None:
    run = write_synthetic_run(tmp_path, name, 40, seed=7, noncanonical_rate=0.25, trim_rate=0.2, junction_rate=0.1,
                              drop_rate=0.1, corrupt_rate=0.05, audit={})
    report = run_audit(run.cfg, profile=profile(name), **QUIET)
    o = report.overall
    tok_ids, sem_ids = set(o.tokenization_mismatch_ids), set(o.semantic_mismatch_ids)
    for sid, s in run.samples.items():
        got = "tokenization" if sid in tok_ids else "semantic" if sid in sem_ids else "exact"
        assert got == s.expected, (sid, s)
    kinds = {s.expected for s in run.samples.values()}
    assert {"exact", "tokenization", "semantic"} <= kinds
    by_cause = {}
    for da in report.datasets:
        for ex in da.examples:
            by_cause[ex.sample_id] = ex
    for sid, ex in by_cause.items():
        assert ex.cause == run.samples[sid].cause, (sid, ex)
        if ex.kind == "tokenization":
            assert ex.ours != ex.reference and ex.ours and ex.reference
    corrupt = {sid for sid, s in run.samples.items() if s.structural}
    assert o.structural_failures.get("end_of_turn_missing", 0) == len(corrupt)
    assert corrupt | sem_ids == set(o.failed_sample_ids)  # merge drops these; tokenization-only ones stay
    assert not (tok_ids & set(o.failed_sample_ids))
    for da in report.datasets:
        for b in da.billing_examples:
            assert b.cause == run.samples[b.sample_id].billing, b
    assert o.billing_explanations.get("unexplained", 0) == 0
    trimmed = o.flags.get("junction_restored", 0)
    assert trimmed > 0 or name in ("kimi-k2.5", "gpt-oss")


def test_first_differing_span() -> None:
    p = profile("qwen3")
    tok = p.tokenizer
    ours = tok.encode("The NORTH wind")
    ref = [*tok.encode("The"), tok.bytes_to_id[b" N"], tok.bytes_to_id[b"OR"], *tok.encode("TH wind")]
    pos, a, b = first_diff_span(p, [*tok.encode("The"), *tok.encode(" NOR"), *tok.encode("TH wind")], ref)
    assert (pos, a, b) == (1, [" NOR"], [" N", "OR"])
    pos, a, b = first_diff_span(p, ours, ours[:-1])
    assert pos == len(ours) - 1 and b == []


def _rewrite(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Rewrite a raw log through ``edit``; a record it maps to None is left out."""
    rows = [r for _, r in iter_jsonl(path, ResponseRecord)]
    path.unlink()
    with JsonlWriter(path, fsync=False) as w:
        for r in rows:
            if (new := edit(r)) is not None:
                w.write(new)


def test_structural_faults_are_found(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path, "qwen3", 12, seed=1, audit={})
    raw = run.cfg.run_path / "raw" / "alpha" / "raw_responses.jsonl"
    tok = profile("qwen3").tokenizer
    legacy = tmp_path / "sglang.jsonl"

    def edit(r: ResponseRecord) -> ResponseRecord | None:
        i = int(r.sample_id.rsplit("-", 1)[1])
        ids = list(r.output_ids or [])
        if i == 0:
            ids.insert(1, tok.special_tokens["<|im_start|>"])  # stray control token
        elif i == 1:
            ids.insert(2, 151668)  # a second end-of-think
        elif i == 2:
            ids.append(10**7)  # outside the vocabulary: refused below, naming the line
        elif i == 3:
            r = msgspec.structs.replace(r, prompt_ids=[*(r.prompt_ids or []), 42])
        elif i == 4:
            r = msgspec.structs.replace(r, content=(r.content or "") + " edited after the fact")
        elif i == 5:  # a legacy SGLang row: it comes back below through `draftgen import`
            legacy.write_bytes(msgspec.json.encode({"sample_id": r.sample_id, "output_ids": ids}) + b"\n")
            return None
        elif i == 6 and r.finish_reason == "stop":
            ids = [*ids, 151645]
        return msgspec.structs.replace(r, output_ids=ids)

    _rewrite(raw, edit)
    assert run_import(run.cfg, **QUIET, dataset="alpha", source=legacy).imported == 1
    bare = [r for _, r in iter_jsonl(raw, ResponseRecord) if r.sample_id == "alpha-0005"]
    assert len(bare) == 1 and bare[0].content is None and bare[0].prompt_ids is None
    # An id outside the vocabulary is a corrupt record: the audit stops on it, naming file:line.
    with pytest.raises(InputError, match=re.escape(
            f"{raw}:3: output_ids holds id {10**7}, outside the tokenizer's vocabulary [0, {tok.vocab_size})")):
        run_audit(run.cfg, profile=profile("qwen3"), **QUIET)
    assert not (run.cfg.run_path / "audit" / "audit.json").exists()
    _rewrite(raw, lambda r: None if r.sample_id == "alpha-0002" else r)
    report = run_audit(run.cfg, profile=profile("qwen3"), **QUIET)
    alpha = report.datasets[0]
    kinds = {(e.sample_id, e.kind) for e in alpha.structural_examples}
    assert ("alpha-0000", "stray_special") in kinds
    assert ("alpha-0001", "end_of_think_multiple") in kinds
    assert ("alpha-0003", "prompt_mismatch") in kinds
    assert ("alpha-0004", "decode_mismatch") in kinds
    assert not any(sid == "alpha-0005" for sid, _ in kinds)  # a bare ids row is structurally fine
    assert report.datasets[1].structural_failures == {}
    assert {"alpha-0000", "alpha-0001", "alpha-0003", "alpha-0004"} <= set(alpha.failed_sample_ids)


def test_thresholds_and_cli_exit_code(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path, "qwen3", 30, seed=2, noncanonical_rate=0.3,
                              audit={"max_tokenization_mismatch_rate": 0.05, "max_semantic_mismatch_rate": 0.0})
    lines: list[str] = []
    with pytest.raises(ThresholdBroken, match="tokenization mismatch rate"):
        run_audit(run.cfg, echo=lines.append, profile=profile("qwen3"))
    assert (run.cfg.run_path / "audit" / "audit.json").is_file()
    assert any(line.startswith("THRESHOLD BROKEN: alpha: tokenization mismatch rate") for line in lines)
    assert any("non_canonical_segmentation" in line for line in lines)
    result = CliRunner().invoke(cli, ["audit", str(tmp_path / "cfg.yaml")])
    assert result.exit_code == 3 and "audit threshold broken" in result.output


def test_reference_by_sample_id_and_default_reference(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path, "kimi-k2.5", 10, seed=4)
    gt = run.cfg.run_path / "emulator" / "ground_truth.jsonl"
    gt.unlink()
    lines: list[str] = []
    report = run_audit(run.cfg, profile=profile("kimi-k2.5"), echo=lines.append)
    assert report.reference is None and report.overall.reference_compared == 0
    # As against a separately started emulator: ref 0, and where reference ids would come from.
    hint = next(line for line in lines if line.startswith("ref 0:"))
    assert "draftgen emulate --ground-truth FILE" in hint and "--reference FILE" in hint
    # Exact-id records (as a vLLM/SGLang run writes them) keyed by sample_id.
    ref = tmp_path / "exact.jsonl"
    with JsonlWriter(ref, fsync=False) as w:
        for ds in ("alpha", "beta"):
            for _, r in iter_jsonl(run.cfg.run_path / "raw" / ds / "raw_responses.jsonl", ResponseRecord):
                w.write({"sample_id": r.sample_id, "output_ids": r.output_ids})
    result = CliRunner().invoke(cli, ["audit", str(tmp_path / "cfg.yaml"), "--reference", str(ref)])
    assert result.exit_code == 0, result.output
    assert "ref 0:" not in result.output
    saved = read_json(run.cfg.run_path / "audit" / "audit.json", AuditReport)
    assert saved.overall.exact_match == 20 and saved.reference == str(ref.resolve())


def test_empty_run_dir_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text("run_dir: run\ndatasets: [{name: a, path: a.jsonl}]\n", encoding="utf-8")
    with pytest.raises(RunDirError, match="run `draftgen generate` first"):
        run_audit(load_config(tmp_path / "cfg.yaml"), **QUIET)


def test_truncation_boundary_is_told_apart() -> None:
    from draftgen.phases.audit.run import compare_reference

    p = profile("qwen3")
    tok = p.tokenizer
    ours = tok.encode("Going NOR")  # the truncated text, re-encoded
    ref = [*tok.encode("Going"), tok.bytes_to_id[b" N"], tok.bytes_to_id[b"OR"]]  # "... NORTH" cut after "OR"
    kind, ex = compare_reference(p, "s", ours, ref, ["truncated"])
    assert kind == "tokenization" and ex is not None and ex.cause == "truncation_boundary"
    kind, ex = compare_reference(p, "s", ours, ref, [])
    assert ex is not None and ex.cause == "non_canonical_segmentation"


def test_trimmed_model_whitespace_is_named() -> None:
    from draftgen.phases.audit.run import compare_reference

    p = profile("kimi-k2.5")
    truth = p.build_output(" The user asks.", " The answer.", "stop").ids
    ours = p.build_output(" The user asks.", "The answer.", "stop").ids  # a provider trimmed the content edge
    kind, ex = compare_reference(p, "s", ours, truth, [])
    assert kind == "semantic" and ex is not None and ex.cause == "whitespace_trimmed"
