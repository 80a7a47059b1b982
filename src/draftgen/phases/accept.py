"""``draftgen accept CONFIG --drafter PATH``: the served drafter's acceptance on held-out prompts.

Reads the prepared prompts (``prepared/<dataset>/prompts.jsonl``), the merged shards' sample ids
(``merged/manifest.json`` → its Parquet files) and, for a drafter under ``train/``, ``train/log.jsonl``.
Writes one ``AcceptReport`` per drafter, ``accept/<drafter key>/acceptance.json`` (the key: the drafter
folder's last two path parts and a digest of its resolved path, ``drafter_key``; measuring the same folder
again replaces its report), and a copy of the latest one as ``accept/acceptance.json``.

1. Held-out prompts (``phases.heldout``): prepared prompts in no merged row (train or validation) by sample
   id or by content (merge's prompt dedupe key), ordered by sha256 of the sample id and taken round-robin
   over ``accept.datasets`` until ``accept.prompts``. With no merge yet, every prepared prompt is eligible
   (a note says so).
2. They are sent greedily (temperature 0, ``accept.max_tokens``, ``accept.concurrency`` in flight) to the
   server that serves the target with the drafter:
   The server's kind is ``accept.server``, or with ``auto`` the endpoint's kind when that backend reports
   acceptance, else vLLM; its ``Capabilities.acceptance`` says how acceptance is read:
   - ``metrics`` (vLLM): through draftgen's backend of that kind (chat completions); ``GET {root}/metrics``
     is read before and after, and the ``vllm:spec_decode_*`` counters' deltas give AL = 1 + Δaccepted /
     Δdrafts, per position Δaccepted_per_pos[i] / Δdrafts, acceptance rate Δaccepted / Δdraft_tokens
     (counters summed over label sets, per position by its ``position`` label);
   - ``meta_info`` (SGLang): native ``POST {root}/generate`` with the prompt ids rendered by the target's
     profile; each response's ``meta_info`` gives ``completion_tokens`` and ``spec_verify_ct``, and AL =
     Σcompletion_tokens / Σspec_verify_ct.
   A counter that went down between the scrapes (a restarted server) or a run without a single draft is an
   error naming the fix. Every request goes through the backends' HTTP layer (the backend's one session,
   ``backends.http`` bounds, ``backends.errors`` classification) and retryable failures are retried by the
   one policy (``engine.retry``, ``retry.*``), as generate's; the ``/metrics`` scrapes are not retried.
3. With ``--baseline-url`` (``accept.baseline_url``) the same prompts go to a server without the drafter:
   tokens/s with and without speculation, and their ratio.
4. Offline estimate: AL ≈ 1 + Σ_k Π_{j≤k} cond_acc_j from the drafter's own training log, the run's
   ``train/log.jsonl`` when the drafter folder is under ``train/`` (its last validation record, else its last
   step), else ``accept.offline_cond_acc``, else none; shown next to the measured AL.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.config import RunConfig
from draftgen.errors import APIError, ConfigError, InputError
from draftgen.phases import Echo
from draftgen.phases.heldout import held_out_prompts
from draftgen.records import (
    AcceptanceFigures,
    AcceptReport,
    PromptRecord,
    ThroughputFigures,
    TrainLogRecord,
)
from draftgen.rundir import RunDir
from draftgen.store import atomic_write_json, iter_jsonl, read_json_object

if TYPE_CHECKING:
    import aiohttp

    from draftgen.engine.retry import RetryPolicy
    from draftgen.phases import PhaseContext, PhaseOutcome
    from draftgen.tokens import Profile

__all__ = [
    "PromSample",
    "SGLangMeta",
    "SpecCounters",
    "drafter_key",
    "offline_al",
    "parse_prometheus",
    "run_accept",
    "sglang_acceptance",
    "vllm_acceptance",
    "vllm_counters",
]


_VLLM = "vllm:spec_decode_"
_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _PER_POS = (f"{_VLLM}num_drafts", f"{_VLLM}num_draft_tokens",
                                               f"{_VLLM}num_accepted_tokens", f"{_VLLM}num_accepted_tokens_per_pos")
#: the server kind ``accept.server: auto`` measures when the endpoint's kind reports no acceptance
_DEFAULT_SERVER = "vllm"


# -- Prometheus text ---------------------------------------------------------------------------------------


class PromSample(msgspec.Struct, frozen=True):
    name: str
    labels: dict[str, str]
    value: float


_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_prometheus(text: str) -> list[PromSample]:
    """The samples of a Prometheus text exposition. Tolerant: comments, blank and unparseable lines are
    skipped; a value that is not a number (or NaN) is skipped."""
    out: list[PromSample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels: dict[str, str] = {}
        body = m.group(3) or ""
        pos = 0
        while pos < len(body):
            lm = _LABEL.match(body, pos)
            if not lm:
                break
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        out.append(PromSample(m.group(1), labels, value))
    return out


class SpecCounters(msgspec.Struct, kw_only=True):
    """vLLM's speculative-decoding counters at one scrape, summed over label sets (per position kept)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = msgspec.field(default_factory=dict)
    seen: bool = False  # any spec_decode counter was exposed


def vllm_counters(text: str) -> SpecCounters:
    """Sum ``vllm:spec_decode_*`` counters (``_total`` samples, or the bare name where no ``_total`` is
    exposed; ``_created`` samples ignored) over every label set but ``position``."""
    samples = [s for s in parse_prometheus(text) if s.name.startswith(_VLLM) and not s.name.endswith("_created")]
    totals = {s.name.removesuffix("_total") for s in samples if s.name.endswith("_total")}
    c = SpecCounters(seen=bool(samples))
    for s in samples:
        base = s.name.removesuffix("_total")
        if base in totals and not s.name.endswith("_total"):
            continue  # the bare name next to its _total: counted once
        if base == _DRAFTS:
            c.drafts += s.value
        elif base == _DRAFT_TOKENS:
            c.draft_tokens += s.value
        elif base == _ACCEPTED:
            c.accepted += s.value
        elif base == _PER_POS:
            try:
                p = int(s.labels.get("position", ""))
            except ValueError:
                continue
            c.per_pos[p] = c.per_pos.get(p, 0.0) + s.value
    return c


def _counter_reset(what: str) -> APIError:
    return APIError(f"vLLM /metrics: {what} went down between the scrapes before and after the run: the server "
                    "restarted meanwhile; run accept again against a server that stays up", kind="counter_reset")


def vllm_acceptance(before: SpecCounters, after: SpecCounters) -> AcceptanceFigures | None:
    """Acceptance from two scrapes; None when no draft was made in between. A counter that went down is an
    ``APIError`` (the server restarted between the scrapes)."""
    d_drafts, d_tokens, d_acc = (after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                                 after.accepted - before.accepted)
    for name, d in (("num_drafts", d_drafts), ("num_draft_tokens", d_tokens), ("num_accepted_tokens", d_acc)):
        if d < 0:
            raise _counter_reset(f"vllm:spec_decode_{name}")
    positions = sorted(set(before.per_pos) | set(after.per_pos))
    per_pos = []
    for p in range(positions[-1] + 1 if positions else 0):
        d = after.per_pos.get(p, 0.0) - before.per_pos.get(p, 0.0)
        if d < 0:
            raise _counter_reset(f"vllm:spec_decode_num_accepted_tokens_per_pos{{position={p}}}")
        per_pos.append(d)
    if d_drafts <= 0:
        return None
    return AcceptanceFigures(
        source="vllm-metrics", acceptance_length=1.0 + d_acc / d_drafts,
        per_position=[v / d_drafts for v in per_pos],
        acceptance_rate=d_acc / d_tokens if d_tokens > 0 else None,
        drafts=d_drafts, draft_tokens=d_tokens, accepted=d_acc, accepted_per_pos=per_pos)


class SGLangMeta(msgspec.Struct):
    """The part of SGLang's per-request ``meta_info`` accept reads (``spec_*`` only set when speculating)."""

    completion_tokens: int = 0
    prompt_tokens: int = 0
    spec_verify_ct: int = 0
    spec_accept_length: float | None = None
    spec_num_correct_drafts: int | None = None


def sglang_acceptance(metas: Sequence[SGLangMeta]) -> AcceptanceFigures | None:
    """AL = Σcompletion_tokens / Σspec_verify_ct over the requests; None when none was verified."""
    verify = sum(m.spec_verify_ct for m in metas)
    tokens = sum(m.completion_tokens for m in metas)
    if verify <= 0:
        return None
    accepted = float(tokens - verify)
    return AcceptanceFigures(source="sglang-meta_info", acceptance_length=tokens / verify, verify_calls=verify,
                             completion_tokens=tokens, drafts=float(verify), accepted=accepted)


def offline_al(cond_acc: Sequence[float]) -> float:
    """1 + Σ_k Π_{j≤k} acc_j: the expected accepted length of a chain whose step k is right with
    conditional probability acc_k."""
    total, prod = 1.0, 1.0
    for a in cond_acc:
        prod *= a
        total += prod
    return total


# -- sending -----------------------------------------------------------------------------------------------


def _root(base_url: str) -> str:
    from draftgen.backends.sglang import sglang_root

    return sglang_root(base_url)


async def _scrape(session: aiohttp.ClientSession, base_url: str) -> SpecCounters:
    """One scrape of ``{root}/metrics`` through the backends' HTTP layer (``backends.http.get_bytes``); not
    retried: a scrape that fails says what to fix."""
    from draftgen.backends.http import get_bytes

    url = _root(base_url) + "/metrics"
    try:
        body = await get_bytes(session, url)
    except APIError as exc:
        if exc.status is not None:
            raise APIError(f"GET {url}: HTTP {exc.status}; the server must expose vLLM's /metrics",
                           status=exc.status) from None
        raise APIError(f"GET {url}: {exc}; is the server up?") from None
    c = vllm_counters(body.decode("utf-8", errors="replace"))
    if not c.seen:
        raise APIError(f"GET {url}: no vllm:spec_decode_* counters; start vLLM with the drafter "
                       "(--speculative-config '{\"method\": \"eagle3\", ...}')")
    return c


def _policy(cfg: RunConfig) -> RetryPolicy:
    """The one retry policy (``retry.*``), as generate's."""
    from draftgen.engine.retry import RetryPolicy

    return RetryPolicy(cfg.retry)


def _greedy_cfg(cfg: RunConfig, server: str) -> RunConfig:
    """``cfg`` for greedy, unstreamed requests to a server of kind ``server``."""
    s = msgspec.structs.replace(cfg.sampling, temperature=0.0, top_p=None, seed=None)
    ep = msgspec.structs.replace(cfg.endpoint, kind=server, stream=False)
    return msgspec.structs.replace(cfg, sampling=s, endpoint=ep)


async def _vllm_pass(cfg: RunConfig, server: str, url: str, prompts: Sequence[PromptRecord], scrape: bool) -> tuple[
        ThroughputFigures, AcceptanceFigures | None]:
    from draftgen.backends import CompletionRequest, api_key_for, open_backend
    from draftgen.backends.http import HttpBackend
    from draftgen.engine.retry import retrying

    g = _greedy_cfg(cfg, server)
    sem = asyncio.Semaphore(max(1, cfg.accept.concurrency))
    policy = _policy(cfg)
    async with open_backend(g, api_key_for(g), base_urls=[url], connections=cfg.accept.concurrency + 2) as be:
        assert isinstance(be, HttpBackend)  # one URL: one backend; its session scrapes /metrics too
        before = await _scrape(be.session, url) if scrape else None

        async def one(p: PromptRecord) -> int:
            req = CompletionRequest(sample_id=p.sample_id, messages=p.messages, max_tokens=cfg.accept.max_tokens,
                                    tools=p.tools)
            async with sem:
                comp = await retrying(lambda: be.complete(req), policy)
            if comp.usage is not None and comp.usage.completion_tokens:
                return int(comp.usage.completion_tokens)
            return len(comp.output_ids or [])

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(p) for p in prompts))
        seconds = time.perf_counter() - t0
        figures = vllm_acceptance(before, await _scrape(be.session, url)) if before is not None else None
    tokens = sum(counts)
    if figures is not None:
        figures.completion_tokens = tokens
    return ThroughputFigures(base_url=url, requests=len(prompts), completion_tokens=tokens, seconds=round(seconds, 4),
                             tokens_per_s=round(tokens / seconds, 3) if seconds > 0 else 0.0), figures


class _GenReply(msgspec.Struct):
    meta_info: SGLangMeta | None = None
    output_ids: list[int] | None = None


async def _sglang_pass(cfg: RunConfig, server: str, url: str, prompts: Sequence[PromptRecord],
                       ids: Sequence[list[int]]) -> tuple[ThroughputFigures, list[SGLangMeta]]:
    from draftgen.backends import api_key_for, open_backend
    from draftgen.backends.sglang import SGLangBackend
    from draftgen.engine.retry import retrying

    g = _greedy_cfg(cfg, server)
    sem = asyncio.Semaphore(max(1, cfg.accept.concurrency))
    policy = _policy(cfg)
    dec = msgspec.json.Decoder(_GenReply)
    max_tokens = cfg.accept.max_tokens

    async with open_backend(g, api_key_for(g), base_urls=[url], connections=cfg.accept.concurrency + 2) as be:
        if not isinstance(be, SGLangBackend):
            raise ConfigError(f"accept.server {server!r}: acceptance from meta_info needs SGLang's native /generate")
        target = be.base_url + "/generate"

        async def post(body: dict[str, Any]) -> SGLangMeta:
            data = await be.generate_raw(body, max_tokens=max_tokens)
            try:
                reply = dec.decode(data)
            except msgspec.DecodeError as exc:
                raise APIError(f"POST {target}: not an SGLang /generate reply ({exc})") from None
            if reply.meta_info is None:
                raise APIError(f"POST {target}: the reply has no meta_info")
            return reply.meta_info

        async def one(p_ids: list[int]) -> SGLangMeta:
            body = {"input_ids": p_ids, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0},
                    "stream": False}
            async with sem:
                meta: SGLangMeta = await retrying(lambda: post(body), policy)
                return meta

        t0 = time.perf_counter()
        metas = await asyncio.gather(*(one(list(i)) for i in ids))
        seconds = time.perf_counter() - t0
    tokens = sum(m.completion_tokens for m in metas)
    return ThroughputFigures(base_url=url, requests=len(prompts), completion_tokens=tokens, seconds=round(seconds, 4),
                             tokens_per_s=round(tokens / seconds, 3) if seconds > 0 else 0.0), list(metas)


# -- offline estimate and the drafter ----------------------------------------------------------------------


def _from_train(folder: Path, rd: RunDir) -> bool:
    """The drafter folder is inside this run's ``train/`` (its training log is ``train/log.jsonl``)."""
    return folder.resolve().is_relative_to(rd.train.resolve())


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


def _write_report(rd: RunDir, report: AcceptReport) -> Path:
    """The drafter's own report, then the same as the run's latest (``accept/acceptance.json``); returns the
    drafter's."""
    out = rd.accept_report(report.drafter_key)
    atomic_write_json(out, report)
    atomic_write_json(rd.accept_json, report)
    return out


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


def run_accept(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
               drafter: str | Path, base_url: str | None = None, baseline_url: str | None = None,
               prompts: int | None = None) -> AcceptReport:
    """Measure the served drafter's acceptance (see the module docstring); write and return the report.
    ``profile``: the already loaded profile of ``cfg.model``, for the SGLang pass's prompt ids (default:
    loaded there). ``force``: nothing to accept (accept checks no provenance); the one phase signature.
    ``drafter``: the checkpoint folder the server serves; ``base_url``/``baseline_url``: the servers with and
    without it (default: the config's); ``prompts``: how many held-out prompts (default ``accept.prompts``)."""
    rd = RunDir(cfg.run_path)
    folder = Path(drafter)
    k = _drafter_k(folder)
    url = base_url or cfg.endpoint.base_url or (cfg.endpoint.base_urls[0] if cfg.endpoint.base_urls else None)
    if not url:
        raise ConfigError("accept needs the server's URL: pass --base-url (or set endpoint.base_url)")
    baseline = baseline_url or cfg.accept.baseline_url
    n = prompts if prompts is not None else cfg.accept.prompts
    if n < 1:
        raise ConfigError(f"accept.prompts is {n}; it must be 1 or more")
    held = held_out_prompts(cfg, rd, n)
    chosen, notes = held.prompts, held.notes
    server, acceptance = _server(cfg)
    echo(f"accept: {len(chosen)} held-out prompts → {url} ({server}), max_tokens {cfg.accept.max_tokens}"
         + (f"; {held.excluded_by_content} left out as their content is in a merged row"
            if held.excluded_by_content else ""))
    base_fig: ThroughputFigures | None = None
    if acceptance == "meta_info":
        from draftgen.tokens import profile_from_config

        profile = profile if profile is not None else profile_from_config(cfg)
        ids = [profile.prompt_ids(p.messages, p.tools) for p in chosen]
        spec, metas = asyncio.run(_sglang_pass(cfg, server, url, chosen, ids))
        figures = sglang_acceptance(metas)
        if figures is None:
            raise APIError(f"{url}: no request reported spec_verify_ct; start SGLang with the drafter "
                           "(--speculative-algorithm EAGLE3 --speculative-draft-model-path ...)")
        if baseline:
            base_fig, _ = asyncio.run(_sglang_pass(cfg, server, baseline, chosen, ids))
    else:
        spec, got = asyncio.run(_vllm_pass(cfg, server, url, chosen, scrape=True))
        if got is None:
            raise APIError(f"{url}: vllm:spec_decode_num_drafts did not move during the run; is the drafter "
                           "enabled (--speculative-config '{\"method\": \"eagle3\", ...}')?")
        figures = got
        if baseline:
            base_fig, _ = asyncio.run(_vllm_pass(cfg, server, baseline, chosen, scrape=False))
    cond, source = _offline(cfg, rd, folder)
    report = AcceptReport(
        drafter=str(folder), drafter_key=drafter_key(folder), excluded_by_content=held.excluded_by_content,
        server=server, prompts=len(chosen), sample_ids=[p.sample_id for p in chosen],
        max_tokens=cfg.accept.max_tokens, acceptance=figures, speculative=spec, baseline=base_fig,
        speedup=round(spec.tokens_per_s / base_fig.tokens_per_s, 4) if base_fig and base_fig.tokens_per_s else None,
        k=k, offline_al=round(offline_al(cond), 4) if cond else None, offline_cond_acc=cond,
        offline_source=source, notes=notes, created_at=time.time())
    out = _write_report(rd, report)
    for line in summary_lines(report):
        echo(line)
    echo(f"accept: report written to {out} (and {rd.accept_json}, the latest)")
    return report


def summary_lines(rep: AcceptReport) -> list[str]:
    """The report in a few lines: AL measured next to the offline estimate, per position, tokens/s."""
    a = rep.acceptance
    lines = [f"acceptance length {a.acceptance_length:.3f} ({a.source})"
             + (f"  offline estimate {rep.offline_al:.3f}" if rep.offline_al is not None else "")]
    if a.per_position:
        lines.append("per position " + " ".join(f"{v:.3f}" for v in a.per_position)
                     + (f"  acceptance rate {a.acceptance_rate:.3f}" if a.acceptance_rate is not None else ""))
    s = rep.speculative
    line = f"tokens/s {s.tokens_per_s:.1f} with the drafter"
    if rep.baseline is not None:
        line += f", {rep.baseline.tokens_per_s:.1f} without (×{rep.speedup or 0:.2f})"
    lines.append(line)
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
