"""The data loop on the CPU chain (issue 35): a second round of generation steered by measured acceptance beats the same budget spread evenly.

On the learned tiny target (scripts/tiny-chain's, reused from ``DRAFTGEN_CHAIN_TARGET`` when it holds it),
with the language's four tasks as four datasets:

1. round 1, a deliberately uneven mix (``ROUND_ONE``: prompts per dataset, drawn by ``max_samples`` from a
   pool of ``POOL`` per task): prepare → generate (``draftgen emulate --model``, greedy, exact ids) → audit →
   merge → extract → train (``EPOCHS`` epochs);
2. its drafter measured on an evaluation run of its own (``EVAL`` prompts per task drawn with another seed, none
   in the pool): ``draftgen accept`` at k = 3, each prompt's counters from the server's per-request fields;
3. the round-1 run copied twice (its prepared prompts, raw responses and merged rows; not its hidden states or
   drafter); in one, ``plan --next-round --spread guided --acceptance <that pass> --add-tokens B``, in the
   other the same with ``--spread uniform``; then in each ``generate --round 2`` → audit → merge → extract,
   and a drafter trained on it from each of the training seeds ``SEEDS`` (same settings otherwise);
4. every round-2 drafter measured on the same evaluation prompts.

Generation runs one request at a time (``GEN_CONCURRENCY``): the server then computes each response alone, so
the data are the same on every run (with many in flight, batching changed the padded numerics enough to flip
a greedy token now and then, and round 1's data differed between runs). A drafter trained 24 epochs on a few
hundred rows still depends on its seed: each arm is therefore trained from several seeds, and an arm's
acceptance is pooled over its seeds' drafters (1 + Σ accepted / Σ drafts over seeds and prompts).

Beside round 1's drafter, on the same evaluation prompts: an independent draft LM (``draftgen train --draft-lm``:
a 2-layer Qwen3 decoder reading ids only, the drafter's trainable parameter count, draft vocabulary, rows,
steps, tokens and learning rate; the target's embedding and head frozen) replayed on the target's greedy
continuations (``accept --draft-lm``): ``al_trained_minus_draft_lm`` with its paired 95% interval.

``B`` is ``BUDGET_SHARE`` of round 1's supervised tokens. Figures: each drafter's AL per dataset, the
proposals' prompts per dataset, and the paired differences guided − uniform over the evaluation prompts
with 95% bootstrap intervals (prompts resampled within each dataset, the same prompts for both arms, and each
arm's training seeds resampled too, so the interval holds the training noise as well as the prompts'): on
the dataset weakest after round 1
(``al_guided_minus_uniform_weakest`` with ``_ci_lo``) and on the traffic-weighted mean (equal traffic:
``al_guided_minus_uniform_weighted``), and the weighted difference seed by seed. Each stage's wall time.

Needs the ``[extract]`` extra and speculators 0.9 (``DRAFTGEN_SPECULATORS`` or ``.venv-speculators``).
``--quick`` runs the same experiment (it has one size).

    python bench/bench_loop.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from bench._common import emit_result, machine_info
    from bench.bench_chain import load_chain_script
except ImportError:  # python bench/bench_loop.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import emit_result, machine_info  # type: ignore[no-redef]
    from bench_chain import load_chain_script  # type: ignore[no-redef]

TASKS = ("walk", "sort", "count", "close")
#: prompts a task can draw from (walk's language has 112 prompts in all; the others have many more)
POOL = {"walk": 80, "sort": 240, "count": 240, "close": 240}
EVAL = 24
EVAL_SEED = 4242
ROUND_ONE = {"walk": 48, "sort": 8, "count": 48, "close": 8}
BUDGET_SHARE = 0.5
#: training seeds of each round-2 arm (round 1's drafter, the basis of the proposal, is trained from the first)
SEEDS = (0, 1, 2)
#: requests in flight while generating: one, so that every run makes the same data (see the docstring)
GEN_CONCURRENCY = 1
#: training epochs of every drafter: its validation loss flat by then (the ``*_val_loss_change_last_quarter`` figures)
EPOCHS = 24
BOOT = 2000


def write_sources(work: Path, chain: Any) -> None:
    """``pool/<task>.jsonl`` (``POOL[task]`` prompts, drawn as the chain draws them) and ``eval-prompts/<task>.jsonl`` (``EVAL``
    others, drawn with ``EVAL_SEED``; walk has 112 prompts in all, so the pool leaves 32)."""
    from draftgen.drafter import tinylang
    from draftgen.store import atomic_write_bytes, encode_json

    pool = {t: tinylang.write_prompts(work / "pool", POOL[t], chain.PROMPT_SEED, tasks=(t,))[t] for t in TASKS}
    for task in TASKS:
        taken = {json.loads(ln)["messages"][0]["content"] for ln in pool[task].read_bytes().splitlines()}
        rng = random.Random(f"{EVAL_SEED}:{task}")
        picked: dict[str, None] = {}
        for _ in range(100_000):
            p = tinylang.draw(task, rng)
            if p not in taken:
                picked.setdefault(p, None)
            if len(picked) == EVAL:
                break
        assert len(picked) == EVAL, f"{task}: only {len(picked)} evaluation prompts outside the pool"
        atomic_write_bytes(work / "eval-prompts" / f"{task}.jsonl", b"".join(
            encode_json({"messages": [{"role": "user", "content": p}]}) + b"\n" for p in picked))


def write_cfg(chain: Any, work: Path, name: str, url: str, target: Path, *, source: str,
              counts: dict[str, int] | None, seed: int = SEEDS[0], run: str | None = None) -> Path:
    """The chain's example config ``name``.yaml for run ``run`` (default ``name``): datasets from ``source``/,
    ``max_samples`` from ``counts`` (None: every prompt), no merge cap, ``GEN_CONCURRENCY`` requests in flight
    while generating, ``EPOCHS`` epochs from training seed ``seed``."""
    import yaml

    path = chain.write_config(work, name, base_url=url, run=run or name, target=target,
                              train={"epochs": EPOCHS, "seed": seed})
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["partitions"] = {p: {**v, "concurrency": GEN_CONCURRENCY} for p, v in data["partitions"].items()}
    data["datasets"] = [{"name": t, "path": str(work / source / f"{t}.jsonl"),
                         **({"max_samples": counts[t]} if counts else {})} for t in TASKS]
    data["accept"] = {**data["accept"], "prompts": EVAL * len(TASKS)}
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def data_and_drafter(chain: Any, cfg_path: Path, url: str, echo: Any, *, round_: int | None = None) -> Path:
    """generate (starting ``round_`` when given) → audit → merge → extract → train; the drafter's folder."""
    from draftgen.config import load_config
    from draftgen.phases.audit.run import run_audit
    from draftgen.phases.generate.run import run_generate
    from draftgen.phases.merge.run import run_merge
    from draftgen.phases.prepare.run import run_prepare

    cfg = load_config(cfg_path)
    gen = run_generate(cfg, echo=echo, prepare=run_prepare, round=round_)
    if gen.exit_code != 0:
        raise RuntimeError(f"generate: {gen.message}")
    run_audit(cfg, echo=echo)
    run_merge(cfg, echo=echo)
    chain._extract(cfg_path, None, echo)
    return train(cfg_path, echo)


def train(cfg_path: Path, echo: Any) -> Path:
    from draftgen.config import load_config
    from draftgen.phases.train.run import run_train

    return Path(run_train(load_config(cfg_path), echo=echo).checkpoint)


def measure(chain: Any, eval_cfg: Path, target: Path, drafter: Path, work: Path, name: str, echo: Any,
            draft_lm: Path | None = None) -> Any:
    """``draftgen accept`` of ``drafter`` on the evaluation prompts (per-request fields, many in flight), with
    ``draft_lm`` replayed beside copy-last and lookup when given."""
    from draftgen.config import load_config
    from draftgen.phases.accept.run import run_accept

    with chain.serve(target, work / f"emulate-{name}.log", drafter=drafter, per_request=True) as url:
        return run_accept(load_config(eval_cfg), drafter=drafter, base_url=url, echo=echo, draft_lm=draft_lm)


def _al(rows: Sequence[Any]) -> float:
    drafts = sum(r.drafts for r in rows)
    return 1.0 + sum(r.accepted for r in rows) / drafts if drafts else 1.0


def pooled_al(reports: Sequence[Any], dataset: str) -> float:
    """The AL of ``dataset``'s prompts pooled over the drafters of ``reports`` (one per training seed)."""
    return _al([r for rep in reports for r in rep.per_prompt if r.dataset == dataset])


def paired(g: Sequence[Any], u: Sequence[Any], datasets: Sequence[str],
           weights: dict[str, float]) -> dict[str, list[float]]:
    """Per dataset and traffic-weighted: guided − uniform AL, each arm pooled over its seeds' drafters (``g``,
    ``u``: their accept reports), with its 95% bootstrap interval: prompts resampled within each dataset (the
    same draw for both arms: they saw the same prompts) and each arm's seeds resampled with replacement."""
    def counters(reps: Sequence[Any]) -> list[dict[str, tuple[float, float]]]:
        return [{r.sample_id: (r.accepted, r.drafts) for r in rep.per_prompt} for rep in reps]

    arms = counters(g), counters(u)
    of = {r.sample_id: r.dataset for rep in (*g, *u) for r in rep.per_prompt}
    ids = {d: sorted(s for s, ds in of.items() if ds == d and all(s in c for arm in arms for c in arm))
           for d in datasets}

    def al(arm: Sequence[dict[str, tuple[float, float]]], sids: list[str]) -> float:
        acc = sum(c[s][0] for c in arm for s in sids)
        drafts = sum(c[s][1] for c in arm for s in sids)
        return 1.0 + acc / drafts if drafts else 1.0

    def diff(draw: dict[str, list[str]], pick: tuple[Sequence[Any], Sequence[Any]]) -> dict[str, float]:
        per = {d: al(pick[0], draw[d]) - al(pick[1], draw[d]) for d in datasets}
        per["weighted"] = sum(weights[d] * per[d] for d in datasets)
        return per

    point = diff(ids, arms)
    rng = random.Random(0)
    reps = [diff({d: [rng.choice(ids[d]) for _ in ids[d]] for d in datasets},
                 ([rng.choice(arms[0]) for _ in arms[0]], [rng.choice(arms[1]) for _ in arms[1]]))
            for _ in range(BOOT)]
    out = {}
    for key, value in point.items():
        vals = sorted(r[key] for r in reps)
        out[key] = [round(value, 4), round(vals[int(0.025 * BOOT)], 4), round(vals[int(0.975 * BOOT) - 1], 4)]
    return out


def seeded_drafters(chain: Any, work: Path, spread: str, url: str, tpath: Path, eval_cfg: Path, first: Path,
                    stage: Any, echo: Any, f: dict[str, Any]) -> list[Any]:
    """Arm ``spread``'s drafter from each of ``SEEDS`` (``first``: the one trained with its data), each measured
    on the evaluation prompts, its validation-loss plateau in ``f``; each seed's ``train/`` kept as
    ``train-seed<s>/``."""
    run = work / spread
    out = []
    for seed in SEEDS:
        if seed != SEEDS[0]:
            with stage(f"round 2 ({spread}): train, seed {seed}"):
                drafter = train(write_cfg(chain, work, f"{spread}-seed{seed}", url, tpath, source="pool",
                                          counts=ROUND_ONE, seed=seed, run=spread), echo)
        else:
            drafter = first
        with stage(f"round 2 ({spread}): accept, seed {seed}"):
            out.append(measure(chain, eval_cfg, tpath, drafter, work, f"{spread}-seed{seed}", echo))
        for key, value in chain.plateau(run).items():
            f[f"{spread}_seed{seed}_{key}"] = value
        (run / "train").rename(run / f"train-seed{seed}")
    return out


def experiment(work: Path, target: Path | None, echo: Any = print) -> dict[str, Any]:
    from draftgen.config import load_config
    from draftgen.drafter.learned import build_learned_target
    from draftgen.phases.plan.rounds import run_next_round
    from draftgen.phases.prepare.run import run_prepare
    from draftgen.phases.train.draftlm import run_draft_lm
    from draftgen.rundir import RunDir

    chain = load_chain_script()
    stage = chain.Stages(echo)
    f: dict[str, Any] = {"times_s": stage.times}
    with stage("target"):
        tpath = build_learned_target((target or work / "target").resolve(), echo=echo)
    write_sources(work, chain)
    with chain.serve(tpath, work / "emulate-generate.log") as url:
        r1 = write_cfg(chain, work, "r1", url, tpath, source="pool", counts=ROUND_ONE)
        eval_cfg = write_cfg(chain, work, "eval", url, tpath, source="eval-prompts", counts=None)
        run_prepare(load_config(eval_cfg), echo=echo)
        with stage("round 1: generate, merge, extract, train"):
            d1 = data_and_drafter(chain, r1, url, echo)
        with stage("round 1: the draft LM (ids only, the drafter's size, steps and tokens)"):
            lm = run_draft_lm(load_config(r1), echo=echo)
        with stage("round 1: accept (with the draft LM replayed)"):
            m1 = measure(chain, eval_cfg, tpath, d1, work, "r1", echo, draft_lm=work / "r1" / "train" / "draft-lm")
        f.update(draft_lm_params=lm.trainable_params, drafter_params=lm.matched_to, draft_lm_steps=lm.steps,
                 draft_lm_loss_first=lm.loss_first, draft_lm_loss_last=lm.loss_last)
        vs = next(c for c in m1.comparisons if c.versus == "draft-lm")
        f["al_draft_lm"] = next(a.acceptance_length for a in m1.alternatives if a.name == "draft-lm")
        f["al_trained_minus_draft_lm"] = vs.difference
        if vs.ci95:
            f["al_trained_minus_draft_lm_ci_lo"], f["al_trained_minus_draft_lm_ci_hi"] = vs.ci95
        basis = RunDir(work / "eval").accept_report(m1.drafter_key, m1.pass_name)
        budget = round(BUDGET_SHARE * sum(
            d.supervised_tokens for d in load_json_stats(work / "r1")))
        f["budget_tokens"] = budget
        for key, value in chain.plateau(work / "r1").items():
            f[f"r1_{key}"] = value
        arms: dict[str, list[Any]] = {"r1": [m1]}
        for spread in ("guided", "uniform"):
            run = work / spread
            shutil.copytree(work / "r1", run, ignore=shutil.ignore_patterns("hidden", "train", "accept", "*.lock"))
            cfg_path = write_cfg(chain, work, spread, url, tpath, source="pool", counts=ROUND_ONE)
            plan = run_next_round(load_config(cfg_path), spread=spread, add_tokens=budget, acceptance=basis,
                                  echo=echo)
            f[f"{spread}_adds"] = {d.dataset: d.add_samples for d in plan.datasets}
            with stage(f"round 2 ({spread}): generate, merge, extract, train seed {SEEDS[0]}"):
                d2 = data_and_drafter(chain, cfg_path, url, echo, round_=2)
            arms[spread] = seeded_drafters(chain, work, spread, url, tpath, eval_cfg, d2, stage, echo, f)
    weights = {t: 1 / len(TASKS) for t in TASKS}
    for name, reps in arms.items():
        for t in TASKS:
            f[f"{t}_al_{name}"] = round(pooled_al(reps, t), 4)
        f[f"al_{name}"] = round(_al([r for rep in reps for r in rep.per_prompt]), 4)
    for spread in ("guided", "uniform"):
        changes = [f[f"{spread}_seed{s}_val_loss_change_last_quarter"] for s in SEEDS]
        f[f"{spread}_val_loss_change_last_quarter_worst"] = max(changes, key=abs)
    weakest = min(TASKS, key=lambda t: f[f"{t}_al_r1"])
    f["weakest"] = weakest
    for s, (g, u) in zip(SEEDS, zip(arms["guided"], arms["uniform"], strict=True), strict=True):
        f[f"weighted_guided_minus_uniform_seed{s}"] = round(
            sum(weights[t] * (pooled_al([g], t) - pooled_al([u], t)) for t in TASKS), 4)
    diffs = paired(arms["guided"], arms["uniform"], TASKS, weights)
    for key, (v, _lo, _hi) in diffs.items():
        f[f"{key}_guided_minus_uniform"] = v
    f["al_guided_minus_uniform_weakest"], f["al_guided_minus_uniform_weakest_ci_lo"], \
        f["al_guided_minus_uniform_weakest_ci_hi"] = diffs[weakest]
    f["al_guided_minus_uniform_weighted"], f["al_guided_minus_uniform_weighted_ci_lo"], \
        f["al_guided_minus_uniform_weighted_ci_hi"] = diffs["weighted"]
    return f


def load_json_stats(run: Path) -> list[Any]:
    from draftgen.records import MergeStats
    from draftgen.rundir import RunDir
    from draftgen.store import read_json

    return list(read_json(RunDir(run).merged_stats, MergeStats).datasets)


def flat(f: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in f.items() if not isinstance(v, dict)}
    for spread in ("guided", "uniform"):
        for t, n in f.get(f"{spread}_adds", {}).items():
            out[f"{spread}_adds_{t}"] = n
    for name, s in f["times_s"].items():
        out["stage_" + "".join(c if c.isalnum() else "_" for c in name).strip("_") + "_s"] = s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the same experiment (it has one size)")
    ap.parse_args()
    print(machine_info())
    keep = os.environ.get("DRAFTGEN_CHAIN_TARGET")
    with tempfile.TemporaryDirectory(prefix="dg-bench-loop-") as tmp:
        f = experiment(Path(tmp), Path(keep) if keep else None)
    print(f"round 1 ({', '.join(f'{t} {n}' for t, n in ROUND_ONE.items())} prompts), then +{f['budget_tokens']:,} "
          "supervised tokens:")
    for spread in ("guided", "uniform"):
        print(f"  {spread}: " + ", ".join(f"{t} +{n}" for t, n in f[f"{spread}_adds"].items()))
    print(f"  {'dataset':<8} {'round 1':>8} {'guided':>8} {'uniform':>8}   (round 2: pooled over {len(SEEDS)} "
          "training seeds)")
    for t in TASKS:
        print(f"  {t:<8} {f[f'{t}_al_r1']:>8.3f} {f[f'{t}_al_guided']:>8.3f} {f[f'{t}_al_uniform']:>8.3f}")
    print(f"  weakest after round 1: {f['weakest']}; guided - uniform there {f['al_guided_minus_uniform_weakest']:+.3f} "
          f"[{f['al_guided_minus_uniform_weakest_ci_lo']:+.3f}, {f['al_guided_minus_uniform_weakest_ci_hi']:+.3f}]; "
          f"traffic-weighted {f['al_guided_minus_uniform_weighted']:+.3f} "
          f"[{f['al_guided_minus_uniform_weighted_ci_lo']:+.3f}, {f['al_guided_minus_uniform_weighted_ci_hi']:+.3f}]")
    print("  traffic-weighted guided - uniform seed by seed: "
          + ", ".join(f"seed {s} {f[f'weighted_guided_minus_uniform_seed{s}']:+.3f}" for s in SEEDS))
    for name in ("r1", *(f"{a}_seed{s}" for a in ("guided", "uniform") for s in SEEDS)):
        print(f"  {name}: {f[f'{name}_epochs']} epochs, validation loss {f[f'{name}_val_loss_first']:.3f} → "
              f"{f[f'{name}_val_loss_last']:.3f}, last quarter vs the one before {f[f'{name}_val_loss_change_last_quarter']:+.1%}")
    print(f"  round 1's drafter ({f['drafter_params']:,} trainable parameters) vs the draft LM "
          f"({f['draft_lm_params']:,}, ids only, {f['draft_lm_steps']} steps): AL {f['al_r1']:.3f} vs "
          f"{f['al_draft_lm']:.3f}, difference {f['al_trained_minus_draft_lm']:+.3f} "
          f"[{f.get('al_trained_minus_draft_lm_ci_lo', float('nan')):+.3f}, "
          f"{f.get('al_trained_minus_draft_lm_ci_hi', float('nan')):+.3f}]")
    emit_result("loop", flat(f))


if __name__ == "__main__":
    main()
