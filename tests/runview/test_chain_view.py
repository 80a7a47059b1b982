"""``runview.chain``: the verdict sentence (did the drafter beat the no-model drafters, by how much, with the
interval), status's accept line, and the chain's files read back (every pass, the latest marked)."""

from __future__ import annotations

from pathlib import Path

from _chain_helpers import accept_report as report
from _chain_helpers import write_chain
from draftgen.records import AlternativeFigures
from draftgen.rundir import RunDir
from draftgen.runview.chain import accept_line, accept_status, beats, read_chain, verdict
from draftgen.store import atomic_write_json


def test_the_verdict_says_in_words_whether_the_drafter_won_and_by_how_much() -> None:
    won = verdict(report(0.734, 0.573, 0.903), "the trained drafter")
    assert won == ("The trained drafter beats the no-model drafters by +0.734 (95% interval +0.573 to +0.903): "
                   "acceptance length 2.040 [1.870, 2.219] against 1.306 for lookup, the better no-model drafter, "
                   "over 64 held-out prompts.")
    lost = verdict(report(-0.2, -0.35, -0.05))
    assert lost is not None and lost.startswith("The drafter does not beat the no-model drafters; it is behind by "
                                                "-0.200 (95% interval -0.350 to -0.050)")
    tied = verdict(report(0.05, -0.02, 0.12))
    assert tied is not None and tied.startswith("The drafter does not beat the no-model drafters: the difference, "
                                                "+0.050 (95% interval -0.020 to +0.120), may be 0")
    assert (beats(report(0.734, 0.573, 0.903)), beats(report(0.05, 0.0, 0.12)), beats(report(-0.2, -0.35, -0.05))) \
        == (True, False, False)  # an interval that touches 0 is no win
    # no paired comparison (per-prompt counters unknown): no verdict, no guess
    assert verdict(report(0, 0, 0, with_comparison=False)) is None and beats(report(0, 0, 0, with_comparison=False)) \
        is None


def test_a_draft_lm_beside_them_is_never_named_the_better_no_model_drafter() -> None:
    rep = report(0.734, 0.573, 0.903)
    rep.alternatives.append(AlternativeFigures(name="draft-lm", how="replay", acceptance_length=1.9))
    said = verdict(rep)
    assert said is not None and "against 1.306 for lookup, the better no-model drafter" in said


def test_status_line_shows_the_figure_its_interval_and_the_margin() -> None:
    assert accept_line(report(0.734, 0.573, 0.903)) == ("AL 2.040 [1.870, 2.219] over 64 prompts (vllm), +0.734 "
                                                        "[+0.573, +0.903] over max(copy-last, lookup)")
    assert accept_line(report(0, 0, 0, with_comparison=False)) == "AL 2.040 [1.870, 2.219] over 64 prompts (vllm)"


def test_read_chain_lists_every_pass_and_marks_the_latest(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    assert read_chain(rd.root).empty and accept_status(rd.root) is None
    main, sg, other = write_chain(rd.root)
    (rd.accept / "broken").mkdir()
    (rd.accept / "broken" / "vllm-1p.json").write_text("{not json")
    view = read_chain(rd.root)
    assert view.accept == main and view.drafters == 2 and view.hidden is not None and view.train is not None
    assert [(p.path, p.acceptance_length, p.latest) for p in view.passes] == [
        (f"accept/train-drafter-0123456789/{main.pass_name}.json", 2.04, True),
        (f"accept/train-drafter-0123456789/{sg.pass_name}.json", 1.964, False),
        (f"accept/untrained-drafter-9876543210/{other.pass_name}.json", 1.013, False)]
    assert len(view.notes) == 1 and "broken/vllm-1p.json" in view.notes[0]
    # status's accept row: the figure, its interval, the margin, and how many passes (a3c8820: "2 drafters
    # measured" and no figure)
    assert accept_status(rd.root) == ("AL 2.040 [1.870, 2.219] over 64 prompts (vllm), +0.734 [+0.573, +0.903] "
                                      "over max(copy-last, lookup); 2 drafters measured (3 passes)")


def test_a_report_of_a_draftgen_before_schema_4_still_reads(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    old = report(0.734, 0.573, 0.903)
    atomic_write_json(rd.accept_report(old.drafter_key, "acceptance"), old)  # accept/<key>/acceptance.json
    view = read_chain(rd.root)
    assert [p.path for p in view.passes] == [f"accept/{old.drafter_key}/acceptance.json"] and view.drafters == 1
