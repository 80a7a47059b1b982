"""The drafter chain as phases of ``draftgen run`` (issue 21 build item 7): extract, train and accept are rows of
the phase table, enabled by config, and ``draftgen status`` lists its rows from the same table.

The whole-chain test runs the real phases on the tiny learnable target (``draftgen.drafter.tiny``, the
``examples/tiny-chain.yaml`` settings, fewer prompts and tokens): generation against the model server
(``draftgen emulate --model``, in a thread), extract (hf), train (speculators on the CPU, one step) and accept
against a second model server that serves the drafter train just wrote. That server can only start once the
drafter exists, so the test runs a copy of the table with one extra phase between train and accept that
starts it (``PhaseTable.add``, as a plugin would); every other row is the default table's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from _common_helpers import config_dict, free_port, load, write_config
from _report_helpers import write_run_dir
from draftgen.config import RunConfig
from draftgen.errors import ConfigError
from draftgen.phases import PHASES, Phase, PhaseContext, PhaseOutcome
from draftgen.phases.pipeline import run_pipeline
from draftgen.phases.status.run import run_status
from draftgen.records import AcceptReport, MergeManifest, TrainReport
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-chain.yaml"
CHAIN = ["prepare", "generate", "audit", "merge", "extract", "train", "accept", "report"]


def _enabled(cfg: RunConfig) -> list[str]:
    return [p.name for p in PHASES if p.enabled is None or p.enabled(cfg)]


def test_train_and_accept_run_after_extract_only_when_enabled(tmp_path: Path) -> None:
    plain = load(write_config(tmp_path, config_dict(tmp_path), "plain.yaml"))
    assert _enabled(plain) == ["prepare", "generate", "audit", "merge", "report"]  # the quickstart's run
    chain = load(write_config(tmp_path, config_dict(tmp_path, hidden_states={"extract": True},
                                                    train={"enabled": True}, accept={"enabled": True}),
                              "chain.yaml"))
    assert _enabled(chain) == CHAIN
    only_train = load(write_config(tmp_path, config_dict(tmp_path, hidden_states={"extract": True},
                                                         train={"enabled": True}), "train.yaml"))
    assert _enabled(only_train) == ["prepare", "generate", "audit", "merge", "extract", "train", "report"]
    # the switches are omitted when off: a default config's hash (and so its run directory) is unchanged
    assert "enabled" not in msgspec.json.decode(msgspec.json.encode(plain.train))
    assert "enabled" not in msgspec.json.decode(msgspec.json.encode(plain.accept))


def test_accept_without_a_drafter_names_the_keys(tmp_path: Path) -> None:
    from draftgen.phases.accept.run import phase_drafter, phase_run

    cfg = load(write_config(tmp_path, config_dict(tmp_path, accept={"enabled": True})))
    rd = RunDir(cfg.run_path)
    assert phase_drafter(cfg, rd) == rd.train_drafter
    ctx = PhaseContext(cfg=cfg, rd=rd, profile=None, options=None, echo=lambda s: None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"train\.enabled: true.*accept\.drafter"):
        phase_run(ctx)
    other = load(write_config(tmp_path, config_dict(tmp_path, accept={"enabled": True, "drafter": "mine"}), "o.yaml"))
    assert phase_drafter(other, rd) == tmp_path / "mine"


def _later(path: Path, seconds: float) -> None:
    import os
    import time

    t = time.time() + seconds
    os.utime(path, (t, t))


def test_status_lists_the_chain_rows_of_the_table_in_its_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run, datasets={"chat": 4}, done_fraction=1.0)
    rd = RunDir(run)
    atomic_write_json(rd.merged_manifest, MergeManifest(files=[], seed=0, merge={}, datasets=["chat"],
                                                        profile="qwen3", layout=2))
    _later(rd.merged_manifest, 5)
    names = [p.name for p in run_status(str(run), echo=lambda s: None).summary.phases]
    assert names == ["prepare", "generate", "audit", "merge", "report"]  # no chain phase has started
    rd.train.mkdir()  # train started, nothing finished
    (rd.hidden).mkdir()
    (rd.hidden / "manifest.json").write_text("{}")
    _later(rd.hidden / "manifest.json", 10)
    phases = {p.name: p for p in run_status(str(run), echo=lambda s: None).summary.phases}
    assert list(phases) == ["prepare", "generate", "audit", "merge", "extract", "train", "report"]
    assert phases["extract"].state == "done"
    assert (phases["train"].state, phases["train"].detail) == ("incomplete", "started, not finished")
    atomic_write_json(rd.train_report, TrainReport(exit_code=0, message="drafter", verifier="t", hidden="h", samples=2,
                                                   layer_ids=[1], draft_vocab_size=8, ttt_steps=1))  # written last
    _later(rd.train_report, 10)
    rd.accept_json.parent.mkdir()
    rd.accept_json.write_text("{}")
    _later(rd.accept_json, 10)
    phases = {p.name: p for p in run_status(str(run), echo=lambda s: None).summary.phases}
    assert list(phases) == CHAIN and phases["train"].state == phases["accept"].state == "done"
    _later(rd.merged_manifest, 20)  # merged again after training: the chain's outputs are out of date
    phases = {p.name: p for p in run_status(str(run), echo=lambda s: None).summary.phases}
    assert all(phases[n].detail == "older than merged/manifest.json" for n in ("extract", "train", "accept"))
    # a phase added to the table is a row of status too, in the table's place
    PHASES.add(Phase("toy", "draftgen.phases.merge.run:phase_run", output=lambda r: r.root / "toy.json",
                     doc="a toy"), after="train")
    try:
        rows = run_status(str(run), echo=lambda s: None).summary.phases
    finally:
        PHASES.unregister("toy")
    assert [p.name for p in rows] == [*CHAIN[:6], "toy", *CHAIN[6:]]
    assert next(p for p in rows if p.name == "toy").state == "pending"


# -- the whole chain in one `draftgen run` ------------------------------------------------------------------


@contextlib.contextmanager
def _model_server(model: Path, *, drafter: Path | None = None, port: int = 0) -> Iterator[str]:
    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread

    opts = ModelServerOptions(model=str(model), port=port, threads=1, served_model_name="tiny-chain",
                              drafter=str(drafter) if drafter else None, num_speculative_tokens=3)
    with start_in_thread(opts) as srv:
        yield srv.base_url


def _chain_config(tmp: Path, target: Path, gen_url: str, accept_url: str) -> Path:
    from _hidden_export_helpers import speculators_python

    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data["run_dir"] = str(tmp / "run")
    data["endpoint"]["base_url"] = gen_url
    data["partitions"] = {"short": {"concurrency": 8, "max_tokens": 24}, "long": {"concurrency": 4, "max_tokens": 24}}
    data["datasets"] = [{"name": "chat", "path": "bundled:chat", "max_samples": 14, "cap": 10}]  # 4 held out
    data["hidden_states"] = {**data["hidden_states"], "model": str(target), "extract": True}
    data["train"] = {**data["train"], "enabled": True, "speculators": str(speculators_python()), "epochs": 1,
                     "max_steps": 1, "total_seq_len": 512}
    data["accept"] = {**data["accept"], "enabled": True, "base_url": accept_url, "prompts": 3, "max_tokens": 12}
    return write_config(tmp, data, "chain.yaml")


@pytest.mark.slow
def test_run_runs_every_phase_of_the_chain_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from draftgen.drafter.tiny import build_tiny_target

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    torch.set_num_threads(1)
    target = build_tiny_target(tmp_path / "target")
    port = free_port()
    accept_url = f"http://127.0.0.1:{port}/v1"
    with contextlib.ExitStack() as stack:
        gen_url = stack.enter_context(_model_server(target))
        cfg = load(_chain_config(tmp_path, target, gen_url, accept_url))
        rd = RunDir(cfg.run_path)

        def serve(ctx: PhaseContext) -> PhaseOutcome:  # the drafter server, once train has written it
            stack.enter_context(_model_server(target, drafter=ctx.rd.train_drafter, port=port))
            return PhaseOutcome()

        table = PHASES.copy()
        table.add(Phase("serve", serve, doc="serve train/drafter"), after="train")
        lines: list[str] = []
        rep = run_pipeline(cfg, argv=["draftgen", "run"], echo=lines.append, phases=table, yes=True)
    assert rep.exit_code == 0, (rep.message, lines[-20:])
    assert rep.phases_run == [*CHAIN[:6], "serve", *CHAIN[6:]]
    banners = [ln.split()[1] for ln in lines if ln.startswith("── ")]
    assert banners == ["prepare", "plan", *rep.phases_run[1:]]  # each ran once, in the table's order
    train = json.loads(rd.train_report.read_text())
    assert train["last_step"] >= 1 and Path(train["checkpoint"]) == rd.train_drafter
    acc = msgspec.json.decode(rd.accept_json.read_bytes(), type=AcceptReport)
    assert Path(acc.drafter) == rd.train_drafter and acc.k == 3 and acc.prompts == 3
    assert acc.acceptance.source == "vllm-metrics" and acc.acceptance.drafts > 0
    assert acc.offline_source is not None  # the run's own train/log.jsonl
    rows = {p.name: p.state for p in run_status(str(rd.root), echo=lambda s: None).summary.phases}
    assert list(rows) == CHAIN and set(rows.values()) == {"done"}
    # a second run: train and accept are up to date (their inputs stand), extract resumes with nothing new
    again = run_pipeline(cfg, argv=["draftgen", "run"], echo=lambda s: None, yes=True)
    assert again.exit_code == 0 and {"train", "accept"} <= set(again.phases_skipped), again
