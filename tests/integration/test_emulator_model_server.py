"""``draftgen emulate --model DIR``: a vLLM-compatible server over a real tiny transformers model.

A seeded random Qwen3 (8 layers, hidden 64, the bundled Qwen3 tokenizer; ``_extract_helpers``) served in
process on a free loopback port. Checked against the model itself: batched greedy equals HF's plain greedy
per prompt; draftgen's own generate phase (endpoint.kind vllm, exact ids) records the model's greedy ids;
extract-mode files equal an independent HF forward (``output_hidden_states[k]`` for aux ids, the last
layer's pre-norm output for id L); a drafter drives real speculative verification and vLLM's counters.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import aiohttp  # noqa: E402

from _emulator_helpers import post_all  # noqa: E402
from _extract_helpers import build_random_drafter, build_tiny_model  # noqa: E402
from _generate_helpers import claim, make_config, responses, write_prompts  # noqa: E402
from draftgen.emulator.real.server import (  # noqa: E402
    ModelServerOptions,
    RunningModelServer,
    start_in_thread,
)

NAME = "tiny-qwen3"
L = 8


def _keep_output(into: dict[str, Any]) -> Any:
    """A forward hook storing the layer's output (the last layer's: the pre-norm final state)."""
    def hook(module: Any, args: Any, out: Any) -> None:
        into["pre"] = out
    return hook


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", layers=L, hidden=64)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def srv(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningModelServer]:
    hs = tmp_path_factory.mktemp("hs")
    with start_in_thread(ModelServerOptions(model=str(model_dir), port=0, threads=1, served_model_name=NAME,
                                            extract_dir=str(hs), extract_layers=[2, 4, 5, L])) as s:
        yield s


def hf_greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(ids):]]


PROMPTS = [[785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562], [3838, 374, 279, 6722], [9707] * 3,
           [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28], [1986, 1052, 264], [40, 1075, 311, 1156, 13]]


def test_batched_greedy_equals_hf_greedy(srv: RunningModelServer, hf: Any) -> None:
    eng = srv.server.engine
    batches0 = eng.batches
    bodies = [{"model": NAME, "prompt": p, "max_tokens": 12, "return_token_ids": True} for p in PROMPTS]
    outs = [json.loads(b) for b in post_all(srv.base_url + "/completions", bodies)]
    assert eng.batches - batches0 < len(PROMPTS)  # the concurrent requests shared forward passes
    for p, o in zip(PROMPTS, outs, strict=True):
        ch = o["choices"][0]
        assert ch["prompt_token_ids"] == p
        assert ch["token_ids"] == hf_greedy(hf, p, len(ch["token_ids"]))
        assert len(ch["token_ids"]) == 12 or ch["finish_reason"] == "stop"
        assert o["usage"]["completion_tokens"] == len(ch["token_ids"])


def test_chat_shapes_whole_and_streamed(srv: RunningModelServer, hf: Any, model_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    msgs = [{"role": "user", "content": "Tell me about tokenizers."}]
    body: dict[str, Any] = {"model": NAME, "messages": msgs, "max_tokens": 20, "return_token_ids": True,
                            "chat_template_kwargs": {"enable_thinking": False}}
    whole = json.loads(post_all(srv.base_url + "/chat/completions", [body])[0])
    want_prompt = tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                     enable_thinking=False), add_special_tokens=False)
    assert whole["prompt_token_ids"] == want_prompt and whole["object"] == "chat.completion"
    ids = whole["choices"][0]["token_ids"]
    assert ids == hf_greedy(hf, want_prompt, len(ids))
    msg = whole["choices"][0]["message"]
    assert msg["content"] == tok.decode(ids, skip_special_tokens=True) and msg["reasoning"] is None
    raw = post_all(srv.base_url + "/chat/completions",
                   [{**body, "stream": True, "stream_options": {"include_usage": True}}])[0].decode()
    events = [json.loads(x) for x in re.findall(r"^data: (\{.*\})$", raw, re.M)]
    assert raw.endswith("data: [DONE]\n\n") and events[0]["prompt_token_ids"] == want_prompt
    got_ids = [t for e in events for c in e["choices"] for t in (c.get("token_ids") or [])]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert got_ids == ids and text == msg["content"]
    assert events[-1]["usage"]["completion_tokens"] == len(ids) and events[-1]["choices"] == []
    # unknown model: vLLM's 404 NotFoundError
    async def bad() -> int:
        async with aiohttp.ClientSession() as s, s.post(srv.base_url + "/chat/completions",
                                                        json={**body, "model": "other"}) as r:
            return r.status
    assert asyncio.run(bad()) == 404


def test_generate_phase_records_the_models_greedy_ids(srv: RunningModelServer, hf: Any, tmp_path: Path) -> None:
    model = {"id": NAME, "profile": "qwen3", "tokenizer": "bundled:qwen3", "thinking": False}
    run_dir = claim(make_config(tmp_path, ["a"], model=model))
    write_prompts(run_dir, "a", 6)
    cfg = make_config(tmp_path, ["a"], kind="vllm", base_url=srv.base_url, model=model,
                      partitions={"short": {"concurrency": 6, "max_tokens": 16},
                                  "long": {"concurrency": 2, "max_tokens": 16}})
    from draftgen.phases.generate.run import run_generate

    rep = run_generate(cfg, echo=lambda s: None)
    recs = responses(run_dir, "a")
    assert rep.done == 6 and len(recs) == 6, rep
    for r in recs:
        assert r.ids_source == "exact" and r.prompt_ids and r.output_ids
        assert r.output_ids == hf_greedy(hf, r.prompt_ids, len(r.output_ids))


def test_extract_files_match_an_independent_forward(srv: RunningModelServer, hf: Any) -> None:
    from safetensors.torch import load_file

    from draftgen.target.vllm import wait_for_lock

    bodies = [{"model": NAME, "prompt": p, "max_tokens": 1, "return_token_ids": True, "prompt_logprobs": n}
              for n, p in enumerate(PROMPTS[:3])]
    for n, (p, raw) in enumerate(zip(PROMPTS, post_all(srv.base_url + "/completions", bodies), strict=False)):
        o = json.loads(raw)
        # vLLM's prompt_logprobs: None, then per position {id: {logprob, rank, decoded_token}}, the prompt id
        # first and the n best besides; the values are the model's own next-token log-probs
        plp = o["choices"][0]["prompt_logprobs"]
        assert len(plp) == len(p) and plp[0] is None
        with torch.inference_mode():
            want = torch.log_softmax(hf(torch.tensor([p])).logits[0].float(), -1)
        for t in range(1, len(p)):
            entry = plp[t]
            assert next(iter(entry)) == str(p[t]) and n <= len(entry) <= n + 1
            got = entry[str(p[t])]
            assert abs(got["logprob"] - float(want[t - 1, p[t]])) < 1e-4
            assert got["rank"] == 1 + int((want[t - 1] > want[t - 1, p[t]]).sum())
            assert isinstance(got["decoded_token"], str)
            best = [int(i) for i in want[t - 1].topk(n).indices]
            assert set(best) <= {int(k) for k in entry}
        path = o["kv_transfer_params"]["hidden_states_path"]
        assert Path(path).is_absolute() and Path(path + ".lock").exists()
        asyncio.run(wait_for_lock(path, 30))
        f = load_file(path)
        assert f["token_ids"].dtype == torch.int64 and f["token_ids"].tolist() == p
        hs = f["hidden_states"]
        assert hs.shape == (len(p), 4, 64) and hs.dtype == hf.dtype
        grabbed: dict[str, Any] = {}
        h = hf.model.layers[L - 1].register_forward_hook(_keep_output(grabbed))
        try:
            with torch.inference_mode():
                ref = hf(torch.tensor([p]), output_hidden_states=True).hidden_states
        finally:
            h.remove()
        for slot, k in enumerate([2, 4, 5]):
            torch.testing.assert_close(hs[:, slot], ref[k][0], rtol=1e-3, atol=2e-4)  # fp32, batched vs alone
        pre = grabbed["pre"][0] if isinstance(grabbed["pre"], tuple) else grabbed["pre"]
        torch.testing.assert_close(hs[:, 3], pre[0], rtol=1e-3, atol=2e-4)  # fp32, batched vs alone
        assert not torch.allclose(hs[:, 3], ref[L][0], atol=1e-3)  # id L is pre-norm, HF's [L] is post-norm


def test_metrics_generate_and_models(srv: RunningModelServer, hf: Any) -> None:
    async def get(path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(srv.root_url + path) as r:
            return r.status, await r.text()
    status, text = asyncio.run(get("/metrics"))
    assert status == 200
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert re.search(rf'^vllm:spec_decode_{name}_total\{{engine="0",model_name="{NAME}"\}} 0\.0$', text, re.M)
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{NAME}",position="0"}} 0.0' \
        in text
    assert json.loads(asyncio.run(get("/v1/models"))[1])["data"][0]["id"] == NAME
    assert asyncio.run(get("/health"))[0] == 200
    out = json.loads(post_all(srv.root_url + "/generate", [{"input_ids": PROMPTS[0],
                                                             "sampling_params": {"max_new_tokens": 7}}])[0])
    assert out["output_ids"] == hf_greedy(hf, PROMPTS[0], len(out["output_ids"]))
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) and "spec_verify_ct" not in out["meta_info"]


def test_seeded_sampling_is_reproducible(srv: RunningModelServer) -> None:
    body = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 10, "temperature": 1.0, "seed": 7,
            "return_token_ids": True}
    a, b, c = (json.loads(x)["choices"][0]["token_ids"]
               for x in post_all(srv.base_url + "/completions", [body, body, {**body, "seed": 8}]))
    assert a == b and a != c


def test_drafter_counters_and_exact_output(model_dir: Path, hf: Any, tmp_path: Path) -> None:
    pytest.importorskip("draftgen.drafter.speculate")
    ckpt = build_random_drafter(tmp_path / "drafter", model_dir)
    with start_in_thread(ModelServerOptions(model=str(model_dir), port=0, threads=1, served_model_name=NAME,
                                            drafter=str(ckpt), num_speculative_tokens=3)) as s:
        outs = [json.loads(x) for x in post_all(s.root_url + "/generate", [
            {"input_ids": p, "sampling_params": {"max_new_tokens": 10}} for p in PROMPTS[:3]])]
        async def metrics() -> str:
            async with aiohttp.ClientSession() as cs, cs.get(s.root_url + "/metrics") as r:
                return await r.text()
        text = asyncio.run(metrics())
    for p, o in zip(PROMPTS, outs, strict=False):
        assert o["output_ids"] == hf_greedy(hf, p, len(o["output_ids"]))
        m = o["meta_info"]
        assert m["spec_verify_ct"] >= 1 and m["spec_accept_length"] == m["completion_tokens"] / m["spec_verify_ct"]
    def val(name: str) -> float:
        mm = re.search(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M)
        assert mm is not None, name
        return float(mm.group(1))
    drafts = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    assert val("num_drafts") == drafts > 0 and val("num_draft_tokens") == 3 * drafts
    assert val("num_accepted_tokens") == sum(o["meta_info"]["spec_num_correct_drafts"] for o in outs)


def test_cli_emulate_model_serves_extract_mode(model_dir: Path, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    from _common_helpers import free_port

    port = free_port()
    hs = tmp_path / "hs"
    log_path = tmp_path / "emulate.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "draftgen.cli", "emulate", "--model", str(model_dir), "--port", str(port),
             "--served-model-name", NAME, "--extract-dir", str(hs), "--extract-layers", "2,4,5,8"],
            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-2000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "emulate --model did not answer within 120 s"
                time.sleep(0.2)
        out = json.loads(post_all(f"http://127.0.0.1:{port}/v1/completions",
                                  [{"model": NAME, "prompt": PROMPTS[0], "max_tokens": 1, "return_token_ids": True}])[0])
        path = out["kv_transfer_params"]["hidden_states_path"]
        assert Path(path).parent == hs.resolve() and out["choices"][0]["prompt_token_ids"] == PROMPTS[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log_path.read_text(errors="replace")
    assert "extract mode: hidden states of layer ids [2, 4, 5, 8]" in text and "model server stopped" in text


def test_partial_vocab_head_is_exact_on_the_chain_target(tmp_path: Path) -> None:
    """The learnable chain target (``drafter.tiny``: lm_head rows >= 2048 zeroed) takes the engine's
    live-rows head; greedy must still equal HF's full-vocabulary greedy, for many prompts batched at once."""
    tiny = pytest.importorskip("draftgen.drafter.tiny")
    import random

    d = tiny.build_tiny_target(tmp_path / "chain")
    hf_chain = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    rnd = random.Random(0)
    prompts = [[rnd.randrange(100, 2000) for _ in range(8 + i % 5)] for i in range(12)]
    with start_in_thread(ModelServerOptions(model=str(d), port=0, threads=1)) as s:
        assert s.server.engine._head.live is not None and len(s.server.engine._head.live) == 2048
        outs = [json.loads(x)["choices"][0]["token_ids"] for x in post_all(
            s.base_url + "/completions", [{"prompt": p, "max_tokens": 24, "return_token_ids": True} for p in prompts])]
    for p, o in zip(prompts, outs, strict=True):
        assert o == hf_greedy(hf_chain, p, 24)
