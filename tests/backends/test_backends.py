"""Backends against the emulator: OpenRouter (streamed and whole), vLLM and SGLang exact ids, balancing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from _generate_helpers import claim, emulator, fast, make_config, prompt, responses, write_prompts
from draftgen.backends import (
    BACKENDS,
    EMULATOR_KEY,
    BackendKind,
    Balanced,
    Completion,
    CompletionRequest,
    WireMeter,
    api_key_for,
    capabilities,
    management_key_for,
    open_backend,
)
from draftgen.backends.sglang import sglang_root
from draftgen.errors import AuthError, ConfigError, RetryableAPIError
from draftgen.records import GroundTruthRecord
from draftgen.store import iter_jsonl


@contextmanager
def swapped(kind: str, entry: BackendKind) -> Iterator[None]:
    """``kind`` registered as ``entry`` for the block, then as it was (its doc kept)."""
    old, doc = BACKENDS.get(kind), BACKENDS.docs()[kind]
    BACKENDS.register(kind, entry, doc=doc, replace=True)
    try:
        yield
    finally:
        BACKENDS.register(kind, old, doc=doc, replace=True)


def _req(i: int, prompt_ids: list[int] | None = None, tools: bool = False) -> CompletionRequest:
    p = prompt("b", i, tools=tools)
    return CompletionRequest(sample_id=p.sample_id, messages=p.messages, tools=p.tools, max_tokens=2048,
                             prompt_ids=prompt_ids)


def _truth(path: Path) -> dict[str, GroundTruthRecord]:
    return {r.generation_id: r for _, r in iter_jsonl(path, GroundTruthRecord)}


def test_openrouter_streamed_and_whole_agree(tmp_path: Path) -> None:
    with emulator() as emu:
        async def go(stream: bool) -> list[tuple[str | None, str | None, str | None]]:
            cfg = make_config(tmp_path, ["b"], base_url=emu.base_url, endpoint={"stream": stream})
            async with open_backend(cfg, "sk-or-test") as be:
                comps = await asyncio.gather(*(be.complete(_req(i, tools=i == 0)) for i in range(6)))
            out = []
            for c in comps:
                assert c.provider and c.generation_id and c.usage is not None and c.usage.completion_tokens > 0
                assert c.usage.cost > 0 and c.finish_reason in ("stop", "length", "tool_calls")
                assert c.output_ids is None  # OpenRouter returns text only
                out.append((c.reasoning, c.content, c.finish_reason))
            return out

        streamed, whole = asyncio.run(go(True)), asyncio.run(go(False))
    assert streamed == whole
    assert any(r for r, _, _ in streamed)


def test_a_stream_counts_what_arrives_on_its_meter(tmp_path: Path, qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    """The engine's display and tail guard see a stream's progress: text (OpenRouter) or ids (SGLang)."""
    with emulator(fast(stream_chunk_tokens=4)) as emu:
        async def go(kind: str) -> tuple[WireMeter, Completion]:
            cfg = make_config(tmp_path, ["b"], kind=kind, base_url=emu.base_url)
            p = prompt("b", 1)
            req = _req(1, prompt_ids=qwen3_profile.prompt_ids(p.messages, p.tools) if kind == "sglang" else None)
            req.meter = WireMeter()
            async with open_backend(cfg, "sk-or-test") as be:
                return req.meter, await be.complete(req)

        meter, comp = asyncio.run(go("openrouter"))
        assert meter.events > 2 and meter.provider == comp.provider
        assert meter.chars == len(comp.reasoning or "") + len(comp.content or "")
        assert meter.first_at is not None and meter.last_at is not None and meter.last_at >= meter.first_at
        meter, comp = asyncio.run(go("sglang"))
        assert meter.ids == len(comp.output_ids or []) > 0 and meter.tokens() == meter.ids


def test_account_endpoints(tmp_path: Path) -> None:
    with emulator(credits=42.0, management_key="sk-or-mgmt-1") as emu:
        cfg = make_config(tmp_path, ["b"], base_url=emu.base_url)

        async def go() -> None:
            async with open_backend(cfg, "sk-or-test") as be:
                key = await be.get_key_info()
                assert key is not None and key.usage == 0.0
                assert await be.get_credits(None) is None
                cr = await be.get_credits("sk-or-mgmt-1")
                assert cr is not None and cr.total_credits == pytest.approx(42.0)
                eps = await be.get_model_endpoints("qwen/qwen3-8b")
                assert eps is not None and {e.tag for e in eps} == {"deepinfra/fp4", "baseten/fp4", "chutes/int4"}
                assert all(e.pricing.completion > 0 for e in eps)
            async with open_backend(cfg, "not-a-valid-key") as be:
                with pytest.raises(AuthError):
                    await be.complete(_req(0))

        asyncio.run(go())


@pytest.mark.parametrize("legacy", [False, True], ids=["current", "legacy"])
@pytest.mark.parametrize("stream", [False, True])
def test_vllm_exact_ids(tmp_path: Path, stream: bool, legacy: bool, qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    gt = tmp_path / "gt.jsonl"
    with emulator(fast(vllm_legacy=legacy), ground_truth=str(gt)) as emu:
        cfg = make_config(tmp_path, ["b"], kind="vllm", base_url=emu.root_url + "/v1", endpoint={"stream": stream})

        async def go() -> list:  # type: ignore[type-arg]
            async with open_backend(cfg, None) as be:
                return list(await asyncio.gather(*(be.complete(_req(i)) for i in range(4))))

        comps = asyncio.run(go())
    truth = _truth(gt)
    for c in comps:
        t = truth[c.generation_id or ""]
        assert c.output_ids == t.output_ids and c.prompt_ids == t.prompt_ids
        assert c.backend == "vllm" and (c.reasoning or c.content)
        parsed = qwen3_profile.parse_output(t.output_ids)
        assert (c.reasoning, c.content) == (parsed.reasoning, parsed.content)
        assert c.reasoning_field == ("reasoning_content" if legacy else "reasoning")


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
@pytest.mark.parametrize("stream", [False, True])
def test_sglang_exact_ids(tmp_path: Path, stream: bool, incremental: bool, qwen3_profile) -> None:  # type: ignore[no-untyped-def]
    gt = tmp_path / "gt.jsonl"
    with emulator(fast(sglang_incremental=incremental), ground_truth=str(gt)) as emu:
        cfg = make_config(tmp_path, ["b"], kind="sglang", base_url=emu.base_url, endpoint={"stream": stream})

        async def go() -> list:  # type: ignore[type-arg]
            async with open_backend(cfg, None) as be:
                reqs = []
                for i in range(4):
                    p = prompt("b", i)
                    reqs.append(_req(i, prompt_ids=qwen3_profile.prompt_ids(p.messages, p.tools)))
                return list(await asyncio.gather(*(be.complete(r) for r in reqs)))

        comps = asyncio.run(go())
    truth = {k.replace("gen-", ""): v for k, v in _truth(gt).items()}
    for c in comps:
        t = truth[c.generation_id or ""]
        assert c.output_ids == t.output_ids and c.prompt_ids == t.prompt_ids
        assert c.finish_reason in ("stop", "length")
        parsed = qwen3_profile.parse_output(c.output_ids)
        assert parsed.reasoning  # the engine splits reasoning/content from exact ids
        # the whole text, however it was streamed (incremental events carry only their new text)
        ended = t.output_ids[-1] in qwen3_profile.end_of_turn_ids
        assert c.content == qwen3_profile.tokenizer.decode(t.output_ids[:-1] if ended else t.output_ids)
        assert c.usage is not None and c.usage.completion_tokens == len(t.output_ids)


def test_sglang_root_strips_api_suffix() -> None:
    assert sglang_root("http://h:1/api/v1/") == "http://h:1"
    assert sglang_root("http://h:1/v1") == "http://h:1"
    assert sglang_root("http://h:1") == "http://h:1"


def test_several_base_urls_are_balanced(tmp_path: Path) -> None:
    with emulator() as a, emulator() as b:
        cfg = make_config(tmp_path, ["b"], endpoint={"base_urls": [a.base_url, b.base_url], "stream": False})

        async def go() -> None:
            async with open_backend(cfg, "sk-or-test") as be:
                assert isinstance(be, Balanced)
                await asyncio.gather(*(be.complete(_req(i)) for i in range(12)))
                assert sum(be.sent) == 12 and min(be.sent) >= 4

        asyncio.run(go())
        assert a.state.requests >= 4 and b.state.requests >= 4


def test_idle_timeout_not_total_timeout(tmp_path: Path) -> None:
    # A provider that stops sending: the idle timeout fires; a slow but steady stream would not.
    sc = fast().with_provider("deepinfra", faults={"hang": 1.0}).replace(hang_s=3.0)
    with emulator(sc) as emu:
        cfg = make_config(tmp_path, ["b"], base_url=emu.base_url,
                          endpoint={"stream": False, "idle_timeout_s": 0.3}, routing={"only": ["deepinfra"]})

        async def go() -> None:
            async with open_backend(cfg, "sk-or-test") as be:
                with pytest.raises(RetryableAPIError) as ei:
                    await be.complete(_req(1))
                assert ei.value.kind in ("idle_timeout", "connection_reset")

        asyncio.run(go())


def test_registry_covers_every_endpoint_kind(tmp_path: Path) -> None:
    from draftgen.config import load_config
    from draftgen.docgen import config_reference
    from draftgen.extensions import check_config

    kinds = set(BACKENDS.names())
    assert kinds == {"openrouter", "emulator", "openai", "vllm", "sglang"}
    # the config accepts exactly the registered kinds, and the reference lists them
    (tmp_path / "c.yaml").write_text("endpoint: {kind: tgi}\ndatasets: [{name: a, path: a.jsonl}]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"endpoint\.kind 'tgi' is not registered; use one of "
                                          + ", ".join(BACKENDS.names())) as info:
        check_config(load_config(tmp_path / "c.yaml"), "c.yaml")
    assert "\n" not in str(info.value)
    row = next(line for line in config_reference().splitlines() if line.startswith("| `endpoint.kind` |"))
    assert all(f"``{k}``" in row for k in kinds)
    assert {k for k in kinds if capabilities(k).embedded_server} == {"emulator"}
    for kind in kinds:
        entry = BACKENDS.get(kind)
        assert isinstance(entry, BackendKind) and callable(entry.factory)
        assert capabilities(kind) is entry.capabilities
    # what the protocols declare (behaviour is decided from these, not from the names)
    assert capabilities("sglang").needs_prompt_ids and capabilities("sglang").output_is_raw_ids
    assert not any(capabilities(k).needs_prompt_ids for k in kinds - {"sglang"})
    assert {k for k in kinds if capabilities(k).exact_ids} == {"vllm", "sglang"}
    assert {k for k in kinds if capabilities(k).account} == {"openrouter", "emulator"}
    with pytest.raises(ConfigError, match=r"endpoint\.kind: backend kind 'tgi' is not registered; use one of"):
        capabilities("tgi")


@pytest.mark.parametrize("kind", ["openrouter", "emulator", "openai", "vllm", "sglang"])
def test_built_backend_carries_its_kinds_capabilities(tmp_path: Path, kind: str) -> None:
    cfg = make_config(tmp_path, ["b"], kind=kind, base_url="http://127.0.0.1:9/v1")

    async def go() -> None:
        async with open_backend(cfg, "sk-or-test") as be:
            assert be.capabilities is BACKENDS.get(kind).capabilities  # type: ignore[attr-defined]

    asyncio.run(go())


def test_capabilities_drive_the_key_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.delenv("DG_MGMT", raising=False)
    cfg = make_config(tmp_path, ["b"], kind="openai", base_url="http://127.0.0.1:9/v1",
                      endpoint={"management_key_env": "DG_MGMT"})
    assert api_key_for(cfg) is None and management_key_for(cfg) is None
    assert api_key_for(make_config(tmp_path, ["b"], kind="emulator")) == EMULATOR_KEY
    with pytest.raises(ConfigError, match="no API key"):
        api_key_for(make_config(tmp_path, ["b"], kind="openrouter"))
    base = BACKENDS.get("openai")
    requires_key = BackendKind(msgspec.structs.replace(base.capabilities, requires_key=True), base.factory)
    with swapped("openai", requires_key), pytest.raises(ConfigError, match="no API key"):
        api_key_for(cfg)
    with swapped("openai", BackendKind(msgspec.structs.replace(base.capabilities, placeholder_key="sk-placeholder"),
                                       base.factory)):
        assert api_key_for(cfg) == "sk-placeholder"
        monkeypatch.setenv("OPENROUTER_API_KEY", " sk-real ")
        monkeypatch.setenv("DG_MGMT", " sk-mgmt ")
        assert api_key_for(cfg) == "sk-real" and management_key_for(cfg) == "sk-mgmt"
    assert BACKENDS.get("openai") is base


@pytest.mark.parametrize("needs", [False, True])
def test_capabilities_drive_prompt_ids(tmp_path: Path, needs: bool) -> None:
    from draftgen.phases.generate.run import run_generate

    sent: list[list[int] | None] = []
    base = BACKENDS.get("vllm")

    def factory(cfg, session, url, bounds):  # type: ignore[no-untyped-def]
        be = base.factory(cfg, session, url, bounds)
        send = be.send

        async def recording(req: CompletionRequest):  # type: ignore[no-untyped-def]
            sent.append(req.prompt_ids)
            return await send(req)

        be.send = recording  # type: ignore[method-assign]
        return be

    caps = msgspec.structs.replace(base.capabilities, needs_prompt_ids=needs)
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 4)
    with emulator() as emu, swapped("vllm", BackendKind(caps, factory)):
        cfg = make_config(tmp_path, ["a"], kind="vllm", base_url=emu.root_url + "/v1")
        rep = run_generate(cfg, echo=lambda line: None)
    assert rep.done == 4 and len(sent) >= 4
    recs = {r.sample_id: r for r in responses(run_dir, "a")}
    if needs:
        assert all(ids for ids in sent)
        assert {tuple(ids or []) for ids in sent} == {tuple(r.prompt_ids or []) for r in recs.values()}
    else:
        assert all(ids is None for ids in sent)
