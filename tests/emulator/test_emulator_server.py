"""The OpenRouter API surface of the emulator, through a plain HTTP client against ``start_in_thread``."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from _emulator_helpers import KEY, chat, chat_body, parse_sse, request
from draftgen.emulator import EmulatorOptions, Provider, builtin_scenario, start_in_thread
from draftgen.emulator.server import RunningEmulator
from draftgen.errors import ConfigError, TokenizerError
from draftgen.records import GroundTruthRecord, Message
from draftgen.store import iter_jsonl
from draftgen.tokens import Profile

FAST_NAMES = {"DeepInfra", "Baseten", "Chutes"}


@pytest.fixture(scope="module")
def gt_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("emu") / "ground_truth.jsonl"


@pytest.fixture(scope="module")
def emu(gt_path: Path) -> Iterator[RunningEmulator]:
    with start_in_thread(EmulatorOptions(ground_truth=str(gt_path), management_key="sk-or-mgmt",
                                         generation_lag_s=0.3)) as e:
        yield e


def _gt(path: Path) -> dict[str, GroundTruthRecord]:
    return {r.generation_id: r for _, r in iter_jsonl(path, GroundTruthRecord)}


def _single(provider: Provider, **scenario: Any) -> EmulatorOptions:
    sc = builtin_scenario("fast").replace(providers=[provider], **scenario)
    return EmulatorOptions(scenario_obj=sc)


def test_starts_on_a_free_port_and_stops_cleanly() -> None:
    e = start_in_thread(EmulatorOptions(port=0))
    assert e.base_url == f"http://127.0.0.1:{e.port}/api/v1" and e.root_url.endswith(str(e.port))
    assert request(f"{e.root_url}/health").status == 200
    e.stop()
    assert not e.alive
    with pytest.raises(OSError):
        request(f"{e.root_url}/health", timeout=2)


def test_start_errors_are_one_line_draftgen_errors(emu: RunningEmulator) -> None:
    with pytest.raises(TokenizerError, match=r"kimi-k2\.5"):
        start_in_thread(EmulatorOptions(profile="kimi-k2.5"))  # Kimi profile on Qwen3's tokenizer
    with pytest.raises(ConfigError, match="cannot listen"):
        start_in_thread(EmulatorOptions(port=emu.port))  # the port is taken


def test_chat_completion_shape(emu: RunningEmulator) -> None:
    r = chat(emu.base_url, chat_body())
    assert r.status == 200 and r.headers["content-type"].startswith("application/json")
    b = r.json()
    assert b["id"].startswith("gen-") and r.headers["x-generation-id"] == b["id"]
    assert b["object"] == "chat.completion" and b["provider"] in FAST_NAMES and b["model"] == "qwen/qwen3-8b"
    (choice,) = b["choices"]
    assert choice["finish_reason"] == "stop" and choice["native_finish_reason"] == "stop"
    assert choice["logprobs"] is None
    msg = choice["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str) and msg["reasoning"]
    assert msg["reasoning_details"] == [{"type": "reasoning.text", "text": msg["reasoning"], "format": "unknown",
                                         "index": 0}]
    u = b["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 0 < u["completion_tokens_details"]["reasoning_tokens"] < u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] == 0 and u["is_byok"] is False
    cd = u["cost_details"]
    assert u["cost"] == pytest.approx(cd["upstream_inference_prompt_cost"] + cd["upstream_inference_completions_cost"])


def test_stream_shape_and_equivalence_with_non_streamed(emu: RunningEmulator) -> None:
    pin = {"order": ["deepinfra"], "allow_fallbacks": False}
    whole = chat(emu.base_url, chat_body("same prompt", provider=pin)).json()
    r = chat(emu.base_url, chat_body("same prompt", stream=True, provider=pin))
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    s = parse_sse(r.body)
    assert s.comments and s.comments[0] == ": OPENROUTER PROCESSING" and s.done
    assert r.headers["x-generation-id"] == s.events[0]["id"]
    assert all(ev["object"] == "chat.completion.chunk" and ev["provider"] == "DeepInfra" for ev in s.events)
    assert s.events[-1]["choices"] == [] and s.events[-1]["usage"]  # usage chunk, then [DONE]
    assert s.finish_reasons == ["stop"]
    msg = whole["choices"][0]["message"]
    assert s.text("reasoning") == msg["reasoning"] and s.text("content") == msg["content"]
    details = "".join(d["text"] for ev in s.events for ch in ev["choices"]
                      for d in ch["delta"].get("reasoning_details") or [])
    assert details == msg["reasoning"]
    assert s.usage == whole["usage"]
    assert len(s.events) < whole["usage"]["completion_tokens"] / 8  # several tokens per chunk


def test_ground_truth_decodes_to_exactly_what_was_returned(emu: RunningEmulator, gt_path: Path,
                                                          qwen3_profile: Profile) -> None:
    bodies = {}
    for i in range(12):
        req = chat_body(f"question {i}", stream=i % 2 == 1, max_tokens=300 + 100 * i)
        r = chat(emu.base_url, req)
        assert r.status == 200
        if req["stream"]:
            s = parse_sse(r.body)
            bodies[s.events[0]["id"]] = (req, s.text("reasoning"), s.text("content"), s.usage, s.finish_reasons[0])
        else:
            b = r.json()
            m = b["choices"][0]["message"]
            bodies[b["id"]] = (req, m["reasoning"], m["content"], b["usage"], b["choices"][0]["finish_reason"])
    gt = _gt(gt_path)
    for gid, (req, reasoning, content, usage, finish) in bodies.items():
        rec = gt[gid]
        parsed = qwen3_profile.parse_output(rec.output_ids)
        assert (parsed.reasoning or "", parsed.content) == (reasoning or "", content)
        assert usage["completion_tokens"] == len(rec.output_ids) <= req["max_tokens"]
        assert usage["completion_tokens_details"]["reasoning_tokens"] == parsed.reasoning_token_count
        msgs = msgspec.convert(req["messages"], list[Message])
        assert rec.prompt_ids == qwen3_profile.prompt_ids(msgs) and usage["prompt_tokens"] == len(rec.prompt_ids)
        assert (finish == "length") == (len(rec.output_ids) == req["max_tokens"] and not parsed.ended)
        if not rec.non_canonical:
            assert qwen3_profile.build_output(reasoning, content, finish).ids == rec.output_ids


def test_non_canonical_rate_gives_same_text_other_ids(qwen3_profile: Profile, tmp_path: Path) -> None:
    sc = builtin_scenario("fast").replace(non_canonical_rate=1.0, pool_size=16)
    gt = tmp_path / "gt.jsonl"
    with start_in_thread(EmulatorOptions(scenario_obj=sc, ground_truth=str(gt))) as e:
        out = {}
        for i in range(6):
            b = chat(e.base_url, chat_body(f"nc {i}")).json()
            out[b["id"]] = b
    for gid, rec in _gt(gt).items():
        m = out[gid]["choices"][0]["message"]
        assert rec.non_canonical
        rebuilt = qwen3_profile.build_output(m["reasoning"], m["content"], out[gid]["choices"][0]["finish_reason"])
        assert rebuilt.ids != rec.output_ids
        assert qwen3_profile.tokenizer.decode(rebuilt.ids) == qwen3_profile.tokenizer.decode(rec.output_ids)


def test_same_seed_same_output_different_seed_differs() -> None:
    def run(seed: int) -> list[Any]:
        with start_in_thread(EmulatorOptions(seed=seed)) as e:
            return [chat(e.base_url, chat_body(f"det {i}", temperature=0.7, seed=3)).json()["choices"]
                    for i in range(4)]
    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c


def test_sampling_parameters_change_the_output(emu: RunningEmulator) -> None:
    def content(**kw: Any) -> str:
        return str(chat(emu.base_url, chat_body("sampling", **kw)).json()["choices"][0]["message"]["content"])
    assert content(temperature=0.5) == content(temperature=0.5)
    assert len({content(temperature=0.5), content(temperature=0.9), content(top_p=0.5), content(seed=11)}) > 2


def test_auth(emu: RunningEmulator) -> None:
    assert chat(emu.base_url, chat_body(), key=None).status == 401
    r = chat(emu.base_url, chat_body(), key="not-openrouter")
    assert r.status == 401 and r.json()["error"]["metadata"]["error_type"] == "authentication"
    with start_in_thread(EmulatorOptions(api_key="sk-or-only-this")) as e:
        assert chat(e.base_url, chat_body(), key="sk-or-other").status == 401
        assert chat(e.base_url, chat_body(), key="sk-or-only-this").status == 200


def test_key_credits_and_generation(emu: RunningEmulator) -> None:
    b = chat(emu.base_url, chat_body("for generation")).json()
    gid = b["id"]
    r = request(f"{emu.base_url}/generation?id={gid}")
    assert r.status == 404  # not yet: OpenRouter lags about a second
    time.sleep(0.35)
    g = request(f"{emu.base_url}/generation?id={gid}").json()["data"]
    assert g["id"] == gid and g["tokens_completion"] == b["usage"]["completion_tokens"]
    assert g["total_cost"] == pytest.approx(b["usage"]["cost"]) and g["provider_name"] == b["provider"]
    for k in ("native_tokens_prompt", "native_tokens_reasoning", "finish_reason", "latency", "generation_time",
              "streamed", "cancelled", "is_byok", "created_at"):
        assert k in g
    assert request(f"{emu.base_url}/generation?id=gen-nope").status == 404

    k = request(f"{emu.base_url}/key").json()["data"]
    assert k["limit"] == 100.0 and k["usage"] == pytest.approx(emu.state.spend_usd)
    assert k["limit_remaining"] == pytest.approx(emu.state.credits_remaining)
    assert k["is_free_tier"] is False and k["is_management_key"] is False and KEY not in k["label"]
    assert request(f"{emu.base_url}/auth/key").status == 200
    r = request(f"{emu.base_url}/credits")
    assert r.status == 403 and r.json()["error"]["code"] == 403
    c = request(f"{emu.base_url}/credits", key="sk-or-mgmt").json()["data"]
    assert c["total_credits"] == 100.0 and c["total_usage"] == pytest.approx(emu.state.spend_usd)


def test_models_and_endpoints(emu: RunningEmulator) -> None:
    m = request(f"{emu.base_url}/models", key=None).json()
    assert m["total_count"] == len(m["data"]) >= 1
    kimi = next(x for x in m["data"] if x["id"] == "moonshotai/kimi-k2.5")
    assert kimi["canonical_slug"] == "moonshotai/kimi-k2.5-0127"
    assert float(kimi["pricing"]["completion"]) * 1e6 == pytest.approx(2.0)  # cheapest provider, per token
    for key in ("context_length", "architecture", "top_provider", "supported_parameters", "reasoning"):
        assert key in kimi
    e = request(f"{emu.base_url}/models/moonshotai/kimi-k2.5/endpoints", key=None).json()["data"]
    tags = {ep["tag"]: ep for ep in e["endpoints"]}
    assert set(tags) == {"deepinfra/fp4", "baseten/fp4", "chutes/int4"}
    di = tags["deepinfra/fp4"]
    assert di["quantization"] == "fp4" and di["pricing"]["prompt"] == "0.00000045"
    assert "logprobs" in di["supported_parameters"] and "logprobs" not in tags["chutes/int4"]["supported_parameters"]
    assert set(di["latency_last_30m"]) == {"p50", "p75", "p90", "p99"} and "throughput_last_30m" in di


def test_bad_requests_are_400(emu: RunningEmulator) -> None:
    r = request(f"{emu.base_url}/chat/completions", "POST", None)
    assert r.status == 400
    for body in ({"model": "x"}, chat_body(max_tokens=0), chat_body(temperature=5),
                 chat_body(reasoning={"effort": "high", "max_tokens": 100}), chat_body(stop=[1]),
                 chat_body(provider={"sort": "vibes"}), chat_body(messages=[{"content": "no role"}])):
        r = chat(emu.base_url, body)
        assert r.status == 400, body
        assert r.json()["error"]["metadata"]["error_type"] in ("invalid_request", "invalid_prompt")
    r = chat(emu.base_url, chat_body("x " * 10, max_tokens=10_000_000))
    assert r.status == 400 and r.json()["error"]["metadata"]["error_type"] == "context_length_exceeded"


def test_reasoning_controls_stop_and_length(emu: RunningEmulator) -> None:
    off = chat(emu.base_url, chat_body("ctl", reasoning={"enabled": False})).json()
    assert off["choices"][0]["message"]["reasoning"] is None
    assert off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    ex = chat(emu.base_url, chat_body("ctl", reasoning={"exclude": True})).json()
    assert ex["choices"][0]["message"]["reasoning"] is None
    assert ex["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    legacy = chat(emu.base_url, chat_body("ctl", include_reasoning=False)).json()
    assert legacy["choices"][0]["message"]["reasoning"] is None
    full = chat(emu.base_url, chat_body("ctl")).json()
    content = full["choices"][0]["message"]["content"]
    stop = content[5:9]
    cut = chat(emu.base_url, chat_body("ctl", stop=[stop])).json()
    assert cut["choices"][0]["message"]["content"] == content[: content.index(stop)]
    short = chat(emu.base_url, chat_body("ctl", max_tokens=7)).json()
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 7
    assert short["choices"][0]["message"]["content"] == ""  # reasoning ate the budget
    legacy_max = chat(emu.base_url, {**chat_body("ctl", max_tokens=None), "max_completion_tokens": 9}).json()
    assert legacy_max["usage"]["completion_tokens"] == 9


def test_logprobs_only_from_supporting_providers(emu: RunningEmulator, qwen3_profile: Profile,
                                                 gt_path: Path) -> None:
    tok = qwen3_profile.tokenizer
    b = chat(emu.base_url, chat_body("lp", logprobs=True, top_logprobs=0, provider={"only": ["deepinfra"]})).json()
    entries = b["choices"][0]["logprobs"]["content"]
    content = b["choices"][0]["message"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries) == content.encode()
    assert all(e["logprob"] <= 0 and e["top_logprobs"] == [] and isinstance(e["token"], str) for e in entries)
    # The entries are the true content tokens: their ids are the sampled ones.
    ids = [tok.special_tokens[e["token"]] if e["token"] in tok.special_tokens else tok.bytes_to_id[bytes(e["bytes"])]
           for e in entries]
    true = _gt(gt_path)[b["id"]].output_ids
    end = true.index(tok.special_tokens["</think>"])
    assert ids == true[end + 1: -1]
    s = parse_sse(chat(emu.base_url, chat_body("lp", stream=True, logprobs=True,
                                               provider={"only": ["deepinfra"]})).body)
    streamed = [e for ev in s.events for ch in ev["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
    assert streamed == entries
    other = chat(emu.base_url, chat_body("lp", logprobs=True, provider={"only": ["chutes"]})).json()
    assert other["choices"][0]["logprobs"] is None  # dropped silently
    r = chat(emu.base_url, chat_body("lp", logprobs=True, provider={"only": ["chutes"], "require_parameters": True}))
    assert r.status == 404 and r.json()["error"]["availability"]["code"] == "no_endpoints"
    ok = chat(emu.base_url, chat_body("lp", logprobs=True, provider={"require_parameters": True})).json()
    assert ok["provider"] == "DeepInfra"


def test_ignored_provider_is_never_chosen(emu: RunningEmulator) -> None:
    seen = set()
    for i in range(40):
        b = chat(emu.base_url, chat_body(f"route {i}", max_tokens=16, provider={"ignore": ["chutes"]})).json()
        seen.add(b["provider"])
    assert "Chutes" not in seen and seen <= FAST_NAMES
    r = chat(emu.base_url, chat_body(provider={"only": ["nobody"]}))
    assert r.status == 503 and r.json()["error"]["availability"]["retryable"] is False


def test_credits_go_down_to_402() -> None:
    with start_in_thread(EmulatorOptions(credits=0.02)) as e:
        spent = 0.0
        for i in range(200):
            r = chat(e.base_url, chat_body(f"money {i}", max_tokens=1000, provider={"only": ["chutes"]}))
            if r.status != 200:
                break
            spent += r.json()["usage"]["cost"]
        assert r.status == 402
        err = r.json()["error"]
        assert err["code"] == 402 and err["metadata"]["error_type"] == "payment_required"
        assert "can only afford" in err["message"]
        assert e.state.spend_usd == pytest.approx(spent) and e.state.credits_remaining == pytest.approx(0.02 - spent)
        assert e.state.credits_remaining < 1000 * 2.0 / 1e6 + 0.001  # 402 only once max_tokens x price no longer fits
        assert e.state.by_status[402] == 1


def test_in_flight_budget_402_with_retry_after() -> None:
    slow = Provider("Slow", "slow/int4", "int4", 0.5, 2.0, ttft_s=(1.0, 1.0))
    opts = _single(slow)
    opts.in_flight_budget_usd = 0.003  # one request of 1000 tokens (~0.002) fits, two do not
    with start_in_thread(opts) as e:
        first: dict[str, int] = {}
        t = threading.Thread(target=lambda: first.update(s=chat(e.base_url, chat_body("a", max_tokens=1000)).status))
        t.start()
        deadline = time.monotonic() + 10
        while e.state.in_flight_usd == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the first request holds its reservation
        r = chat(e.base_url, chat_body("b", max_tokens=1000))
        t.join()
        assert first["s"] == 200 and r.status == 402 and "retry-after" in r.headers
        err = r.json()["error"]
        assert err["metadata"]["limit_source"] == "openrouter_in_flight_budget"
        assert err["availability"]["retryable"] is True
        big = chat(e.base_url, chat_body("c", max_tokens=5000))
        assert big.status == 402 and big.json()["error"]["availability"]["code"] == "weight_exceeds_budget"
        assert chat(e.base_url, chat_body("b", max_tokens=1000)).status == 200  # budget free again


# -- quirks ----------------------------------------------------------------------------------------

def _quirky(**quirks: Any) -> Provider:
    return Provider("Quirky", "quirky/fp8", "fp8", 0.5, 2.0, **quirks)


def test_quirk_reasoning_content(qwen3_profile: Profile) -> None:
    with start_in_thread(_single(_quirky(reasoning_field="reasoning_content"))) as e:
        m = chat(e.base_url, chat_body()).json()["choices"][0]["message"]
        assert m["reasoning_content"] and "reasoning" not in m and "reasoning_details" not in m
        s = parse_sse(chat(e.base_url, chat_body(stream=True)).body)
        assert s.text("reasoning_content") == m["reasoning_content"] and s.text("reasoning") == ""


def test_quirk_reasoning_dropped_while_counted() -> None:
    with start_in_thread(_single(_quirky(drop_reasoning=True))) as e:
        b = chat(e.base_url, chat_body()).json()
        assert b["choices"][0]["message"]["reasoning"] is None
        assert b["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
        s = parse_sse(chat(e.base_url, chat_body(stream=True)).body)
        assert s.text("reasoning") == "" and s.text("content") == b["choices"][0]["message"]["content"]


def test_quirk_trimmed_edges_differ_from_ground_truth_only_there(qwen3_profile: Profile, tmp_path: Path) -> None:
    opts = _single(_quirky(trim_whitespace=True))
    opts.ground_truth = str(tmp_path / "gt.jsonl")
    with start_in_thread(opts) as e:
        b = chat(e.base_url, chat_body()).json()
        s = parse_sse(chat(e.base_url, chat_body(stream=True)).body)
    rec = _gt(tmp_path / "gt.jsonl")[b["id"]]
    true = qwen3_profile.parse_output(rec.output_ids)
    m = b["choices"][0]["message"]
    assert true.reasoning is not None and true.reasoning.startswith("\n") and true.content.startswith("\n\n")
    assert m["reasoning"] == true.reasoning.strip() and m["content"] == true.content.strip()
    assert s.text("reasoning") == m["reasoning"] and s.text("content") == m["content"]
    rebuilt = qwen3_profile.build_output(m["reasoning"], m["content"], "stop")
    assert "junction_restored" in rebuilt.flags


def test_quirk_padding_repeat_finish_chunk_and_permaslug() -> None:
    p = _quirky(pad_body=True, repeat_finish_chunk=True, model_permaslug=True)
    with start_in_thread(_single(p)) as e:
        r = chat(e.base_url, chat_body(model="moonshotai/kimi-k2.5"))
        assert r.status == 200 and r.body.startswith(b"\n") and r.json()["model"] == "moonshotai/kimi-k2.5-0127"
        s = parse_sse(chat(e.base_url, chat_body(stream=True, model="moonshotai/kimi-k2.5")).body)
        assert all(ev["choices"] for ev in s.events)  # no empty-choices usage chunk
        last, before = s.events[-1], s.events[-2]
        assert last["usage"] and last["choices"][0]["finish_reason"] == "stop"
        assert before["choices"] == last["choices"] and "usage" not in before and s.done


def test_realistic_timing_on_a_compressed_clock() -> None:
    p = Provider("Paced", "paced/int4", "int4", 0.5, 2.0, ttft_s=(20.0, 20.0), tokens_per_s=(50.0, 50.0))
    with start_in_thread(_single(p, time_scale=0.01, keepalive_s=5.0)) as e:
        t0 = time.monotonic()
        r = chat(e.base_url, chat_body(stream=True, max_tokens=100))
        elapsed = time.monotonic() - t0
        s = parse_sse(r.body)
        # TTFT 20 s x 0.01 plus 100 tokens at 50 tok/s x 0.01 = 0.22 s; keep-alives every 0.05 s meanwhile.
        assert 0.2 <= elapsed < 2.0 and len(s.comments) >= 3


def test_connection_survives_many_requests(emu: RunningEmulator) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=10)
    try:
        for i in range(5):
            conn.request("POST", "/api/v1/chat/completions", body=msgspec.json.encode(chat_body(f"ka {i}")),
                         headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            r = conn.getresponse()
            assert r.status == 200 and r.read().startswith(b'{"id":"gen-')
    finally:
        conn.close()


def test_realistic_roster_returns_ground_truth_apart_from_documented_quirks(qwen3_profile: Profile,
                                                                          tmp_path: Path) -> None:
    sc = builtin_scenario("realistic").replace(time_scale=0.0005, hang_s=0.5, reasoning_tokens_median=200,
                                               content_tokens_median=80)
    gt = tmp_path / "gt.jsonl"
    served: dict[str, tuple[dict[str, Any], bool]] = {}
    with start_in_thread(EmulatorOptions(scenario_obj=sc, ground_truth=str(gt))) as e:
        for i in range(24):
            stream = i % 2 == 0
            try:
                r = chat(e.base_url, chat_body(f"roster {i}", stream=stream, max_tokens=2000,
                                               provider={"order": [sc.providers[i % 8].tag]}), timeout=5)
            except (ConnectionError, http.client.HTTPException, TimeoutError):
                continue  # a rare hang or reset
            if r.status != 200:
                continue
            if stream:
                s = parse_sse(r.body)
                if not s.done:
                    continue
                msg = {"reasoning": s.text("reasoning") or None, "content": s.text("content"),
                       "reasoning_content": s.text("reasoning_content") or None}
                served[s.events[0]["id"]] = ({"provider": s.events[0]["provider"], "message": msg}, True)
            else:
                b = r.json()
                if "choices" not in b or b["choices"][0]["finish_reason"] == "error" or not b["usage"]["completion_tokens"]:
                    continue
                served[b["id"]] = ({"provider": b["provider"], "message": b["choices"][0]["message"]}, False)
    truth = _gt(gt)
    assert len(served) >= 15 and set(served) == set(truth)
    providers = {p.name: p for p in sc.providers}
    quirks_seen = set()
    for gid, (b, streamed) in served.items():
        p = providers[b["provider"]]
        true = qwen3_profile.parse_output(truth[gid].output_ids)
        reasoning, content = true.reasoning, true.content
        if p.trim_whitespace:
            quirks_seen.add("trim")
            reasoning, content = (reasoning or "").strip() or None, content.strip()
        if p.drop_reasoning:
            quirks_seen.add("drop")
            reasoning = None
        m = b["message"]
        field = "reasoning_content" if p.reasoning_field == "reasoning_content" else "reasoning"
        quirks_seen.add(field)
        assert (m.get(field) or None, m["content"] or "") == (reasoning or None, content), (p.name, streamed)
    assert {"trim", "drop", "reasoning_content", "reasoning"} <= quirks_seen


def test_cli_serves_and_stops_on_sigterm() -> None:
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "draftgen.cli", "emulate", "--port", "0", "--seed", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("OpenRouter emulator: http://127.0.0.1:") and "scenario fast" in first
        base = first.split()[2]
        assert chat(base, chat_body("cli")).status == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "emulator stopped: 1 requests" in out and "Traceback" not in err


def test_an_unknown_model_slug_is_openrouters_404_and_every_listed_family_is_served(emu: RunningEmulator) -> None:
    r = chat(emu.base_url, chat_body(model="moonshotai/kimi-k2.5x"))
    assert r.status == 404
    err = r.json()["error"]
    assert "moonshotai/kimi-k2.5x is not a valid model ID" in err["message"]
    assert err["availability"]["code"] == "model_not_found" and err["availability"]["retryable"] is False
    assert request(f"{emu.base_url}/models/moonshotai/kimi-k2.5x/endpoints", key=None).status == 404
    listed = [m["id"] for m in request(f"{emu.base_url}/models", key=None).json()["data"]]
    assert {"qwen/qwen3-8b", "moonshotai/kimi-k2.5", "z-ai/glm-4.6"} <= set(listed)
    assert chat(emu.base_url, chat_body(model="moonshotai/kimi-k2.5:floor", max_tokens=16)).status == 200
