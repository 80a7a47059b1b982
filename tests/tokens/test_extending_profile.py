"""Adding a profile is its module plus one registration line; the emulator reads its behaviour from it.

A toy family is registered at run time (a Qwen3 subclass under a new name that declares different field
edges and no tool-call markup), then ``prepare`` + ``generate`` + ``audit`` run on the embedded emulator
with it. The emulator's outputs show the declared behaviour (every reasoning and content field starts
with the declared edge, and no Qwen-style tool call appears although every sample asks for one), and the
audit finds every rebuilt id sequence equal to the emulator's ground truth. The registration is removed
afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from draftgen.config import load_config
from draftgen.emulator.scenarios import builtin_scenario
from draftgen.emulator.scripted import EmulatedModel
from draftgen.errors import ConfigError
from draftgen.phases.audit.run import run_audit
from draftgen.phases.generate.run import run_generate
from draftgen.phases.prepare.run import run_prepare
from draftgen.records import ResponseRecord
from draftgen.store import iter_jsonl
from draftgen.tokens import PROFILES, load_profile, profile_class, register_profile
from draftgen.tokens.qwen3 import Qwen3Profile

QUIET = {"echo": lambda s: None}


class ToyProfile(Qwen3Profile):
    """A made-up family: Qwen3's tokens and layout, its own edges, no tool-call markup of its own."""

    name = "toy-qwen3"
    tool_markup = None
    reasoning_edge = "  "
    content_edge = " "


@pytest.fixture
def toy() -> Iterator[type[ToyProfile]]:
    register_profile(ToyProfile)  # the one registration line
    try:
        yield ToyProfile
    finally:
        PROFILES.unregister(ToyProfile.name)


def _config(tmp: Path, n: int = 8) -> Path:
    rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"Explain idea number {i} briefly."}]})
            for i in range(n)]
    (tmp / "prompts.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    (tmp / "edges.yaml").write_text("base: fast\nleading_space_rate: 1.0\ntool_call_rate: 1.0\n", encoding="utf-8")
    cfg = tmp / "cfg.yaml"
    cfg.write_text(
        "run_dir: run\n"
        "model: {id: qwen/qwen3-8b, profile: toy-qwen3, tokenizer: 'bundled:qwen3'}\n"
        "endpoint: {kind: emulator, emulator: {scenario: edges.yaml}}\n"
        "partitions: {short: {concurrency: 4, max_tokens: 512}, long: {concurrency: 2, max_tokens: 512}}\n"
        "progress: 'off'\n"
        "datasets:\n  - {name: ideas, path: prompts.jsonl}\n",
        encoding="utf-8",
    )
    return cfg


def test_registration_and_removal(toy: type[ToyProfile]) -> None:
    assert profile_class("toy-qwen3") is toy and PROFILES.names()[-1] == "toy-qwen3"
    with pytest.raises(ConfigError, match=r"model\.profile: profile 'toy-qwen3' is registered already"):
        register_profile(toy)
    PROFILES.unregister(toy.name)
    with pytest.raises(ConfigError, match=r"profile 'toy-qwen3' is not registered \(did you mean 'qwen3'\?\)"):
        profile_class("toy-qwen3")
    register_profile(toy)  # for the fixture's own removal


def test_the_emulator_writes_what_the_profile_declares(toy: type[ToyProfile]) -> None:
    sc = builtin_scenario("fast").replace(leading_space_rate=1.0, tool_call_rate=1.0)
    qwen = EmulatedModel(load_profile("qwen3", "bundled:qwen3"), sc, seed=5)
    model = EmulatedModel(load_profile("toy-qwen3", "bundled:qwen3"), sc, seed=5)
    assert qwen.tool_style == "qwen3" and model.tool_style is None
    assert (model.reasoning_edge, model.content_edge) == ("  ", " ")
    for i in range(6):
        out = model.output(1000 + i, thinking=True, max_tokens=4096)
        assert "<tool_call>" in qwen.output(1000 + i, thinking=True, max_tokens=4096).content
        assert out.reasoning is not None and out.reasoning.startswith("\n  ")  # Qwen3's lead, then the edge
        assert "<tool_call>" not in out.content


def test_prepare_generate_audit_with_a_registered_profile(tmp_path: Path, toy: type[ToyProfile]) -> None:
    cfg = load_config(_config(tmp_path))
    run_prepare(cfg, **QUIET)
    rep = run_generate(cfg, **QUIET)
    assert rep.exit_code == 0 and rep.done == 8, rep.message
    recs = [r for _, r in iter_jsonl(cfg.run_path / "raw" / "ideas" / "raw_responses.jsonl", ResponseRecord)]
    assert len(recs) == 8 and all(r.provenance is None or r.provenance.profile == "toy-qwen3" for r in recs)
    for r in recs:
        assert r.reasoning is not None and r.reasoning.lstrip("\n").startswith("  ")
        assert r.content is not None and "<tool_call>" not in r.content
    report = run_audit(cfg, **QUIET)
    o = report.overall
    assert o.reference_compared == 8 and o.exact_match == 8, (o.examples, o.structural_examples)
    assert o.structural_failures == {}
