"""Acceptance per prompt at full speed (issue 35, item 1): vLLM's per-request spec-decode fields
(``--per-request-spec-decode-metrics``, vLLM PR #48915) read with many requests in flight, equal to the
one-at-a-time ``/metrics`` figures on the same prompts; each prompt's record joined to its dataset and length
bucket (and tags, with the per-tag figures pooled from them), written one a line; fields that do not add up, or
that disagree with the server's own counters, refused.

The server is draftgen's own ``emulate --model`` over a tiny random Qwen3 with a random EAGLE-3 drafter (real
greedy speculative verification); the hostile servers are an HTTP man-in-the-middle in front of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from _common_helpers import AppServer, config_dict, load, write_config  # noqa: E402
from _extract_helpers import build_random_drafter, build_tiny_model  # noqa: E402
from draftgen.backends import SpecDecodeMetrics  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread  # noqa: E402
from draftgen.errors import PermanentAPIError  # noqa: E402
from draftgen.phases.accept.counters import request_acceptance  # noqa: E402
from draftgen.phases.accept.passes import length_bucket  # noqa: E402
from draftgen.phases.accept.run import run_accept  # noqa: E402
from draftgen.records import Message, PromptAcceptance, PromptRecord  # noqa: E402
from draftgen.rundir import RunDir  # noqa: E402
from draftgen.store import encode_json, iter_jsonl  # noqa: E402

NAME = "qwen/qwen3-8b"  # the config's model.id (tests/_common_helpers DEFAULT_MODEL)
K = 3

# -- the counts of one response ------------------------------------------------------------------------------

EXAMPLE = {"mean_acceptance_length": 1.2325581395348837, "draft_acceptance_rate": 0.07751937984496124,
           "acceptance_histogram": [39, 1, 0, 3], "num_spec_steps": 43, "num_accepted_draft_tokens": 10,
           "num_draft_tokens": 129, "num_spec_tokens": 3}  # vLLM PR #48915's own example


def test_one_responses_counts_as_vllm_documents_them() -> None:
    f = request_acceptance(SpecDecodeMetrics(**EXAMPLE), where="x")
    assert f.acceptance_length == pytest.approx(EXAMPLE["mean_acceptance_length"])
    assert f.accepted_per_pos == [4.0, 3.0, 3.0]  # position i accepted in the steps that accepted more than i
    assert f.acceptance_rate == pytest.approx(EXAMPLE["draft_acceptance_rate"])
    assert (f.drafts, f.accepted, f.source) == (43.0, 10.0, "vllm-per-request")


@pytest.mark.parametrize(("change", "why"), [
    ({"acceptance_histogram": [39, 1, 0]}, "3 entries, not num_spec_tokens + 1 = 4"),
    ({"acceptance_histogram": [38, 1, 0, 3]}, "sums to 42 steps"),
    ({"num_accepted_draft_tokens": 11}, "accounts for 10 accepted tokens"),
    ({"num_draft_tokens": 200}, "in 43 steps of 3"),
    ({"num_spec_steps": -1, "acceptance_histogram": [-1, 0, 0, 0]}, "num_spec_steps is negative"),
    ({"per_step_accepted": [3, 3]}, "per_step_accepted lists 2 steps"),
])
def test_counts_that_cannot_all_be_true_are_refused(change: dict[str, Any], why: str) -> None:
    with pytest.raises(PermanentAPIError) as err:
        request_acceptance(SpecDecodeMetrics(**{**EXAMPLE, **change}), where="POST u: sample s")
    msg = str(err.value)
    assert why in msg and msg.startswith("POST u: sample s:") and "accept.per_request: metrics" in msg
    assert "\n" not in msg and err.value.kind == "bad_spec_metrics"


def test_length_buckets() -> None:
    assert [length_bucket(n) for n in (None, 0, 255, 256, 1023, 1024, 4096, 16383, 16384)] == \
        [None, "<256", "<256", "256-1k", "256-1k", "1k-4k", "4k-16k", "4k-16k", ">=16k"]


# -- a real server, honest or not ------------------------------------------------------------------------------


class Middle(AppServer):
    """Forwards chat completions and ``/metrics`` to the emulator at ``upstream``; ``alter(n, body)`` may change
    the n-th completion's JSON (from 1). Counts the completions in flight at once and the scrapes."""

    def __init__(self, upstream: str, alter: Callable[[int, dict[str, Any]], None] | None = None) -> None:
        self.upstream, self.alter = upstream, alter
        self.n = self.inflight = self.peak = self.scrapes = 0
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            async with aiohttp.ClientSession() as s, s.post(self.upstream + "/v1/chat/completions", json=body) as r:
                out = await r.json()
        finally:
            self.inflight -= 1
        self.n += 1
        if self.alter is not None:
            self.alter(self.n, out)
        return web.json_response(out)

    async def metrics(self, _request: web.Request) -> web.Response:
        self.scrapes += 1
        async with aiohttp.ClientSession() as s, s.get(self.upstream + "/metrics") as r:
            return web.Response(text=await r.text(), content_type="text/plain")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("passes")
    target = build_tiny_model(tmp / "target", layers=8, hidden=64)
    drafter = build_random_drafter(tmp / "drafter", target, k=K)
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=1, served_model_name=NAME,
                                            drafter=str(drafter), num_speculative_tokens=K,
                                            per_request_spec_decode_metrics="summary")) as srv:
        yield {"tmp": tmp, "drafter": drafter, "root": srv.root_url}


WORDS = ["alpha", "beta gamma", "delta epsilon zeta", "eta", "theta iota", "kappa lambda mu nu", "xi", "omicron pi"]


def _run(tmp: Path, url: str, **accept: Any) -> Path:
    """A run directory with 8 prepared prompts over two datasets (no merge: every one is held out)."""
    cfg = write_config(tmp, config_dict(tmp, ["chat", "code"], endpoint={"kind": "vllm", "base_url": url},
                                        accept={"prompts": 8, "max_tokens": 24, "concurrency": 8, **accept}),
                       f"cfg-{len(list(tmp.glob('cfg-*.yaml')))}.yaml")
    rd = RunDir(tmp / "run")
    for ds in ("chat", "code"):
        path = rd.prepared(ds)
        path.parent.mkdir(parents=True, exist_ok=True)
        recs = [PromptRecord(sample_id=f"{ds}-{i}", dataset=ds, messages=[Message(role="user", content=f"{ds}: {w}")])
                for i, w in enumerate(WORDS[:4])]
        path.write_bytes(b"".join(encode_json(r) + b"\n" for r in recs))
    return cfg


def _counts(rows: list[PromptAcceptance]) -> dict[str, tuple[float, float, list[float], list[int] | None]]:
    return {r.sample_id: (r.drafts, r.accepted, r.accepted_per_pos, r.output_ids) for r in rows}


def test_per_request_fields_many_in_flight_equal_the_one_at_a_time_metrics(served: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    """The same 8 prompts, once from the responses' own fields (8 in flight, 3 scrapes: before, after the first
    prompt sent alone, after the rest) and once one at a time around /metrics (9 scrapes): the same counters
    for every prompt, each written as a typed record joined to its dataset and length bucket."""
    with Middle(served["root"]) as fast:
        cfg = load(_run(tmp_path, fast.url))
        rep = run_accept(cfg, drafter=served["drafter"], echo=lambda _s: None)
    rd = RunDir(tmp_path / "run")
    written = [r for _, r in iter_jsonl(rd.accept_prompts(rep.drafter_key, rep.pass_name), PromptAcceptance)]
    with Middle(served["root"]) as slow:
        one = run_accept(load(_run(tmp_path, slow.url, per_request="metrics")), drafter=served["drafter"],
                         echo=lambda _s: None)
    assert fast.peak > 1 and fast.scrapes == 3 and slow.peak == 1 and slow.scrapes == 9
    assert rep.acceptance.source == "vllm-per-request" and one.acceptance.source == "vllm-metrics"
    assert {r.source for r in rep.per_prompt} == {"vllm-per-request"}
    assert {r.source for r in one.per_prompt} == {"vllm-metrics"}
    assert _counts(rep.per_prompt) == _counts(one.per_prompt)
    assert sum(r.drafts for r in rep.per_prompt) > 8  # every prompt went through several verify steps
    assert rep.acceptance.drafts == one.acceptance.drafts and rep.acceptance.accepted == one.acceptance.accepted
    assert written == rep.per_prompt
    by_id = {r.sample_id: r for r in written}
    assert {r.dataset for r in written} == {"chat", "code"}
    assert all(r.prompt_tokens is not None and r.length_bucket == "<256" for r in written)  # the server's count
    assert by_id["chat-0"].acceptance_length == pytest.approx(1 + by_id["chat-0"].accepted / by_id["chat-0"].drafts)


def _inflate(n: int, out: dict[str, Any]) -> None:
    """Every response claims one more verify step accepting all K drafts, its counts kept consistent."""
    m = out["metrics"]["speculative_decoding"]
    m["acceptance_histogram"][K] += 1
    m["num_spec_steps"] += 1
    m["num_accepted_draft_tokens"] += K
    m["num_draft_tokens"] += K


def _inflate_later(n: int, out: dict[str, Any]) -> None:
    if n > 1:
        _inflate(n, out)


@pytest.mark.parametrize(("alter", "said"), [
    (_inflate, "the first prompt's metrics.speculative_decoding reports"),
    (_inflate_later, "vllm:spec_decode_num_drafts moved by"),
])
def test_fields_the_servers_own_counters_contradict_are_refused(served: dict[str, Any], tmp_path: Path,
                                                                alter: Callable[[int, dict[str, Any]], None],
                                                                said: str) -> None:
    """A server whose per-request fields add up but claim more than its /metrics counted (on every response,
    or only after the first): accept stops with one line naming the fix, writes no report; with
    ``accept.per_request: metrics`` the same server is measured from its counters."""
    with Middle(served["root"], alter) as liar:
        with pytest.raises(PermanentAPIError) as err:
            run_accept(load(_run(tmp_path, liar.url)), drafter=served["drafter"], echo=lambda _s: None)
        msg = str(err.value)
        assert said in msg and "accept.per_request: metrics" in msg and "\n" not in msg
        assert not (tmp_path / "run" / "accept").exists()
        rep = run_accept(load(_run(tmp_path, liar.url, per_request="metrics")), drafter=served["drafter"],
                         echo=lambda _s: None)
    assert rep.acceptance.source == "vllm-metrics" and all(r.drafts > 0 for r in rep.per_prompt)


def test_without_the_fields_accept_falls_back_to_metrics_one_at_a_time(served: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    """A vLLM started without --per-request-spec-decode-metrics (the fields stripped): one at a time, /metrics."""
    with Middle(served["root"], lambda _n, out: out.pop("metrics")) as plain:
        rep = run_accept(load(_run(tmp_path, plain.url)), drafter=served["drafter"], echo=lambda _s: None)
    assert rep.acceptance.source == "vllm-metrics" and plain.peak == 1 and plain.scrapes == 9
    assert {r.source for r in rep.per_prompt} == {"vllm-metrics"}


def test_fields_of_another_shape_are_refused(served: dict[str, Any], tmp_path: Path) -> None:
    def garble(_n: int, out: dict[str, Any]) -> None:
        out["metrics"]["speculative_decoding"]["num_spec_steps"] = "many"

    with Middle(served["root"], garble) as odd, pytest.raises(PermanentAPIError) as err:
        run_accept(load(_run(tmp_path, odd.url)), drafter=served["drafter"], echo=lambda _s: None)
    assert "metrics.speculative_decoding is not vLLM's shape" in str(err.value)


def test_the_emulator_streams_the_fields_with_the_usage(served: dict[str, Any]) -> None:
    """Streamed: the fields come in the usage chunk (``choices: []``), as vLLM sends them; whole: top level."""
    body = {"model": NAME, "messages": [{"role": "user", "content": "alpha"}], "max_tokens": 12,
            "stream": True, "stream_options": {"include_usage": True}}

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        import json

        async with aiohttp.ClientSession() as s:
            async with s.post(served["root"] + "/v1/chat/completions", json=body) as r:
                text = await r.text()
            async with s.post(served["root"] + "/v1/chat/completions", json={**body, "stream": False}) as r:
                whole = await r.json()
        chunks = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return chunks, whole

    chunks, whole = asyncio.run(main())
    with_metrics = [c for c in chunks if "metrics" in c]
    assert len(with_metrics) == 1 and with_metrics[0]["choices"] == [] and "usage" in with_metrics[0]
    streamed = with_metrics[0]["metrics"]["speculative_decoding"]
    assert streamed == whole["metrics"]["speculative_decoding"]
    assert sum(streamed["acceptance_histogram"]) == streamed["num_spec_steps"] > 0


def test_a_server_drafting_another_k_is_measured_at_its_k_in_a_file_of_its_own(served: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    """The drafter's config says k=3; a server drafting 2 tokens a step: the report's k is 2 (its replays and k
    figures use it), its file is ``…-k2`` beside the k=3 pass's, and the run's latest stays the k=3 pass."""
    with Middle(served["root"]) as at3:
        rep3 = run_accept(load(_run(tmp_path, at3.url)), drafter=served["drafter"], echo=lambda _s: None)
    with start_in_thread(ModelServerOptions(model=str(served["tmp"] / "target"), port=0, threads=1,
                                            served_model_name=NAME, drafter=str(served["drafter"]),
                                            num_speculative_tokens=2,
                                            per_request_spec_decode_metrics="summary")) as srv2:
        lines: list[str] = []
        rep2 = run_accept(load(_run(tmp_path, srv2.root_url + "/v1")), drafter=served["drafter"], echo=lines.append)
    assert (rep3.k, rep2.k) == (3, 2) and len(rep2.acceptance.per_position) == 2
    assert rep2.pass_name == rep3.pass_name + "-k2" and rep2.drafter_key == rep3.drafter_key
    rd = RunDir(tmp_path / "run")
    assert rd.accept_report(rep2.drafter_key, rep2.pass_name).is_file()
    assert rd.accept_report(rep3.drafter_key, rep3.pass_name).is_file()
    from draftgen.records import AcceptReport
    from draftgen.store import read_json

    assert read_json(rd.accept_json, AcceptReport) == rep3
    assert any("served at k=2, not the drafter's own k" in ln for ln in lines)
    assert any("the server drafts 2 tokens a step; the drafter's config says 3" in n for n in rep2.notes)


# -- tags -----------------------------------------------------------------------------------------------------

TOPICS: list[Any] = ["x", "y", ["x", "y"], None, "x", ["y"], "x", None]


def _bootstrap(al: Callable[[list[int]], float], idx: list[int]) -> list[float]:
    """The 95% percentile-bootstrap interval accept documents (2,000 resamples of the prompts, random.Random(0),
    linear interpolation), written out again."""
    import random

    rng = random.Random(0)
    values = sorted(al([idx[rng.randrange(len(idx))] for _ in idx]) for _ in range(2000))

    def at(q: float) -> float:
        pos = q * (len(values) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(values) - 1)
        return values[lo] + (values[hi] - values[lo]) * (pos - lo)

    return [round(at(0.025), 4), round(at(0.975), 4)]


def test_each_prompts_tags_are_joined_and_the_per_tag_figures_pool_its_prompts(served: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    """Prepared for real with ``tags_field`` (chat) and without (code): each prompt's record carries its prepared
    prompt's tags; the report's per-(dataset, tag) figures are the per-prompt records pooled (a prompt of two
    tags in both, the untagged ones under ""), each with its bootstrap interval; the console shows them."""
    from draftgen.phases.prepare.run import run_prepare

    rows = []
    for i, topic in enumerate(TOPICS):
        row: dict[str, Any] = {"messages": [{"role": "user", "content": f"chat: {WORDS[i]} {i}"}]}
        if topic is not None:
            row["topic"] = topic
        rows.append(row)
    (tmp_path / "chat.jsonl").write_bytes(b"".join(encode_json(r) + b"\n" for r in rows))
    (tmp_path / "code.jsonl").write_bytes(b"".join(
        encode_json({"messages": [{"role": "user", "content": f"code: {w}"}], "topic": "z"}) + b"\n"
        for w in WORDS[:4]))
    with Middle(served["root"]) as fast:
        cfg = load(write_config(tmp_path, config_dict(
            tmp_path, [{"name": "chat", "path": "chat.jsonl", "tags_field": "topic"},
                       {"name": "code", "path": "code.jsonl"}],
            endpoint={"kind": "vllm", "base_url": fast.url},
            accept={"prompts": 12, "max_tokens": 24, "concurrency": 8})))
        run_prepare(cfg, echo=lambda _s: None)
        lines: list[str] = []
        rep = run_accept(cfg, drafter=served["drafter"], echo=lines.append)
    rd = RunDir(tmp_path / "run")
    prepared = {p.sample_id: p.tags for ds in ("chat", "code") for _, p in iter_jsonl(rd.prepared(ds), PromptRecord)}
    written = [r for _, r in iter_jsonl(rd.accept_prompts(rep.drafter_key, rep.pass_name), PromptAcceptance)]
    assert len(written) == 12 and all(r.tags == prepared[r.sample_id] for r in written)
    assert sorted(tuple(r.tags or ()) for r in written if r.dataset == "chat") == sorted(
        tuple(sorted(t if isinstance(t, list) else [t])) if t else () for t in TOPICS)
    assert all(r.tags is None for r in written if r.dataset == "code")  # no tags_field: none
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(written):
        if r.dataset == "chat":
            for t in r.tags or [""]:
                groups.setdefault(t, []).append(i)

    def al(idx: list[int]) -> float:
        drafts = sum(written[i].drafts for i in idx)
        return 1.0 + sum(written[i].accepted for i in idx) / drafts if drafts > 0 else 1.0

    assert sorted(groups) == ["", "x", "y"] and [len(groups[t]) for t in ("", "x", "y")] == [2, 4, 3]
    assert [(f.dataset, f.tag, f.prompts) for f in rep.tags] == [("chat", t, len(groups[t])) for t in ("", "x", "y")]
    for f in rep.tags:
        assert f.acceptance_length == round(al(groups[f.tag or ""]), 4)
        assert f.ci95 == _bootstrap(al, groups[f.tag or ""])
        assert f.ci95[0] <= f.acceptance_length <= f.ci95[1]
        assert set(f.alternatives) == {"copy-last", "lookup"}
        shown = f"  chat / {f.tag or '(untagged)'}: {f.acceptance_length:.3f} [{f.ci95[0]:.3f}, {f.ci95[1]:.3f}] " \
                f"over {f.prompts} prompts"
        assert any(line.startswith("  " + shown) for line in lines), (shown, lines)
    chat_line = next(i for i, line in enumerate(lines) if line.startswith("  dataset chat:"))
    assert lines[chat_line + 1].startswith("    chat / (untagged):")  # the tags under their dataset
