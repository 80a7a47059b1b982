"""draftgen plan against the emulator: pilot kept for the run, prices, budget caps, disk, failures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import yaml
from click.testing import CliRunner

from _common_helpers import config_dict
from _common_helpers import write_config as write_shared_config
from draftgen.backends import EndpointInfo
from draftgen.backends.base import EndpointPricing
from draftgen.backends.pricing import eligible_endpoints, estimate_price
from draftgen.cli import cli
from draftgen.config import RoutingConfig, load_config
from draftgen.emulator.server import EmulatorOptions, RunningEmulator, start_in_thread
from draftgen.errors import AuthError
from draftgen.phases.generate.run import run_generate
from draftgen.phases.plan.run import run_plan
from draftgen.records import GroundTruthRecord, ResponseRecord
from draftgen.store import iter_jsonl


@pytest.fixture(scope="module")
def emulator() -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(port=0)) as emu:
        yield emu


def write_config(tmp: Path, *, base_url: str | None = None, n: int = 10, extra: str = "", key: str = "sk-or-v1-t") -> Path:
    """Two datasets (``a`` of ``n`` prompts, ``b`` of half as many), the emulator keyed by ``tmp/key``;
    ``extra`` is YAML text whose top-level sections are added to (or replace) the config's. The key file
    lies in pytest's temp folder, so it never holds ``FAKE_KEY`` (the reliability suite scans for it)."""
    rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Tell me about topic {i}."}]}) for i in range(n)]
    (tmp / "a.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    (tmp / "b.jsonl").write_bytes(b"\n".join(rows[: n // 2]) + b"\n")
    (tmp / "key").write_text(key, encoding="utf-8")
    sections = {
        "endpoint": {"kind": "emulator", "api_key_file": "key", **({"base_url": base_url} if base_url else {})},
        "progress": "off",
        "partitions": {"short": {"concurrency": 4, "max_tokens": 300}, "long": {"concurrency": 2, "max_tokens": 600}},
        **(yaml.safe_load(extra) or {}),
    }
    return write_shared_config(tmp, config_dict(tmp, ["a", "b"], **sections))


def _records(run: Path, name: str) -> list[ResponseRecord]:
    return [r for _, r in iter_jsonl(run / "raw" / name / "raw_responses.jsonl", ResponseRecord)]


def test_pilot_is_kept_and_reused_by_the_run(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()  # the target's config: its layer count, for which drafters the capture feeds
    (tmp_path / "target" / "config.json").write_text('{"num_hidden_layers": 36, "hidden_size": 4096}')
    cfg = load_config(write_config(tmp_path, extra="plan: {pilot: 2}\nhidden_states: {hidden_size: 4096, "
                                                  "extraction_tokens_per_s: 20000, model: target, "
                                                  "layer_ids: [2, 10, 18, 26, 33, 34]}\n"))
    lines: list[str] = []
    rep = run_plan(cfg, echo=lines.append)
    run = tmp_path / "run"
    assert rep.pilot_responses == 4
    assert [len(_records(run, n)) for n in ("a", "b")] == [2, 2]
    pilot_gt = {g.generation_id for _, g in iter_jsonl(run / "emulator" / "ground_truth.jsonl", GroundTruthRecord)}
    assert {r.generation_id for n in ("a", "b") for r in _records(run, n)} <= pilot_gt
    a = rep.datasets[0]
    assert (a.prompts, a.done, a.remaining) == (10, 2, 8)
    assert a.output_basis == "observed (2)"
    done = _records(run, "a")
    mean_out = sum(r.usage.completion_tokens for r in done if r.usage) / 2
    assert a.avg_output_tokens == pytest.approx(mean_out)
    assert a.expected_output_tokens == round(8 * mean_out)
    assert a.cost_usd == pytest.approx(sum(r.usage.cost for r in done if r.usage) / 2 * 8)
    assert rep.prices is not None and rep.prices.basis == "load-balance"
    assert rep.hidden is not None and rep.hidden.hidden_size == 4096 and rep.hidden.tokens > 0
    assert rep.hidden.bytes == rep.hidden.tokens * 4096 * 4 * 2
    assert rep.extraction_s == pytest.approx(rep.hidden.tokens / 20000)
    assert any(line.startswith("hidden states") for line in lines)
    assert "feeds eagle3, eagle3.1, peagle, dflash, dflash2, dspark, xpress" in rep.algorithms[0]
    assert any("eagle3/eagle3.1/peagle: layers [2, 18, 33] + final" in line for line in lines)
    # Planning again sends nothing new; the run sends only the rest.
    again = run_plan(cfg, echo=lambda s: None)
    assert again.pilot_responses == 0 and [len(_records(run, n)) for n in ("a", "b")] == [2, 2]
    gen = run_generate(cfg, echo=lambda s: None, argv=["draftgen", "generate"])
    assert gen.exit_code == 0
    assert [d.done_before for d in gen.datasets] == [2, 2] and gen.done == 11


@pytest.mark.parametrize(("window_mb", "under"), [(2000, False), (50, True)])
def test_online_training_plans_its_window_against_two_batches(tmp_path: Path, emulator: RunningEmulator,
                                                              window_mb: float, under: bool) -> None:
    (tmp_path / "target").mkdir()  # Kimi-K2.5's sizes: 61 layers, hidden 7168, bf16
    (tmp_path / "target" / "config.json").write_text(
        '{"text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "torch_dtype": "bfloat16"}}')
    cfg = load_config(write_config(tmp_path, base_url=emulator.base_url, extra=(
        "plan: {avg_output_tokens: 200}\nhidden_states: {hidden_size: 7168, model: target}\n"
        f"train: {{online: true, total_seq_len: 8192, online_window_mb: {window_mb}}}\n")))
    lines: list[str] = []
    rep = run_plan(cfg, echo=lines.append)
    online = [x for x in rep.algorithms if x.startswith("train --online")]
    # EAGLE-3's three aux layers + the final, 7168 wide, 2 bytes: 57,344 bytes a token; two 8,192-token batches
    assert len(online) == 1 and "57,344 bytes a token" in online[0] and "about 940 MB" in online[0]
    assert ("the window is under one batch" in online[0]) is under
    assert any(x.strip() == online[0] for x in lines)


def test_budget_too_small_says_what_to_cap(tmp_path: Path, emulator: RunningEmulator) -> None:
    cfg = load_config(write_config(tmp_path, base_url=emulator.base_url,
                                   extra="plan: {avg_output_tokens: 200}\nbudget: {max_spend_usd: 0.001}\n"))
    lines: list[str] = []
    rep = run_plan(cfg, echo=lines.append)
    out = "\n".join(lines)
    assert rep.pilot_responses == 0 and not (tmp_path / "run" / "raw").exists()
    assert rep.datasets[0].output_basis == "plan.avg_output_tokens" and rep.datasets[0].cost_basis == "prices"
    assert rep.expected_cost_usd is not None and rep.expected_cost_usd > 0.001
    assert rep.budget_ok is False
    caps = {d.dataset: d for d in rep.datasets}
    assert 0 <= caps["a"].cap_samples < 10 and caps["a"].cap_tokens is not None  # type: ignore[operator]
    fitted = sum((d.cap_samples or 0) * (d.cost_usd or 0) / d.remaining for d in rep.datasets)
    assert fitted <= 0.001 + 1e-9
    assert "does NOT suffice" in out and "datasets[0].token_budget" in out
    assert rep.account_remaining_usd is not None and rep.account_ok is True
    # Without a pilot or averages the output is an upper bound at max_tokens.
    cfg2 = load_config(write_config(tmp_path, base_url=emulator.base_url))
    rep2 = run_plan(cfg2, echo=lambda s: None)
    assert rep2.datasets[0].avg_output_tokens == 300 and rep2.datasets[0].output_basis == "max_tokens"
    assert any("upper bounds" in n for n in rep2.notes)


def test_ignored_provider_is_not_priced(tmp_path: Path, emulator: RunningEmulator) -> None:
    base = run_plan(load_config(write_config(tmp_path, base_url=emulator.base_url)), echo=lambda s: None)
    assert base.prices is not None and len(base.eligible_endpoints) == 3
    shares = base.prices.providers
    cheapest = max(shares, key=lambda tag: shares[tag])  # load balancing favours the cheapest
    rep = run_plan(load_config(write_config(tmp_path, base_url=emulator.base_url,
                                            extra=f"routing: {{ignore: [{cheapest.split('/')[0]}]}}\n")),
                   echo=lambda s: None)
    assert cheapest not in rep.eligible_endpoints and len(rep.eligible_endpoints) == 2
    assert rep.prices is not None and cheapest not in rep.prices.providers
    rep = run_plan(load_config(write_config(tmp_path, base_url=emulator.base_url, extra="routing: {sort: price}\n")),
                   echo=lambda s: None)
    assert rep.prices is not None and rep.prices.basis == "price"
    assert rep.prices.completion == rep.prices.min_completion


def test_plan_bad_key_and_no_credits(tmp_path: Path) -> None:
    with start_in_thread(EmulatorOptions(port=0, api_key="sk-or-v1-right")) as emu:
        cfg = write_config(tmp_path, base_url=emu.base_url, key="sk-or-v1-wrong")
        with pytest.raises(AuthError, match="rejected"):
            run_plan(load_config(cfg), echo=lambda s: None)
        res = CliRunner().invoke(cli, ["plan", str(cfg)])
        assert res.exit_code == 1 and "Error:" in res.output and "sk-or-v1-wrong" not in res.output
    with start_in_thread(EmulatorOptions(port=0, credits=0.001)) as emu:
        lines: list[str] = []
        rep = run_plan(load_config(write_config(tmp_path, base_url=emu.base_url, extra="plan: {pilot: 3}\n")),
                       echo=lines.append)
    assert rep.account_ok is False and rep.account_remaining_usd is not None
    assert any("pilot stopped early" in n for n in rep.notes)
    assert "add credits" in "\n".join(lines)


def test_price_estimate_follows_routing() -> None:
    def ep(name: str, tag: str, q: str, out: float) -> EndpointInfo:
        return EndpointInfo(provider_name=name, tag=tag, quantization=q,
                            pricing=EndpointPricing(prompt=out / 5, completion=out))
    eps = [ep("DeepInfra", "deepinfra/fp4", "fp4", 2e-6), ep("DeepInfra", "deepinfra/turbo", "fp8", 4e-6),
           ep("Chutes", "chutes/int4", "int4", 1e-6)]
    assert [e.tag for e in eligible_endpoints(eps, RoutingConfig(ignore=["deepinfra"]))] == ["chutes/int4"]
    assert [e.tag for e in eligible_endpoints(eps, RoutingConfig(only=["DeepInfra/turbo"]))] == ["deepinfra/turbo"]
    assert [e.tag for e in eligible_endpoints(eps, RoutingConfig(quantizations=["fp4", "fp8"]))] == \
        ["deepinfra/fp4", "deepinfra/turbo"]
    assert [e.tag for e in eligible_endpoints(eps, RoutingConfig(max_price={"completion": 2.0}))] == \
        ["deepinfra/fp4", "chutes/int4"]
    order = estimate_price(eps, RoutingConfig(order=["deepinfra/turbo"]))
    assert order is not None and order.completion == 4e-6 and order.basis == "order"
    lb = estimate_price(eps, RoutingConfig())
    assert lb is not None and lb.basis == "load-balance"
    # 1/price² weighting: the cheapest endpoint gets the largest share.
    assert max(lb.providers, key=lambda k: lb.providers[k]) == "chutes/int4"
    assert 1e-6 < lb.completion < 4e-6 and sum(lb.providers.values()) == pytest.approx(1.0)
    assert estimate_price([], RoutingConfig()) is None


def test_time_comes_in_waves_never_under_one_request_and_rows_add_up(tmp_path: Path, emulator: RunningEmulator,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table's basis column on one line
    # The case: few prompts, 2,000 in flight. latency × prompts ÷ concurrency said 11 s of a 6-minute run.
    cfg = load_config(write_config(tmp_path, base_url=emulator.base_url, n=20, extra=(
        "partitions: {short: {concurrency: 2000, max_tokens: 1000}, long: {concurrency: 500, max_tokens: 2000}}\n"
        "plan: {avg_output_tokens: 400, avg_latency_s: 9.0}\nbudget: {token_budget: 6000}\n"
        "model: {id: moonshotai/kimi-k2.5, profile: qwen3, tokenizer: 'bundled:qwen3'}\n")))
    lines: list[str] = []
    rep = run_plan(cfg, echo=lines.append)
    (short,) = rep.partitions
    assert short.waves == 1 and rep.time_s == short.time_s >= 1.0 + 1000 / 50 >= 9.0  # one request at max_tokens
    assert sum(d.time_s for d in rep.datasets) == pytest.approx(rep.time_s)
    # The token budget binds a: 6,000 tokens at 400 a sample is 15 of its 20 prompts; it shows in the basis.
    a = rep.datasets[0]
    assert a.requests == pytest.approx(15) and a.token_budget == 6000
    assert "token budget 0/6,000" in "\n".join(lines)
    assert any("does not look like a model of profile 'qwen3'" in n for n in rep.notes)  # the profile's fit
    # Many waves: (waves - 1) × mean + the slowest request.
    from draftgen.config import PartitionConfig, PartitionsConfig
    from draftgen.phases.plan.timing import PartitionWork, StreamRates, partition_times

    narrow = msgspec.structs.replace(cfg, partitions=PartitionsConfig(
        short=PartitionConfig(concurrency=4, max_tokens=1000), long=PartitionConfig(concurrency=2, max_tokens=2000)))
    work = [PartitionWork(dataset="a", partition="short", requests=20, latency_s=9.0),
            PartitionWork(dataset="a", partition="long", requests=4, latency_s=9.0)]
    got = {p.partition: p for p in partition_times(narrow, work, StreamRates(ttft_s=1.0, slowest_tokens_per_s=20.0,
                                                                             responses=5))}
    assert got["short"].waves == 5 and got["short"].time_s == pytest.approx(4 * 9.0 + 1.0 + 1000 / 20)
    assert got["long"].waves == 2 and got["long"].time_s == pytest.approx(9.0 + 1.0 + 2000 / 20)


def test_overshoot_bound_is_sized_to_what_can_be_in_flight(tmp_path: Path, emulator: RunningEmulator) -> None:
    cfg = load_config(write_config(tmp_path, base_url=emulator.base_url, n=10, extra=(
        "partitions: {short: {concurrency: 2000, max_tokens: 10240}, long: {concurrency: 500, max_tokens: 16384}}\n"
        "plan: {avg_output_tokens: 300}\nbudget: {max_spend_usd: 100}\n")))
    lines: list[str] = []
    rep = run_plan(cfg, echo=lines.append)
    bound = next(ln for ln in lines if ln.startswith("budget bound"))
    assert "15 × 10,240" in bound and "2,000" not in bound and "500 ×" not in bound  # 10 + 5 prompts, no long ones
    assert rep.budget_ok and "to shrink it" not in bound  # 15 × 10,240 × $3/M = $0.46, under a fifth of $100
    small = load_config(write_config(tmp_path, base_url=emulator.base_url, n=10, extra=(
        "partitions: {short: {concurrency: 2000, max_tokens: 10240}}\nplan: {avg_output_tokens: 300}\n"
        "budget: {max_spend_usd: 1}\n")))
    lines = []
    run_plan(small, echo=lines.append)
    bound = next(ln for ln in lines if ln.startswith("budget bound"))
    assert "46% of the budget" in bound and "partitions.short.concurrency" in bound and "token_policy: strict" in bound
