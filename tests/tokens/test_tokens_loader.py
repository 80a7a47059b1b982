"""Tokenizer loading: bundled, folders (plain and gzip, odd file names), files, the hub (monkeypatched),
sha256 pins, and the errors for wrong or missing files and for a tokenizer that does not fit the profile."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import yaml

from _common_helpers import free_port
from _tokens_helpers import ASSETS, need_shared, profile, synthetic_kimi_dir
from draftgen.config import load_config
from draftgen.errors import ConfigError, TokenizerError
from draftgen.records import Message
from draftgen.tokens import load_profile, load_tokenizer, profile_from_config

QWEN3_SHA = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
R1_SHA = "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"


def test_bundled_qwen3_offline_with_template() -> None:
    loaded = load_tokenizer("bundled:qwen3", sha256=QWEN3_SHA)
    assert loaded.sha256 == QWEN3_SHA
    assert loaded.chat_template and "<|im_start|>" in loaded.chat_template
    tok = loaded.tokenizer
    assert tok.special_tokens["<|im_end|>"] == 151645
    assert tok.normalization == "NFC"
    with pytest.raises(TokenizerError, match="bundled:nope"):
        load_tokenizer("bundled:nope")


def test_folder_plain_json_and_sha_pin() -> None:
    need_shared()
    loaded = load_tokenizer(str(ASSETS / "qwen3"), sha256=QWEN3_SHA.upper())
    assert loaded.folder == ASSETS / "qwen3"
    assert loaded.template_file and loaded.template_file.endswith("chat_template.jinja")
    with pytest.raises(TokenizerError, match="sha256 is aeb13307a71acd8f"):
        load_tokenizer(str(ASSETS / "qwen3"), sha256="0" * 64)


def test_gzip_folder_pins_uncompressed_bytes() -> None:
    need_shared()
    loaded = load_tokenizer(str(ASSETS / "deepseek-r1"), sha256=R1_SHA)
    assert loaded.tokenizer.special_tokens["</think>"] == 128799
    assert loaded.config.get("bos_token") is not None


def test_relative_folder_resolves_from_base_dir() -> None:
    need_shared()
    loaded = load_tokenizer("deepseek-v3.1", base_dir=ASSETS)
    assert loaded.tokenizer.special_tokens["<｜end▁of▁sentence｜>"] == 1


def test_glm_folder_odd_names_resolved_by_profile() -> None:
    need_shared()
    bare = load_tokenizer(str(ASSETS / "glm-4.5"))
    assert bare.chat_template is None  # two chat_template*.jinja and no preference: none is guessed
    assert bare.config.get("added_tokens_decoder")  # the single tokenizer_config*.json is used
    prof = load_profile("glm-4.5", str(ASSETS / "glm-4.5"))
    assert prof.chat_template is not None and prof.chat_template.startswith("[gMASK]<sop>")


def test_file_spec_uses_folder_config(tmp_path: Path) -> None:
    need_shared()
    loaded = load_tokenizer(str(ASSETS / "qwen3" / "tokenizer.json"))
    assert loaded.chat_template is not None
    assert loaded.tokenizer.special_tokens["<think>"] == 151667


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer folder not found"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(TokenizerError, match=r"hf:moonshotai/Kimi-K2.5"):
        load_tokenizer("moonshotai/Kimi-K2.5")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerError, match=r"no tokenizer.json, tokenizer.json.gz or tiktoken.model"):
        load_tokenizer(str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer.json"):
        load_tokenizer(str(bad))
    badgz = tmp_path / "badgz"
    badgz.mkdir()
    (badgz / "tokenizer.json.gz").write_bytes(b"not gzip at all")
    with pytest.raises(TokenizerError, match="not a valid gzip file"):
        load_tokenizer(str(badgz))
    badcfg = tmp_path / "badcfg"
    badcfg.mkdir()
    (badcfg / "tokenizer_config.json").write_text("[1,", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        load_tokenizer(str(badcfg))
    badkimi = tmp_path / "badkimi"
    badkimi.mkdir()
    (badkimi / "tiktoken.model").write_bytes(b"QQ== 0\nnot-base64! 1\n")
    with pytest.raises(TokenizerError, match=r"tiktoken.model:2"):
        load_tokenizer(str(badkimi))


def test_gzip_roundtrip_of_a_local_copy(tmp_path: Path) -> None:
    need_shared()
    data = (ASSETS / "qwen3" / "tokenizer.json").read_bytes()
    (tmp_path / "tokenizer.json.gz").write_bytes(gzip.compress(data))
    loaded = load_tokenizer(str(tmp_path), sha256=hashlib.sha256(data).hexdigest())
    assert loaded.chat_template is None
    assert loaded.tokenizer.encode("Hello") == load_tokenizer(str(ASSETS / "qwen3")).tokenizer.encode("Hello")


def test_hub_spec_through_snapshot_download(monkeypatch: pytest.MonkeyPatch) -> None:
    need_shared()
    hub = types.ModuleType("huggingface_hub")  # stands in for the optional dependency: no network
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    calls: list[dict[str, object]] = []

    def fake(**kw: object) -> str:
        calls.append(kw)
        return str(ASSETS / "deepseek-v3.1")

    monkeypatch.setattr(hub, "snapshot_download", fake, raising=False)
    prof = load_profile("deepseek-v3.1", "hf:deepseek-ai/DeepSeek-V3.1@abc123")
    assert calls[0]["repo_id"] == "deepseek-ai/DeepSeek-V3.1" and calls[0]["revision"] == "abc123"
    assert "tiktoken.model" in calls[0]["allow_patterns"]  # type: ignore[operator]
    assert prof.end_of_turn_ids == (1,)

    def failing(**kw: object) -> str:
        raise OSError("offline")

    monkeypatch.setattr(hub, "snapshot_download", failing)
    # the stand-in hub has no endpoint to check (the real constants module may be loaded by earlier tests)
    monkeypatch.setattr("draftgen.tokens.loader._hub_endpoint", lambda: None)
    with pytest.raises(TokenizerError, match=r"hf:org/name: download failed \(OSError\)"):
        load_tokenizer("hf:org/name")
    with pytest.raises(TokenizerError, match="expected hf:org/name"):
        load_tokenizer("hf:justaname")


def test_hub_without_huggingface_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(TokenizerError, match="huggingface_hub is not installed"):
        load_tokenizer("hf:org/name")


def test_profile_over_wrong_tokenizer_is_refused() -> None:
    need_shared()
    with pytest.raises(TokenizerError, match=r"profile 'qwen3' needs control token '<\|im_end\|>'"):
        load_profile("qwen3", str(ASSETS / "deepseek-v3.1"))
    with pytest.raises(ConfigError, match=r"model\.profile: profile 'llama' is not registered"):
        load_profile("llama", "bundled:qwen3")


def test_kimi_wrong_config_ids_are_refused(tmp_path: Path) -> None:
    src = synthetic_kimi_dir()
    dest = tmp_path / "kimi"
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "tokenizer_config.json").read_text(encoding="utf-8"))
    # The classic mistake: <|im_end|> moved to another id (the reference run first used 163533).
    cfg["added_tokens_decoder"]["163586"]["content"] = "<|im_end_wrong|>"
    cfg["added_tokens_decoder"]["163587"]["content"] = "<|im_end|>"
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"is id 163587 .* expected 163586"):
        load_profile("kimi-k2.5", str(dest))


def test_chat_template_text_or_path(tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}", encoding="utf-8")
    by_path = load_profile("qwen3", "bundled:qwen3", chat_template="t.jinja", base_dir=tmp_path)
    by_text = load_profile("qwen3", "bundled:qwen3", chat_template="{{ messages[0].content }}!")
    msgs = [Message(role="user", content="hi")]
    assert by_path.render_prompt(msgs) == "[hi]"
    assert by_text.render_prompt(msgs) == "hi!"
    with pytest.raises(TokenizerError, match=r"chat_template .*file not found.*fix model\.chat_template"):
        load_profile("qwen3", "bundled:qwen3", chat_template="missing.jinja", base_dir=tmp_path)


def test_profile_from_config_generic_options(tmp_path: Path) -> None:
    need_shared()
    data = {
        "run_dir": "run",
        "datasets": [{"name": "d", "path": "d.jsonl"}],
        "model": {
            "profile": "generic",
            "tokenizer": str(ASSETS / "qwen3"),
            "profile_options": {
                "think_start": "<think>", "think_end": "</think>", "end_of_turn": ["<|im_end|>"],
                "reasoning_lead": "\n", "reasoning_trail": "\n", "content_lead": "\n\n",
                "tool_specials": ["<tool_call>", "</tool_call>"], "thinking_kwarg": "enable_thinking",
                "expected_ids": {"<|im_end|>": 151645},
            },
        },
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    prof = profile_from_config(load_config(tmp_path / "c.yaml"))
    qwen = profile("qwen3")
    for args in (("r", "c", "stop"), ("\nr\n", "\n\nc", "stop"), ("cut", "", "length")):
        assert prof.build_output(*args).ids == qwen.build_output(*args).ids
    data["model"]["profile_options"] = {"think_end": 5}  # type: ignore[index]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="think_end: expected a string"):
        profile_from_config(load_config(tmp_path / "c.yaml"))
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        load_profile("generic", "bundled:qwen3", options={"bogus": 1})
    with pytest.raises(TokenizerError, match="takes no profile_options"):
        load_profile("qwen3", "bundled:qwen3", options={"think_end": "</think>"})


def test_unknown_vocab_file_type_is_refused() -> None:
    need_shared()
    with pytest.raises(TokenizerError, match="unknown tokenizer file type"):
        load_tokenizer(str(ASSETS / "gpt-oss" / "o200k_base.tiktoken"))


# -- the hub offline: one quick line that names the way out ---------------------------------------------------


KIMI_SHA = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"


def test_kimi_hub_offline_fails_fast_in_one_line(tmp_path: Path) -> None:
    """``plan`` on a Kimi ``hf:`` tokenizer with the hub unreachable and an empty cache: one line, in seconds,
    naming the network-once option, the local folder's three files and the pinned sha256; no retry spam."""
    import os
    import subprocess
    import time

    pytest.importorskip("huggingface_hub")
    cfg = tmp_path / "kimi.yaml"
    cfg.write_text(yaml.safe_dump({
        "run_dir": "run",
        "model": {"id": "moonshotai/kimi-k2.5", "profile": "kimi-k2.5",
                  "tokenizer": "hf:moonshotai/Kimi-K2.5@4d01dfe0332d63057c186e0b262165819efb6611",
                  "tokenizer_sha256": KIMI_SHA},
        "endpoint": "emulator",
        "datasets": [{"name": "chat", "path": "bundled:chat"}],
    }), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}", HF_HOME=str(tmp_path / "hf"),
               OPENROUTER_API_KEY="sk-or-v1-test")
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "draftgen.cli", "plan", str(cfg)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - start
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-3000:]
    line = lines[0]
    assert line.startswith("Error: hf:moonshotai/Kimi-K2.5@") and "unreachable" in line
    assert "network" in line and "downloads once" in line
    for needed in ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja", KIMI_SHA):
        assert needed in line, needed
    assert "Retry" not in res.stderr and "Traceback" not in res.stderr
    assert took < 10, f"took {took:.1f} s"


def test_hub_offline_mode_and_unreachable_endpoint_in_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import time

    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"), raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(TokenizerError) as info:
        load_tokenizer("hf:Qwen/Qwen3-8B@main", sha256="ab" * 32)
    msg = str(info.value)
    assert time.monotonic() - start < 10 and "\n" not in msg
    assert "is unreachable" in msg and "tokenizer.json, tokenizer_config.json and chat_template.jinja" in msg
    assert "sha256 " + "ab" * 32 in msg and "tiktoken.model" not in msg
    monkeypatch.setattr(constants, "is_offline_mode", lambda: True, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerError, match="HF_HUB_OFFLINE is set"):
        load_tokenizer("hf:moonshotai/Kimi-K2.5")
    assert "Retry" not in capsys.readouterr().err
