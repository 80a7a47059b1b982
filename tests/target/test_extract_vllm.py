"""The ``vllm`` extract backend against two ``draftgen emulate --model`` servers in extract mode.

A real merged run (emulator pipeline, bundled Qwen3), a seeded tiny Qwen3 target (8 layers, hidden 64), two
model servers on free loopback ports writing connector files into one shared folder
(``hidden_states.connector_dir``). ``draftgen extract`` with the vllm backend must
store what the hf backend stores (fp32, within float tolerance) and what an independent HF forward gives;
a server that returns altered ``prompt_token_ids`` is rejected with an error naming the sample, and nothing
of that batch is published. The log-prob check compares the stored states with the engine's own
``prompt_logprobs``: a sound capture passes it; each miswired server (``--extract-fault``: layer ids off by one,
the final state from the wrong layer or after the norm, aux not captured, positions shifted) is flagged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _common_helpers import write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run, merged_rows  # noqa: E402
from draftgen.config import RunConfig, load_config  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, RunningModelServer, start_in_thread  # noqa: E402
from draftgen.errors import PermanentAPIError  # noqa: E402
from draftgen.hidden.format import HiddenStore, open_hidden  # noqa: E402
from draftgen.phases.extract.run import run_extract  # noqa: E402
from draftgen.target.vllm import VllmClientOptions, VllmExtractBackend  # noqa: E402

L, H = 8, 64


def _keep_output(into: dict[str, Any]) -> Any:
    """A forward hook storing the layer's output (the last layer's: the pre-norm final state)."""
    def hook(module: Any, args: Any, out: Any) -> None:
        into["pre"] = out
    return hook


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[RunningModelServer]]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("xv")
    model = build_tiny_model(tmp / "tiny", layers=L, hidden=H)
    cfg_path = make_merged_run(tmp, n_chat=5, n_code=3, max_tokens=24)
    # both servers write into the one connector folder the client is configured with
    servers = [start_in_thread(ModelServerOptions(model=str(model), port=0, threads=1,
                                                  extract_dir=str(tmp / "hs"))) for _ in range(2)]
    try:
        yield cfg_path, model, servers
    finally:
        for s in servers:
            s.stop()


def _config(cfg_path: Path, model: Path, name: str, backend: str, output: str, *, connector_dir: Path | None = None,
            **endpoint: Any) -> RunConfig:
    data = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    data["hidden_states"] = {"backend": backend, "model": str(model), "dtype": "fp32", "compute_dtype": "fp32",
                             "output": output, "teacher_min_margin": None, "max_flagged_fraction": 1.0,
                             "teacher_fraction": 1.0,
                             "connector_dir": str(connector_dir or cfg_path.parent / "hs")}
    if endpoint:
        data["endpoint"] = {**data["endpoint"], **endpoint}
    return load_config(write_config(cfg_path.parent, data, name))


def test_vllm_backend_over_two_servers_matches_hf_and_a_plain_forward(
        setup: tuple[Path, Path, list[RunningModelServer]]) -> None:
    cfg_path, model, servers = setup
    urls = [s.root_url for s in servers]
    cfg_v = _config(cfg_path, model, "cfg-vllm.yaml", "vllm", "hidden-vllm", kind="vllm", base_url=urls[0],
                    base_urls=[urls[1]])
    rep_v = run_extract(cfg_v, echo=lambda s: None)
    cfg_h = _config(cfg_path, model, "cfg-hf.yaml", "hf", "hidden-hf")
    rep_h = run_extract(cfg_h, echo=lambda s: None)
    rows = merged_rows(cfg_path.parent / "run")
    assert rep_v.extracted == rep_h.extracted == len(rows) > 0
    assert all(s.server.counters.requests > 0 for s in servers)  # both servers took requests
    for s in servers:  # the client removed every connector file after reading it
        assert not list(Path(s.server.opts.extract_dir or "").iterdir())
    hv = open_hidden(str(cfg_path.parent / "hidden-vllm"))
    hh = open_hidden(str(cfg_path.parent / "hidden-hf"))
    # the log-prob check ran against each engine's own prompt_logprobs, and passed
    done = HiddenStore(str(cfg_path.parent / "hidden-vllm")).done()
    assert all(r.failed == [] and r.teacher and r.teacher.reference_source == "engine" for r in done.values()), done
    assert all(r.teacher and r.teacher.logprob_err is not None and r.teacher.aux_logprob_err is not None
               and r.teacher.logprob_err < 1e-3 for r in done.values())
    assert hv.manifest.layer_ids.aux == hh.manifest.layer_ids.aux == [2, 4, 5]
    assert hv.manifest.norm_weight_sha256 == hh.manifest.norm_weight_sha256 and hv.manifest.backend == "vllm"
    hf = transformers.AutoModelForCausalLM.from_pretrained(model).eval()
    for (sid, ids, mask), a, b in zip(rows, hv.samples(), hh.samples(), strict=True):
        assert a.sample_id == b.sample_id == sid and a.input_ids.tolist() == ids and a.loss_mask.tolist() == mask
        torch.testing.assert_close(a.aux, b.aux, rtol=1e-3, atol=2e-4)
        torch.testing.assert_close(a.final, b.final, rtol=1e-3, atol=2e-4)
        grabbed: dict[str, Any] = {}
        h = hf.model.layers[L - 1].register_forward_hook(_keep_output(grabbed))
        try:
            with torch.inference_mode():
                ref = hf.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        finally:
            h.remove()
        want_aux = torch.cat([ref[k][0] for k in (2, 4, 5)], dim=-1)
        pre = grabbed["pre"][0] if isinstance(grabbed["pre"], tuple) else grabbed["pre"]
        torch.testing.assert_close(a.aux, want_aux, rtol=1e-3, atol=2e-4)
        torch.testing.assert_close(a.final, pre[0], rtol=1e-3, atol=2e-4)
    # a rerun finds everything done
    assert run_extract(cfg_v, echo=lambda s: None).extracted == 0


def test_changed_prompt_ids_are_rejected_and_nothing_is_published(
        setup: tuple[Path, Path, list[RunningModelServer]], tmp_path: Path) -> None:
    cfg_path, model, _ = setup
    with start_in_thread(ModelServerOptions(model=str(model), port=0, threads=1, extract_dir=str(tmp_path / "hs"),
                                            extract_fault="prompt_ids")) as bad:
        cfg = _config(cfg_path, model, "cfg-bad.yaml", "vllm", str(tmp_path / "hidden-bad"), kind="vllm",
                      base_url=bad.root_url, base_urls=[], connector_dir=tmp_path / "hs")
        be = VllmExtractBackend(cfg)
        try:
            with pytest.raises(PermanentAPIError, match=r"sample \S+: the server's prompt_token_ids differ") as ei:
                run_extract(cfg, echo=lambda s: None, backend=be)
        finally:
            be.close()
        assert ei.value.kind == "ids_mismatch" and be.retries == 0  # permanent: never retried
        assert not list((tmp_path / "hs").iterdir())  # refused, yet named to draftgen: removed with its lock
    store = HiddenStore(str(tmp_path / "hidden-bad"))
    assert store.done() == {} and not (tmp_path / "hidden-bad" / "states").exists()


def test_every_request_asks_the_same_question_and_the_checked_samples_are_drawn_after_the_answer(
        setup: tuple[Path, Path, list[RunningModelServer]], tmp_path: Path) -> None:
    """Item 2, offline: at the default teacher_fraction every request carries prompt_logprobs (a recording
    man-in-the-middle in front of the emulator sees them all), the samples checked are the backend's draw after
    the answer (``checks.SpotChecking``), each checked against the engine's own log-probs of its request."""
    from _hostile_extract import ExtractMITM
    from draftgen.target.checks import SpotChecking

    cfg_path, model, servers = setup
    with ExtractMITM(servers[0].root_url, lambda *_: None) as mitm:
        cfg = _config(cfg_path, model, "cfg-spot.yaml", "vllm", str(tmp_path / "hidden"), kind="vllm",
                      base_url=mitm.url, base_urls=[])
        cfg = msgspec.structs.replace(cfg, hidden_states=msgspec.structs.replace(cfg.hidden_states,
                                                                                  teacher_fraction=0.05))
        be = VllmExtractBackend(cfg)
        try:
            assert isinstance(be, SpotChecking) and be.spot.block == 100 and be.spot.per_block == 5
            run_extract(cfg, echo=lambda s: None, backend=be)
        finally:
            be.close()
    rows = merged_rows(cfg_path.parent / "run")
    assert len(mitm.bodies) == len(rows) and all(b.get("prompt_logprobs") == 0 for b in mitm.bodies)
    done = HiddenStore(str(tmp_path / "hidden")).done()
    assert len(done) == len(rows) and all(r.failed == [] for r in done.values())
    assert all(r.teacher.reference_source == "engine" for r in done.values() if r.teacher is not None)


BREAKS = {"layers_off_by_one": "teacher_reference", "final_wrong_layer": "teacher_reference",
          "final_post_norm": "teacher_reference", "aux_zeros": "teacher_aux", "shift": "teacher_reference"}


@pytest.mark.parametrize("fault", sorted(BREAKS))
def test_the_logprob_check_flags_a_miswired_server(setup: tuple[Path, Path, list[RunningModelServer]],
                                                  tmp_path: Path, fault: str) -> None:
    cfg_path, model, _ = setup
    with start_in_thread(ModelServerOptions(model=str(model), port=0, threads=1, extract_dir=str(tmp_path / "hs"),
                                            extract_fault=fault)) as bad:
        cfg = _config(cfg_path, model, f"cfg-{fault}.yaml", "vllm", str(tmp_path / "hidden"), kind="vllm",
                      base_url=bad.root_url, base_urls=[], connector_dir=tmp_path / "hs")
        run_extract(cfg, echo=lambda s: None, limit=3)
    failed = {sid: r.failed for sid, r in HiddenStore(str(tmp_path / "hidden")).done().items()}
    assert len(failed) == 3 and all(BREAKS[fault] in f for f in failed.values()), failed


def test_wrong_layer_count_is_a_config_error(setup: tuple[Path, Path, list[RunningModelServer]]) -> None:
    from draftgen.errors import ConfigError
    from draftgen.target import ExtractRow

    _, model, servers = setup
    np = pytest.importorskip("numpy")
    opts = VllmClientOptions(base_urls=(servers[0].root_url,), connector_dir=servers[0].server.opts.extract_dir)
    be = VllmExtractBackend.from_parts(model, opts, [2, 4])
    try:
        row = ExtractRow("s-1", np.array([1, 2, 3], dtype=np.int64), np.array([0, 1, 1], dtype=np.uint8))
        with pytest.raises(ConfigError, match=r"captures 4 layers per token but draftgen expects 3"):
            be.capture([row])
    finally:
        be.close()


def test_without_a_connector_folder_the_backend_refuses_to_start(
        setup: tuple[Path, Path, list[RunningModelServer]]) -> None:
    from draftgen.errors import ConfigError

    _, model, servers = setup
    with pytest.raises(ConfigError, match=r"^hidden_states\.connector_dir: not set; .*shared_storage_path") as ei:
        VllmExtractBackend.from_parts(model, VllmClientOptions(base_urls=(servers[0].root_url,)))
    assert "\n" not in str(ei.value)
