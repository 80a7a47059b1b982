"""``draftgen accept`` on prompts that are really held out, and one report per drafter (issue 21 item 8).

A real run (prepare → generate over the embedded emulator → audit → merge) whose second dataset holds the
same prompts as the first under another name: merge drops them as duplicates, so their sample ids are in no
merged row, but their content is, and accept must not take them as held out. Acceptance is read from a
loopback vLLM stand-in (chat completions + ``/metrics``) whose per-request counts the test sets.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from _common_helpers import AppServer, config_dict, load, write_config
from draftgen.datasets import content_hash
from draftgen.phases.accept.heldout import held_out_prompts
from draftgen.phases.accept.run import run_accept
from draftgen.phases.pipeline import run_pipeline
from draftgen.phases.status.run import run_status
from draftgen.records import AcceptReport, MergeStats, PromptRecord, TrainLogRecord
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, encode_json, iter_jsonl, read_json

from ._helpers import write_prompts


class MetricsServer(AppServer):
    """vLLM's chat completions and ``/metrics``: each request adds ``drafts`` drafts of 3 tokens and
    ``accepted`` accepted tokens (all at position 0)."""

    def __init__(self, drafts: int, accepted: int) -> None:
        self.per_request = (drafts, accepted)
        self.drafts = self.accepted = 0
        self.prompts: list[str] = []
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.prompts.append(body["messages"][-1]["content"])
        self.drafts += self.per_request[0]
        self.accepted += self.per_request[1]
        return web.json_response({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length",
                         "token_ids": [1, 2]}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})

    async def metrics(self, _request: web.Request) -> web.Response:
        lab = '{engine="0",model_name="m"}'
        text = (f"vllm:spec_decode_num_drafts_total{lab} {self.drafts}\n"
                f"vllm:spec_decode_num_draft_tokens_total{lab} {3 * self.drafts}\n"
                f"vllm:spec_decode_num_accepted_tokens_total{lab} {self.accepted}\n"
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {self.accepted}\n')
        return web.Response(text=text, content_type="text/plain")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)


def _drafter(folder: Path) -> Path:
    folder.mkdir(parents=True)
    atomic_write_json(folder / "config.json", {"speculators_model_type": "eagle3", "speculators_config": {
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}})
    return folder


@pytest.fixture(scope="module")
def merged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``first`` and ``second``: the same 8 prompts under two names; ``fresh``: 2 of them again and 3 new ones,
    weight 0 (generated, never merged). Run through merge over the embedded emulator; returns the config."""
    tmp = tmp_path_factory.mktemp("heldout")
    shared = write_prompts(tmp / "shared.jsonl", 8)
    shutil.copy(shared, tmp / "second.jsonl")
    fresh = write_prompts(tmp / "new.jsonl", 3, seed=7)
    (tmp / "fresh.jsonl").write_text("".join(shared.read_text().splitlines(keepends=True)[:2]) + fresh.read_text())
    data = config_dict(tmp, [{"name": "first", "path": str(shared)}, {"name": "second", "path": "second.jsonl"},
                             {"name": "fresh", "path": "fresh.jsonl", "weight": 0.0}],
                       endpoint={"kind": "emulator", "emulator": {"scenario": "fast", "seed": 0}}, progress="off",
                       merge={"val_fraction": 0.25}, accept={"datasets": ["second", "fresh"], "max_tokens": 8})
    path = write_config(tmp, data)
    rep = run_pipeline(load(path), argv=["draftgen", "run", str(path)], echo=lambda _s: None)
    assert rep.exit_code == 0, rep.message
    return path


def _prompts(rd: RunDir, name: str) -> list[PromptRecord]:
    return [rec for _, rec in iter_jsonl(rd.prepared(name), PromptRecord)]


@pytest.fixture
def run_copy(merged_run: Path, tmp_path: Path) -> Path:
    """A copy of the merged run (each test measures its own drafters in its own); returns its config."""
    shutil.copytree(merged_run.parent / "run", tmp_path / "run")
    text = merged_run.read_text().replace(str(merged_run.parent / "run"), str(tmp_path / "run"))
    for name in ("shared.jsonl", "second.jsonl", "fresh.jsonl"):
        shutil.copy(merged_run.parent / name, tmp_path / name)
    text = text.replace(str(merged_run.parent / "shared.jsonl"), str(tmp_path / "shared.jsonl"))
    (tmp_path / "cfg.yaml").write_text(text)
    return tmp_path / "cfg.yaml"


def test_item08_duplicate_prompt_under_other_dataset_not_held_out(run_copy: Path) -> None:
    cfg = load(run_copy)
    rd = RunDir(cfg.run_path)
    stats = read_json(rd.merged_stats, MergeStats)
    by = {d.dataset: d for d in stats.datasets}
    assert by["second"].dropped.get("duplicate") == 8 and by["fresh"].dropped.get("duplicate") == 2  # merge deduped
    first = {content_hash(p.messages, p.tools) for p in _prompts(rd, "first")}
    new = {p.sample_id for p in _prompts(rd, "fresh") if content_hash(p.messages, p.tools) not in first}
    assert len(new) == 3

    held = held_out_prompts(cfg, rd, 20)
    assert {p.sample_id for p in held.prompts} == new  # none of second's, none of fresh's repeats
    assert not {content_hash(p.messages, p.tools) for p in held.prompts} & first
    assert held.excluded_by_content == 10 and any("10 candidates left out" in n for n in held.notes)

    lines: list[str] = []
    with MetricsServer(drafts=4, accepted=6) as srv:
        rep = run_accept(cfg, drafter=_drafter(rd.train_drafter), base_url=srv.url, echo=lines.append)
    assert set(rep.sample_ids) == new and rep.excluded_by_content == 10 and len(srv.prompts) == 3
    assert any("10 left out as their content is in a merged row" in ln for ln in lines)


def _log(rd: RunDir, cond: list[float]) -> None:
    rd.train_log.write_bytes(encode_json(TrainLogRecord(kind="val", global_step=9, epoch=1, loss=1.0,
                                                        cond_acc_k=cond)) + b"\n")


def test_two_drafters_measured_one_after_the_other_leave_two_reports(run_copy: Path, tmp_path: Path) -> None:
    cfg = load(run_copy)
    rd = RunDir(cfg.run_path)
    trained = _drafter(rd.train_drafter)  # from this run's train/: the estimate is its training log's
    _log(rd, [0.5, 0.4, 0.25])
    elsewhere = _drafter(tmp_path / "models" / "drafter")  # same folder name, not from train/: no estimate
    with MetricsServer(drafts=4, accepted=6) as a, MetricsServer(drafts=4, accepted=2) as b:
        rep_a = run_accept(cfg, drafter=trained, base_url=a.url, echo=lambda _s: None)
        rep_b = run_accept(cfg, drafter=elsewhere, base_url=b.url, echo=lambda _s: None)
    assert rep_a.drafter_key != rep_b.drafter_key
    assert rep_a.drafter_key.startswith("train-drafter-") and rep_b.drafter_key.startswith("models-drafter-")
    reports = {p.parent.name: read_json(p, AcceptReport) for p in rd.accept_reports()}
    assert reports == {rep_a.drafter_key: rep_a, rep_b.drafter_key: rep_b}
    assert rep_a.acceptance.acceptance_length == pytest.approx(1 + 6 / 4)
    assert rep_b.acceptance.acceptance_length == pytest.approx(1 + 2 / 4)
    assert rep_a.offline_al == pytest.approx(1.75) and str(rd.train_log) in (rep_a.offline_source or "")
    assert rep_b.offline_al is None and rep_b.offline_source is None and rep_b.offline_cond_acc == []
    assert read_json(rd.accept_json, AcceptReport) == rep_a  # the latest: the run's own drafter's, not elsewhere's

    # the trained drafter measured again (retrained: a new log) replaces its own report only
    _log(rd, [0.5])
    with MetricsServer(drafts=2, accepted=1) as c:
        rep_a2 = run_accept(cfg, drafter=trained, base_url=c.url, echo=lambda _s: None)
    reports = {p.parent.name: read_json(p, AcceptReport) for p in rd.accept_reports()}
    assert reports == {rep_a.drafter_key: rep_a2, rep_b.drafter_key: rep_b}
    assert rep_a2.offline_al == pytest.approx(1.5) and rep_a2.acceptance.acceptance_length == pytest.approx(1.5)
    assert read_json(rd.accept_json, AcceptReport) == rep_a2
    out: list[Any] = []
    run_status(str(rd.root), echo=out.append)
    assert "2 drafters measured" in out[0]
