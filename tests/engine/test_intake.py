"""One intake for every way a response arrives (issue 31, items 3 to 5): the same hostile answers, sent as
synchronous responses and as batch results, get the same verdict, and what the server billed is booked.

The server is ``HostileOpenRouter``: ``reliability._billing.LyingOpenRouter`` (a real aiohttp proxy in
front of the emulator, which generates, bills and keeps the truth) that also rewrites the Batch API: it
remembers each submitted request by its custom_id, and rewrites a completed batch's results and usage
once (every later read of that batch gets the same lie). A case (``Hostile``) lies about the first answer
of every even-numbered prompt, in a chat body (sync) or in that prompt's batch result, alike; the retry
of a refused answer is honest. ``run_generate`` drives it, as the CLI does.

The matrix, each case in both modes:

    other_model        another model's answer                      refused (model_mismatch), retried
    no_finish          no finish reason                            refused (incomplete), retried
    cut_short          ``length`` after 3 tokens of 512            refused (incomplete), retried
    negative_usage     a negative cost (the batch's too)           kept, flagged cost_invalid, priced
    undecodable_usage  usage that is no object (the batch's too)   refused (bad_response), retried
    duplicates         two answers to one request: in sync a second choice 0 (one record, flagged
                       extra_choices); in batch the custom_id three times, another model's first
                       (the first usable one is the record, the others booked, no retry)
    strays             an answer to nothing asked: in sync a choice of index 1 only (refused:
                       empty_response, retried, billed); in batch results with custom_ids the batch
                       was not submitted with, one not even a string (booked, no record)

Every case: each sample has exactly one record, none carrying the lie; the refused ones' attempts are
booked; and what the run booked (records, and attempts that left none) equals what the server billed,
the dearer where nothing says the real price (a negative or unreadable cost: priced at the worst case).
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from _generate_helpers import claim, emulator, failures, fast, make_config, responses, write_prompts
from draftgen.config import RunConfig
from draftgen.emulator import RunningEmulator
from draftgen.emulator.batch import with_batch
from draftgen.engine.batch_journal import load_batches
from draftgen.phases.generate.run import GenerateReport, run_generate
from draftgen.phases.importer.run import run_import
from draftgen.records import AttemptRecord, ResponseRecord, Usage
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, scan_attempt_spend, scan_responses
from reliability._billing import Lie, LyingOpenRouter, Obj

QUIET: dict[str, Any] = {"echo": lambda s: None}
MODEL = "qwen/qwen3-8b"
N = 8
MAX_TOKENS = 512


# -- the hostile server ------------------------------------------------------------------------------------


def _index(request: Obj) -> int:
    """The number of the prompt a request asks (``_generate_helpers.prompt``: "Question {i} of …")."""
    found = re.search(r"Question (\d+) of", json.dumps(request.get("messages")))
    assert found is not None, request
    return int(found.group(1))


def _results_of(obj: Obj) -> list[Obj]:
    return list(obj.get("results") or [])


class Hostile(Lie):
    """Lies about the first answer of every even-numbered prompt (``bad``), in a chat body and in a batch
    result alike; ``batch`` may also change a completed batch's results and usage as a whole."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.lied: set[int] = set()

    def chosen(self, request: Obj) -> bool:
        i = _index(request)
        first = i not in self.seen
        self.seen.add(i)
        if first and i % 2 == 0:
            self.lied.add(i)
            return True
        return False

    def body(self, obj: Obj, st: Obj) -> Obj:
        return self.bad(obj) if self.chosen(st["request"]) else obj

    def bad(self, obj: Obj) -> Obj:
        return obj

    def batch(self, obj: Obj, requests: dict[str, Obj]) -> Obj:
        for r in _results_of(obj):
            resp = r.get("response")
            if resp and resp.get("body") is not None:
                resp["body"] = self.body(resp["body"], {"request": requests[r["custom_id"]]})
        return obj


class OtherModel(Hostile):
    def bad(self, obj: Obj) -> Obj:
        obj["model"] = "qwen/qwen3-0.6b"
        return obj


class NoFinish(Hostile):
    def bad(self, obj: Obj) -> Obj:
        for ch in obj["choices"]:
            ch["finish_reason"] = ch["native_finish_reason"] = None
        return obj


class CutShort(Hostile):
    """``length`` at 3 tokens of 512: three characters of text, billed as 3 completion tokens."""

    def bad(self, obj: Obj) -> Obj:
        ch = obj["choices"][0]
        msg = ch["message"]
        ch["message"] = {"role": "assistant", "content": ((msg.get("content") or "") + "abc")[:3]}
        ch["finish_reason"] = ch["native_finish_reason"] = "length"
        obj["usage"]["completion_tokens"] = 3
        obj["usage"]["completion_tokens_details"] = {"reasoning_tokens": 0}
        return obj


class NegativeUsage(Hostile):
    def bad(self, obj: Obj) -> Obj:
        obj["usage"]["cost"] = -0.01
        return obj

    def batch(self, obj: Obj, requests: dict[str, Obj]) -> Obj:
        obj["usage"]["cost"] = -1.0
        return super().batch(obj, requests)


class UndecodableUsage(Hostile):
    def bad(self, obj: Obj) -> Obj:
        obj["usage"] = "lots"
        return obj

    def batch(self, obj: Obj, requests: dict[str, Obj]) -> Obj:
        obj["usage"] = "lots"
        return super().batch(obj, requests)


def _cost(result: Obj) -> float:
    return float(result["response"]["body"]["usage"]["cost"])


class Duplicates(Hostile):
    """Sync: a second choice 0 after the first. Batch: an even-numbered prompt's result three times, billed
    three times: another model's copy, the real one, and the real one again."""

    def bad(self, obj: Obj) -> Obj:
        ch = obj["choices"][0]
        obj["choices"] = [ch, {**ch, "message": {"role": "assistant", "content": "XXDUPXX"}}]
        return obj

    def batch(self, obj: Obj, requests: dict[str, Obj]) -> Obj:
        out: list[Obj] = []
        for r in _results_of(obj):
            if r.get("response") and self.chosen(requests[r["custom_id"]]):
                other = json.loads(json.dumps(r))
                other["response"]["body"]["model"] = "qwen/qwen3-0.6b"
                out += [other, r, json.loads(json.dumps(r))]
                obj["usage"]["cost"] += 2 * _cost(r)
            else:
                out.append(r)
        obj["results"] = out
        return obj


class Strays(Hostile):
    """Sync: the answer as a choice of index 1 (no choice 0). Batch: each even-numbered prompt's result once
    more under another batch's custom_id, one of them under a number, all billed."""

    def bad(self, obj: Obj) -> Obj:
        obj["choices"][0]["index"] = 1
        return obj

    def batch(self, obj: Obj, requests: dict[str, Obj]) -> Obj:
        extra: list[Obj] = []
        for r in _results_of(obj):
            if r.get("response") and self.chosen(requests[r["custom_id"]]):
                stray = json.loads(json.dumps(r))
                stray["custom_id"] = 7 if not extra else "b0-other-1:q:" + r["custom_id"].rsplit(":", 1)[-1]
                extra.append(stray)
                obj["usage"]["cost"] += _cost(r)
        obj["results"] = _results_of(obj) + extra
        return obj


class HostileOpenRouter(LyingOpenRouter):
    """``LyingOpenRouter`` whose lie reaches the Batch API too (module docstring). ``overbilled``: what the
    batches it rewrote claimed beyond what the emulator billed for them (a claim that is no number adds
    nothing: then the emulator's bill is the truth)."""

    def __init__(self, emu: RunningEmulator, lie: Hostile) -> None:
        super().__init__(emu, lie)
        self.hostile = lie
        self.requests: dict[str, Obj] = {}
        self.sent: dict[str, bytes] = {}
        self.overbilled = 0.0

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if "/batches" not in request.path:
            return await super()._forward(request)
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        async with self.session.request(request.method, self.emu.root_url + request.path_qs, data=body,
                                        headers=headers) as up:
            status, raw = up.status, await up.read()
        if request.method == "POST" and status == 202:
            for r in json.loads(body)["requests"]:
                self.requests[r["custom_id"]] = r["body"]
        if request.method == "GET" and status == 200:
            obj = json.loads(raw)
            if obj.get("results"):
                if obj["id"] not in self.sent:
                    true = float(obj["usage"]["cost"])
                    lied = self.hostile.batch(obj, self.requests)
                    claimed = lied.get("usage", {}).get("cost") if isinstance(lied.get("usage"), dict) else None
                    if isinstance(claimed, float) and claimed >= 0:
                        self.overbilled += claimed - true
                    self.sent[obj["id"]] = json.dumps(lied).encode()
                raw = self.sent[obj["id"]]
        return web.Response(status=status, body=raw, content_type="application/json")


# -- running it --------------------------------------------------------------------------------------------


def _config(tmp: Path, url: str, mode: str, retry: str = "sync", **sections: Any) -> RunConfig:
    """One batch holds every prompt (``max_requests``); ``retry``: ``endpoint.batch.retry``."""
    endpoint = {"mode": mode, "stream": False, "batch": {"poll_interval_s": 0.02, "poll_max_interval_s": 0.1,
                                                         "max_requests": 100, "retry": retry}}
    sections.setdefault("partitions", {"short": {"concurrency": 4, "max_tokens": MAX_TOKENS}})
    return make_config(tmp, ["q"], base_url=url, endpoint=endpoint, **sections)


def _generate(cfg: RunConfig, within_s: float = 120.0) -> GenerateReport:
    """``run_generate`` in a thread, given ``within_s`` to finish (a batch it cannot read is polled forever)."""
    out: list[GenerateReport | BaseException] = []

    def go() -> None:
        try:
            out.append(run_generate(cfg, **QUIET))
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(within_s)
    assert out, f"generate did not finish within {within_s:g}s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _run(tmp: Path, lie: Hostile, mode: str, n: int = N, **sections: Any) -> tuple[GenerateReport, HostileOpenRouter]:
    write_prompts(claim(_config(tmp, "http://unused", mode)), "q", n)
    with emulator(with_batch(fast(), "fast")) as emu, HostileOpenRouter(emu, lie) as fake:
        rep = _generate(_config(tmp, fake.base_url, mode, **sections))
        fake.billed_at_end = fake.billed + fake.overbilled
    return rep, fake


def _attempts(run: Path) -> list[AttemptRecord]:
    return [a for _, a in iter_jsonl(RunDir(run).attempts, AttemptRecord)]


def _booked(run: Path) -> float:
    """What the next run's budget reads as spent: the records' costs and the attempts that left none."""
    rd = RunDir(run)
    return scan_responses(rd.raw("q")).spend_usd + _attempts_booked(rd)


# -- the matrix --------------------------------------------------------------------------------------------

#: case → (its lie, what the lied-about first answers become in sync, and in batch: the attempt outcome
#: of a refusal that is retried, or None when the answer is kept; the records' flag; exact billing)
CASES: dict[str, tuple[type[Hostile], dict[str, str | None], str | None, bool]] = {
    "other_model": (OtherModel, {"sync": "model_mismatch", "batch": "model_mismatch"}, None, True),
    "no_finish": (NoFinish, {"sync": "incomplete", "batch": "incomplete"}, None, True),
    "cut_short": (CutShort, {"sync": "incomplete", "batch": "incomplete"}, None, True),
    "negative_usage": (NegativeUsage, {"sync": None, "batch": None}, "cost_invalid", False),
    "undecodable_usage": (UndecodableUsage, {"sync": "bad_response", "batch": "bad_response"}, None, False),
    "duplicates": (Duplicates, {"sync": None, "batch": None}, None, True),
    "strays": (Strays, {"sync": "empty_response", "batch": None}, None, True),
}


@pytest.mark.parametrize("mode", ["sync", "batch"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_arrival_gets_the_same_intake(tmp_path: Path, case: str, mode: str) -> None:
    cls, refused, flag, exact = CASES[case]
    lie = cls()
    rep, fake = _run(tmp_path, lie, mode)
    run = tmp_path / "run"
    recs = responses(run, "q")
    assert rep.exit_code == 0 and rep.failed == 0 and not failures(run, "q"), rep.message
    assert len(recs) == N and len({r.sample_id for r in recs}) == N, "a sample has no record, or two"
    assert lie.lied == set(range(0, N, 2))
    for r in recs:  # nothing of the lie is in a record
        assert r.model == MODEL and r.finish_reason in ("stop", "length") and "XXDUPXX" not in (r.content or "")
        assert r.finish_reason == "stop" or (r.usage is not None and r.usage.completion_tokens >= MAX_TOKENS // 2)
    lied = {f"q-{i:05d}" for i in lie.lied}
    atts = _attempts(run)
    kind = refused[mode]
    if kind is not None:  # refused, booked, retried: the record is the retry's
        bad = [a for a in atts if a.outcome == kind]
        assert {a.sample_id for a in bad} == lied and all(a.cost > 0 for a in bad), bad
        assert {a.sample_id for a in atts if a.outcome != "ok"} == lied
        assert all(r.batch_id is None for r in recs if r.sample_id in lied)  # not the batch's answer
    if flag is not None:
        assert {r.sample_id for r in recs if flag in r.recon_flags} == lied
    if case == "duplicates" and mode == "sync":
        assert {r.sample_id for r in recs if "extra_choices" in r.recon_flags} == lied
    if case == "duplicates" and mode == "batch":  # the first usable copy is the record; the others are booked
        assert Counter(a.outcome for a in atts if a.sample_id in lied) == Counter(
            {"ok": len(lied), "model_mismatch": len(lied), "batch_duplicate": len(lied)})
        assert all(r.batch_id is not None and r.attempts == 1 for r in recs)
    if case == "strays" and mode == "batch":
        strays = [a for a in atts if a.outcome == "batch_stray"]
        assert len(strays) == len(lied) and all(a.cost > 0 for a in strays)
        assert "7" in {a.sample_id for a in strays}
    booked, billed = _booked(run), fake.billed_at_end
    assert rep.spend_session == pytest.approx(booked, rel=1e-6)  # what "left" is computed from
    if exact:
        assert booked == pytest.approx(billed, rel=1e-6), (booked, billed)
    else:  # nothing says the real price: priced at the worst case, never under
        assert booked >= billed * (1 - 1e-6), (booked, billed)


@pytest.mark.parametrize("lie", [NoFinish, CutShort], ids=["no_finish", "cut_short"])
def test_unusable_batch_results_are_regenerated_in_a_later_batch(tmp_path: Path, lie: type[Hostile]) -> None:
    """Item 4 with ``endpoint.batch.retry: batch``: a result with no finish reason or cut short is not done;
    the next batch makes it again, on a provider other than the one that cut it."""
    rep, _ = _run(tmp_path, lie(), "batch", retry="batch")
    run = tmp_path / "run"
    recs = {r.sample_id: r for r in responses(run, "q")}
    assert rep.exit_code == 0 and len(recs) == N and all(r.finish_reason in ("stop", "length") for r in recs.values())
    first, second = load_batches(RunDir(run).batch_journal).values()
    lied = {f"q-{i:05d}" for i in range(0, N, 2)}
    assert {it.sample_id for it in second.items} == lied
    assert {sid for sid, r in recs.items() if r.batch_id == second.batch_id} == lied
    assert first.provider not in (second.provider or "") and second.provider_only and all(
        not p.startswith((first.provider or "?").lower()) for p in second.provider_only)
    assert Counter(a.outcome for a in _attempts(run)) == Counter({"ok": N, "incomplete": len(lied)})


# -- item 5: booked is billed, and the budget's bound ---------------------------------------------------------


class BilledTwice(Hostile):
    """Every result of every batch is billed twice by the batch's ``usage.cost`` (a duplicate the results do
    not show, or the sync price for a batch); each result's own cost is the real one."""

    def batch(self, obj: Obj, requests: dict[str, Obj]) -> Obj:
        obj["usage"]["cost"] *= 2
        return obj


def test_a_batch_billed_beyond_its_results_is_booked_and_bounds_the_budget(tmp_path: Path) -> None:
    budget = 0.006
    rep, fake = _run(tmp_path, BilledTwice(), "batch", n=40, budget={"max_spend_usd": budget})
    run = tmp_path / "run"
    billed = fake.billed_at_end
    assert rep.exit_code != 0 and "dollar budget" in (rep.message or "")
    # Booked is billed: the records' costs, plus what each batch billed beyond them (no record).
    assert rep.spend_total == pytest.approx(billed, rel=1e-6) and _booked(run) == pytest.approx(billed, rel=1e-6)
    beyond = [a for a in _attempts(run) if a.outcome == "batch_unattributed"]
    recs = responses(run, "q")
    assert beyond and sum(a.cost for a in beyond) == pytest.approx(sum(r.usage.cost for r in recs if r.usage))
    # docs/batch.md: spend passes the budget only by what the batches in flight were billed beyond their
    # reservations, and nothing is cut once the budget is passed.
    views = list(load_batches(RunDir(run).batch_journal).values())
    assert views and all(v.finished for v in views)
    excess = sum(max(0.0, (v.cost or 0.0) - v.reserved_usd) for v in views)
    assert billed <= budget + excess + 1e-9
    assert rep.spend_over_budget == pytest.approx(max(0.0, billed - budget), abs=1e-6)


# -- import: the same intake on the fields a record carries ----------------------------------------------------


def test_import_holds_records_to_the_same_intake(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, ["q"], partitions={"short": {"concurrency": 4, "max_tokens": MAX_TOKENS}})
    run = claim(cfg)
    ids = write_prompts(run, "q", 8)
    good = {"finish_reason": "stop", "model": MODEL, "provider": "DeepInfra", "max_tokens": MAX_TOKENS,
            "usage": Usage(prompt_tokens=30, completion_tokens=3, cost=0.0001)}
    rows: list[ResponseRecord] = [
        ResponseRecord(sample_id=ids[0], output_ids=[1, 2, 3], **good),  # kept
        ResponseRecord(sample_id=ids[1], output_ids=[1, 2, 3]),  # a bare local-SGLang row: kept, its end unknown
        ResponseRecord(sample_id=ids[2], output_ids=[1, 2, 3], **{**good, "model": "qwen/qwen3-0.6b"}),
        ResponseRecord(sample_id=ids[3], output_ids=[1, 2, 3], **{**good, "finish_reason": None}),
        ResponseRecord(sample_id=ids[4], output_ids=[1, 2, 3], **{**good, "finish_reason": "length"}),
        ResponseRecord(sample_id=ids[5], output_ids=list(range(1, 600)), **{**good, "finish_reason": "length"}),
        ResponseRecord(sample_id=ids[6], output_ids=list(range(1, 600))),  # bare, more ids than max_tokens
        ResponseRecord(sample_id=ids[7], output_ids=[1, 2, 3], **{**good, "provider": "Chutes"}),
    ]
    source = tmp_path / "elsewhere.jsonl"
    source.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in rows))
    printed: list[str] = []
    cfg = make_config(tmp_path, ["q"], partitions={"short": {"concurrency": 4, "max_tokens": MAX_TOKENS}},
                      routing={"ignore": ["chutes"]})
    rep = run_import(cfg, echo=printed.append, dataset="q", source=source)
    assert rep.imported == 2 and rep.unusable == {"model_mismatch": 1, "incomplete": 2, "too_many_tokens": 2,
                                                  "provider_excluded": 1}
    assert {r.sample_id for r in responses(run, "q")} == {ids[0], ids[1]}
    assert any("6 records not imported" in ln and f"{source}:3" in ln for ln in printed), printed
    # The refused samples are not done: generate makes them.
    with emulator(fast()) as emu:
        gen = run_generate(make_config(tmp_path, ["q"], base_url=emu.base_url, routing={"ignore": ["chutes"]},
                                       partitions={"short": {"concurrency": 4, "max_tokens": MAX_TOKENS}}), **QUIET)
    assert gen.exit_code == 0 and gen.done == 6 and len(responses(run, "q")) == 8


def _attempts_booked(rd: RunDir) -> float:
    """What the attempts booked, abandoned requests' holds included (``store.scan_attempt_spend``)."""
    spend = scan_attempt_spend(rd.attempts, rd.settlements)
    return spend.billed + spend.held
