"""Generation against a server that lies (issue 22): each defect of the attack on 926b262, replayed against
``_billing.LyingOpenRouter``, a fake OpenRouter in front of a real emulator that logs what it billed.

Money: on every overspend attack the server's billed total stays within the budget plus the worst case of
what was in flight, and what draftgen booked (its records, and the attempts log for what left no record)
covers what was billed. Data: no other model's or provider's text, no second choice, no half of the
reasoning; incomplete answers are retried. Verdicts: an excluded sample is not done (generated again,
elsewhere), a mostly excluded run fails, an underbilled record with exact ids is kept and the provider
blamed. Rate limits are waited out; the key's limit is named.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from _generate_helpers import claim, emulator, failures, make_config, responses, write_prompts
from draftgen.emulator import Provider, builtin_scenario
from draftgen.emulator.scenarios import Scenario
from draftgen.errors import ThresholdBroken
from draftgen.phases.audit.run import run_audit
from draftgen.phases.generate.run import GenerateReport, run_generate
from draftgen.phases.merge.run import run_merge
from draftgen.records import AttemptRecord
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, scan_attempt_spend, scan_responses

from ._billing import Lie, LyingOpenRouter, Obj

QUIET: dict[str, Any] = {"echo": lambda s: None}
MAX_TOKENS = 2048


def _scenario(**changes: Any) -> Scenario:
    return builtin_scenario("fast").replace(pool_size=64, **changes)


def _run(tmp: Path, lie: Lie | None, n: int, *, sc: Scenario | None = None, key: Any = None, prompts: bool = True,
         gt: bool = False, **sections: Any) -> tuple[Path, GenerateReport, LyingOpenRouter, Any]:
    base = make_config(tmp, ["q"])
    run_dir = base.run_path
    if prompts:
        claim(base)
        write_prompts(run_dir, "q", n)
    opts: dict[str, Any] = {"ground_truth": str(tmp / "gt.jsonl")} if gt else {}
    with emulator(sc or _scenario(), **opts) as emu, LyingOpenRouter(emu, lie, key) as fake:
        sections.setdefault("partitions", {"short": {"concurrency": 4, "max_tokens": MAX_TOKENS}})
        sections.setdefault("audit", {"reference": str(tmp / "gt.jsonl")} if gt else {})
        cfg = make_config(tmp, ["q"], base_url=fake.base_url, **sections)
        rep = run_generate(cfg, **QUIET)
        fake.billed_at_end = fake.billed
    return run_dir, rep, fake, cfg


def _attempts(run_dir: Path) -> list[AttemptRecord]:
    return [a for _, a in iter_jsonl(RunDir(run_dir).attempts, AttemptRecord)]


def _booked(run_dir: Path) -> float:
    """What the next run's budget sees: the records' spend and the attempts that left no record."""
    rd = RunDir(run_dir)
    return scan_responses(rd.raw("q")).spend_usd + _attempts_booked(rd)


def _worst(concurrency: int) -> float:
    """The worst case of what can be in flight: max_tokens at the dearest provider's prices (+ prompts)."""
    return concurrency * (MAX_TOKENS * 3.0e-6 + 200 * 0.6e-6)


def _delta(obj: Obj) -> Obj | None:
    ch = obj.get("choices") or []
    return ch[0].get("delta") if ch and isinstance(ch[0], dict) else None


# -- 1, 2: every billed response is booked -----------------------------------------------------------------


class CoercedUsage(Lie):
    """Counts as floats, the cost as a string: a body the old decoder refused (and booked $0 for)."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        u = obj.get("usage")
        if u:
            u["completion_tokens"] = float(u["completion_tokens"])
            u["cost"] = str(u["cost"])
        return [obj]


class BadShape(CoercedUsage):
    """The finish chunk of the wrong shape (its usage still readable): the response is rejected, billed."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        ch = obj.get("choices") or []
        if ch and ch[0].get("finish_reason"):
            ch[0]["delta"] = 7
        return super().chunk(obj, st)


class NegativeCost(Lie):
    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        if obj.get("usage"):
            obj["usage"]["cost"] = -0.01
        return [obj]


def test_coerced_usage_is_read_and_booked(tmp_path: Path) -> None:
    run_dir, rep, fake, _ = _run(tmp_path, CoercedUsage(), 6)
    assert rep.exit_code == 0 and rep.done == 6
    assert all("usage_coerced" in r.recon_flags for r in responses(run_dir, "q"))
    assert rep.spend_session == pytest.approx(fake.billed_at_end, rel=1e-6)


@pytest.mark.parametrize("lie", [BadShape(), NegativeCost()], ids=["bad_shape", "negative_cost"])
def test_overspend_attacks_stay_within_budget_plus_in_flight(tmp_path: Path, lie: Lie) -> None:
    budget, conc = 0.01, 2
    run_dir, rep, fake, _ = _run(tmp_path, lie, 30, budget={"max_spend_usd": budget},
                                 partitions={"short": {"concurrency": conc, "max_tokens": MAX_TOKENS}})
    assert fake.billed_at_end <= budget + _worst(conc), (fake.billed_at_end, rep.message)
    assert rep.exit_code != 0 and "max-spend" in (rep.message or "")
    assert _booked(run_dir) >= fake.billed_at_end * 0.999  # every billed byte is booked: no credit
    if isinstance(lie, NegativeCost):
        assert all("cost_invalid" in r.recon_flags and r.usage and r.usage.cost > 0 for r in responses(run_dir, "q"))


def test_requests_abandoned_on_interrupt_are_booked_for_the_next_run(tmp_path: Path) -> None:
    slow = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, tokens_per_s=(300.0, 300.0)),
            Provider("Baseten", "baseten/fp4", "fp4", 0.60, 3.00, tokens_per_s=(300.0, 300.0))]
    base = make_config(tmp_path, ["q"])
    claim(base)
    write_prompts(base.run_path, "q", 12)
    with emulator(_scenario(providers=slow)) as emu, LyingOpenRouter(emu) as fake:

        def interrupt_twice() -> None:  # once 6 requests are on the wire: Ctrl-C, then Ctrl-C again (abort)
            while fake.chats < 6:
                threading.Event().wait(0.05)
            threading.Event().wait(0.3)
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(0.3)
            os.kill(os.getpid(), signal.SIGINT)

        killer = threading.Thread(target=interrupt_twice, daemon=True)
        killer.start()
        cfg = make_config(tmp_path, ["q"], base_url=fake.base_url,
                          partitions={"short": {"concurrency": 6, "max_tokens": MAX_TOKENS}})
        rep = run_generate(cfg, **QUIET)
        killer.join()
        deadline = 60.0
        while emu.state.in_flight_usd > 1e-12 and deadline > 0:  # the provider finishes what was left
            threading.Event().wait(0.2)
            deadline -= 0.2
        billed = fake.billed
    assert rep.exit_code == 130
    abandoned = [a for a in _attempts(base.run_path) if a.outcome == "abandoned"]
    assert abandoned and all(a.cost > 0 for a in abandoned)
    assert billed > rep.spend_session - sum(a.cost for a in abandoned) + 1e-9  # the fake billed the abandoned
    assert _booked(base.run_path) >= billed  # and the next run's budget sees them


# -- 4 to 8, 13: only the asked-for model, from allowed providers, in one piece -----------------------------


class OtherModel(Lie):
    """Chutes answers with another model; DeepInfra names the model's dated slug (an alias)."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        if obj.get("provider") == "Chutes":
            obj["model"] = "qwen/qwen3-0.6b"
        elif obj.get("provider") == "DeepInfra":
            obj["model"] = "qwen/qwen3-8b-04-28"
        return [obj]


class ProviderSwitch(Lie):
    """DeepInfra's streams open under the name of an excluded provider."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        st["n"] = st.get("n", 0) + 1
        if obj.get("provider") == "DeepInfra" and st["n"] <= 2:
            obj["provider"] = "Chutes"
        return [obj]


class SecondChoice(Lie):
    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        d = _delta(obj)
        if d and d.get("content"):
            other = dict(obj, choices=[{"index": 1, "delta": {"content": "XXSECONDXX"}, "finish_reason": None}])
            return [obj, other]
        return [obj]


class MixedReasoning(Lie):
    """Alternate deltas carry the reasoning in ``reasoning`` only, then in ``reasoning_details`` only."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        d = _delta(obj)
        if d and d.get("reasoning"):
            st["n"] = st.get("n", 0) + 1
            if st["n"] % 2:
                d.pop("reasoning_details", None)
            else:
                d.pop("reasoning", None)
        return [obj]


class DisagreeingReasoning(Lie):
    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        d = _delta(obj)
        if d and d.get("reasoning_details"):
            d["reasoning_details"] = [{"type": "reasoning.text", "text": "something else entirely"}]
        return [obj]


class ToolCallsUnasked(Lie):
    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        ch = obj.get("choices") or []
        if ch and ch[0].get("finish_reason") and not st.get("done"):
            st["done"] = True
            call = {"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": "{}"}}
            return [dict(obj, choices=[{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]), obj]
        return [obj]


def test_another_models_answer_is_never_recorded(tmp_path: Path) -> None:
    run_dir, rep, _, _ = _run(tmp_path, OtherModel(), 12)
    recs = responses(run_dir, "q")
    assert rep.exit_code == 0 and len(recs) == 12
    assert all(r.model in ("qwen/qwen3-8b", "qwen/qwen3-8b-04-28") for r in recs)
    assert any(a.outcome == "model_mismatch" for a in _attempts(run_dir))


def test_a_stream_that_changes_provider_is_unusable(tmp_path: Path) -> None:
    run_dir, rep, _, _ = _run(tmp_path, ProviderSwitch(), 12, routing={"ignore": ["chutes"]})
    recs = responses(run_dir, "q")
    assert rep.exit_code == 0 and len(recs) == 12
    assert all(r.provider == "Baseten" for r in recs)
    assert any(a.outcome == "provider_changed" for a in _attempts(run_dir))


@pytest.mark.parametrize("lie,flag", [(SecondChoice(), "extra_choices"), (MixedReasoning(), "reasoning_fields_mixed"),
                                      (DisagreeingReasoning(), "reasoning_fields_disagree"),
                                      (ToolCallsUnasked(), "tool_calls_without_tools")],
                         ids=["second_choice", "mixed_reasoning", "disagreeing_reasoning", "tool_calls"])
def test_one_answer_from_every_field_and_flagged(tmp_path: Path, lie: Lie, flag: str) -> None:
    run_dir, rep, _, cfg = _run(tmp_path, lie, 6, gt=True)
    recs = responses(run_dir, "q")
    assert rep.exit_code == 0 and len(recs) == 6
    assert all(flag in r.recon_flags for r in recs if r.reasoning or flag != "reasoning_fields_mixed")
    assert not any("XXSECONDXX" in (r.content or "") for r in recs)
    if isinstance(lie, ToolCallsUnasked):
        return
    audit = run_audit(cfg, **QUIET)  # the ids are the model's: exact against the emulator's ground truth
    o = audit.overall
    assert o.semantic_mismatch == 0 and o.exact_match + o.tokenization_mismatch == 6


# -- 3, 9, 10: excluded means not done -------------------------------------------------------------------


class Underbill(Lie):
    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        if obj.get("usage"):
            obj["usage"]["completion_tokens"] //= 4
        return [obj]


class ChutesOverbills(Lie):
    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        if obj.get("usage") and obj.get("provider") == "Chutes":
            obj["usage"]["completion_tokens"] += 200
        return [obj]


def test_underbilled_records_with_exact_ids_are_kept_and_the_provider_blamed(tmp_path: Path) -> None:
    _, rep, _, cfg = _run(tmp_path, Underbill(), 8, gt=True)
    assert rep.exit_code == 0
    lines: list[str] = []
    audit = run_audit(cfg, echo=lines.append)
    o = audit.overall
    assert o.underbilled >= 6 and o.kept >= 6 and not audit.thresholds_broken
    assert any("the provider's count is wrong" in ln for ln in lines)


def test_excluded_samples_fail_the_verdict_and_are_generated_again_elsewhere(tmp_path: Path) -> None:
    routing = {"order": ["chutes"]}  # every first attempt on the overbilling provider
    run_dir, rep, _, cfg = _run(tmp_path, ChutesOverbills(), 8, gt=True, routing=routing)
    assert rep.exit_code == 0
    with pytest.raises(ThresholdBroken, match="excluded"):
        run_audit(cfg, **QUIET)
    excluded = {r.sample_id for r in responses(run_dir, "q") if r.provider == "Chutes"}
    assert len(excluded) >= 3
    # The next run generates them again, avoiding the provider at fault; the records are kept for the report.
    run_dir, rep, _, cfg = _run(tmp_path, ChutesOverbills(), 8, gt=True, prompts=False, routing=routing)
    assert rep.exit_code == 0 and rep.done == len(excluded)
    fails = failures(run_dir, "q")
    assert {f.kind for f in fails} == {"excluded:billing_off"} and {f.sample_id for f in fails} == excluded
    recs = responses(run_dir, "q")
    assert len(recs) == 8 + len(excluded) and all(r.provider != "Chutes" for r in recs[8:])
    assert not run_audit(cfg, **QUIET).thresholds_broken
    assert run_merge(cfg, **QUIET).train_rows == 8


class ThinkInContent(Lie):
    """A provider without a reasoning parser: the think block comes back inside the content."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        d = _delta(obj)
        if d is not None:
            r = d.pop("reasoning", None)
            d.pop("reasoning_details", None)
            if r:
                d["content"] = ("" if st.get("open") else "<think>") + r
                st["open"] = True
            elif d.get("content") and st.get("open") and not st.get("closed"):
                d["content"] = "</think>" + d["content"]
                st["closed"] = True
        if obj.get("usage"):
            obj["usage"]["completion_tokens_details"] = {"reasoning_tokens": 0}
        return [obj]


class CutShort(Lie):
    """Chutes ends every answer without a finish reason, Baseten with ``length`` long before max_tokens."""

    def chunk(self, obj: Obj, st: Obj) -> list[Obj]:
        for ch in obj.get("choices") or []:
            if ch.get("finish_reason") and obj.get("provider") == "Chutes":
                ch["finish_reason"] = None
            elif ch.get("finish_reason") and obj.get("provider") == "Baseten":
                ch["finish_reason"] = "length"
        return [obj]


def test_think_markup_in_content_is_repaired(tmp_path: Path) -> None:
    run_dir, rep, _, cfg = _run(tmp_path, ThinkInContent(), 6, gt=True)
    assert rep.exit_code == 0
    assert all("think_in_content_repaired" in r.recon_flags for r in responses(run_dir, "q"))
    audit = run_audit(cfg, **QUIET)
    assert not audit.overall.structural_failures and not audit.thresholds_broken


def test_incomplete_answers_are_retried_elsewhere(tmp_path: Path) -> None:
    run_dir, rep, _, _ = _run(tmp_path, CutShort(), 10, sc=_scenario(runaway_rate=0.0),
                              partitions={"short": {"concurrency": 4, "max_tokens": 8192}},
                              quality={"min_length_fraction": 0.9})
    recs = responses(run_dir, "q")
    assert rep.exit_code == 0 and len(recs) == 10
    assert all(r.provider == "DeepInfra" and r.finish_reason == "stop" for r in recs)
    assert sum(a.outcome == "incomplete" for a in _attempts(run_dir)) >= 3


# -- 11: rate limits are waited out ------------------------------------------------------------------------


def test_a_429_storm_shorter_than_its_budget_ends_with_every_sample_done(tmp_path: Path) -> None:
    sc = _scenario(storm_s=(0.0, 3.0), storm_retry_after_s=0.3)
    _, rep, fake, _ = _run(tmp_path, None, 24, sc=sc, retry={"max_attempts": 2, "max_delay_s": 1.0},
                           partitions={"short": {"concurrency": 24, "max_tokens": MAX_TOKENS}})
    assert rep.exit_code == 0 and rep.done == 24 and rep.failed == 0
    assert fake.emu.state.by_fault["storm"] >= 48  # every sample met the storm more often than it has attempts


# -- 12: the key's limit is the key's limit ------------------------------------------------------------------


def _key(remaining: Any) -> Callable[[LyingOpenRouter], Obj]:
    return lambda fake: {"label": "k", "limit": 10.0, "limit_remaining": remaining, "usage": 1.0}


def test_a_spent_key_is_named_never_none(tmp_path: Path) -> None:
    _, rep, _, _ = _run(tmp_path, None, 4, key=_key(-5))
    assert rep.exit_code == 1 and rep.done == 0
    assert "API key's limit ($10.00)" in (rep.message or "") and "None" not in (rep.message or "")


def test_nan_key_limit_is_refused_not_taken_as_no_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _, _, _ = _run(tmp_path, None, 2, key=_key("NaN"))
    assert "the API key's limit could not be read" in capsys.readouterr().err
    assert "limit remaining $nan" not in (run_dir / "logs" / "generate.log").read_text()


def test_a_key_limit_lowered_mid_run_stops_the_run_naming_it(tmp_path: Path) -> None:
    slow = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, tokens_per_s=(2000.0, 2000.0))]

    def key(fake: LyingOpenRouter) -> Obj:
        return _key(10.0 if fake.chats < 6 else 0.0)(fake)

    _, rep, _, _ = _run(tmp_path, None, 40, key=key, sc=_scenario(providers=slow), budget={"key_recheck_s": 0.2},
                        partitions={"short": {"concurrency": 2, "max_tokens": MAX_TOKENS}})
    assert rep.exit_code == 1 and rep.done < 40
    assert "API key's limit ($10.00) is reached" in (rep.message or "")


def _attempts_booked(rd: RunDir) -> float:
    """What the attempts booked, abandoned requests' holds included (``store.scan_attempt_spend``)."""
    spend = scan_attempt_spend(rd.attempts, rd.settlements)
    return spend.billed + spend.held
