"""``phases.accept.figures``: bootstrap intervals over prompts, paired comparisons, per-dataset figures, and the
no-model drafters replayed on a pass's continuations."""

from __future__ import annotations

from draftgen.phases.accept.figures import (
    NO_MODEL_BEST,
    Series,
    compare,
    comparison_lines,
    comparisons,
    dataset_figures,
    interval,
    resamples,
)
from draftgen.records import PromptAcceptance


def _series(name: str, als: list[float], drafts: float = 10.0) -> Series:
    return Series(name, [(a - 1) * drafts for a in als], [drafts] * len(als))


def test_resamples_are_seeded_and_the_interval_brackets_the_figure() -> None:
    assert resamples(range(5)) == resamples(range(5)) and resamples([]) == []
    s = _series("d", [1.5, 2.0, 2.5, 3.0, 1.0, 2.2, 1.8, 2.6])
    lo, hi = interval(s, resamples(range(8))) or [0.0, 0.0]
    assert lo < s.al() < hi and lo >= 1.0 and hi <= 3.0
    same = _series("c", [2.0] * 6)
    assert interval(same, resamples(range(6))) == [2.0, 2.0]
    assert interval(_series("one", [2.0]), resamples(range(1))) is None


def test_comparisons_are_paired_over_the_same_prompts() -> None:
    # the drafter is 0.3 above lookup on every prompt although both vary a lot between prompts: the paired
    # interval of the difference is tight around +0.3, far narrower than either figure's own interval
    base = [1.0, 1.5, 2.5, 1.2, 3.0, 1.1, 2.0, 1.7]
    drafter, lookup = _series("drafter", [b + 0.3 for b in base]), _series("lookup", base)
    copy = _series("copy-last", [1.0] * 8)
    rs = resamples(range(8))
    got = {c.versus: c for c in comparisons(drafter, [copy, lookup], rs)}
    assert set(got) == {"copy-last", "lookup", NO_MODEL_BEST}
    assert got["lookup"].difference == 0.3 and got["lookup"].ci95 == [0.3, 0.3]
    assert got[NO_MODEL_BEST].ci95 == [0.3, 0.3]  # lookup beats copy-last in every resample
    own = interval(drafter, rs) or [0.0, 0.0]
    assert own[1] - own[0] > 0.5


def test_dataset_figures_group_prompts_by_dataset() -> None:
    d = _series("drafter", [3.0, 3.0, 1.0, 1.0])
    lk = _series("lookup", [1.0, 1.0, 2.0, 2.0])
    out = dataset_figures(["walk", "walk", "count", "count"], d, [lk])
    assert [(x.dataset, x.prompts, x.acceptance_length, x.alternatives) for x in out] == [
        ("walk", 2, 3.0, {"lookup": 1.0}), ("count", 2, 1.0, {"lookup": 2.0})]


def _row(sid: str, dataset: str, drafts: float, accepted: float, *, ended: bool = False) -> PromptAcceptance:
    return PromptAcceptance(sample_id=sid, dataset=dataset, drafts=drafts, accepted=accepted,
                            accepted_per_pos=[accepted, 0.0, 0.0], completion_tokens=20, ended=ended)


def test_compare_replays_the_no_model_drafters_and_says_what_it_cannot_do() -> None:
    rows = [_row("a", "x", 8, 12), _row("b", "x", 8, 12), _row("c", "y", 8, 4)]
    loop = [5, 6, 7] * 8  # a looping continuation: lookup accepts nearly everything, copy-last nothing
    ids = [([1, 2, 3], loop), ([1, 2, 3], loop), ([1, 2, 3], loop)]
    zero = [_row("a", "x", 8, 0), _row("b", "x", 8, 1), _row("c", "y", 8, 0)]
    out = compare(rows, ids, 3, counted=True, zero_rows=zero, zero_url="http://z/v1")
    names = [a.name for a in out.alternatives]
    assert names == ["copy-last", "lookup", "zero-aux"] and out.alternatives[2].base_url == "http://z/v1"
    al = {a.name: a.acceptance_length for a in out.alternatives}
    assert al["copy-last"] == 1.0 and al["lookup"] > 2.5 and al["zero-aux"] < 1.1
    assert out.ci95 is not None and [d.dataset for d in out.datasets] == ["x", "y"]
    best = next(c for c in out.comparisons if c.versus == NO_MODEL_BEST)
    assert best.difference < 0
    lines = comparison_lines(out.alternatives, out.comparisons, out.datasets)
    assert not any("verdict" in ln for ln in lines)  # the verdict is runview.chain.verdict's, after these
    assert any("dataset y:" in ln for ln in lines)

    missing = compare(rows, [ids[0], None, ids[2]], 3, counted=True)
    assert not missing.alternatives and "token ids of 2 of 3 requests" in missing.notes[0]
    assert "k is unknown" in compare(rows, ids, None, counted=True).notes[0]
    uncounted = compare(rows, ids, 3, counted=False)
    assert uncounted.ci95 is None and not uncounted.comparisons and len(uncounted.alternatives) == 2
