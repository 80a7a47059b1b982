"""``phases.accept.kchoice`` (issue 35, item 4): the acceptance length at every k up to the served one from the
per-position counts, with intervals; the expected speedup per k and concurrency from the cost model, calibrated
on a measured speedup; the recommended k and the slow-down warning; the records through the store, the report
page and status."""

from __future__ import annotations

import html as htmllib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from _chain_helpers import accept_report, write_chain
from _common_helpers import config_dict, load, write_config
from _report_helpers import html_table, make_config, write_run_dir
from draftgen.config import load_config
from draftgen.config.accept import AcceptConfig
from draftgen.errors import ConfigError
from draftgen.phases.accept.figures import compare
from draftgen.phases.accept.kchoice import acceptance_by_k, k_choice, k_lines
from draftgen.phases.report.run import run_report
from draftgen.phases.status.run import run_status
from draftgen.records import AcceptanceFigures, AcceptReport, KChoice, PromptAcceptance, ThroughputFigures
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, encode_json, read_json

# accepted tokens at positions 1, 2, 3 of 10 drafts per prompt: Σ 24, 12, 4 over 40 drafts
PER_POS = [[6, 3, 1], [8, 5, 2], [4, 2, 0], [6, 2, 1]]


#: AL at k' = 1, 2 of PER_POS's prompts (each prompt's tokens over its steps at k': the first test)
AL1, AL2 = 1.6099, 1.907


def _rows() -> list[PromptAcceptance]:
    return [PromptAcceptance(sample_id=f"s{i}", dataset="walk", drafts=10.0, accepted=float(sum(p)),
                             accepted_per_pos=[float(v) for v in p], completion_tokens=20)
            for i, p in enumerate(PER_POS)]


def _report(**changes: Any) -> AcceptReport:
    """tiny-chain's report (k 3) with the per-prompt counters of PER_POS: AL(1) AL1, AL(2) AL2, AL(3) 2.0."""
    rep = accept_report(0.734, 0.573, 0.903, prompts=len(PER_POS))
    acc = msgspec.structs.replace(rep.acceptance, acceptance_length=2.0, per_position=[0.6, 0.3, 0.1],
                                  drafts=40.0, accepted=40.0, accepted_per_pos=[24.0, 12.0, 4.0])
    return msgspec.structs.replace(rep, acceptance=acc, per_prompt=_rows(), **changes)


def _measured(rep: AcceptReport, speedup: float) -> AcceptReport:
    """``rep`` with a --baseline-url pass: tokens/s with the drafter ``speedup`` times those without (the
    report's speedup rounded as accept rounds it)."""
    spec = msgspec.structs.replace(rep.speculative, tokens_per_s=100.0 * speedup)
    base = ThroughputFigures(base_url="http://base/v1", requests=rep.prompts, completion_tokens=100, seconds=1.0,
                             tokens_per_s=100.0)
    return msgspec.structs.replace(rep, speculative=spec, baseline=base, speedup=round(speedup, 4))


def test_the_acceptance_length_at_every_k_is_each_prompts_tokens_over_its_steps_at_that_k() -> None:
    rep = _report()
    by_k, notes = acceptance_by_k(rep.per_prompt, rep.acceptance, 3)
    # prompt p's 10 + A_p tokens in (10 + A_p) / (1 + its first k' positions' accepted / 10) steps: at k' = 1
    # 80 tokens in 20/1.6 + 25/1.8 + 16/1.4 + 19/1.6 steps; the pooled shares alone would say 1.6 and 1.9
    want = [round(80 / sum((10 + sum(p)) / (1 + sum(p[:j]) / 10) for p in PER_POS), 4) for j in (1, 2, 3)]
    assert want == [AL1, AL2, 2.0]
    assert [(f.k, f.acceptance_length) for f in by_k] == list(zip((1, 2, 3), want, strict=True)) and notes == []
    # the intervals: figures' seeded bootstrap, so the same on every call, and at the served k the drafter's own
    again, _ = acceptance_by_k(rep.per_prompt, rep.acceptance, 3)
    assert [f.ci95 for f in again] == [f.ci95 for f in by_k]
    assert by_k[2].ci95 == compare(rep.per_prompt, [None] * 4, 3, counted=True).ci95
    for f in by_k:
        assert f.ci95 is not None and f.ci95[0] < f.acceptance_length < f.ci95[1]
    # served with k 2: figures up to 2 only
    assert [f.k for f in acceptance_by_k(rep.per_prompt, rep.acceptance, 2)[0]] == [1, 2]
    # no per-prompt counters (vLLM with many in flight): the pass's per position, without intervals
    bare = [msgspec.structs.replace(r, drafts=0.0, accepted=0.0, accepted_per_pos=[]) for r in rep.per_prompt]
    by_k, notes = acceptance_by_k(bare, rep.acceptance, 3)
    assert [(f.k, f.acceptance_length, f.ci95) for f in by_k] == [(1, 1.6, None), (2, 1.9, None), (3, 2.0, None)]
    assert notes == ["per-prompt per-position counts unknown: the acceptance by k has no intervals"]
    # SGLang's meta_info: no per-position counts at all, only the served k
    sg = AcceptanceFigures(source="sglang-meta_info", acceptance_length=1.964, ci95=[1.8, 2.1])
    by_k, notes = acceptance_by_k(bare, sg, 3)
    assert [(f.k, f.acceptance_length, f.ci95) for f in by_k] == [(3, 1.964, [1.8, 2.1])]
    assert notes == ["the server gave no per-position counts (sglang-meta_info): the acceptance below k=3 is unknown"]
    assert k_choice(msgspec.structs.replace(rep, k=None, per_prompt=bare, acceptance=sg), AcceptConfig(),
                    measured_concurrency=1) is None


@pytest.mark.parametrize("rates", [(0.9, 0.2), (0.95, 0.5, 0.1), (0.6, 0.6)])
def test_an_easy_prompt_takes_fewer_steps_at_the_served_k_and_is_weighed_as_at_the_smaller_k(
        rates: tuple[float, ...]) -> None:
    """Prompts whose every draft token is accepted with their own rate a (the chain assumption), counted as a k
    = 3 server counts them: the AL at k' is exactly what serving at k' gives, Σ T / Σ T / (1 + a + ... +
    a^k'), where pooling the counts as measured (each prompt weighed by its steps at k = 3) is biased low as
    soon as the prompts differ."""
    tokens = 600.0
    rows, truth = [], {}
    for i, a in enumerate(rates):
        steps = tokens / sum(a**n for n in range(4))
        per_pos = [steps * a**n for n in (1, 2, 3)]
        rows.append(PromptAcceptance(sample_id=f"s{i}", dataset="walk", drafts=steps, accepted=sum(per_pos),
                                     accepted_per_pos=per_pos))
    for j in (1, 2, 3):
        truth[j] = len(rates) * tokens / sum(tokens / sum(a**n for n in range(j + 1)) for a in rates)
    by_k, _ = acceptance_by_k(rows, AcceptanceFigures(source="vllm-per-request", acceptance_length=truth[3]), 3)
    assert [f.acceptance_length for f in by_k] == [round(truth[j], 4) for j in (1, 2, 3)]
    pooled = 1 + sum(r.accepted_per_pos[0] for r in rows) / sum(r.drafts for r in rows)
    assert (pooled < truth[1] - 0.01) == (len(set(rates)) > 1)


def test_the_cost_model_figures_and_the_recommendation_on_a_hand_computed_case() -> None:
    # d 0.05, S 256. At c <= 32 every step is memory-bound: speedup = AL(k) / (1 + 0.05 k): AL1/1.05, AL2/1.1,
    # 2.0/1.15. At c 128: t0 = 1, verifying k+1 tokens costs 128 (k+1)/256: AL1/(1+.05), AL2/(1.5+.1), 2/(2+.15)
    kc = k_choice(_report(), AcceptConfig(concurrency=4), measured_concurrency=1)
    assert kc is not None and not kc.calibrated and kc.concurrencies == [1, 8, 32, 128]
    expected = {1: [AL1 / 1.05] * 4, 2: [AL2 / 1.1] * 3 + [AL2 / 1.6], 3: [2.0 / 1.15] * 3 + [2.0 / 2.15]}
    for f in kc.by_k:
        assert [f.speedup[c] for c in kc.concurrencies] == pytest.approx(expected[f.k], abs=5e-4), f.k
    assert kc.best_k == {1: 3, 8: 3, 32: 3, 128: 1}
    # accept.concurrency 4 is not listed: the recommendation is at the smallest listed concurrency
    assert (kc.recommended_k, kc.recommended_at, kc.slower_at) == (3, 1, [128])
    assert kc.warnings == ["at concurrency 128 the drafter is expected to slow serving to 0.93× at k=3: serve k=1 "
                           f"there (×{AL1 / 1.05:.2f})"]
    assert kc.notes[0].startswith("expected speedups from the cost model (docs/train.md), not measured: a target "
                                  "step of n tokens costs max(1, n/256) decode steps, a draft step 0.05 of one")
    # served at concurrency 128 (listed): k 1 there, and it is faster than plain decoding everywhere
    at128 = k_choice(_report(), AcceptConfig(concurrency=128), measured_concurrency=1)
    assert at128 is not None and (at128.recommended_k, at128.slower_at, at128.warnings) == (1, [], [])


def test_the_slow_down_warning_appears_only_where_the_recommended_k_is_below_one() -> None:
    fast = k_choice(_report(), AcceptConfig(concurrencies=[1, 8]), measured_concurrency=1)
    assert fast is not None and fast.slower_at == [] and fast.warnings == []
    assert not any(line.startswith("warning:") for line in k_lines(_report(k_choice=fast)))
    # S 16: from concurrency 8 on the verification is compute-bound; at 32 and 128 even k 1 loses
    slow = k_choice(_report(), AcceptConfig(saturation_tokens=16), measured_concurrency=1)
    assert slow is not None and (slow.recommended_k, slow.slower_at) == (3, [8, 32, 128])
    assert slow.warnings[0] == ("at concurrency 8 the drafter is expected to slow serving to 0.93× at k=3: serve k=1 "
                                f"there (×{AL1 / 1.05:.2f})")
    # 128: t0 8, k 3 costs 512/16 + 0.15, k 1 costs 256/16 + 0.05
    assert slow.warnings[2] == (f"at concurrency 128 the drafter is expected to slow serving to {16 / 32.15:.2f}× at "
                                f"k=3 (at best {AL1 * 8 / 16.05:.2f}× at k=1): serve without it at that concurrency")
    lines = k_lines(_report(k_choice=slow))
    assert [line for line in lines if line.startswith("warning:")] == [f"warning: {w}" for w in slow.warnings]


@pytest.mark.parametrize("concurrency", [1, 128])
@pytest.mark.parametrize("cost", [0.02, 0.08, 0.3])
def test_calibration_recovers_the_draft_step_cost_behind_a_measured_speedup(concurrency: int, cost: float) -> None:
    # what a server with draft steps of `cost` would measure at k 3 (AL 2.0), S 256: t0 = 1 at both concurrencies,
    # verifying 4 tokens per sequence costs 1 at concurrency 1 and 128·4/256 = 2 at 128
    verify = max(1.0, concurrency * 4 / 256)
    measured = 2.0 / (verify + 3 * cost)
    rep = _measured(_report(), measured)
    kc = k_choice(rep, AcceptConfig(draft_step_cost=0.5), measured_concurrency=concurrency)
    assert kc is not None and kc.calibrated and (kc.measured_concurrency, kc.measured_speedup) == (concurrency,
                                                                                                  rep.speedup)
    assert kc.draft_step_cost == pytest.approx(cost, abs=2e-4)  # not the configured 0.5
    served = next(f for f in kc.by_k if f.k == 3)
    assert served.speedup[concurrency] == pytest.approx(measured, abs=1e-3)  # the model gives what was measured
    assert kc.notes[-1].startswith(f"expected speedups from the cost model calibrated on the measured "
                                   f"×{rep.speedup:.3f} at k=3, concurrency {concurrency}")


def test_a_measured_speedup_above_the_models_ceiling_fits_free_draft_steps_and_says_so() -> None:
    kc = k_choice(_measured(_report(), 2.5), AcceptConfig(), measured_concurrency=1)  # AL 2.0 cannot give 2.5×
    assert kc is not None and kc.calibrated and kc.draft_step_cost == 0.0
    assert "the measured speedup is above the model's ×2.000 with free draft steps" in kc.notes[-1]


def test_the_console_lines_give_the_table_the_recommendation_and_the_model() -> None:
    rep = _report()
    rep = msgspec.structs.replace(rep, k_choice=k_choice(rep, AcceptConfig(), measured_concurrency=1))
    assert rep.k_choice is not None
    ci = rep.k_choice.by_k[2].ci95 or [0.0, 0.0]
    lines = k_lines(rep)
    assert lines[1] == "     k  acceptance length            c=1     c=8    c=32   c=128"
    assert lines[4] == f"  *  3  {f'2.000 [{ci[0]:.3f}, {ci[1]:.3f}]':<24}   1.74×   1.74×   1.74×   0.93×"
    assert lines[5] == "recommended: k=3 at concurrency 1 (×1.74 expected; served k=3)"
    assert lines[-1].startswith("warning: at concurrency 128")
    assert k_lines(_report()) == []  # a report without k_choice (an older draftgen's)


def test_the_figures_by_k_round_trip_through_the_store_and_an_old_report_still_reads(tmp_path: Path) -> None:
    rep = _report()
    rep = msgspec.structs.replace(rep, k_choice=k_choice(_measured(rep, 1.5), AcceptConfig(),
                                                         measured_concurrency=1))
    path = tmp_path / "accept" / "pass.json"
    atomic_write_json(path, rep)
    back = read_json(path, AcceptReport)
    # measured ×1.5 at k 3: draft steps of 1/9 (2.0 / (1 + 3d) = 1.5), and then k 2 is faster (AL2 / (1 + 2/9))
    assert back == rep and back.k_choice is not None and back.k_choice.draft_step_cost == 0.1111
    assert back.k_choice.best_k == {1: 2, 8: 2, 32: 2, 128: 1}  # int keys back as ints
    old = msgspec.structs.replace(rep, k_choice=None)
    assert b"k_choice" not in encode_json(old)  # omit_defaults: a report without it is an older one's shape
    atomic_write_json(path, old)
    assert read_json(path, AcceptReport).k_choice is None
    assert msgspec.json.decode(encode_json(rep.k_choice), type=KChoice) == rep.k_choice


@pytest.mark.parametrize(("section", "expected"), [
    ({"saturation_tokens": 0}, "accept.saturation_tokens 0 must be >= 1"),
    ({"draft_step_cost": -0.1}, "accept.draft_step_cost -0.1 must be >= 0"),
    ({"concurrencies": []}, "accept.concurrencies [] must list one or more concurrencies >= 1"),
    ({"concurrencies": [1, 0]}, "accept.concurrencies [1, 0] must list one or more concurrencies >= 1")])
def test_a_cost_model_parameter_out_of_range_is_refused_at_load_in_one_line(tmp_path: Path, section: dict[str, Any],
                                                                           expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(write_config(tmp_path, config_dict(tmp_path, accept=section)))
    assert expected in str(info.value) and "\n" not in str(info.value)
    cfg = load(write_config(tmp_path, config_dict(tmp_path, accept={"concurrencies": [4, 64]})))
    assert cfg.accept.concurrencies == [4, 64] and cfg.accept.saturation_tokens == 256


def test_the_report_page_and_status_show_the_figures_by_k_and_the_recommended_k(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run)
    write_chain(run)
    page = run_report(load_config(make_config(tmp_path, run)), echo=lambda _s: None).path.read_text()
    assert 'id="accept-by-k"' not in page  # tiny-chain's report has no k_choice: no table, no error
    rep = _report()
    rep = msgspec.structs.replace(rep, k_choice=k_choice(rep, AcceptConfig(), measured_concurrency=1))
    assert rep.k_choice is not None
    atomic_write_json(RunDir(run).accept_json, rep)
    page = run_report(load_config(make_config(tmp_path, run)), echo=lambda _s: None).path.read_text()
    table = html_table(page, "accept-by-k")
    assert table[0] == ["k", "acceptance length", "95% interval"] + [
        f"expected speedup, concurrency {c}" for c in (1, 8, 32, 128)]
    ci = rep.k_choice.by_k[0].ci95 or [0.0, 0.0]
    assert table[1] == ["1", f"{AL1:.3f}", f"[{ci[0]:.3f}, {ci[1]:.3f}]"] + [f"{AL1 / 1.05:.2f}×"] * 4
    assert table[3][0] == "3 (recommended) (served)" and table[3][-1] == "0.93×"
    assert ("at concurrency 128 the drafter is expected to slow serving to 0.93× at k=3: serve k=1 there "
            f"(×{AL1 / 1.05:.2f})") in htmllib.unescape(page)
    out: list[str] = []
    run_status(str(run), echo=out.append)
    assert ("k=3 recommended at concurrency 1 (slower than without the drafter at concurrency 128)"
            in " ".join("\n".join(out).split()))
