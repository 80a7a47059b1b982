"""run_generate end to end against the emulator: ids, provenance, resume, budgets, stops, routing, chaos."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from _common_helpers import CHECKOUT, free_port
from _generate_helpers import (
    SECRET_KEY,
    claim,
    emulator,
    failures,
    fast,
    make_config,
    provenance,
    responses,
    write_prompts,
)
from draftgen.config import load_config
from draftgen.emulator import builtin_scenario
from draftgen.errors import EXIT_FAILURES, AuthError, InputError, RunDirError
from draftgen.phases.generate.run import run_generate
from draftgen.phases.importer.run import run_import
from draftgen.records import GroundTruthRecord, ResponseRecord, RunManifest, Usage
from draftgen.secrets import scrub_argv
from draftgen.store import JsonlWriter, iter_jsonl, read_json

quiet = {"echo": lambda s: None}


def _truth(path: Path) -> dict[str, GroundTruthRecord]:
    return {r.generation_id: r for _, r in iter_jsonl(path, GroundTruthRecord)}


def _all_text(run_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())


def test_generate_embedded_emulator_ids_provenance_and_resume(tmp_path: Path, key_file: Path) -> None:
    assert key_file.read_text().strip() == SECRET_KEY
    cfg = make_config(tmp_path, ["a", "b"], endpoint={"api_key_file": str(key_file), "emulator": {"ground_truth": True}})
    run_dir = claim(cfg)
    ids_a = write_prompts(run_dir, "a", 40, long_every=5, tools_every=7)
    ids_b = write_prompts(run_dir, "b", 15)
    argv = ["draftgen", "generate", "cfg.yaml", "--api-key", SECRET_KEY, f"--api-key-file={key_file}"]
    rep = run_generate(cfg, **quiet, argv=argv)
    assert rep.exit_code == 0 and rep.message is None
    assert rep.done == 55 and rep.failed == 0
    truth = _truth(run_dir / "emulator" / "ground_truth.jsonl")
    recs = responses(run_dir, "a") + responses(run_dir, "b")
    assert sorted(r.sample_id for r in recs) == sorted(ids_a + ids_b)
    parts = Counter(r.partition for r in recs)
    assert parts == {"short": 47, "long": 8}
    exact = 0
    for r in recs:
        t = truth[r.generation_id or ""]
        assert r.provenance == provenance(cfg)
        assert r.prompt_ids == t.prompt_ids
        assert r.ids_source == "reconstructed" and r.usage is not None and r.provider
        assert r.max_tokens == (4096 if r.partition == "long" else 2048)
        if not t.non_canonical:
            assert r.output_ids == t.output_ids
            exact += 1
    assert exact >= 45
    man = read_json(run_dir / "run.json", RunManifest)
    assert man.argv[3:] == ["--api-key", "***", "--api-key-file=***"]
    assert man.versions["draftgen"] and man.config["model"]["profile"] == "qwen3"
    log = (run_dir / "logs" / "generate.log").read_text()
    assert "done 55/55" in log and "reconcile" in log
    assert SECRET_KEY.encode() not in _all_text(run_dir)
    assert b"SECRETSECRET" not in _all_text(run_dir)

    # Resume: nothing left, nothing appended.
    rep2 = run_generate(cfg, **quiet)
    assert rep2.done == 0 and rep2.requests == 0
    assert len(responses(run_dir, "a")) == 40

    # Resume with three prompts added: the display's progress is over the whole set (58), not this run's 3.
    write_prompts(run_dir, "b", 18)
    rep3 = run_generate(cfg, **quiet)
    assert rep3.done == 3
    last = [ln for ln in (run_dir / "logs" / "generate.log").read_text().splitlines() if "total: done" in ln][-1]
    assert "total: done 58/58 (100%)" in last and "0 remaining" in last

    # Another source under a dataset's name is refused (other generation settings are the records': test_rerun).
    other = make_config(tmp_path, [{"name": "a", "path": "elsewhere.jsonl"}, "b"])
    with pytest.raises(RunDirError, match=r"datasets\[0\]\.path \(a\): the run has 'a.jsonl'"):
        run_generate(other, **quiet)


def test_scrub_argv() -> None:
    assert scrub_argv(["x", "--api-key", "sk-or-v1-abcdefghijkl", "--management-key=zz", "--token", "t", "--run-dir", "r"]) == \
        ["x", "--api-key", "***", "--management-key=***", "--token", "***", "--run-dir", "r"]
    assert "abcdefghijklmnop" not in " ".join(scrub_argv(["x", "sk-or-v1-abcdefghijklmnop"]))


def test_chaos_every_sample_done_once_or_failed_with_reason(tmp_path: Path) -> None:
    run_dir = claim(make_config(tmp_path, ["c"]))
    ids = write_prompts(run_dir, "c", 80, long_every=6)
    sc = builtin_scenario("chaos").replace(hang_s=1.0)
    with emulator(sc, seed=3) as emu:
        cfg = make_config(tmp_path, ["c"], base_url=emu.base_url,
                          endpoint={"idle_timeout_s": 0.4}, retry={"max_attempts": 4})
        rep = run_generate(cfg, **quiet)
        assert sum(emu.state.by_fault.values()) > 20  # chaos really happened
    done = [r.sample_id for r in responses(run_dir, "c")]
    assert len(done) == len(set(done))
    fails = {f.sample_id: f for f in failures(run_dir, "c")}
    assert set(done) | set(fails) == set(ids)
    assert not set(done) & set(fails)
    for f in fails.values():
        assert f.reason and f.kind and f.attempts >= 1
    assert rep.done == len(done) and rep.failed == len(fails)
    assert rep.exit_code == (EXIT_FAILURES if fails else 0)  # a session that left failures exits 4
    assert len(done) >= 60
    log = (run_dir / "logs" / "generate.log").read_text()
    assert "retry c/" in log

    # The failures are retried by the next run (with a patient retry budget every sample finishes).
    with emulator(sc, seed=4) as emu:
        cfg = make_config(tmp_path, ["c"], base_url=emu.base_url, endpoint={"idle_timeout_s": 0.4},
                          retry={"max_attempts": 10})
        run_generate(cfg, **quiet)
    done2 = [r.sample_id for r in responses(run_dir, "c")]
    assert len(done2) == len(set(done2)) and set(done2) == set(ids)


def test_dollar_budget_stops_within_reservation(tmp_path: Path) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 200)
    with emulator() as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url,
                          budget={"max_spend_usd": 0.08, "token_policy": "strict"},
                          partitions={"short": {"concurrency": 8, "max_tokens": 2048}})
        rep = run_generate(cfg, **quiet)
        spent = emu.state.spend_usd
    assert rep.exit_code != 0 and rep.message is not None and "dollar budget" in rep.message
    recs = responses(run_dir, "a")
    cost = sum(r.usage.cost for r in recs if r.usage)
    assert 10 <= len(recs) < 200
    assert cost <= 0.08 + 1e-9 and spent <= 0.08 + 1e-9
    assert cost == pytest.approx(spent)
    # Resume counts the prior spend: nothing more can be sent.
    with emulator() as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url, budget={"max_spend_usd": 0.08})
        rep2 = run_generate(cfg, **quiet)
        assert emu.state.requests == 0
    assert rep2.exit_code != 0 and rep2.done == 0


def test_402_stops_scheduling_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A plain OpenAI-compatible client sees no /key caps, so the server's 402 is what stops it.
    monkeypatch.setenv("DRAFTGEN_TEST_KEY", "sk-or-test")
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 300)
    with emulator(credits=0.05) as emu:
        cfg = make_config(tmp_path, ["a"], kind="openai", base_url=emu.base_url,
                          endpoint={"api_key_env": "DRAFTGEN_TEST_KEY"})
        rep = run_generate(cfg, **quiet)
        requests = emu.state.requests
    assert rep.exit_code == 1
    assert rep.message is not None and "out of credits" in rep.message and "\n" not in rep.message
    recs = responses(run_dir, "a")
    fails = failures(run_dir, "a")
    assert recs and fails and all(f.kind == "payment_required" and not f.permanent for f in fails)
    assert requests < 300 and len(recs) + len(fails) <= requests


def test_token_budgets(tmp_path: Path) -> None:
    claimed = make_config(tmp_path, ["a", "b"])
    run_dir = claim(claimed)
    ids_a = write_prompts(run_dir, "a", 10)
    write_prompts(run_dir, "b", 60)
    # dataset a already used its budget in an earlier run
    with JsonlWriter(run_dir / "raw" / "a" / "raw_responses.jsonl") as w:
        w.write_many([ResponseRecord(sample_id=ids_a[0], dataset="a", usage=Usage(completion_tokens=6000),
                                     provenance=provenance(claimed))])
    lines: list[str] = []
    with emulator() as emu:
        cfg = make_config(tmp_path, ["a", "b"], base_url=emu.base_url, budget={"token_budget": 5000, "token_policy": "strict"},
                          partitions={"short": {"concurrency": 4, "max_tokens": 1000}})
        rep = run_generate(cfg, echo=lines.append)
    by = {d.name: d for d in rep.datasets}
    assert by["a"].done == 0 and by["a"].skipped and "token budget" in by["a"].skipped
    assert any("a: skipped" in ln for ln in lines)
    assert len(responses(run_dir, "a")) == 1
    b = responses(run_dir, "b")
    used = sum(r.usage.completion_tokens for r in b if r.usage)
    assert 0 < len(b) < 60 and used <= 5000
    assert by["b"].skipped and "token budget reached" in by["b"].skipped
    assert rep.exit_code == 0


def test_ignored_provider_never_used(tmp_path: Path) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 40)
    with emulator() as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url, routing={"ignore": ["chutes"]},
                          endpoint={"stream": False})
        rep = run_generate(cfg, **quiet)
        assert "Chutes" not in emu.state.by_provider
    provs = Counter(r.provider for r in responses(run_dir, "a"))
    assert rep.done == 40 and "Chutes" not in provs and len(provs) == 2


def test_legacy_sglang_rows_count_as_done(tmp_path: Path) -> None:
    claimed = make_config(tmp_path, ["a"])
    run_dir = claim(claimed)
    ids = write_prompts(run_dir, "a", 20)
    # Local-SGLang rows ({sample_id, output_ids}) come in through `draftgen import`, which stamps them.
    source = tmp_path / "sglang.jsonl"
    source.write_bytes(b"".join(msgspec.json.encode({"sample_id": i, "output_ids": [1, 2, 3]}) + b"\n"
                                for i in ids[:8]))
    imp = run_import(claimed, **quiet, dataset="a", source=source)
    assert (imp.imported, imp.duplicates, imp.not_prepared) == (8, 0, 0)
    stamp = msgspec.structs.replace(provenance(claimed), imported_from=str(source.resolve()))
    assert [(r.sample_id, r.dataset, r.output_ids, r.usage, r.provenance) for r in responses(run_dir, "a")] == \
        [(i, "a", [1, 2, 3], None, stamp) for i in ids[:8]]
    raw = run_dir / "raw" / "a" / "raw_responses.jsonl"
    legacy = raw.read_bytes()
    with raw.open("ab") as fh:
        fh.write(b'{"sample_id": "a-000')  # plus a line cut by a crash
    with emulator() as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url)
        rep = run_generate(cfg, **quiet)
        assert emu.state.requests == 12
    recs = responses(run_dir, "a")
    assert rep.done == 12 and len(recs) == 20 and len({r.sample_id for r in recs}) == 20
    assert raw.read_bytes().startswith(legacy)


def test_bad_key_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 50)
    monkeypatch.setenv("DRAFTGEN_TEST_KEY", "sk-or-the-wrong-one")
    with emulator(api_key="sk-or-the-right-one") as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url, endpoint={"api_key_env": "DRAFTGEN_TEST_KEY"})
        with pytest.raises(AuthError, match="API key was rejected"):
            run_generate(cfg, **quiet)
        assert emu.state.requests == 0  # caught by GET /key before any completion
        # without the /key check (a plain OpenAI-compatible server), the first 401 stops the run
        cfg = make_config(tmp_path, ["a"], kind="openai", base_url=emu.base_url,
                          endpoint={"api_key_env": "DRAFTGEN_TEST_KEY"})
        rep = run_generate(cfg, **quiet)
        assert rep.exit_code == 1 and rep.message is not None and "API key was rejected" in rep.message
        assert emu.state.requests <= cfg.partitions.short.concurrency
    assert not (run_dir / "raw" / "a" / "failures.jsonl").exists()


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_exact_id_backends_through_generate(tmp_path: Path, kind: str) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 12)
    gt = tmp_path / "gt.jsonl"
    with emulator(ground_truth=str(gt)) as emu:
        url = emu.root_url + "/v1" if kind == "vllm" else emu.root_url
        cfg = make_config(tmp_path, ["a"], kind=kind, base_url=url)
        rep = run_generate(cfg, **quiet)
    truth = {k.replace("gen-", ""): v for k, v in _truth(gt).items()}
    recs = responses(run_dir, "a")
    assert rep.done == 12 and len(recs) == 12
    for r in recs:
        t = truth[r.generation_id or ""]
        assert r.ids_source == "exact" and r.output_ids == t.output_ids and r.prompt_ids == t.prompt_ids
        assert r.reasoning and r.backend == kind


def test_quickstart_example_config_loads() -> None:
    cfg = load_config(CHECKOUT / "examples" / "quickstart.yaml")
    assert cfg.endpoint.kind == "emulator" and cfg.model.profile == "qwen3"
    assert [d.path for d in cfg.datasets] == ["bundled:chat", "bundled:code", "bundled:tools"]


def test_logprobs_path_gives_the_true_ids(tmp_path: Path) -> None:
    run_dir = claim(make_config(tmp_path, ["a"], sampling={"logprobs": True}))
    write_prompts(run_dir, "a", 40)
    gt = tmp_path / "gt.jsonl"
    with emulator(fast(non_canonical_rate=0.5), ground_truth=str(gt)) as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url, routing={"only": ["deepinfra"]},
                          sampling={"logprobs": True})
        rep = run_generate(cfg, **quiet)
    truth = _truth(gt)
    recs = responses(run_dir, "a")
    assert rep.done == 40
    by_source = Counter(r.ids_source for r in recs)
    assert by_source["logprobs"] >= 30
    for r in recs:
        t = truth[r.generation_id or ""]
        if r.ids_source == "logprobs" and not t.non_canonical:
            assert r.output_ids == t.output_ids


def test_routed_prices_take_the_worst_case_of_allowed_endpoints(tmp_path: Path) -> None:
    from draftgen.backends import EndpointInfo
    from draftgen.backends.base import EndpointPricing
    from draftgen.backends.pricing import routed_prices

    eps = [
        EndpointInfo(provider_name="DeepInfra", tag="deepinfra/fp4", quantization="fp4",
                     pricing=EndpointPricing(prompt=0.45e-6, completion=2.25e-6)),
        EndpointInfo(provider_name="Baseten", tag="baseten/fp4", quantization="fp4",
                     pricing=EndpointPricing(prompt=0.6e-6, completion=3.0e-6)),
        EndpointInfo(provider_name="Chutes", tag="chutes/int4", quantization="int4",
                     pricing=EndpointPricing(prompt=0.44e-6, completion=2.0e-6)),
    ]
    every, _ = routed_prices(make_config(tmp_path, ["a"]), eps)
    assert every.completion == pytest.approx(3.0e-6) and every.prompt == pytest.approx(0.6e-6)
    ignored, used = routed_prices(make_config(tmp_path, ["a"], routing={"ignore": ["baseten"]}), eps)
    assert ignored.completion == pytest.approx(2.25e-6) and "baseten/fp4" not in used
    only, _ = routed_prices(make_config(tmp_path, ["a"], routing={"only": ["chutes/int4"]}), eps)
    assert only.completion == pytest.approx(2.0e-6)
    quant, _ = routed_prices(make_config(tmp_path, ["a"], routing={"quantizations": ["int4"]}), eps)
    assert quant.completion == pytest.approx(2.0e-6)
    capped, _ = routed_prices(make_config(tmp_path, ["a"], routing={"max_price": {"completion": 2.5}}), eps)
    assert capped.completion == pytest.approx(2.25e-6)


def test_unreachable_server_stops_instead_of_failing_every_sample(tmp_path: Path) -> None:
    port = free_port()  # a port nobody listens on
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 500)
    cfg = make_config(tmp_path, ["a"], base_url=f"http://127.0.0.1:{port}/api/v1")
    rep = run_generate(cfg, **quiet)
    assert rep.exit_code == 1 and rep.message is not None and "cannot reach the server" in rep.message
    assert rep.done == 0 and rep.failed < 100


def test_permanent_failures_print_their_reason_and_only_retryable_ones_are_told_to_rerun(
        tmp_path: Path, qwen3_profile: Any) -> None:
    from draftgen.emulator.scenarios import Provider

    cfg0 = make_config(tmp_path, ["a"])
    run_dir = claim(cfg0)
    write_prompts(run_dir, "a", 6, long_every=3)  # 2 long, 4 short
    broken = Provider("Faulty", "faulty/int4", "int4", 0.5, 2.0, faults={"server_error": 1.0})
    with emulator(fast(providers=[broken], time_scale=0.01), profile_obj=qwen3_profile) as emu:
        # long prompts ask for more than the context: HTTP 400, for good; short ones hit a 502 until retries run out
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url, retry={"max_attempts": 2},
                          partitions={"long": {"concurrency": 2, "max_tokens": 300_000}})
        lines: list[str] = []
        rep = run_generate(cfg, echo=lines.append, profile=qwen3_profile)
    assert rep.exit_code == EXIT_FAILURES and rep.failed == 6
    good = [ln for ln in lines if ln.startswith("failed for good:")]
    assert len(good) == 1 and "2 × context_length_exceeded (HTTP 400" in good[0]
    assert "maximum context length" in good[0]
    assert rep.message is not None
    assert "2 for good (a rerun sends them again only to fail the same way" in rep.message
    assert "4 for now (rerun to retry them)" in rep.message


def test_after_a_run_spent_and_left_add_up_to_the_budget_or_say_what_caps_it() -> None:
    from draftgen.engine import BudgetGovernor
    from draftgen.phases.generate.summary import budget_lines

    gov = BudgetGovernor(max_spend=5.0, prior=0.04, session=0.06)
    gov.reserved = 0.49  # an aborted run's requests in flight: cancelled, their reservations do not count as spent
    assert budget_lines(gov) == ["budget: $0.1000 spent + $4.9000 left = $5"]
    gov.session_cap = 3.0  # the key's account has less than the budget left
    assert "the key's account allows $2.9400 more, which caps the next run first" in budget_lines(gov)[0]
    assert budget_lines(BudgetGovernor()) == [] and budget_lines(BudgetGovernor(max_spend=0.05, prior=0.1)) == []


def test_a_resumed_runs_progress_counts_the_whole_prepared_set(tmp_path: Path, qwen3_profile: Any) -> None:
    """Issue 23: a resumed run's bar said ``done 3/47`` (this run's work) while status said ``13/60``."""
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 3)
    with emulator(profile_obj=qwen3_profile) as emu:
        cfg = make_config(tmp_path, ["a"], base_url=emu.base_url)
        assert run_generate(cfg, echo=lambda s: None, profile=qwen3_profile).done == 3
        write_prompts(run_dir, "a", 5)  # two prompts more; the first three are done
        assert run_generate(cfg, echo=lambda s: None, profile=qwen3_profile).done == 2
    log = (run_dir / "logs" / "generate.log").read_text(encoding="utf-8").splitlines()
    last = [ln for ln in log if "total: done " in ln][-1]  # the display's last line (logged at its stop)
    assert "total: done 5/5 (100%)" in last and "0 remaining" in last, last


def test_generate_alone_refuses_a_dataset_not_prepared_and_writes_nothing(tmp_path: Path) -> None:
    """A phase imports no other phase: ``run_generate`` prepares nothing itself. Without the ``prepare`` a
    command hands in (``draftgen generate`` hands in ``run_prepare``), a selected dataset not prepared is an
    InputError naming its file and the fix, before anything is sent or written."""
    cfg = make_config(tmp_path, ["a", "b"])
    run_dir = claim(cfg)
    write_prompts(run_dir, "a", 3)
    with pytest.raises(InputError) as err:
        run_generate(cfg, **quiet)
    assert str(err.value) == (f"{run_dir / 'prepared' / 'b' / 'prompts.jsonl'}: not found (b not prepared yet); "
                              "run `draftgen prepare CONFIG` first")
    assert not (run_dir / "raw").exists() and not (run_dir / "logs").exists()
