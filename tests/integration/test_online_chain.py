"""Online training on the CPU chain's learned target (issue 25, "done when"): an EAGLE-3 drafter trained with
``draftgen train --online`` reaches the acceptance of the one trained offline on the same rows with the same
settings: its acceptance length lies within the offline drafter's 95% bootstrap interval.

The chain's setting, smaller: the learned tiny target (``drafter.learned``, the session's ``learned_target``),
prompts of the tiny language's four tasks (``PER_TASK`` each, ``HELD`` of them held out by ``cap``) generated
greedily through ``draftgen emulate --model`` (vllm backend), then on the same merged rows and the same
``train`` settings (examples/tiny-chain.yaml's): offline ``extract`` (hf) + ``train``, and online ``train
--online`` through the checking proxy against ``draftgen emulate --model --extract-dir`` (fp32, as the offline
set). Both drafters are served by ``draftgen emulate --drafter`` and measured by ``accept`` (k = 3, vLLM
/metrics, bootstrap intervals over the held-out prompts). bench/bench_online.py measures the same at a larger
size, with the other served algorithms, the disk and the time.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import write_config  # noqa: E402
from _hidden_export_helpers import speculators_python  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.drafter import tinylang  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread  # noqa: E402
from draftgen.phases.accept.run import run_accept  # noqa: E402
from draftgen.phases.extract.run import run_extract  # noqa: E402
from draftgen.phases.generate.run import run_generate  # noqa: E402
from draftgen.phases.merge.run import run_merge  # noqa: E402
from draftgen.phases.prepare.run import run_prepare  # noqa: E402
from draftgen.phases.train.run import run_train  # noqa: E402
from draftgen.records import AcceptReport  # noqa: E402
from draftgen.rundir import MARKER, RunDir  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-chain.yaml"
PER_TASK, HELD, EPOCHS = 40, 10, 4
SERVED = "tiny-chain"


def _quiet(_s: str) -> None:
    return None


def _config(tmp: Path, target: Path, base_url: str) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    data["run_dir"] = str(tmp / "run")
    data["endpoint"]["base_url"] = base_url
    for d in data["datasets"]:
        d["path"], d["cap"] = str(tmp / "prompts" / f"{d['name']}.jsonl"), PER_TASK - HELD
    data["hidden_states"]["model"] = str(target)
    data["train"].update(speculators=str(speculators_python()), epochs=EPOCHS, checkpoint_freq=EPOCHS,
                         layer_ids=[1, 2, 3])  # the 4-layer target has no default layers (hidden.algorithms)
    data["accept"]["prompts"] = 4 * HELD
    return write_config(tmp, data, "offline.yaml")


def _accept(cfg_path: Path, target: Path, drafter: Path) -> AcceptReport:
    with start_in_thread(ModelServerOptions(model=str(target), port=0, threads=2, drafter=str(drafter),
                                            served_model_name=SERVED, num_speculative_tokens=3)) as srv:
        return run_accept(load_config(cfg_path), drafter=drafter, base_url=srv.base_url, echo=_quiet)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, learned_target: Path) -> dict[str, Any]:
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp("online-chain")
    tinylang.write_prompts(tmp / "prompts", PER_TASK, 25)
    try:
        with start_in_thread(ModelServerOptions(model=str(learned_target), port=0, threads=2,
                                                served_model_name=SERVED)) as gen:
            cfg_path = _config(tmp, learned_target, gen.base_url)
            cfg = load_config(cfg_path)
            run_prepare(cfg, echo=_quiet)
            assert run_generate(cfg, echo=_quiet).exit_code == 0
        run_merge(cfg, echo=_quiet)
        run_extract(load_config(cfg_path), echo=_quiet)
        off = run_train(load_config(cfg_path), echo=_quiet)
        on_root = tmp / "online-run"
        on_root.mkdir()
        for part in ("merged", "prepared"):
            shutil.copytree(tmp / "run" / part, on_root / part)
        shutil.copy(tmp / "run" / MARKER, on_root / MARKER)
        data = yaml.safe_load(cfg_path.read_text())
        data["run_dir"] = str(on_root)
        with start_in_thread(ModelServerOptions(model=str(learned_target), port=0, threads=2,
                                                extract_dir=str(tmp / "hs"), extract_layers=[1, 2, 3, 4],
                                                dtype="float32")) as srv:
            data["hidden_states"].update(base_urls=[srv.root_url], connector_dir=str(tmp / "hs"))
            data["train"]["online"] = True
            on_cfg = write_config(tmp, data, "online.yaml")
            on = run_train(load_config(on_cfg), echo=_quiet)
        return {"off": off, "on": on, "hs": tmp / "hs",
                "al_off": _accept(cfg_path, learned_target, RunDir(tmp / "run").train_drafter),
                "al_on": _accept(on_cfg, learned_target, RunDir(on_root).train_drafter)}
    finally:
        mp.undo()


@pytest.mark.slow
def test_online_drafter_reaches_the_offline_drafters_acceptance(both: dict[str, Any]) -> None:
    off, on = both["al_off"].acceptance, both["al_on"].acceptance
    assert off.ci95 is not None and on.ci95 is not None
    lo, hi = off.ci95
    summary = (f"AL offline {off.acceptance_length:.3f} [{lo:.3f}, {hi:.3f}], online {on.acceptance_length:.3f} "
               f"[{on.ci95[0]:.3f}, {on.ci95[1]:.3f}] over {both['al_off'].prompts} prompts")
    print("\n" + summary)
    assert lo <= on.acceptance_length <= hi, summary
    # both learned something the copy-last drafter cannot: not two untrained drafters agreeing at 1.0
    copy = next(a for a in both["al_off"].alternatives if a.name == "copy-last")
    assert off.acceptance_length > copy.acceptance_length + 0.2, (summary, copy.acceptance_length)
    assert on.acceptance_length > copy.acceptance_length + 0.2, (summary, copy.acceptance_length)


@pytest.mark.slow
def test_online_trained_on_the_same_rows_and_left_no_state_behind(both: dict[str, Any]) -> None:
    off, on = both["off"], both["on"]
    assert on.online is not None and on.online.excluded == 0 and on.online.requests >= on.online.rows
    assert on.online.rows == 4 * (PER_TASK - HELD) and off.steps_this_run > 0 and on.steps_this_run > 0
    assert not [p for p in both["hs"].rglob("*") if p.is_file()]  # every connector file was consumed and removed
