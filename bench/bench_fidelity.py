"""Provider fidelity on the chain's target (issue 35): a provider serving a perturbed copy of the target is flagged, a faithful one is not.

The learned tiny target of scripts/tiny-chain (reused from ``DRAFTGEN_CHAIN_TARGET`` when it holds it) stands
behind ``draftgen emulate --model`` model servers in threads, each a "provider" (``--provider NAME``): the
faithful one serves the target itself, the quantized stand-ins the same weights with seeded Gaussian noise of
``PERTURBS`` × each tensor's rms (``--perturb``). Two runs of the whole pipeline (prepare → generate, the
balancer splitting the rows between the servers → audit → merge → extract, hf backend, fp32), on the chain's
four tasks (``PER_TASK`` prompts each, greedy, 96 tokens):

- faithful + two perturbed: extract's fidelity check (the completion ids' mean log-prob and the target's top-1
  agreement from the stored final states, 95% bootstrap intervals, flagged when the top-1 gap to the best
  provider lies wholly above ``hidden_states.fidelity_margin``);
- faithful + faithful (two names, the same weights): nothing may be flagged.

Figures: ``fidelity_perturbed_flagged`` (1: the 20% stand-in flagged), ``fidelity_faithful_flagged`` (providers
flagged among two faithful ones), each provider's top-1 agreement and mean log-prob with intervals, its gap to
the best with its interval, and whether it was flagged.

    python bench/bench_fidelity.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    from bench._common import emit_result, machine_info
    from bench.bench_chain import load_chain_script
except ImportError:  # python bench/bench_fidelity.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import emit_result, machine_info  # type: ignore[no-redef]
    from bench_chain import load_chain_script  # type: ignore[no-redef]

#: the quantized stand-ins' noise: at 5% the learned target's greedy text barely moves (its top-1 gap stays
#: under ``fidelity_margin`` 0.02, so it is rightly not flagged); at 20% it moves enough to matter
PERTURBS = {"q05": 0.05, "q20": 0.20}
FLAGGED = "q20"
PER_TASK = 24
SERVED = "tiny-chain"


@contextlib.contextmanager
def servers(target: Path, *specs: tuple[str, float]) -> Iterator[list[str]]:
    """One model server per (provider, perturbation scale), in threads; their base URLs."""
    from draftgen.emulator.real.server import ModelServerOptions, start_in_thread

    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(start_in_thread(ModelServerOptions(
            model=str(target), port=0, threads=1, served_model_name=SERVED, provider=name, perturb=scale,
            perturb_seed=7))).base_url for name, scale in specs]


def run(chain: Any, work: Path, name: str, target: Path, specs: tuple[tuple[str, float], ...]) -> Any:
    """The pipeline through extract with rows from ``specs``' providers; extract's fidelity figures."""
    import yaml

    from draftgen.config import load_config
    from draftgen.phases.pipeline import run_pipeline
    from draftgen.records import HiddenManifest
    from draftgen.rundir import RunDir
    from draftgen.store import read_json

    with servers(target, *specs) as urls:
        path = chain.write_config(work, name, base_url=urls[0], run=name, target=target)
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data["endpoint"] = {**data["endpoint"], "base_urls": urls}
        data["endpoint"].pop("base_url", None)
        # one request at a time per partition: the balancer splits the rows about evenly between the providers
        data["partitions"] = {p: {"concurrency": 1, "max_tokens": 96} for p in ("short", "long")}
        data["datasets"] = [{**d, "cap": None} for d in data["datasets"]]
        data["hidden_states"] = {**data["hidden_states"], "extract": True}
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        cfg = load_config(path)
        rep = run_pipeline(cfg, argv=["draftgen", "run", str(path)], echo=lambda _line: None, yes=True)
        if rep.exit_code != 0:
            raise RuntimeError(f"{name}: {rep.message}")
    fid = read_json(RunDir(cfg.run_path).hidden / "manifest.json", HiddenManifest).checks.fidelity
    assert fid is not None, f"{name}: extract measured no provider fidelity"
    return fid


def figures(chain: Any, work: Path, target: Path | None) -> dict[str, Any]:
    from draftgen.drafter import tinylang
    from draftgen.drafter.learned import build_learned_target

    tpath = build_learned_target((target or work / "target").resolve(), echo=print)
    tinylang.write_prompts(work / "prompts", PER_TASK, chain.PROMPT_SEED)
    f: dict[str, Any] = {"prompts": PER_TASK * len(tinylang.TASKS)}
    pair = run(chain, work, "perturbed", tpath, (("faithful", 0.0), *PERTURBS.items()))
    for p in pair.providers:
        name = p.provider
        f[f"{name}_rows"], f[f"{name}_top1"] = p.rows, round(p.top1, 4)
        f[f"{name}_logprob_mean"], f[f"{name}_flagged"] = round(p.logprob_mean, 4), int(p.flagged)
        if p.top1_ci95:
            f[f"{name}_top1_ci_lo"], f[f"{name}_top1_ci_hi"] = (round(x, 4) for x in p.top1_ci95)
        f[f"{name}_top1_gap"] = round(p.top1_gap, 4)
        if p.top1_gap_ci95:
            f[f"{name}_top1_gap_ci_lo"], f[f"{name}_top1_gap_ci_hi"] = (round(x, 4) for x in p.top1_gap_ci95)
    f["fidelity_perturbed_flagged"] = f[f"{FLAGGED}_flagged"]
    f["fidelity_margin"] = pair.margin
    same = run(chain, work, "faithful", tpath, (("faithful-a", 0.0), ("faithful-b", 0.0)))
    f["fidelity_faithful_flagged"] = sum(p.flagged for p in same.providers)
    for p in same.providers:
        f[f"{p.provider.replace('-', '_')}_top1"] = round(p.top1, 4)
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the same measurement (it has one size)")
    ap.parse_args()
    print(machine_info())
    keep = os.environ.get("DRAFTGEN_CHAIN_TARGET")
    with tempfile.TemporaryDirectory(prefix="dg-bench-fidelity-") as tmp:
        f = figures(load_chain_script(), Path(tmp), Path(keep) if keep else None)
    print(f"{f['prompts']} prompts of the chain's four tasks, greedy; fidelity_margin {f['fidelity_margin']}:")
    for name in ("faithful", *PERTURBS):
        ci = f" [{f[f'{name}_top1_ci_lo']:.3f}, {f[f'{name}_top1_ci_hi']:.3f}]" if f"{name}_top1_ci_lo" in f else ""
        gap = (f", gap {f[f'{name}_top1_gap']:.3f} [{f[f'{name}_top1_gap_ci_lo']:.3f}, "
               f"{f[f'{name}_top1_gap_ci_hi']:.3f}]" if f"{name}_top1_gap_ci_lo" in f else "")
        print(f"  {name} (perturbed {PERTURBS.get(name, 0.0):.0%}): {f[f'{name}_rows']} rows, top-1 agreement "
              f"{f[f'{name}_top1']:.3f}{ci}, mean log-prob {f[f'{name}_logprob_mean']:.3f}{gap}"
              + ("  FLAGGED" if f[f"{name}_flagged"] else ""))
    print(f"  two faithful providers: {f['fidelity_faithful_flagged']} flagged")
    emit_result("fidelity", f)


if __name__ == "__main__":
    main()
