"""``draftgen emulate --model DIR --provider NAME --perturb SCALE --perturb-seed N``: a stand-in provider for the
provider-fidelity check (issue 35 item 3), on a seeded random tiny Qwen3 (``_extract_helpers``).

Checked: ``perturb_weights`` moves every weight by the stated relative scale, the same for the same seed and
otherwise not; a perturbed server's greedy text differs from the target's; the provider is named at the top
level of every whole chat completion and every chunk of a streamed one that carries a choice (and by nothing
when unset); draftgen's own generate records
it; a negative scale is one ConfigError before anything loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


from _emulator_helpers import post_all  # noqa: E402
from _extract_helpers import build_tiny_model  # noqa: E402
from _generate_helpers import claim, make_config, responses, write_prompts  # noqa: E402
from draftgen.emulator.real.engine import load_model, perturb_weights  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread  # noqa: E402
from draftgen.errors import ConfigError  # noqa: E402

NAME = "tiny-qwen3"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", layers=4, hidden=64)


def test_perturb_weights_moves_each_weight_by_its_relative_scale_seeded(model_dir: Path) -> None:
    base = dict(load_model(str(model_dir), threads=1).model.named_parameters())
    runs = []
    for seed in (3, 3, 4):
        m = load_model(str(model_dir), threads=1).model
        perturb_weights(m, 0.05, seed)
        runs.append(dict(m.named_parameters()))
    for name, w in base.items():
        moved = (runs[0][name] - w).detach().float()
        rel = float(moved.pow(2).mean().sqrt() / w.detach().float().pow(2).mean().sqrt())
        assert 0.04 < rel < 0.06 if w.numel() > 1000 else rel > 0, (name, rel)
        assert torch.equal(runs[0][name], runs[1][name])  # the same seed: the same copy
        assert not torch.equal(runs[0][name], runs[2][name])


def test_a_perturbed_server_names_its_provider_and_writes_other_text(model_dir: Path) -> None:
    plain = ModelServerOptions(model=str(model_dir), port=0, threads=1, served_model_name=NAME)
    noisy = ModelServerOptions(model=str(model_dir), port=0, threads=1, served_model_name=NAME, provider="emu/int4",
                               perturb=0.3, perturb_seed=1)
    outs: dict[str, list[dict[str, Any]]] = {}
    streamed: dict[str, str] = {}
    for key, opts in (("plain", plain), ("noisy", noisy)):
        with start_in_thread(opts) as srv:
            url = srv.base_url + "/chat/completions"
            bodies = [{"model": NAME, "messages": [{"role": "user", "content": f"Say something about {w}."}],
                       "max_tokens": 16, "return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}}
                      for w in ("tokens", "rivers", "glass", "maps")]
            outs[key] = [json.loads(b) for b in post_all(url, bodies)]
            streamed[key] = post_all(url, [{**bodies[0], "stream": True,
                                         "stream_options": {"include_usage": True}}])[0].decode()
    assert all("provider" not in o for o in outs["plain"])  # unset: as vLLM, no provider field
    assert all(o["provider"] == "emu/int4" for o in outs["noisy"])
    events = [json.loads(x) for x in re.findall(r"^data: (\{.*\})$", streamed["noisy"], re.M)]
    assert len(events) > 2 and all(e["provider"] == "emu/int4" for e in events if e["choices"])  # the usage chunk
    # (``choices: []``) is local_wire's, without it: the record takes the provider from the others
    assert not re.search(r'"provider"', streamed["plain"])
    ids = [[o["choices"][0]["token_ids"] for o in outs[k]] for k in ("plain", "noisy")]
    assert ids[0] != ids[1]  # the perturbed copy writes other text (greedy both)


def test_generate_records_the_provider_the_server_names(model_dir: Path, tmp_path: Path) -> None:
    model = {"id": NAME, "profile": "qwen3", "tokenizer": "bundled:qwen3", "thinking": False}
    run_dir = claim(make_config(tmp_path, ["a"], model=model))
    write_prompts(run_dir, "a", 3)
    with start_in_thread(ModelServerOptions(model=str(model_dir), port=0, threads=1, served_model_name=NAME,
                                            provider="emu/int4", perturb=0.05)) as srv:
        cfg = make_config(tmp_path, ["a"], kind="vllm", base_url=srv.base_url, model=model,
                          partitions={"short": {"concurrency": 3, "max_tokens": 8},
                                      "long": {"concurrency": 1, "max_tokens": 8}})
        from draftgen.phases.generate.run import run_generate

        rep = run_generate(cfg, echo=lambda s: None)
    recs = responses(run_dir, "a")
    assert rep.done == 3 and {r.provider for r in recs} == {"emu/int4"}


def test_a_negative_scale_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"emulate --perturb -0\.1: give a relative scale >= 0"):
        start_in_thread(ModelServerOptions(model=str(tmp_path / "nothing-here"), port=0, perturb=-0.1))
