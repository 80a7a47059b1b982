"""``draftgen accept CONFIG --drafter PATH``: the served drafter's acceptance on held-out prompts.

Reads the prepared prompts (``prepared/<dataset>/prompts.jsonl``), the merged shards' sample ids
(``merged/manifest.json`` → its Parquet files) and, for a drafter under ``train/``, ``train/log.jsonl``.
Writes one ``AcceptReport`` per pass, ``accept/<drafter key>/<pass name>.json`` (the key: the drafter folder's
last two path parts and a digest of its resolved path, ``drafter_key``; the name: the server's kind, the number
of prompts and a digest of their sample ids, ``pass_name``): a pass of another server or prompt set never
replaces it; the same drafter, server and prompts measured again do. ``accept/acceptance.json``, the run's
latest (what ``status``, the report and the pipeline's up-to-date check read), is a copy of the latest pass of
the run's own drafter (``phase_drafter``: ``accept.drafter``, else ``train/drafter``, or its ``train/eagle3``;
any drafter while the run has none) over the configured prompts (a ``--prompts`` pass of fewer than
``accept.prompts`` keeps its own file only); ``latest_reason`` says why a pass is not.

1. Held-out prompts (``accept.heldout``): prepared prompts in no merged row (train or validation) by sample
   id or by content (merge's prompt dedupe key), ordered by sha256 of the sample id and taken round-robin
   over ``accept.datasets`` until ``accept.prompts``. With no merge yet, every prepared prompt is eligible
   (a note says so).
2. They are sent greedily (temperature 0, ``accept.max_tokens``) to the server that serves the target with
   the drafter (``accept.passes``). The server's kind is ``accept.server``, or with ``auto`` the endpoint's
   kind when that backend reports acceptance, else vLLM; its ``Capabilities.acceptance`` says how acceptance
   is read:
   - ``metrics`` (vLLM): through draftgen's backend of that kind (chat completions). Each prompt's counters
     come from its response's ``metrics.speculative_decoding`` when the server sends them (vLLM
     ``--per-request-spec-decode-metrics``; ``accept.per_request``), ``accept.concurrency`` in flight; else
     ``GET {root}/metrics`` is read around each request, sent one at a time (``accept.one_at_a_time``). The
     ``vllm:spec_decode_*`` counts give AL = 1 + accepted / drafts, per position accepted_per_pos[i] /
     drafts, acceptance rate accepted / draft_tokens (``accept.counters``);
   - ``meta_info`` (SGLang): native ``POST {root}/generate`` with the prompt ids rendered by the target's
     profile; each response's ``meta_info`` gives ``completion_tokens`` and ``spec_verify_ct``, and AL =
     Σcompletion_tokens / Σspec_verify_ct.
   A counter that went down between the scrapes (a restarted server), per-request counts that do not add up,
   or a run without a single draft is an error naming the fix. Each prompt's counters, joined to its dataset,
   prompt length bucket and tags (``datasets[].tags_field``), are also written one typed record a line
   (``records.PromptAcceptance``) to ``accept/<drafter key>/<pass name>.prompts.jsonl``.
3. Beside the drafter, on the same prompts (``accept.figures``): copy-last and n-gram lookup, replayed
   on the target's greedy continuations of this pass (``drafter.baselines``), and with ``--zero-aux-url``
   (``accept.zero_aux_url``) the same drafter fed zeroed aux states by a second server; every figure with a
   95% bootstrap interval over the prompts, the paired differences, and per dataset (and per dataset and tag,
   for a dataset whose held-out prompts carry tags: the report's ``tags``).
4. With ``--baseline-url`` (``accept.baseline_url``) the same prompts go to a server without the drafter:
   tokens/s with and without speculation, and their ratio.
5. Offline estimate: AL ≈ 1 + Σ_k Π_{j≤k} cond_acc_j from the drafter's own training log, the run's
   ``train/log.jsonl`` when the drafter folder is under ``train/`` but not ``train/previous/`` (its last
   validation record, else its last step), else ``accept.offline_cond_acc``, else none; shown next to the
   measured AL.
6. Which k to serve (``accept.kchoice``): the acceptance length at every k up to the served one, with
   intervals; the expected speedup per k and ``accept.concurrencies``, calibrated on the ``--baseline-url``
   speedup; the recommended k and any slow-down warning (the report's ``k_choice``).
7. What the drafter trained on (``_training``): for this run's ``train/drafter`` or ``train/eagle3`` its
   ``train/train.json``, for a drafter a refused run set aside in ``train/previous/`` the ``train.json`` beside
   it. One that trained on fewer samples than ``train.min_trained_fraction`` of those its batches asked for (or
   on none), or whose train.json says that run published no drafter, gets a warning (the report's
   ``warnings``, one line after the acceptance length). For any other (external) drafter nothing is read: a
   note says the floor was not checked.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from draftgen.config import RunConfig
from draftgen.drafter.baselines import Propose
from draftgen.errors import APIError, ConfigError, InputError
from draftgen.phases import Echo
from draftgen.phases.accept.counters import (
    PromSample,
    SGLangMeta,
    SpecCounters,
    offline_al,
    parse_prometheus,
    sglang_acceptance,
    vllm_acceptance,
    vllm_counters,
)
from draftgen.phases.accept.figures import compare, comparison_lines
from draftgen.phases.accept.heldout import held_out_prompts
from draftgen.phases.accept.kchoice import k_choice, k_lines
from draftgen.phases.accept.passes import Pass, sglang_pass, vllm_pass
from draftgen.records import AcceptReport, PromptRecord, TrainLogRecord, TrainReport
from draftgen.rundir import RunDir
from draftgen.runview.chain import beats, verdict
from draftgen.store import (
    atomic_write_bytes,
    atomic_write_json,
    encode_json,
    iter_jsonl,
    read_json,
    read_json_object,
)

if TYPE_CHECKING:
    from draftgen.phases import PhaseContext, PhaseOutcome
    from draftgen.tokens import Profile

__all__ = [
    "PromSample",
    "SGLangMeta",
    "SpecCounters",
    "drafter_key",
    "latest_reason",
    "offline_al",
    "parse_prometheus",
    "pass_name",
    "run_accept",
    "sglang_acceptance",
    "vllm_acceptance",
    "vllm_counters",
]


#: the server kind ``accept.server: auto`` measures when the endpoint's kind reports no acceptance
_DEFAULT_SERVER = "vllm"


# -- offline estimate and the drafter ----------------------------------------------------------------------


def _from_train(folder: Path, rd: RunDir) -> bool:
    """The drafter folder is inside this run's ``train/`` (its training log is ``train/log.jsonl``), and not
    one set aside in ``train/previous/`` (trained before that log's last run)."""
    resolved = folder.resolve()
    return resolved.is_relative_to(rd.train.resolve()) and not resolved.is_relative_to(rd.train_previous.resolve())


def _train_json(rd: RunDir, folder: Path) -> Path | None:
    """The train.json that describes the drafter ``folder``: this run's for its train/drafter or train/eagle3,
    the one beside it for a drafter set aside in train/previous/; None for any other folder."""
    resolved = folder.resolve()
    for home in (rd.train, rd.train_previous):
        if resolved in ((home / rd.train_drafter.name).resolve(), (home / rd.train_eagle.name).resolve()):
            return home / rd.train_report.name
    return None


def _training(cfg: RunConfig, rd: RunDir, folder: Path) -> tuple[TrainReport | None, list[str], list[str]]:
    """The drafter's train.json (``_train_json``), the warnings about what it trained on and the notes."""
    path = _train_json(rd, folder)
    floor = cfg.train.min_trained_fraction
    if path is None:
        return None, [], [f"{folder} is not this run's train/drafter or train/eagle3: how many samples it trained "
                          "on is not known here (train.min_trained_fraction not checked)"]
    if not path.is_file():
        return None, [], [f"{path}: not there; how many samples the drafter trained on is not known"]
    from draftgen.records import below_floor, trained_line

    rep = read_json(path, TrainReport)
    if rep.exit_code != 0 or rep.checkpoint is None:
        return rep, [f"{path} says its run published no drafter ({rep.message}); {folder} is not that run's"], []
    if rep.samples_trained is None or rep.samples_asked is None:
        return rep, [], [f"{path} does not say how many samples the drafter trained on (a draftgen before schema "
                          "3): train.min_trained_fraction not checked"]
    if below_floor(rep.samples_trained, rep.samples_asked, floor):
        line = trained_line(rep.samples_trained, rep.samples_asked, rep.train_rows or 0, rep.samples)
        return rep, [f"the drafter is below the sample floor: {line}, under train.min_trained_fraction {floor} "
                     f"({path}); its acceptance is not a trained drafter's"], []
    return rep, [], []


def _offline(cfg: RunConfig, rd: RunDir, folder: Path) -> tuple[list[float], str | None]:
    """The per-step conditional accuracies of the offline estimate and where they come from: the run's training
    log for a drafter under ``train/``, else ``accept.offline_cond_acc``, else none."""
    path = rd.train_log
    if not _from_train(folder, rd):
        if cfg.accept.offline_cond_acc:
            return list(cfg.accept.offline_cond_acc), "accept.offline_cond_acc"
        return [], None
    last_val: TrainLogRecord | None = None
    last_train: TrainLogRecord | None = None
    for _, line in iter_jsonl(path, TrainLogRecord):
        if line.kind == "val":
            last_val = line
        else:
            last_train = line
    rec = last_val or last_train
    if rec is not None and rec.cond_acc_k:
        which = "validation" if rec is last_val else "train"
        return list(rec.cond_acc_k), f"{path} ({which}, step {rec.global_step})"
    if cfg.accept.offline_cond_acc:
        return list(cfg.accept.offline_cond_acc), "accept.offline_cond_acc"
    return [], None


def drafter_key(folder: Path) -> str:
    """The drafter's report folder name under ``accept/``: the folder's last two path parts (readable) and the
    first 10 hex digits of sha256 of its resolved path (two folders of the same name stay apart)."""
    resolved = folder.resolve()
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(resolved.parts[-2:])).strip("._-") or "drafter"
    return f"{name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:10]}"


def pass_name(server: str, sample_ids: Sequence[str], served_k: int | None = None) -> str:
    """The pass's report name in its drafter's folder: the server's kind, the number of prompts and the first
    10 hex digits of sha256 of their sample ids in order (another prompt set, another file); ``-k<N>`` after
    them when the server drafted another number of tokens than the drafter's config says (``served_k``)."""
    digest = hashlib.sha256("\n".join(sample_ids).encode()).hexdigest()[:10]
    if served_k is not None:
        return f"{server}-{len(sample_ids)}p-{digest}-k{served_k}"
    return f"{server}-{len(sample_ids)}p-{digest}"


def latest_reason(cfg: RunConfig, rd: RunDir, folder: Path, prompts: int | None) -> str | None:
    """Why a pass of ``folder`` over ``prompts`` prompts (None: ``accept.prompts``) does not become the run's
    latest (``accept/acceptance.json``), or None when it does: the latest is the run's own drafter
    (``phase_drafter``, or its ``train/eagle3`` twin; any drafter while the run has none) over at least
    ``accept.prompts`` prompts."""
    own = phase_drafter(cfg, rd)
    twins = {own.resolve()} | (set() if cfg.accept.drafter else {rd.train_eagle.resolve()})
    if (own / "config.json").is_file() and folder.resolve() not in twins:
        return f"{folder} is not the run's own drafter ({own})"
    if prompts is not None and prompts < cfg.accept.prompts:
        return f"{prompts} prompts, fewer than accept.prompts ({cfg.accept.prompts})"
    return None


def _write_report(cfg: RunConfig, rd: RunDir, report: AcceptReport, folder: Path, prompts: int | None,
                  other_k: int | None) -> list[str]:
    """The pass's own report (and its prompts' records), and a copy as the run's latest when it is that
    (``latest_reason``; never a pass served at ``other_k`` drafted tokens, not the drafter's own); returns the
    line saying where it went."""
    out = rd.accept_report(report.drafter_key, report.pass_name)
    atomic_write_bytes(rd.accept_prompts(report.drafter_key, report.pass_name),
                       b"".join(encode_json(r) + b"\n" for r in report.per_prompt))
    atomic_write_json(out, report)
    why = latest_reason(cfg, rd, folder, prompts) if other_k is None else \
        f"served at k={other_k}, not the drafter's own k"
    if why is None:
        atomic_write_json(rd.accept_json, report)
        return [f"accept: report written to {out} (and {rd.accept_json}, the run's latest)"]
    return [f"accept: report written to {out}; {rd.accept_json} (the run's latest) left as it is: {why}"]


def _drafter_k(folder: Path) -> int | None:
    """The drafter's speculative tokens (speculators config), None when it does not say; refuses a folder that
    is not a drafter checkpoint."""
    path = folder / "config.json"
    try:
        d = read_json_object(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; --drafter must name the drafter checkpoint the server serves") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from None
    if d.get("speculators_model_type") is None and not any("Eagle" in str(a) for a in d.get("architectures") or []):
        raise InputError(f"{path}: not an EAGLE drafter config (no speculators_model_type, no *Eagle* architecture)")
    try:
        return int(d["speculators_config"]["proposal_methods"][0]["speculative_tokens"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


# -- the phase ---------------------------------------------------------------------------------------------


def _server(cfg: RunConfig) -> tuple[str, str]:
    """The kind of the server measured (``accept.server``; ``auto``: the endpoint's kind when its backend
    reports acceptance, else ``_DEFAULT_SERVER``) and how it reports acceptance (its
    ``Capabilities.acceptance``: ``metrics`` or ``meta_info``)."""
    from draftgen.backends import capabilities

    server: str = cfg.accept.server
    if server == "auto":
        server = cfg.endpoint.kind if capabilities(cfg.endpoint.kind).acceptance else _DEFAULT_SERVER
    acceptance = capabilities(server).acceptance
    if acceptance is None:
        raise ConfigError(f"accept.server {server!r} does not report a drafter's acceptance; use auto or a backend "
                          "that does (vllm, sglang)")
    return server, acceptance


def _no_drafts(url: str, acceptance: str, what: str = "the drafter") -> APIError:
    if acceptance == "meta_info":
        return APIError(f"{url}: no request reported spec_verify_ct; start SGLang with {what} "
                        "(--speculative-algorithm EAGLE3 --speculative-draft-model-path ...)")
    return APIError(f"{url}: vllm:spec_decode_num_drafts did not move during the run; is {what} enabled "
                    "(--speculative-config '{\"method\": \"eagle3\", ...}')?")


def _known_ids(cfg: RunConfig, profile: Profile | None, chosen: Sequence[PromptRecord],
               raw: Sequence[tuple[list[int] | None, list[int]] | None]) -> list[tuple[list[int], list[int]] | None]:
    """(prompt ids, output ids) per prompt: the server's, with prompt ids the server did not return rendered by
    the model's profile (loaded only then)."""
    out: list[tuple[list[int], list[int]] | None] = []
    for p, got in zip(chosen, raw, strict=True):
        if got is None:
            out.append(None)
            continue
        p_ids, o_ids = got
        if p_ids is None:
            if profile is None:
                from draftgen.tokens import profile_from_config

                profile = profile_from_config(cfg)
            p_ids = profile.prompt_ids(p.messages, p.tools)
        out.append((list(p_ids), list(o_ids)))
    return out


class _Measure:
    """One pass of the held-out prompts against a server: SGLang ``/generate`` (``meta_info``, the prompts' ids
    rendered once by ``profile``) or vLLM chat completions (``/metrics`` read around them when ``scrape``)."""

    def __init__(self, cfg: RunConfig, server: str, acceptance: str, chosen: Sequence[PromptRecord],
                 profile: Profile | None) -> None:
        self.cfg, self.server, self.acceptance, self.chosen = cfg, server, acceptance, chosen
        self.sg_ids = ([profile.prompt_ids(p.messages, p.tools) for p in chosen]
                       if acceptance == "meta_info" and profile is not None else [])

    def __call__(self, at: str, scrape: bool, concurrency: int | None = None) -> Pass:
        if self.acceptance == "meta_info":
            return asyncio.run(sglang_pass(self.cfg, self.server, at, self.chosen, self.sg_ids))[0]
        return asyncio.run(vllm_pass(self.cfg, self.server, at, self.chosen, scrape=scrape,
                                     one_at_a_time=self.cfg.accept.one_at_a_time,
                                     per_request=self.cfg.accept.per_request == "auto", concurrency=concurrency))


def _zero_aux(measure: _Measure, url: str, acceptance: str, echo: Echo) -> Pass:
    """The pass against the server that feeds the drafter zeroed aux states (``accept.zero_aux_url``)."""
    echo(f"accept: the zero-aux ablation → {url}")
    zero = measure(url, True)
    if zero.figures is None:
        raise _no_drafts(url, acceptance, "the drafter (with zeroed aux states)")
    return zero


def run_accept(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
               drafter: str | Path, base_url: str | None = None, baseline_url: str | None = None,
               zero_aux_url: str | None = None, prompts: int | None = None,
               draft_lm: str | Path | None = None) -> AcceptReport:
    """Measure the served drafter's acceptance (see the module docstring); write and return the report.
    ``profile``: the already loaded profile of ``cfg.model``, for prompt ids the server does not return
    (default: loaded when needed). ``force``: nothing to accept (accept checks no provenance); the one phase
    signature. ``drafter``: the checkpoint folder the server serves; ``base_url``/``baseline_url``/``zero_aux_url``:
    the servers with it, without it, and with it fed zeroed aux states (default: the config's); ``prompts``:
    how many held-out prompts (default ``accept.prompts``); ``draft_lm``: a draft LM folder (``draftgen train
    --draft-lm``) replayed on the same continuations beside copy-last and lookup (default ``accept.draft_lm``)."""
    rd = RunDir(cfg.run_path)
    folder = Path(drafter)
    k = _drafter_k(folder)
    url = base_url or cfg.endpoint.base_url or (cfg.endpoint.base_urls[0] if cfg.endpoint.base_urls else None)
    if not url:
        raise ConfigError("accept needs the server's URL: pass --base-url (or set endpoint.base_url)")
    baseline = baseline_url or cfg.accept.baseline_url
    zero_url = zero_aux_url or cfg.accept.zero_aux_url
    n = prompts if prompts is not None else cfg.accept.prompts
    if n < 1:
        raise ConfigError(f"accept.prompts is {n}; it must be 1 or more")
    held = held_out_prompts(cfg, rd, n)
    chosen, notes = held.prompts, list(held.notes)
    server, acceptance = _server(cfg)
    echo(f"accept: {len(chosen)} held-out prompts → {url} ({server}), max_tokens {cfg.accept.max_tokens}"
         + (f"; {held.excluded_by_content} left out as their content is in a merged row"
            if held.excluded_by_content else ""))
    if acceptance == "meta_info" and profile is None:
        from draftgen.tokens import profile_from_config

        profile = profile_from_config(cfg)
    measure = _Measure(cfg, server, acceptance, chosen, profile)
    main = measure(url, True)
    if main.figures is None:
        raise _no_drafts(url, acceptance)
    figures = main.figures
    base_fig = measure(baseline, False, main.concurrency).throughput if baseline else None  # timed alike
    zero = _zero_aux(measure, zero_url, acceptance, echo) if zero_url else None
    # the tokens a verify step drafted, as the server counted them (vLLM: draft tokens / drafts; SGLang: unknown)
    served = round(figures.draft_tokens / figures.drafts) if figures.drafts > 0 and figures.draft_tokens > 0 else None
    if served is not None and k is not None and served != k:
        notes.append(f"the server drafts {served} tokens a step; the drafter's config says {k}: the figures are "
                     f"at k={served}")
    other_k = served if served is not None and k is not None and served != k else None
    k = served or k
    ids = _known_ids(cfg, profile, chosen, main.ids)
    lm = draft_lm or cfg.accept.draft_lm
    extra = {"draft-lm": _draft_lm(Path(lm), cfg)} if lm else None
    cmp = compare(main.prompts, ids, k, counted=main.counted and (zero is None or zero.counted),
                  zero_rows=zero.prompts if zero is not None else None, zero_url=zero_url, extra=extra)
    figures.ci95 = cmp.ci95
    cond, source = _offline(cfg, rd, folder)
    trained, warnings, trained_notes = _training(cfg, rd, folder)
    report = AcceptReport(
        drafter=str(folder), drafter_key=drafter_key(folder), excluded_by_content=held.excluded_by_content,
        pass_name=pass_name(server, [p.sample_id for p in chosen], other_k),
        server=server, prompts=len(chosen), sample_ids=[p.sample_id for p in chosen],
        max_tokens=cfg.accept.max_tokens, acceptance=figures, speculative=main.throughput, baseline=base_fig,
        speedup=(round(main.throughput.tokens_per_s / base_fig.tokens_per_s, 4)
                 if base_fig and base_fig.tokens_per_s else None),
        k=k, offline_al=round(offline_al(cond), 4) if cond else None, offline_cond_acc=cond,
        offline_source=source, alternatives=cmp.alternatives, comparisons=cmp.comparisons, datasets=cmp.datasets,
        tags=cmp.tags,
        per_prompt=main.prompts, notes=notes + main.notes + cmp.notes + trained_notes, created_at=time.time(),
        samples_trained=trained.samples_trained if trained else None,
        samples_asked=trained.samples_asked if trained else None, warnings=warnings)
    report.k_choice = k_choice(report, cfg.accept, measured_concurrency=main.concurrency)
    written = _write_report(cfg, rd, report, folder, prompts, other_k)
    for line in summary_lines(report) + written:
        echo(line)
    return report


def _draft_lm(folder: Path, cfg: RunConfig) -> Callable[[], Propose]:
    """The draft LM as a fresh-proposer factory (one model, loaded once; its target from the config when set)."""
    from draftgen.drafter.draftlm import load_proposer
    from draftgen.target import model_ref_of

    propose = load_proposer(folder, Path(model_ref_of(cfg)) if cfg.hidden_states.model else None)
    return lambda: propose


def summary_lines(rep: AcceptReport) -> list[str]:
    """The report in a few lines: AL measured (with its interval) next to the offline estimate, per position,
    the alternatives on the same prompts, the comparisons, per dataset (and tag), the verdict (``runview.chain.verdict``),
    tokens/s."""
    a = rep.acceptance
    ci = f" [{a.ci95[0]:.3f}, {a.ci95[1]:.3f}]" if a.ci95 else ""
    lines = [f"acceptance length {a.acceptance_length:.3f}{ci} ({a.source}, {rep.prompts} prompts)"
             + (f"  offline estimate {rep.offline_al:.3f}" if rep.offline_al is not None else "")]
    lines.extend(f"warning: {w}" for w in rep.warnings)
    if a.per_position:
        lines.append("per position " + " ".join(f"{v:.3f}" for v in a.per_position)
                     + (f"  acceptance rate {a.acceptance_rate:.3f}" if a.acceptance_rate is not None else ""))
    lines.extend(comparison_lines(rep.alternatives, rep.comparisons, rep.datasets, rep.tags))
    said = verdict(rep)
    if said is not None:
        lines.append(f"verdict: {said}" + ("" if beats(rep) else " Prompt lookup (vLLM's ngram method) needs no "
                                                              "drafter: do not deploy this one."))
    s = rep.speculative
    line = f"tokens/s {s.tokens_per_s:.1f} with the drafter"
    if rep.baseline is not None:
        line += f", {rep.baseline.tokens_per_s:.1f} without (×{rep.speedup or 0:.2f})"
    lines.append(line)
    lines.extend(k_lines(rep))
    lines.extend(f"note: {n}" for n in rep.notes)
    return lines


def phase_drafter(cfg: RunConfig, rd: RunDir) -> Path:
    """The drafter the ``accept`` phase measures: ``accept.drafter``, else the run's own ``train/drafter``."""
    return cfg.path(cfg.accept.drafter) if cfg.accept.drafter else rd.train_drafter


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``accept`` row of ``phases.PHASES`` (``accept.enabled``): measure ``phase_drafter`` on the server at
    ``accept.base_url`` (default ``endpoint.base_url``). A drafter folder that is not there is a ConfigError
    naming the keys (the train phase, or ``accept.drafter``)."""
    from draftgen.phases import PhaseOutcome

    cfg = ctx.cfg
    drafter = phase_drafter(cfg, ctx.rd)
    if not (drafter / "config.json").is_file():
        raise ConfigError(f"accept.enabled: no drafter checkpoint at {drafter}; enable the train phase "
                          "(train.enabled: true) or set accept.drafter to the folder the server serves")
    run_accept(cfg, echo=ctx.echo, profile=ctx.profile, force=ctx.options.force, drafter=drafter,
               base_url=cfg.accept.base_url)
    return PhaseOutcome()
