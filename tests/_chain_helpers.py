"""The drafter chain's result files as tiny-chain leaves them, written directly (no training, no server): an
accept report per pass, train/train.json and the hidden set's manifest, for the report's and status's
sections and ``runview.chain``."""

from __future__ import annotations

from pathlib import Path

from draftgen.records import (
    AcceptanceFigures,
    AcceptReport,
    AlternativeFigures,
    Comparison,
    DatasetAcceptance,
    HiddenCounts,
    HiddenLayerIds,
    HiddenManifest,
    HiddenTarget,
    ThroughputFigures,
    TrainLogRecord,
    TrainReport,
)
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json


def accept_report(diff: float, lo: float, hi: float, *, al: float = 2.04, server: str = "vllm", prompts: int = 64,
                  with_comparison: bool = True, created_at: float = 1.0,
                  key: str = "train-drafter-0123456789") -> AcceptReport:
    """An accept report whose drafter is ``diff`` [lo, hi] above the better no-model drafter (lookup 1.306),
    with tiny-chain's figures (its a3c8820 rehearsal)."""
    return AcceptReport(
        drafter="/run/train/drafter", drafter_key=key, pass_name=f"{server}-{prompts}p-0123456789", server=server,
        prompts=prompts, sample_ids=[f"s{i}" for i in range(prompts)], max_tokens=32, created_at=created_at, k=3,
        acceptance=AcceptanceFigures(source="vllm-metrics", acceptance_length=al, ci95=[1.87, 2.219],
                                     per_position=[0.6, 0.3, 0.14]),
        speculative=ThroughputFigures(base_url="http://x/v1", requests=prompts, completion_tokens=100, seconds=1.0,
                                      tokens_per_s=100.0),
        alternatives=[AlternativeFigures(name="copy-last", how="replay", acceptance_length=1.07, ci95=[1.036, 1.111],
                                         per_position=[0.05, 0.01, 0.01]),
                      AlternativeFigures(name="lookup", how="replay", acceptance_length=1.306, ci95=[1.21, 1.414],
                                         per_position=[0.2, 0.07, 0.03]),
                      AlternativeFigures(name="zero-aux", how="server", acceptance_length=1.26, ci95=[1.194, 1.332],
                                         per_position=[0.18, 0.06, 0.02])],
        comparisons=([Comparison(versus="copy-last", difference=0.97, ci95=[0.8, 1.15]),
                      Comparison(versus="lookup", difference=0.734, ci95=[0.573, 0.903]),
                      Comparison(versus="zero-aux", difference=0.78, ci95=[0.618, 0.941]),
                      Comparison(versus="no-model", difference=diff, ci95=[lo, hi])] if with_comparison else []),
        datasets=[DatasetAcceptance(dataset="walk", prompts=16, acceptance_length=2.248, ci95=[2.019, 2.53],
                                    alternatives={"copy-last": 1.0, "lookup": 1.0, "zero-aux": 1.069}),
                  DatasetAcceptance(dataset="count", prompts=16, acceptance_length=2.781, ci95=[2.521, 3.081],
                                    alternatives={"copy-last": 1.025, "lookup": 1.881, "zero-aux": 1.49})],
        offline_al=2.53)


def write_chain(run: Path) -> tuple[AcceptReport, AcceptReport, AcceptReport]:
    """tiny-chain's files in ``run``: the hidden set, train.json, and three accept passes (the trained drafter
    over 64 prompts by vLLM, the latest; over 16 by SGLang; an untrained drafter's); returns the passes."""
    rd = RunDir(run)
    atomic_write_json(rd.hidden / "manifest.json", HiddenManifest(
        schema="draftgen-hidden", target=HiddenTarget(name="/t"), hidden_size=128, num_layers=4, vocab_size=151669,
        layer_ids=HiddenLayerIds(aux=[1, 2, 3], final=4, convention="vllm", sglang_aux=[0, 1, 2],
                                 hf_hidden_states_index=[1, 2, 3]),
        dtype="fp32", norm_weight_sha256="0" * 64, norm_eps=1e-6, counts=HiddenCounts(samples=256, tokens=14346,
                                                                                       flagged=0),
        samples=[], throughput_tokens_per_s=5683.0))
    atomic_write_json(rd.train_report, TrainReport(
        exit_code=0, message=f"drafter: {rd.train_drafter} (vllm serve)", verifier="/t", hidden=str(rd.hidden),
        samples=256, layer_ids=[1, 2, 3], draft_vocab_size=256, ttt_steps=3, last_step=85, seconds=71.8,
        checkpoint=str(rd.train_drafter), offline_al=2.53, samples_trained=243, samples_asked=243,
        final_val=TrainLogRecord(kind="val", global_step=85, epoch=2, loss=2.9588, cond_acc_k=[0.66, 0.753, 0.747])))
    main = accept_report(0.734, 0.573, 0.903, created_at=1.0)
    sg = accept_report(0.7, 0.5, 0.9, server="sglang", prompts=16, al=1.964, created_at=2.0)
    other = accept_report(-1.0, -1.1, -0.9, al=1.013, created_at=3.0, key="untrained-drafter-9876543210")
    for r in (main, sg, other):
        atomic_write_json(rd.accept_report(r.drafter_key, r.pass_name), r)
    atomic_write_json(rd.accept_json, main)
    return main, sg, other
