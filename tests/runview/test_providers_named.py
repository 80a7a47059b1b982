"""Who served what, named (issue 34, minor): a self-hosted server's responses and attempts are its kind's row of
the providers table, not "unknown"."""

from __future__ import annotations

from pathlib import Path

from _generate_helpers import claim, emulator, make_config, write_prompts
from draftgen.phases.generate.run import run_generate
from draftgen.runview.metrics import compute_metrics
from draftgen.runview.providers import provider_metrics


def test_a_self_hosted_server_is_named_by_its_kind(tmp_path: Path) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    write_prompts(run_dir, "a", 4)
    with emulator() as emu:  # the emulator's vLLM server: its answers name no provider
        cfg = make_config(tmp_path, ["a"], kind="vllm", base_url=emu.root_url + "/v1")
        assert run_generate(cfg, echo=lambda line: None).done == 4
    rows = provider_metrics(run_dir, ["a"])
    assert [(p.provider, p.responses, p.attempts) for p in rows] == [("vllm", 4, 4)]
    assert [p.provider for p in compute_metrics(run_dir, ["a"]).providers_table] == ["vllm"]
