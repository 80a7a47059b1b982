"""Adding a backend is its module plus one ``backends.BACKENDS.register`` line.

A toy kind is registered here (an OpenAI-compatible chat backend subclass that counts its requests, with
capabilities of its own: self-hosted, served by the embedded emulator when no base URL is given, no
account), a config naming ``endpoint.kind: toy`` is loaded from YAML, and ``run_generate`` writes records
through it. Nothing outside ``backends/`` knows the name: behaviour follows the declared capabilities.
The registration is removed afterwards, and the kind is then refused again by the config check (``extensions.check_config``).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from _generate_helpers import claim, responses, write_prompts
from draftgen.backends import (
    BACKENDS,
    EMULATOR_KEY,
    BackendKind,
    Bounds,
    Capabilities,
    Completion,
    CompletionRequest,
    capabilities,
)
from draftgen.backends.openrouter import OpenAIChatBackend
from draftgen.config import RunConfig, load_config
from draftgen.errors import ConfigError
from draftgen.extensions import check_config
from draftgen.phases.generate.run import run_generate

# -- the toy backend: what a new module under backends/ would hold -------------------------------------------

#: Self-hosted (requests cost nothing), started in process when no base URL is set, any key accepted.
TOY_CAPABILITIES = Capabilities(self_hosted=True, embedded_server=True, placeholder_key=EMULATOR_KEY)


class ToyBackend(OpenAIChatBackend):
    """A plain OpenAI-compatible chat client that counts what it sends."""

    sent = 0

    async def send(self, req: CompletionRequest) -> Completion:
        type(self).sent += 1
        return await super().send(req)


def build_toy(cfg: RunConfig, session: aiohttp.ClientSession, url: str, bounds: Bounds) -> ToyBackend:
    return ToyBackend(session, url, model=cfg.model.id, name="toy", bounds=bounds)


# -- the test -----------------------------------------------------------------------------------------------


def _write_config(tmp_path: Path) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(
        f"run_dir: {tmp_path / 'run'}\n"
        "endpoint: {kind: toy, idle_timeout_s: 5.0}\n"  # no base_url: the embedded emulator serves it
        "model: {id: qwen/qwen3-8b, profile: qwen3, tokenizer: 'bundled:qwen3'}\n"
        "partitions: {short: {concurrency: 4, max_tokens: 512}}\n"
        "progress: 'off'\n"
        "datasets:\n  - {name: a, path: a.jsonl}\n",
        encoding="utf-8",
    )
    return path


def test_a_registered_toy_backend_runs_generate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_config(tmp_path)
    with pytest.raises(ConfigError, match=r"endpoint\.kind"):
        check_config(load_config(path), str(path))  # not registered yet

    BACKENDS.register("toy", BackendKind(TOY_CAPABILITIES, build_toy), doc="a toy chat server")  # the one line
    try:
        _generate_through_toy(path, monkeypatch)
    finally:
        BACKENDS.unregister("toy")


def _generate_through_toy(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ToyBackend, "sent", 0)
    cfg = load_config(path)
    check_config(cfg, str(path))
    assert cfg.endpoint.kind == "toy" and capabilities("toy").embedded_server
    run_dir = claim(cfg)
    write_prompts(run_dir, "a", 5)
    rep = run_generate(cfg, echo=lambda s: None)
    assert rep.exit_code == 0 and rep.done == 5, rep.message
    recs = responses(run_dir, "a")
    assert len(recs) == 5 and {r.backend for r in recs} == {"toy"}
    assert all(r.ids_source == "reconstructed" and r.output_ids for r in recs)  # no exact_ids capability
    assert ToyBackend.sent >= 5
    log = (run_dir / "logs" / "generate.log").read_text(encoding="utf-8")
    assert "the toy endpoint publishes no prices" in log  # no prices capability: not asked


def test_the_registration_is_gone_afterwards(tmp_path: Path) -> None:
    assert "toy" not in BACKENDS
    path = _write_config(tmp_path)
    with pytest.raises(ConfigError, match=r"endpoint\.kind.*emulator"):
        check_config(load_config(path), str(path))
