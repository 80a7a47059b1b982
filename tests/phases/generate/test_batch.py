"""``endpoint.mode: batch`` end to end against the emulator's Batch API: the same records as sync at the
batch price, limits, routing refusals, failed/expired/partially failed batches, costs, budgets, display."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from _common_helpers import config_dict
from _generate_helpers import claim, emulator, failures, fast, make_config, responses, write_prompts
from draftgen.backends import EndpointInfo
from draftgen.backends.openrouter_batch import (
    MAX_REQUESTS,
    batch_provider,
    check_batch_config,
    encode_submission,
    request_item,
)
from draftgen.backends.pricing import tier_pool
from draftgen.config import RunConfig, config_from_mapping
from draftgen.emulator.batch import with_batch
from draftgen.emulator.scenarios import Provider, Scenario
from draftgen.engine.batch_journal import batch_lines, load_batches
from draftgen.errors import ConfigError
from draftgen.phases.generate.run import run_generate
from draftgen.phases.plan.run import run_plan
from draftgen.phases.report.run import run_report
from draftgen.phases.status.run import run_status
from draftgen.records import AttemptRecord, BatchEvent, BatchItem, fold_batches
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl

quiet = {"echo": lambda s: None}
POLL = {"poll_interval_s": 0.02, "poll_max_interval_s": 0.1}
PARTS = {"short": {"concurrency": 8, "max_tokens": 256}, "long": {"concurrency": 4, "max_tokens": 512}}


def _cfg(tmp: Path, url: str, *, batch: dict[str, Any] | None = None, mode: str = "batch", **sections: Any) -> RunConfig:
    sections.setdefault("partitions", PARTS)
    return make_config(tmp, ["chat"], base_url=url, endpoint={"mode": mode, "batch": {**POLL, **(batch or {})}},
                       **sections)


def _scenario(preset: str | None = "fast", **changes: Any) -> Scenario:
    return with_batch(fast(), preset, **changes)


def _attempts(run: Path) -> list[AttemptRecord]:
    return [a for _, a in iter_jsonl(RunDir(run).attempts, AttemptRecord)]


def test_batch_records_are_the_sync_records_at_half_the_price(tmp_path: Path) -> None:
    runs: dict[str, Path] = {}
    spend: dict[str, float] = {}
    for mode in ("sync", "batch"):
        tmp = tmp_path / mode
        run = claim(_cfg(tmp, "http://unused", mode=mode))
        write_prompts(run, "chat", 16, long_every=6, tools_every=5)
        with emulator(_scenario()) as emu:
            rep = run_generate(_cfg(tmp, emu.base_url, mode=mode, batch={"max_requests": 6}), **quiet)
            spend[mode] = emu.state.spend_usd
        assert rep.exit_code == 0 and rep.done == 16
        runs[mode] = run
    sync = {r.sample_id: r for r in responses(runs["sync"], "chat")}
    batch = {r.sample_id: r for r in responses(runs["batch"], "chat")}
    assert sync.keys() == batch.keys()
    for sid, b in batch.items():
        s = sync[sid]
        # The same sample, the same ids rebuilt the same way: reconstruction and the audit see nothing new.
        assert (b.output_ids, b.prompt_ids, b.ids_source, b.recon_flags) == (s.output_ids, s.prompt_ids, s.ids_source,
                                                                          s.recon_flags)
        assert b.provenance == s.provenance and b.request_hash == s.request_hash
        assert b.batch_id and b.batch_id.startswith("batch_") and b.service_tier == "batch" and s.batch_id is None
        assert b.usage is not None and s.usage is not None and b.usage.completion_tokens == s.usage.completion_tokens
    views = load_batches(RunDir(runs["batch"]).batch_journal)
    assert [len(v.items) for v in views.values()] == [6, 6, 4] and all(v.finished and not v.open for v in views.values())
    assert all(v.keyed for v in views.values())
    assert sum(r.usage.cost for r in batch.values() if r.usage) == pytest.approx(spend["batch"])
    # every sample served by the cheapest provider (Chutes: $0.44/$2.00 per M) at half its price
    assert spend["batch"] / spend["sync"] < 0.5


def test_custom_ids_carry_the_batch_key_and_old_journals_keep_theirs() -> None:
    it = BatchItem("chat", "s:1", "short", 256, 0.01)
    new, old = fold_batches([BatchEvent(key="b1-aa-1", event="prepared", at=1.0, items=[it], keyed=True),
                             BatchEvent(key="b0", event="prepared", at=0.5, items=[it])]).values()
    assert new.custom_id(it) == "b1-aa-1:chat:s:1" and old.custom_id(it) == "chat:s:1"


def test_submission_body_limits_and_routing() -> None:
    body, fp = encode_submission("m/x", {"only": ["a/fp8"]}, [request_item("d:1", b'{"max_tokens":5}')])
    keys = list(msgspec.json.decode(body))
    assert keys[:2] == ["endpoint", "model"] and keys[-1] == "requests" and len(fp) == 64
    eps = [EndpointInfo(provider_name="A", tag="a/fp8", quantization="fp8"),
           EndpointInfo(provider_name="B", tag="b/int4", quantization="int4"),
           EndpointInfo(provider_name="C", tag="c/flex", quantization="fp8")]
    cfg = make_config(Path("/tmp/none"), ["chat"], endpoint={"mode": "batch"}, routing={"quantizations": ["fp8"]})
    provider, allowed = batch_provider(cfg, eps)
    assert provider == {"only": ["a/fp8", "c/flex"]} and [e.tag for e in allowed] == ["a/fp8", "c/flex"]
    assert batch_provider(cfg, eps, avoid=["a"])[0] == {"only": ["c/flex"]}
    assert batch_provider(make_config(Path("/tmp/none"), ["chat"], endpoint={"mode": "batch"}), eps)[0] is None
    refused = [({"routing": {"order": ["a"]}}, "routing.order"), ({"routing": {"sort": "throughput"}}, "routing.sort"),
               ({"routing": {"require_parameters": True}}, "require_parameters"),
               ({"routing": {"data_collection": "deny"}}, "data_collection"),
               ({"endpoint": {"mode": "batch", "service_tier": "flex"}}, "service_tier"),
               ({"endpoint": {"mode": "batch", "batch": {"max_requests": MAX_REQUESTS + 1}}}, "max_requests")]
    for sections, key in refused:
        with pytest.raises(ConfigError, match=key):
            check_batch_config(make_config(Path("/tmp/none"), ["chat"], **sections))
    with pytest.raises(ConfigError, match="no batch endpoint"):
        batch_provider(make_config(Path("/tmp/none"), ["chat"], routing={"only": ["zzz"]}), eps)
    # order without fallbacks is an allow-list: accepted
    ok = make_config(Path("/tmp/none"), ["chat"], routing={"order": ["b"], "allow_fallbacks": False})
    assert batch_provider(ok, eps)[0] == {"only": ["b/int4"]}
    # service tiers: tier endpoints only when asked for
    assert [e.tag for e in tier_pool(eps, None)] == ["a/fp8", "b/int4"]
    assert [e.tag for e in tier_pool(eps, "flex")] == ["c/flex"]


def test_limits_cut_batches_and_routing_reaches_the_batch(tmp_path: Path) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 9)
    with emulator(_scenario()) as emu:
        cfg = _cfg(tmp_path, emu.base_url, batch={"max_bytes": 1024}, routing={"ignore": ["chutes"]})
        rep = run_generate(cfg, **quiet)
    assert rep.exit_code == 0 and rep.done == 9
    views = list(load_batches(RunDir(run).batch_journal).values())
    assert len(views) >= 2 and all(v.size_bytes <= 1024 for v in views)
    assert all(v.provider_only == ["deepinfra/fp4", "baseten/fp4"] for v in views)
    # the cheapest batch endpoint left by the routing ran them
    assert {r.provider for r in responses(run, "chat")} == {"DeepInfra"}


def test_model_without_batch_variant_is_refused(tmp_path: Path) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 3)
    with emulator(_scenario(models=[])) as emu:
        with pytest.raises(ConfigError, match="no batch variant"):
            run_generate(_cfg(tmp_path, emu.base_url), **quiet)
        assert emu.state.requests == 0
    with pytest.raises(ConfigError, match="Batch API"):
        run_generate(_cfg(tmp_path, "http://127.0.0.1:9", kind="vllm"), **quiet)


def test_partially_failed_batch_is_finished_synchronously(tmp_path: Path) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    ids = write_prompts(run, "chat", 24)
    with emulator(_scenario("partial", item_fail_rate=0.3)) as emu:
        rep = run_generate(_cfg(tmp_path, emu.base_url), **quiet)
        sync_requests = emu.state.requests
    assert rep.exit_code == 0 and rep.done == 24
    recs = responses(run, "chat")
    assert sorted(r.sample_id for r in recs) == sorted(ids)
    from_sync = [r for r in recs if r.batch_id is None]
    assert from_sync and len(from_sync) < 24 and sync_requests == len(from_sync)
    kinds = Counter(a.outcome for a in _attempts(run))
    assert kinds["batch_item_error"] == len(from_sync) and kinds["ok"] == 24


@pytest.mark.parametrize("preset", ["failed", "expired"])
def test_failed_and_expired_batches_go_to_a_later_batch_then_give_up(tmp_path: Path, preset: str) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 5)
    sc = _scenario(preset, window_s=0.3) if preset == "expired" else _scenario(preset)
    with emulator(sc) as emu:
        rep = run_generate(_cfg(tmp_path, emu.base_url, batch={"retry": "batch"}, retry={"max_attempts": 2}), **quiet)
        billed = emu.state.spend_usd
    assert rep.done == 0 and rep.failed == 5 and billed == 0.0
    views = list(load_batches(RunDir(run).batch_journal).values())
    assert [v.status for v in views] == [preset, preset] and all(v.finished for v in views)
    assert {f.kind for f in failures(run, "chat")} == {f"retries_exhausted:batch_{preset}"}


def test_results_without_cost_share_the_batch_cost(tmp_path: Path) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 10)
    with emulator(_scenario(item_cost=False)) as emu:
        rep = run_generate(_cfg(tmp_path, emu.base_url), **quiet)
        billed = emu.state.spend_usd
    recs = responses(run, "chat")
    assert rep.done == 10 and all(r.usage is not None and r.usage.cost_computed for r in recs)
    assert sum(r.usage.cost for r in recs if r.usage) == pytest.approx(billed)


@pytest.mark.parametrize("bound", ["dollars", "tokens"])
def test_budgets_never_pass_their_bound_in_batch_mode(tmp_path: Path, bound: str) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 40)
    # The worst case of one request: 1,024 tokens at the dearest batch price ($1.50/M) ≈ $0.0015; 40 of
    # them ≈ $0.06, while they cost about $0.03. Batches are cut to what is left of the bound.
    budget = {"max_spend_usd": 0.02} if bound == "dollars" else {"token_budget": 20_000}
    with emulator(_scenario()) as emu:
        cfg = _cfg(tmp_path, emu.base_url, budget=budget, partitions={"short": {"concurrency": 8, "max_tokens": 1024}})
        rep = run_generate(cfg, **quiet)
        billed = emu.state.spend_usd
    recs = responses(run, "chat")
    assert 0 < len(recs) < 40
    views = list(load_batches(RunDir(run).batch_journal).values())
    assert len(views) >= 2 and all(v.finished for v in views)
    if bound == "dollars":
        assert rep.exit_code != 0 and rep.message is not None and "dollar budget" in rep.message
        assert billed <= 0.02 + 1e-12 and rep.spend_total <= 0.02 + 1e-12
        assert max(v.reserved_usd for v in views) <= 0.02  # no batch ever reserved more than was left
    else:
        assert rep.exit_code == 0 and sum(r.usage.completion_tokens for r in recs if r.usage) <= 20_000
        assert max(sum(it.max_tokens for it in v.items) for v in views) <= 20_000


def test_batch_lines_show_states_ages_and_reservations(tmp_path: Path) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 4)
    with emulator(_scenario()) as emu:
        run_generate(_cfg(tmp_path, emu.base_url, batch={"max_requests": 2}), **quiet)
    views = load_batches(RunDir(run).batch_journal)
    lines = batch_lines(views.values())
    assert lines[0].startswith("batches: 0 waiting to be submitted, 0 submitted, 0 in progress, 2 done")
    assert "$0 reserved" in lines[0]
    v = next(iter(views.values()))
    v.finished, v.status, v.completed = False, "in_progress", 1
    lines = batch_lines(views.values(), now=v.submitted_at + 125 if v.submitted_at else 0)
    assert "1 in progress" in lines[0] and f"{v.batch_id}: in_progress, 1/2 requests, age 2m 05s" in lines[1]


def test_status_and_the_provider_table_show_batches_and_tiers(tmp_path: Path) -> None:
    run = claim(_cfg(tmp_path, "http://unused"))
    write_prompts(run, "chat", 4)
    printed: list[str] = []
    with emulator(_scenario()) as emu:
        run_generate(_cfg(tmp_path, emu.base_url), echo=printed.append)
    # the table fits 80 columns: its last columns (tier last) come in the last block, under its own header
    head = max(i for i, ln in enumerate(printed) if ln.startswith("provider "))
    assert printed[head].split()[-1] == "tier" and printed[head + 1].split()[-1] == "batch"
    shown: list[str] = []
    run_status(str(run), echo=shown.append)
    assert "batches: 0 waiting to be submitted, 0 submitted, 0 in progress, 1 done" in shown[0]
    assert "tier batch" in shown[0]
    page = run_report(_cfg(tmp_path, "http://unused"), **quiet).path.read_text(encoding="utf-8")
    assert "<th>service tier</th>" in page and '<td class="mono">batch</td>' in page


def test_service_tier_is_sent_recorded_priced_and_shown(tmp_path: Path) -> None:
    sc = fast()
    flex = Provider("DeepInfra", "deepinfra/flex", "fp4", 0.2, 1.0, supports_logprobs=True, tier="flex")
    run = claim(_cfg(tmp_path, "http://unused", mode="sync"))
    write_prompts(run, "chat", 6)
    printed: list[str] = []
    with emulator(sc.replace(providers=[*sc.providers, flex])) as emu:
        cfg = make_config(tmp_path, ["chat"], base_url=emu.base_url, partitions=PARTS, endpoint={"service_tier": "flex"})
        rep = run_generate(cfg, echo=printed.append)
        billed = emu.state.spend_usd
    assert cfg.endpoint.service_tier == "flex" and rep.done == 6
    recs = responses(run, "chat")
    assert {r.service_tier for r in recs} == {"flex"} and {r.provider for r in recs} == {"DeepInfra"}
    u = recs[0].usage
    assert u is not None and u.cost == pytest.approx((u.prompt_tokens * 0.2 + u.completion_tokens * 1.0) / 1e6)
    assert sum(r.usage.cost for r in recs if r.usage) == pytest.approx(billed)
    # the table fits 80 columns: its last columns (tier last) come in the last block, under its own header
    head = max(i for i, ln in enumerate(printed) if ln.startswith("provider "))
    assert printed[head + 1].split()[-1] == "flex"
    with pytest.raises(ConfigError, match="service_tier"):
        run_generate(make_config(tmp_path, ["chat"], kind="vllm", base_url="http://127.0.0.1:9",
                                 endpoint={"service_tier": "flex"}), **quiet)


def test_plan_shows_sync_flex_and_batch_side_by_side(tmp_path: Path) -> None:
    rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Topic {i}?"}]}) for i in range(12)]
    (tmp_path / "chat.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    sc = fast()
    flex = Provider("DeepInfra", "deepinfra/flex", "fp4", 0.2, 1.0, tier="flex")
    printed: list[str] = []
    for variant, scenario in (("with", _scenario().replace(providers=[*sc.providers, flex])),
                              ("without", _scenario(models=[]))):
        with emulator(scenario) as emu:
            data = config_dict(tmp_path / variant, [{"name": "chat", "path": str(tmp_path / "chat.jsonl")}],
                               endpoint={"kind": "emulator", "base_url": emu.base_url}, progress="off",
                               plan={"avg_output_tokens": 200}, partitions=PARTS)
            rep = run_plan(config_from_mapping(data, where="test", base_dir=tmp_path), echo=printed.append)
        modes = {m.mode: m for m in rep.modes}
        assert modes["sync"].available and modes["sync"].cost_usd == pytest.approx(rep.expected_cost_usd)
        if variant == "with":
            assert modes["flex"].available and modes["flex"].vs_sync is not None and modes["flex"].vs_sync < 0.6
            b = modes["batch"]
            assert b.available and b.vs_sync is not None and b.vs_sync < 0.55 and b.time_s == 2 * 3600.0
            assert "1 batches of ≤ 5,000" in b.note
        else:
            assert modes["batch"].available is False and "no :batch variant" in modes["batch"].note
    assert any(ln.startswith("what remains, bought three ways") for ln in printed)
    assert any(ln.strip().startswith("batch ") and "≤ 24 h" in ln for ln in printed)
