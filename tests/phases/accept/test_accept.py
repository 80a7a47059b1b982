"""``draftgen accept``: the acceptance formulas on known counts, the held-out prompt choice, and a whole run
against a loopback server (aiohttp) that serves vLLM's chat completions and ``/metrics`` counters, or SGLang's
``/generate`` with ``meta_info``, with counts the test controls.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner

from _common_helpers import AppServer, config_dict, free_port, load, write_config
from draftgen.cli import cli
from draftgen.errors import APIError, InputError
from draftgen.phases.accept.heldout import held_out_prompts
from draftgen.phases.accept.run import (
    SGLangMeta,
    offline_al,
    parse_prometheus,
    run_accept,
    sglang_acceptance,
    vllm_acceptance,
    vllm_counters,
)
from draftgen.records import (
    AcceptReport,
    MergedFile,
    MergeManifest,
    Message,
    PromptRecord,
    TrainLogRecord,
    TrainReport,
)
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, encode_json, read_json

METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d0}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7e9
vllm:spec_decode_num_drafts_total{{engine="1",model_name="m"}} {d1}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {t}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="m",position="0"}} {p0b}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="2"}} {p2}
vllm:num_requests_running{{model_name="m"}} 0.0
garbage line without value
"""


def _metrics(d0: float, d1: float, t: float, a: float, p0: float, p0b: float, p1: float, p2: float) -> str:
    return METRICS.format(d0=d0, d1=d1, t=t, a=a, p0=p0, p0b=p0b, p1=p1, p2=p2)


def test_prometheus_parser_is_tolerant() -> None:
    got = parse_prometheus('a_total{x="1",y="q\\"z"} 3\n# c\nb 2.5 1700000000\nbad{ 1\nc NaN\n')
    assert [(s.name, s.labels, s.value) for s in got] == [("a_total", {"x": "1", "y": 'q"z'}, 3.0), ("b", {}, 2.5)]


def test_vllm_formulas_on_known_counts() -> None:
    before = vllm_counters(_metrics(10, 5, 45, 20, 8, 2, 6, 4))
    after = vllm_counters(_metrics(30, 15, 135, 62, 30, 4, 18, 10))
    assert (before.drafts, before.draft_tokens, before.accepted, before.per_pos) == (15, 45, 20, {0: 10, 1: 6, 2: 4})
    fig = vllm_acceptance(before, after)
    assert fig is not None
    # Δdrafts 30, Δdraft_tokens 90, Δaccepted 42, Δper_pos [24, 12, 6]
    assert fig.acceptance_length == pytest.approx(1 + 42 / 30)
    assert fig.per_position == pytest.approx([24 / 30, 12 / 30, 6 / 30])
    assert fig.acceptance_rate == pytest.approx(42 / 90)
    assert fig.accepted_per_pos == [24, 12, 6]


def test_vllm_no_drafts_is_none_and_reset_is_an_error() -> None:
    same = vllm_counters(_metrics(10, 5, 45, 20, 8, 2, 6, 4))
    assert vllm_acceptance(same, same) is None
    with pytest.raises(APIError, match="restarted"):
        vllm_acceptance(same, vllm_counters(_metrics(1, 0, 3, 1, 1, 0, 0, 0)))
    assert not vllm_counters("vllm:num_requests_running 0\n").seen


def test_sglang_formula_on_known_counts() -> None:
    metas = [SGLangMeta(completion_tokens=12, spec_verify_ct=5), SGLangMeta(completion_tokens=20, spec_verify_ct=11),
             SGLangMeta(completion_tokens=1)]  # a request with no verification omits spec_verify_ct
    fig = sglang_acceptance(metas)
    assert fig is not None and fig.acceptance_length == pytest.approx(33 / 16)
    assert (fig.verify_calls, fig.completion_tokens) == (16, 33)
    assert sglang_acceptance([SGLangMeta(completion_tokens=5)]) is None


def test_offline_estimate() -> None:
    assert offline_al([0.5, 0.4, 0.25]) == pytest.approx(1 + 0.5 + 0.2 + 0.05)
    assert offline_al([]) == 1.0


# -- a run directory with prepared prompts and a merge ----------------------------------------------------


def _run_dir(tmp: Path, *, merged: list[str] | None, **sections: Any) -> Path:
    cfg_path = write_config(tmp, config_dict(tmp, ["chat", "code"], **sections))
    rd = RunDir(tmp / "run")
    for ds in ("chat", "code"):
        path = rd.prepared(ds)
        path.parent.mkdir(parents=True, exist_ok=True)
        recs = [PromptRecord(sample_id=f"{ds}-{i}", dataset=ds, messages=[Message(role="user", content=f"{ds} {i}")])
                for i in range(6)]
        path.write_bytes(b"".join(encode_json(r) + b"\n" for r in recs))
    if merged is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        shard = rd.merged_shard("train", 0, 1)
        shard.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"sample_id": merged}), shard)
        atomic_write_json(rd.merged_manifest, MergeManifest(
            files=[MergedFile(path=str(shard.relative_to(rd.root)), split="train", kind="parquet", rows=len(merged),
                              bytes=shard.stat().st_size, sha256="")],
            seed=0, merge={}, datasets=["chat", "code"], profile="qwen3", layout=2))
    return cfg_path


def test_held_out_prompts_skip_merged_rows_deterministically(tmp_path: Path) -> None:
    merged = [f"chat-{i}" for i in range(5)] + ["code-0#rep1", "code-1"]
    cfg = load(_run_dir(tmp_path, merged=merged))
    held = held_out_prompts(cfg, RunDir(cfg.run_path), 4)
    ids = [p.sample_id for p in held.prompts]
    assert ids[0] == "chat-5" and set(ids[1:]) <= {f"code-{i}" for i in range(2, 6)} and len(ids) == 4
    assert not set(ids) & {s.split("#")[0] for s in merged}
    assert held_out_prompts(cfg, RunDir(cfg.run_path), 4) == held and held.notes == []
    assert held.excluded_by_content == 0 and held.prompts[0].messages[0].content == "chat 5"
    few = held_out_prompts(cfg, RunDir(cfg.run_path), 50)
    assert len(few.prompts) == 5 and "only 5" in few.notes[0]


def test_no_held_out_prompt_is_an_input_error(tmp_path: Path) -> None:
    cfg = load(_run_dir(tmp_path, merged=[f"{d}-{i}" for d in ("chat", "code") for i in range(6)]))
    with pytest.raises(InputError, match="no held-out prompts"):
        held_out_prompts(cfg, RunDir(cfg.run_path), 3)


# -- a loopback server with counters the test controls ------------------------------------------------------


class FakeServer(AppServer):
    """vLLM chat completions + /metrics, and SGLang /generate; each request adds known counts."""

    def __init__(self, *, speculate: bool = True, delay: float = 0.0, faults: list[int] | None = None) -> None:
        self.speculate, self.delay = speculate, delay
        self.faults = list(faults or [])  # statuses the next requests get (one each), before any success
        self.c = {"drafts": 0.0, "tokens": 0.0, "acc": 0.0, "p0": 0.0, "p1": 0.0, "p2": 0.0}
        self.requests: list[dict[str, Any]] = []
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _count(self) -> None:
        if self.speculate:  # per request: 4 drafts of k=3, 6 accepted (3 at position 0, 2 at 1, 1 at 2)
            for key, v in (("drafts", 4), ("tokens", 12), ("acc", 6), ("p0", 3), ("p1", 2), ("p2", 1)):
                self.c[key] += v

    def _fault(self) -> web.Response | None:
        if not self.faults:
            return None
        status = self.faults.pop(0)
        return web.json_response({"error": {"message": f"injected {status}", "code": status}}, status=status)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if (fault := self._fault()) is not None:
            return fault
        await asyncio.sleep(self.delay)
        self._count()
        n = 10
        return web.json_response({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a" * n}, "finish_reason": "length",
                         "token_ids": list(range(n))}],
            "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
            "prompt_token_ids": [1, 2, 3]})

    async def metrics(self, _request: web.Request) -> web.Response:
        c = self.c
        text = _metrics(c["drafts"], 0, c["tokens"], c["acc"], c["p0"], 0, c["p1"], c["p2"])
        return web.Response(text=text, content_type="text/plain")

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if (fault := self._fault()) is not None:
            return fault
        await asyncio.sleep(self.delay)
        meta: dict[str, Any] = {"completion_tokens": 12, "prompt_tokens": len(body["input_ids"])}
        if self.speculate:
            meta.update(spec_verify_ct=5, spec_accept_length=2.4)
        return web.json_response({"text": "", "output_ids": list(range(12)), "meta_info": meta})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/generate", self.generate)


@pytest.fixture
def drafter_dir(tmp_path: Path) -> Path:
    d = tmp_path / "drafter"
    d.mkdir()
    atomic_write_json(d / "config.json", {"speculators_model_type": "eagle3", "speculators_config": {
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}})
    return d


@pytest.fixture
def servers() -> Iterator[tuple[FakeServer, FakeServer]]:
    with FakeServer(delay=0.01) as spec, FakeServer(speculate=False, delay=0.08) as base:
        yield spec, base


def test_run_accept_vllm_with_baseline_and_train_log(tmp_path: Path, drafter_dir: Path,
                                                     servers: tuple[FakeServer, FakeServer]) -> None:
    spec, base = servers
    cfg_path = _run_dir(tmp_path, merged=["chat-0", "code-0"], endpoint={"kind": "vllm", "base_url": spec.url},
                        accept={"prompts": 6, "max_tokens": 10})
    rd = RunDir(tmp_path / "run")
    rd.train.mkdir(parents=True)
    drafter_dir = drafter_dir.rename(rd.train_drafter)  # a drafter of this run: its estimate is the train log's
    (rd.train / "log.jsonl").write_bytes(
        encode_json(TrainLogRecord(kind="train", global_step=5, epoch=0, loss=1.0, cond_acc_k=[0.9, 0.9, 0.9]))
        + b"\n" + encode_json(TrainLogRecord(kind="val", global_step=5, epoch=0, loss=1.0,
                                             cond_acc_k=[0.5, 0.4, 0.25])) + b"\n")
    lines: list[str] = []
    rep = run_accept(load(cfg_path), drafter=drafter_dir, baseline_url=base.url, echo=lines.append)
    # 6 requests × (4 drafts, 12 draft tokens, 6 accepted; per position 3/2/1)
    assert rep.acceptance.acceptance_length == pytest.approx(1 + 36 / 24)
    assert rep.acceptance.per_position == pytest.approx([0.75, 0.5, 0.25])
    assert rep.acceptance.acceptance_rate == pytest.approx(0.5)
    assert (rep.k, rep.prompts, rep.server) == (3, 6, "vllm")
    assert rep.speculative.completion_tokens == 60 and rep.baseline is not None
    assert rep.speedup is not None and rep.speedup > 1.0
    assert rep.offline_al == pytest.approx(1.75) and "validation" in (rep.offline_source or "")
    assert not {"chat-0", "code-0"} & set(rep.sample_ids)
    assert all(r["temperature"] == 0.0 and r["max_tokens"] == 10 and not r.get("stream") for r in spec.requests)
    assert len(base.requests) == 6
    saved = read_json(rd.root / "accept" / "acceptance.json", AcceptReport)
    assert saved == rep and read_json(rd.accept_report(rep.drafter_key, rep.pass_name), AcceptReport) == rep
    assert rep.drafter_key.startswith("train-drafter-")
    assert any("acceptance length 2.500" in ln and "offline estimate 1.750" in ln for ln in lines)


def test_accept_warns_when_the_drafter_trained_on_fewer_samples_than_the_floor(
        tmp_path: Path, drafter_dir: Path, servers: tuple[FakeServer, FakeServer]) -> None:
    """The run's own drafter, published by a train whose floor was lower (train.min_trained_fraction 0.05: 3 of
    the 40 samples its batches asked for): accept, under the default floor 0.5, says so in one line and in
    its report; under the drafter's own floor it does not. Set aside in train/previous/, its train.json
    there is read; outside the run (an external drafter) nothing is known, and a note says so."""
    spec, _ = servers
    cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": "vllm", "base_url": spec.url},
                        accept={"prompts": 2, "max_tokens": 10})
    rd = RunDir(tmp_path / "run")
    rd.train.mkdir(parents=True)
    drafter = drafter_dir.rename(rd.train_drafter)
    atomic_write_json(rd.train_report, TrainReport(
        exit_code=0, message=f"drafter: {drafter} (vllm serve)", verifier="target", hidden="online: http://x",
        samples=50, layer_ids=[2, 4, 5], draft_vocab_size=64, ttt_steps=3, checkpoint=str(drafter),
        samples_trained=3, samples_asked=40, train_rows=45, min_trained_fraction=0.05))
    want = ("the drafter is below the sample floor: it trained on 3 of the 40 samples its batches asked for (8%; a "
            f"training split of 45 of 50 rows), under train.min_trained_fraction 0.5 ({rd.train_report})")
    lines: list[str] = []
    rep = run_accept(load(cfg_path), drafter=drafter, echo=lines.append)
    warned = [x for x in lines if x.startswith("warning: ")]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {want}"), lines
    assert rep.warnings == [warned[0].removeprefix("warning: ")] and (rep.samples_trained, rep.samples_asked) == (3, 40)
    assert read_json(rd.accept_json, AcceptReport).warnings == rep.warnings
    assert run_accept(load(cfg_path, {"train.min_trained_fraction": 0.05}), drafter=drafter,
                      echo=lambda _s: None).warnings == []
    rd.train_previous.mkdir()  # what a refused run leaves: the drafter published before, with its train.json
    moved = drafter.rename(rd.train_previous / drafter.name)
    rd.train_report.rename(rd.train_previous / rd.train_report.name)
    rep = run_accept(load(cfg_path), drafter=moved, echo=lambda _s: None)
    assert len(rep.warnings) == 1 and str(rd.train_previous / rd.train_report.name) in rep.warnings[0]
    outside = moved.rename(tmp_path / "users-drafter")
    rep = run_accept(load(cfg_path), drafter=outside, echo=lambda _s: None)
    assert rep.warnings == [] and rep.samples_trained is None
    assert any("how many samples it trained on is not known here" in n for n in rep.notes)


def test_every_pass_keeps_its_file_and_the_latest_is_the_runs_own_drafter_over_the_configured_prompts(
        tmp_path: Path, drafter_dir: Path, servers: tuple[FakeServer, FakeServer]) -> None:
    """issue 34, finding 6: tiny-chain's order of passes. The run's trained drafter over the configured 6
    prompts (vLLM), then again over 2 of them through SGLang, then an untrained drafter of another run folder
    measured with this run's config: three files, none overwritten, and accept/acceptance.json is still the
    trained drafter's 6-prompt vLLM pass (on a3c8820 the SGLang pass replaced the trained drafter's only file and
    the untrained drafter became the latest)."""
    spec, _ = servers
    cfg_path = _run_dir(tmp_path, merged=["chat-0"], endpoint={"kind": "vllm", "base_url": spec.url},
                        accept={"prompts": 6, "max_tokens": 10})
    rd = RunDir(tmp_path / "run")
    rd.train.mkdir(parents=True)
    trained = drafter_dir.rename(rd.train_drafter)
    untrained = tmp_path / "untrained" / "train" / "drafter"
    untrained.parent.mkdir(parents=True)
    shutil.copytree(trained, untrained)
    cfg = load(cfg_path)
    lines: list[str] = []
    main = run_accept(cfg, drafter=trained, echo=lines.append)
    sg = run_accept(load(cfg_path, {"accept.server": "sglang"}), drafter=trained, prompts=2, echo=lines.append)
    other = run_accept(cfg, drafter=untrained, echo=lines.append)
    files = {p.relative_to(rd.accept).as_posix(): read_json(p, AcceptReport) for p in rd.accept_reports()}
    assert files == {f"{main.drafter_key}/{main.pass_name}.json": main, f"{sg.drafter_key}/{sg.pass_name}.json": sg,
                     f"{other.drafter_key}/{other.pass_name}.json": other}
    assert main.pass_name.startswith("vllm-6p-") and sg.pass_name.startswith("sglang-2p-")
    assert main.drafter_key == sg.drafter_key != other.drafter_key
    assert read_json(rd.accept_json, AcceptReport) == main
    written = [x for x in lines if x.startswith("accept: report written to ")]
    assert written[0].endswith(f"{main.pass_name}.json (and {rd.accept_json}, the run's latest)")
    assert written[1].endswith(f"{rd.accept_json} (the run's latest) left as it is: 2 prompts, fewer than "
                               "accept.prompts (6)")
    assert written[2].endswith(f"left as it is: {untrained} is not the run's own drafter ({rd.train_drafter})")
    # the same drafter, server and prompts measured again replace that pass's file only; it is the latest again
    again = run_accept(cfg, drafter=trained, echo=lambda _s: None)
    assert len(rd.accept_reports()) == 3 and read_json(rd.accept_json, AcceptReport) == again != main
    assert read_json(rd.accept_report(sg.drafter_key, sg.pass_name), AcceptReport) == sg


def test_run_accept_sglang_meta_info(tmp_path: Path, drafter_dir: Path,
                                     servers: tuple[FakeServer, FakeServer]) -> None:
    spec, _ = servers
    cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": "sglang", "base_url": spec.url},
                        accept={"prompts": 3, "offline_cond_acc": [0.5]})
    rep = run_accept(load(cfg_path), drafter=drafter_dir, echo=lambda _s: None)
    assert rep.acceptance.acceptance_length == pytest.approx(12 / 5) and rep.acceptance.verify_calls == 15
    assert rep.offline_al == pytest.approx(1.5) and rep.offline_source == "accept.offline_cond_acc"
    assert "no merged/" in rep.notes[0]
    assert all(isinstance(r["input_ids"], list) and r["input_ids"] and r["sampling_params"]["temperature"] == 0.0
               for r in spec.requests)


@pytest.mark.parametrize(("kind", "server", "expected"), [
    ("openai", "sglang", "sglang"),  # accept.server names a backend whose acceptance is meta_info
    ("openai", "auto", "vllm"),  # the endpoint's backend reports no acceptance: vLLM's metrics
    ("sglang", "vllm", "vllm"),  # accept.server wins over the endpoint's kind
])
def test_the_servers_capabilities_decide_how_acceptance_is_read(
        tmp_path: Path, drafter_dir: Path, servers: tuple[FakeServer, FakeServer], kind: str, server: str,
        expected: str) -> None:
    spec, _ = servers
    cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": kind, "base_url": spec.url},
                        accept={"prompts": 2, "max_tokens": 10, "server": server})
    rep = run_accept(load(cfg_path), drafter=drafter_dir, echo=lambda _s: None)
    assert rep.server == expected
    assert rep.acceptance.source == ("sglang-meta_info" if expected == "sglang" else "vllm-metrics")
    assert all(("input_ids" in r) == (expected == "sglang") for r in spec.requests) and len(spec.requests) == 2


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_503_is_retried_by_the_one_policy_and_a_400_is_not(tmp_path: Path, drafter_dir: Path, kind: str) -> None:
    """accept's requests go through the backends' HTTP layer (``backends.errors`` classification) and the
    one retry policy (``retry.*``): a 503 is retried and the run completes; a 400 stops it at once."""
    from draftgen.errors import PermanentAPIError

    retry = {"base_delay_s": 0.01, "max_delay_s": 0.05}
    with FakeServer(faults=[503]) as flaky:
        cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": kind, "base_url": flaky.url},
                            accept={"prompts": 1, "max_tokens": 10, "concurrency": 1}, retry=retry)
        rep = run_accept(load(cfg_path), drafter=drafter_dir, echo=lambda _s: None)
        assert len(flaky.requests) == 2 and rep.prompts == 1  # the 503, then its retry
    with FakeServer(faults=[400]) as refusing:
        cfg_path = _run_dir(tmp_path / "b", merged=None, endpoint={"kind": kind, "base_url": refusing.url},
                            accept={"prompts": 1, "max_tokens": 10, "concurrency": 1}, retry=retry)
        with pytest.raises(PermanentAPIError, match="HTTP 400") as ei:
            run_accept(load(cfg_path), drafter=drafter_dir, echo=lambda _s: None)
        assert ei.value.kind == "http_400" and len(refusing.requests) == 1  # never retried


def test_an_unreachable_metrics_endpoint_is_one_api_error(tmp_path: Path, drafter_dir: Path) -> None:
    cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": "vllm"})
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: a connect error, translated
    with pytest.raises(APIError, match=r"GET http://127\.0\.0\.1:\d+/metrics: .*; is the server up\?"):
        run_accept(load(cfg_path), drafter=drafter_dir, base_url=url, prompts=1, echo=lambda _s: None)


def test_cli_accept_without_drafts_fails_in_one_line(tmp_path: Path, drafter_dir: Path,
                                                     servers: tuple[FakeServer, FakeServer]) -> None:
    _, base = servers  # a server that never speculates
    cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": "vllm"})
    res = CliRunner().invoke(cli, ["accept", str(cfg_path), "--drafter", str(drafter_dir), "--base-url", base.url,
                                   "--prompts", "2"])
    assert res.exit_code == 1, res.output
    assert "did not move" in res.output and "Traceback" not in res.output


def test_cli_accept_prints_the_baselines_and_the_intervals_for_a_users_drafter(
        tmp_path: Path, drafter_dir: Path, servers: tuple[FakeServer, FakeServer]) -> None:
    spec, _ = servers
    with FakeServer() as zero:  # the zero-aux server: here the same counts as the drafter's
        cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": "vllm"}, accept={"prompts": 8, "max_tokens": 10})
        res = CliRunner().invoke(cli, ["accept", str(cfg_path), "--drafter", str(drafter_dir), "--base-url", spec.url,
                                       "--zero-aux-url", zero.url])
    assert res.exit_code == 0, res.output
    out = res.output
    # 2.5 on every prompt: a point interval. Replayed on prompt 1 2 3 → output 0 1 … 9: copy-last never matches;
    # lookup gains where the output repeats the prompt's 1 2 3
    assert "acceptance length 2.500 [2.500, 2.500] (vllm-metrics, 8 prompts)" in out, out
    assert ("beside it, same prompts: copy-last 1.000 [1.000, 1.000]  lookup 1.500 [1.500, 1.500]  zero-aux 2.500 "
            "[2.500, 2.500]") in out, out
    assert "drafter minus: copy-last +1.500 [+1.500, +1.500]  lookup +1.000 [+1.000, +1.000]" in out, out
    assert "zero-aux +0.000 [+0.000, +0.000]  max(copy-last, lookup) +1.000 [+1.000, +1.000]" in out, out
    assert ("verdict: The drafter beats the no-model drafters by +1.000 (95% interval +1.000 to +1.000): acceptance "
            "length 2.500 [2.500, 2.500] against 1.500 for lookup, the better no-model drafter, over 8 held-out "
            "prompts.") in out, out
    assert "dataset chat: 2.500 [2.500, 2.500] over 4 prompts (copy-last 1.000, lookup 1.500, zero-aux 2.500)" in out
    assert len(zero.requests) == 8


def test_cli_accept_refuses_a_folder_that_is_no_drafter(tmp_path: Path) -> None:
    cfg_path = _run_dir(tmp_path, merged=None, endpoint={"kind": "vllm"})
    (tmp_path / "nod").mkdir()
    res = CliRunner().invoke(cli, ["accept", str(cfg_path), "--drafter", str(tmp_path / "nod"), "--base-url",
                                   "http://127.0.0.1:9/v1"])
    assert res.exit_code == 1 and "config.json" in res.output


# -- against the real model server (draftgen emulate --model DIR --drafter DIR) ----------------------------


def _save_speculators_drafter(target: Any, out: Path) -> Any:
    """An untrained drafter (seeded) in the speculators layout, without embed_tokens (the target's is used)."""
    import torch
    from safetensors.torch import save_file

    from draftgen.drafter.eagle3 import DrafterConfig, Eagle3Drafter

    torch.manual_seed(100)
    v = target.config.vocab_size
    c = DrafterConfig(arch="llama", hidden_size=128, num_heads=4, num_kv_heads=4, head_dim=32, rope_dim=32,
                      intermediate_size=256, num_layers=1, vocab_size=v, draft_vocab_size=2048,
                      norm_before_residual=True)
    d = Eagle3Drafter(c, fc_in=3 * 128).eval()
    with torch.no_grad():
        d.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        d.lm_head.weight.copy_(target.lm_head.weight[:2048])
    out.mkdir()
    save_file({k: t.contiguous() for k, t in d.state_dict().items() if k != "embed_tokens.weight"},
              str(out / "model.safetensors"))
    atomic_write_json(out / "config.json", {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "draft_vocab_size": 2048,
        "norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
            "head_dim": 32, "intermediate_size": 256, "num_hidden_layers": 1, "vocab_size": v, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}})
    return d


def test_run_accept_against_the_model_server(tmp_path: Path) -> None:
    """vLLM counters and SGLang meta_info from real greedy speculation; SGLang's AL recomputed here."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from draftgen.drafter.speculate import greedy_speculative_generate
    from draftgen.drafter.tiny import build_tiny_target
    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread
    from draftgen.tokens import profile_from_config

    torch.set_num_threads(1)
    tdir = build_tiny_target(tmp_path / "target")
    target = transformers.AutoModelForCausalLM.from_pretrained(tdir).eval()
    drafter = _save_speculators_drafter(target, tmp_path / "drafter")
    with start_in_thread(ModelServerOptions(model=str(tdir), port=0, threads=1, served_model_name="tiny",
                                            drafter=str(tmp_path / "drafter"), num_speculative_tokens=3)) as srv:
        cfg_path = _run_dir(tmp_path, merged=["chat-1"], model={"id": "tiny"},
                            endpoint={"kind": "vllm", "base_url": srv.base_url},
                            accept={"prompts": 3, "max_tokens": 24, "concurrency": 2})
        rep = run_accept(load(cfg_path), drafter=tmp_path / "drafter", echo=lambda _s: None)
        a = rep.acceptance
        assert a.source == "vllm-metrics" and a.drafts > 0 and a.draft_tokens == 3 * a.drafts
        assert 1.0 <= a.acceptance_length < 1.5  # untrained drafter
        assert len(a.per_position) == 3 and a.accepted == sum(a.accepted_per_pos)
        assert rep.speculative.completion_tokens == 3 * 24  # the tiny target never ends early

        cfg = load(cfg_path, {"endpoint.kind": "sglang"})
        rep2 = run_accept(cfg, drafter=tmp_path / "drafter", echo=lambda _s: None)
    profile = profile_from_config(cfg)
    tokens = verify = 0
    for p in held_out_prompts(cfg, RunDir(cfg.run_path), 3).prompts:
        r = greedy_speculative_generate(target, drafter, profile.prompt_ids(p.messages, p.tools), k=3,
                                        max_new_tokens=24, eos_ids=[151645, 151643], aux_layer_ids=[2, 4, 5])
        tokens, verify = tokens + len(r.ids), verify + r.verify_calls
    assert rep2.acceptance.source == "sglang-meta_info"
    assert (rep2.acceptance.completion_tokens, rep2.acceptance.verify_calls) == (tokens, verify)
    assert rep2.acceptance.acceptance_length == pytest.approx(tokens / verify)


def test_a_draft_lm_is_replayed_beside_copy_last_and_lookup_and_compared_paired(tmp_path: Path) -> None:
    """accept --draft-lm: the draft LM's counters equal an independent replay of it on the same continuations,
    with a paired comparison; the verdict still names the better no-model drafter."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from draftgen.drafter.baselines import replay
    from draftgen.drafter.draftlm import load_proposer, train_draft_lm
    from draftgen.drafter.tiny import build_tiny_target
    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread
    from draftgen.tokens import profile_from_config

    torch.set_num_threads(1)
    tdir = build_tiny_target(tmp_path / "target")
    target = transformers.AutoModelForCausalLM.from_pretrained(tdir).eval()
    _save_speculators_drafter(target, tmp_path / "drafter")
    rows = [(list(range(100 + i, 140 + i)), [0] * 8 + [1] * 32) for i in range(8)]
    info = train_draft_lm(tdir, tmp_path / "drafter", rows, tmp_path / "lm", steps=5, batch_tokens=128, lr=1e-3,
                          echo=lambda _s: None)
    assert len(info.vocab_ids) == 2048
    with start_in_thread(ModelServerOptions(model=str(tdir), port=0, threads=1, served_model_name="tiny",
                                            drafter=str(tmp_path / "drafter"), num_speculative_tokens=3)) as srv:
        cfg_path = _run_dir(tmp_path, merged=["chat-1"], model={"id": "tiny"},
                            endpoint={"kind": "vllm", "base_url": srv.base_url},
                            accept={"prompts": 3, "max_tokens": 24, "concurrency": 2})
        res = CliRunner().invoke(cli, ["accept", str(cfg_path), "--drafter", str(tmp_path / "drafter"),
                                       "--draft-lm", str(tmp_path / "lm")])
    assert res.exit_code == 0, res.output
    assert "draft-lm" in res.output and "for draft-lm, the better no-model drafter" not in res.output
    cfg = load(cfg_path)
    rep = read_json(RunDir(cfg.run_path).accept_json, AcceptReport)
    lm = next(a for a in rep.alternatives if a.name == "draft-lm")
    assert lm.how == "replay" and lm.prompts == 3
    assert any(c.versus == "draft-lm" and c.ci95 for c in rep.comparisons)
    profile = profile_from_config(cfg)
    propose = load_proposer(tmp_path / "lm")
    by_id = {p.sample_id: p for p in held_out_prompts(cfg, RunDir(cfg.run_path), 3).prompts}
    counts = [replay(profile.prompt_ids(by_id[r.sample_id].messages, by_id[r.sample_id].tools), r.output_ids or [],
                     propose, k=3, ended=r.ended) for r in rep.per_prompt]
    assert (lm.drafts, lm.accepted) == (sum(c.drafts for c in counts), sum(c.accepted for c in counts))
