"""The independent draft LM (issue 35 item 5): matched to an EAGLE-3 drafter's size and draft vocabulary,
trained on rows of ids, replayed as a proposer; a real transformers Qwen3 decoder on the tiny target's
embedding and head."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _extract_helpers import build_random_drafter  # noqa: E402
from draftgen.drafter.baselines import copy_last, replay  # noqa: E402
from draftgen.drafter.draftlm import intermediate_for, load_proposer, train_draft_lm  # noqa: E402
from draftgen.drafter.eagle3 import draft_vocabulary  # noqa: E402
from draftgen.errors import InputError  # noqa: E402

CYCLE = [17, 42, 99, 5, 63, 8]  # a rule only the ids say: each token is followed by the next of the cycle


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from draftgen.drafter.tiny import build_tiny_target

    torch.set_num_threads(1)
    return build_tiny_target(tmp_path_factory.mktemp("target") / "tiny", layers=2)


def _rows(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Rows of a short prompt then the cycle from a random place; loss on the continuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(200, 250) for _ in range(4)]
        start = rng.randrange(len(CYCLE))
        cont = [CYCLE[(start + i) % len(CYCLE)] for i in range(24)]
        out.append((prompt + cont, [0] * len(prompt) + [1] * len(cont)))
    return out


def test_the_draft_lm_matches_the_drafter_learns_from_ids_and_beats_copy_last(target: Path, tmp_path: Path) -> None:
    drafter = build_random_drafter(tmp_path / "drafter", target, draft_vocab=256)
    matched, vocab = draft_vocabulary(drafter)
    assert vocab == list(range(256)) and matched > 0
    info = train_draft_lm(target, drafter, _rows(48, 0), tmp_path / "lm", steps=60, batch_tokens=256, lr=3e-3,
                          echo=lambda s: None)
    per_unit = 3 * 128 * info.layers  # one step of the intermediate size
    assert info.matched_to == matched and abs(info.trainable_params - matched) <= per_unit
    assert info.intermediate_size == intermediate_for(target, info.layers, matched)
    assert info.loss_last < info.loss_first / 4
    propose = load_proposer(tmp_path / "lm")
    held = _rows(8, 1)
    lm = [replay(ids[:4], ids[4:], propose, k=3) for ids, _ in held]
    copy = [replay(ids[:4], ids[4:], copy_last, k=3) for ids, _ in held]
    al_lm = 1 + sum(c.accepted for c in lm) / sum(c.drafts for c in lm)
    al_copy = 1 + sum(c.accepted for c in copy) / sum(c.drafts for c in copy)
    assert al_copy == 1.0 and al_lm > 3.5  # the cycle learned from ids alone; copy-last never right here
    assert all(t in set(vocab) for t in propose(held[0][0][:10], 3))


def test_a_folder_that_is_no_draft_lm_is_refused_in_one_line(target: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"draftgen-draft-lm\.json: not found; --draft-lm must name"):
        load_proposer(tmp_path)
    drafter = build_random_drafter(tmp_path / "drafter", target, draft_vocab=256)
    with pytest.raises(InputError, match="no merged rows"):
        train_draft_lm(target, drafter, [], tmp_path / "lm", steps=1, batch_tokens=64, lr=1e-3)
