"""The emulator's Batch API (``emulator.batch``) and service tiers (``emulator.tiers``) on the wire: the
documented shapes and checks, the lifecycle scenarios, and the openai and openrouter SDKs' types parsing its
bodies."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from _generate_helpers import emulator, fast
from draftgen.emulator.batch import with_batch
from draftgen.emulator.scenarios import Provider, Scenario

KEY = "sk-or-v1-emulator-test"
MODEL = "qwen/qwen3-8b"


def _call(root: str, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(root + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _submission(n: int = 2, **extra: Any) -> dict[str, Any]:
    reqs = [{"custom_id": f"c{i}", "body": {"messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 64}}
            for i in range(n)]
    return {"endpoint": "/v1/chat/completions", "model": MODEL, **extra, "requests": reqs}


def _wait(root: str, bid: str, timeout: float = 20.0) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        _, b = _call(root, "GET", f"/api/beta/batches/{bid}")
        if b["status"] in ("completed", "failed", "expired", "cancelled") or time.monotonic() > end:
            return b  # type: ignore[no-any-return]
        time.sleep(0.02)


def test_submission_checks_follow_the_documented_rules() -> None:
    with emulator(with_batch(fast(), "fast")) as emu:
        root = emu.root_url
        out_of_order = b'{"requests":[],"endpoint":"/v1/chat/completions","model":"qwen/qwen3-8b"}'
        assert _call(root, "POST", "/api/beta/batches", raw=out_of_order)[0] == 400
        bad = [_submission(stream=True), {**_submission(), "completion_window": "1h"},
               {**_submission(), "provider": {"ignore": ["chutes"]}}, {**_submission(), "requests": []},
               {**_submission(), "endpoint": "/v1/responses"}]
        bad[0]["requests"][0]["body"]["stream"] = True
        bad.append(_submission())
        bad[-1]["requests"][1]["custom_id"] = "c0"
        for body in bad:
            status, err = _call(root, "POST", "/api/v1/batches", body)
            assert status == 400 and err["error"]["message"], body
        status, b = _call(root, "POST", "/api/beta/batches", {**_submission(), "provider": {"only": ["deepinfra"]}})
        assert status == 202 and b["status"] == "validating" and b["results"] is None and b["completion_window"] == "24h"
        assert b["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
        done = _wait(root, b["id"])
        assert done["status"] == "completed" and done["provider"] == "DeepInfra" and len(done["results"]) == 2
        r = done["results"][0]
        assert r["error"] is None and r["response"]["status_code"] == 200 and r["custom_id"] in ("c0", "c1")
        body = r["response"]["body"]
        assert body["id"].startswith("gen-batch-") and body["choices"][0]["message"]["reasoning"]
        # billed once, at half the provider's price: DeepInfra is $0.45/$2.25 per M
        u = body["usage"]
        assert u["cost"] == pytest.approx((u["prompt_tokens"] * 0.225 + u["completion_tokens"] * 1.125) / 1e6)
        assert done["usage"]["cost"] == pytest.approx(emu.state.spend_usd)
        eps = _call(root, "GET", f"/api/v1/models/{MODEL}:batch/endpoints")[1]["data"]["endpoints"]
        assert {e["tag"] for e in eps} == {"deepinfra/fp4", "baseten/fp4", "chutes/int4"}
        assert eps[0]["pricing"]["completion"] == "0.000001125"
    with emulator(with_batch(fast(), "fast", models=["other/model"])) as emu:
        assert _call(emu.root_url, "GET", f"/api/v1/models/{MODEL}:batch/endpoints")[1]["data"]["endpoints"] == []
        status, err = _call(emu.root_url, "POST", "/api/v1/batches", _submission())
        assert status == 400 and "batch variant" in err["error"]["message"]


@pytest.mark.parametrize(("preset", "status"), [("failed", "failed"), ("expired", "expired"), ("partial", "completed")])
def test_failed_expired_and_partial_batches(preset: str, status: str) -> None:
    extra = {"window_s": 0.2} if preset == "expired" else {"item_fail_rate": 0.5} if preset == "partial" else {}
    with emulator(with_batch(fast(), preset, **extra)) as emu:
        _, b = _call(emu.root_url, "POST", "/api/beta/batches", _submission(8))
        done = _wait(emu.root_url, b["id"])
        spent = emu.state.spend_usd
    assert done["status"] == status
    if status != "completed":
        assert done["results"] is None and done["usage"] is None and spent == 0.0
        assert preset != "failed" or done["error"]["message"]
        return
    c = done["request_counts"]
    errors = [r for r in done["results"] if r["error"] is not None]
    assert c["total"] == 8 and c["failed"] == len(errors) and 0 < len(errors) < 8 and c["completed"] == 8 - len(errors)
    assert all(r["response"] is None and r["error"]["message"] for r in errors)
    assert done["usage"]["cost"] == pytest.approx(spent) and spent > 0


def test_slow_batch_moves_through_its_statuses() -> None:
    sc = with_batch(fast(), validating_s=0.15, in_progress_s=0.3, per_request_s=0.0, finalizing_s=0.15)
    with emulator(sc) as emu:
        _, b = _call(emu.root_url, "POST", "/api/beta/batches", _submission(3))
        seen = []
        end = time.monotonic() + 10
        while time.monotonic() < end:
            _, got = _call(emu.root_url, "GET", f"/api/beta/batches/{b['id']}")
            if not seen or seen[-1] != got["status"]:
                seen.append(got["status"])
            if got["status"] == "completed":
                break
            time.sleep(0.02)
    assert seen == ["validating", "in_progress", "finalizing", "completed"]


def test_openai_sdk_types_parse_the_batch_bodies() -> None:
    import openai
    from openai.types import BatchRequestCounts
    from openai.types.chat import ChatCompletion

    with emulator(with_batch(fast(), "fast")) as emu:
        _, b = _call(emu.root_url, "POST", "/api/v1/batches", _submission(3))
        _wait(emu.root_url, b["id"])
        client = openai.OpenAI(base_url=emu.base_url, api_key=KEY, max_retries=0)
        got = client.batches.retrieve(b["id"])
        assert got.id == b["id"] and got.status == "completed" and got.endpoint == "/v1/chat/completions"
        assert got.request_counts is not None and got.request_counts.total == 3
        page = client.batches.list(limit=10)
        assert [x.id for x in page.data] == [b["id"]] and page.data[0].status == "completed"
        _, raw = _call(emu.root_url, "GET", f"/api/v1/batches/{b['id']}")
    # strict validation, not only the SDK's lenient construction
    assert BatchRequestCounts.model_validate(raw["request_counts"]).completed == 3
    for r in raw["results"]:
        comp = ChatCompletion.model_validate(r["response"]["body"])
        assert comp.choices[0].finish_reason in ("stop", "length") and comp.usage is not None


def test_openrouter_sdk_batch_types_parse_the_batch_bodies() -> None:
    """The official ``openrouter`` SDK (Speakeasy-generated from OpenRouter's OpenAPI spec) submits, gets and
    lists batches against the emulator, and its models validate the raw bodies strictly, draftgen's own
    submission included."""
    from openrouter import OpenRouter, components

    from draftgen.backends.openrouter_batch import encode_submission, request_item

    with emulator(with_batch(fast(), "fast")) as emu:
        sdk = OpenRouter(api_key=KEY, server_url=emu.base_url)
        reqs = [components.Request(custom_id=r["custom_id"], body=r["body"]) for r in _submission(3)["requests"]]
        made = sdk.batch.create_batches(endpoint="/v1/chat/completions", model=MODEL, requests=reqs,
                                        provider={"only": ["deepinfra"]})
        assert made.status == "validating" and made.results is None and made.request_counts.total == 3
        _wait(emu.root_url, made.id)
        got = sdk.batch.get_batches(id=made.id)
        assert got.status == "completed" and got.provider == "DeepInfra" and got.usage is not None
        assert got.results is not None and {r.custom_id for r in got.results} == {"c0", "c1", "c2"}
        page = sdk.batch.list(limit=10)
        assert page is not None and [x.id for x in page.result.data] == [made.id]
        _, raw = _call(emu.root_url, "GET", f"/api/v1/batches/{made.id}")
        _, raw_list = _call(emu.root_url, "GET", "/api/v1/batches?limit=10")
    done = components.BatchObject.model_validate(raw)
    assert done.usage is not None and done.usage.cost == pytest.approx(raw["usage"]["cost"])
    for r in done.results or []:
        assert r.error is None and r.response is not None and r.response.status_code == 200
        body = r.response.body
        assert isinstance(body, components.BodyChatCompletion) and body.choices and body.usage is not None
    listed = components.BatchListResponse.model_validate(raw_list)
    assert listed.data[0].results is None and listed.data[0].request_counts.completed == 3
    sub, _ = encode_submission(MODEL, {"only": ["deepinfra"]},
                               [request_item("ds:s1", json.dumps({"messages": [], "max_tokens": 8}).encode())])
    parsed = components.BatchSubmitBody.model_validate_json(sub)
    assert parsed.model == MODEL and parsed.requests[0].custom_id == "ds:s1" and parsed.completion_window == "24h"


def _tiered() -> Scenario:
    sc = fast()
    flex = Provider("DeepInfra", "deepinfra/flex", "fp4", 0.2, 1.0, supports_logprobs=True, tier="flex")
    return sc.replace(providers=[*sc.providers, flex])


def test_service_tier_routes_echoes_and_bills_the_tier_served() -> None:
    with emulator(_tiered()) as emu:
        base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
        _, plain = _call(emu.root_url, "POST", "/api/v1/chat/completions", base)
        _, flex = _call(emu.root_url, "POST", "/api/v1/chat/completions", {**base, "service_tier": "flex"})
        _, prio = _call(emu.root_url, "POST", "/api/v1/chat/completions",
                        {**base, "service_tier": "priority", "provider": {"only": ["chutes"]}})
        status, _ = _call(emu.root_url, "POST", "/api/v1/chat/completions", {**base, "service_tier": "cheap"})
    assert "service_tier" not in plain and plain["provider"] != "" and status == 400
    assert flex["service_tier"] == "flex" and flex["provider"] == "DeepInfra"
    u = flex["usage"]
    assert u["cost"] == pytest.approx((u["prompt_tokens"] * 0.2 + u["completion_tokens"] * 1.0) / 1e6)
    assert prio["service_tier"] == "default"  # asked for priority, none there: served (and billed) at default
