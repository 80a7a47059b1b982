"""One pass of ``draftgen accept`` over the held-out prompts against one server, and each prompt's counters.

Reads nothing on disk; sends requests through the backends' HTTP layer (the backend's one session,
``backends.http`` bounds, ``backends.errors`` classification) with retryable failures retried by the one policy
(``engine.retry``, ``retry.*``), as generate's. Returns a ``Pass``: throughput, the acceptance over the pass,
per prompt its counters (joined to its dataset, length bucket and tags) and the ids the server returned.

How each prompt's counters are known:

- vLLM with ``--per-request-spec-decode-metrics`` (vLLM PR #48915): each response's top-level
  ``metrics.speculative_decoding`` (``backends.SpecDecodeMetrics``; ``counters.request_acceptance`` checks
  its counts agree). With ``accept.per_request`` ``auto`` the first prompt goes alone, ``/metrics`` scraped
  around it; when its response carries the fields the rest go ``accept.concurrency`` at a time and every
  prompt's counters are its own response's (source ``vllm-per-request``). ``/metrics`` is scraped before and
  after the whole pass as well: counters that moved less than the responses say are an error (the fields
  cannot be trusted), more is a note (other requests shared the server).
- vLLM without them (or ``accept.per_request: metrics``): with ``accept.one_at_a_time`` the prompts go one
  at a time and ``GET {root}/metrics`` is read around each (the counters' deltas; ``vllm-metrics``); without
  it, ``accept.concurrency`` in flight and one figure over the pass.
- SGLang: native ``POST {root}/generate`` with the prompt ids; each response's ``meta_info``.

The ``/metrics`` scrapes are not retried: a scrape that fails says what to fix.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from draftgen.config import RunConfig
from draftgen.errors import APIError, ConfigError, PermanentAPIError
from draftgen.phases.accept.counters import (
    SGLangMeta,
    SpecCounters,
    request_acceptance,
    sglang_acceptance,
    sum_figures,
    vllm_acceptance,
    vllm_counters,
)
from draftgen.records import AcceptanceFigures, PromptAcceptance, PromptRecord, ThroughputFigures

if TYPE_CHECKING:
    import aiohttp

    from draftgen.backends import Completion
    from draftgen.backends.http import HttpBackend
    from draftgen.engine.retry import RetryPolicy

__all__ = ["Pass", "length_bucket", "sglang_pass", "vllm_pass"]

#: prompt-token edges of the length buckets a prompt's acceptance is joined to (``length_bucket``)
LENGTH_EDGES = (256, 1024, 4096, 16384)


def length_bucket(tokens: int | None) -> str | None:
    """The prompt's length bucket: ``<256``, ``256-1k``, ``1k-4k``, ``4k-16k`` or ``>=16k`` (None unknown)."""
    if tokens is None:
        return None
    names = ["<256", "256-1k", "1k-4k", "4k-16k", ">=16k"]
    return names[sum(tokens >= e for e in LENGTH_EDGES)]


@dataclass
class Pass:
    """One pass over the held-out prompts: throughput, the acceptance over the pass, and per prompt (same order
    as the prompts) its counters (``counted``: per-prompt counters are known) and the ids the server returned.
    ``notes``: what the reader should know about how it was measured."""

    throughput: ThroughputFigures
    figures: AcceptanceFigures | None
    prompts: list[PromptAcceptance]
    counted: bool
    ids: list[tuple[list[int] | None, list[int]] | None]  # (prompt ids if returned, output ids) per prompt
    notes: list[str]
    concurrency: int = 1  # requests in flight while the pass was timed


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


def _prompt_row(p: PromptRecord, tokens: int, ended: bool, fig: AcceptanceFigures | None,
                out: list[int] | None, prompt_tokens: int | None) -> PromptAcceptance:
    row = PromptAcceptance(sample_id=p.sample_id, dataset=p.dataset, completion_tokens=tokens, ended=ended,
                           output_ids=out, prompt_tokens=prompt_tokens, length_bucket=length_bucket(prompt_tokens),
                           tags=p.tags)
    if fig is not None:
        row.drafts, row.accepted, row.accepted_per_pos = fig.drafts, fig.accepted, fig.accepted_per_pos
        row.source = fig.source
    return row


def _throughput(url: str, n: int, tokens: int, seconds: float) -> ThroughputFigures:
    return ThroughputFigures(base_url=url, requests=n, completion_tokens=tokens, seconds=round(seconds, 4),
                             tokens_per_s=round(tokens / seconds, 3) if seconds > 0 else 0.0)


Sent = tuple["Completion", float]


class _VllmSender:
    """The requests of one vLLM pass on one backend: ``one`` sends a prompt (retried), ``scrape`` reads
    ``/metrics``."""

    def __init__(self, cfg: RunConfig, be: HttpBackend, url: str, concurrency: int) -> None:
        self.cfg, self.be, self.url = cfg, be, url
        self.where = f"POST {url}/chat/completions"
        self.sem = asyncio.Semaphore(max(1, concurrency))
        self.policy = _policy(cfg)

    async def one(self, p: PromptRecord) -> Sent:
        from draftgen.backends import CompletionRequest
        from draftgen.engine.retry import retrying

        req = CompletionRequest(sample_id=p.sample_id, messages=p.messages, max_tokens=self.cfg.accept.max_tokens,
                                tools=p.tools)
        async with self.sem:
            t = time.perf_counter()
            comp: Completion = await retrying(lambda: self.be.complete(req), self.policy)
            return comp, time.perf_counter() - t

    async def scrape(self) -> SpecCounters:
        return await _scrape(self.be.session, self.url)

    async def all(self, prompts: Sequence[PromptRecord]) -> list[Sent]:
        return list(await asyncio.gather(*(self.one(p) for p in prompts)))


def _fields(comp: Completion, p: PromptRecord, where: str) -> AcceptanceFigures | None:
    """The prompt's counters from its response's per-request fields (None when it sent none)."""
    if "spec_decode_unreadable" in comp.flags:
        raise PermanentAPIError(f"{where}: sample {p.sample_id}: metrics.speculative_decoding is not vLLM's shape (a count "
                       "missing or not an integer); fix the server or set accept.per_request: metrics",
                       kind="bad_spec_metrics")
    return request_acceptance(comp.spec_decode, where=f"{where}: sample {p.sample_id}") \
        if comp.spec_decode is not None else None


def _same_counts(fields: AcceptanceFigures | None, window: AcceptanceFigures | None, url: str) -> None:
    """The first prompt, sent alone: its response's counts must be what ``/metrics`` counted around it."""
    got = (fields.drafts, fields.accepted) if fields is not None else (0.0, 0.0)
    seen = (window.drafts, window.accepted) if window is not None else (0.0, 0.0)
    if got != seen:
        raise PermanentAPIError(
            f"{url}: the first prompt's metrics.speculative_decoding reports {got[0]:g} verify steps accepting "
            f"{got[1]:g} tokens, but /metrics counted {seen[0]:g} and {seen[1]:g} around it (it was sent alone); "
            "the per-request figures cannot be trusted: set accept.per_request: metrics", kind="bad_spec_metrics")


async def _per_request(s: _VllmSender, prompts: Sequence[PromptRecord], first: Sent, before: SpecCounters,
                       where: str) -> tuple[list[Sent], list[AcceptanceFigures | None], float,
                                        AcceptanceFigures | None, list[str]]:
    """The rest of the prompts ``accept.concurrency`` at a time, each prompt's counters from its response (and
    their sum, the pass's figures); the pass's ``/metrics`` delta checked against that sum."""
    t0 = time.perf_counter()
    rest = await s.all(prompts[1:])
    seconds = first[1] + time.perf_counter() - t0
    done = [first, *rest]
    figs = [_fields(c, p, where) for p, (c, _) in zip(prompts, done, strict=True)]
    missing = [p.sample_id for p, f in zip(prompts, figs, strict=True) if f is None]
    if missing:
        raise PermanentAPIError(f"{where}: {len(missing)} of {len(prompts)} responses carry no metrics.speculative_decoding "
                       f"(first: sample {missing[0]}) though the first did; serve every request from one vLLM with "
                       "--per-request-spec-decode-metrics, or set accept.per_request: metrics", kind="bad_spec_metrics")
    total = sum_figures([f for f in figs if f is not None], "vllm-per-request")
    scraped = vllm_acceptance(before, await s.scrape())
    notes = []
    seen = (scraped.drafts, scraped.accepted) if scraped is not None else (0.0, 0.0)
    said = (total.drafts, total.accepted) if total is not None else (0.0, 0.0)
    for name, n_seen, n_said in zip(("num_drafts", "num_accepted_tokens"), seen, said, strict=True):
        if n_seen + 1e-9 < n_said:
            raise PermanentAPIError(
                f"{_root(s.url)}/metrics: vllm:spec_decode_{name} moved by {n_seen:g} during the pass, less than the "
                f"{n_said:g} the responses' metrics.speculative_decoding add up to; their per-request figures cannot "
                "be trusted: set accept.per_request: metrics", kind="bad_spec_metrics")
    if seen[0] > said[0] + 1e-9:
        notes.append(f"the server's /metrics counted {seen[0] - said[0]:g} verify steps besides this pass's "
                     "(other requests shared it); each prompt's figures are its own response's")
    return done, figs, seconds, total, notes


async def _one_at_a_time(s: _VllmSender, prompts: Sequence[PromptRecord], first: Sent,
                         first_fig: AcceptanceFigures | None, last: SpecCounters,
                         ) -> tuple[list[Sent], list[AcceptanceFigures | None]]:
    """The rest of the prompts one at a time, ``/metrics`` read around each."""
    done, figs = [first], [first_fig]
    for p in prompts[1:]:
        done.append(await s.one(p))
        now = await s.scrape()
        figs.append(vllm_acceptance(last, now))
        last = now
    return done, figs


async def _measured(s: _VllmSender, prompts: Sequence[PromptRecord], *, scrape: bool, one_at_a_time: bool,
                    per_request: bool) -> tuple[list[Sent], list[AcceptanceFigures | None], float,
                                                AcceptanceFigures | None, list[str]]:
    """The pass's responses, each prompt's counters (empty: unknown), its seconds, its figures and notes."""
    if not scrape or not prompts:
        t0 = time.perf_counter()
        done = await s.all(prompts)
        return done, [], time.perf_counter() - t0, None, []
    before = await s.scrape()
    if not per_request and not one_at_a_time:
        t0 = time.perf_counter()
        done = await s.all(prompts)
        seconds = time.perf_counter() - t0
        return done, [], seconds, vllm_acceptance(before, await s.scrape()), []
    first = await s.one(prompts[0])
    after_first = await s.scrape()
    if per_request and first[0].spec_decode is not None:
        _same_counts(_fields(first[0], prompts[0], s.where), vllm_acceptance(before, after_first), s.url)
        return await _per_request(s, prompts, first, before, s.where)
    if per_request:
        _fields(first[0], prompts[0], s.where)  # none sent: fall back; one sent unreadable: an error
    if not one_at_a_time:
        t0 = time.perf_counter()
        rest = await s.all(prompts[1:])
        seconds = first[1] + time.perf_counter() - t0
        return [first, *rest], [], seconds, vllm_acceptance(before, await s.scrape()), []
    done, figs = await _one_at_a_time(s, prompts, first, vllm_acceptance(before, after_first), after_first)
    known = [f for f in figs if f is not None]
    total = sum_figures(known, "vllm-metrics") if known else None
    return done, figs, sum(d for _, d in done), total, []


async def vllm_pass(cfg: RunConfig, server: str, url: str, prompts: Sequence[PromptRecord], *, scrape: bool,
                    one_at_a_time: bool, per_request: bool, concurrency: int | None = None) -> Pass:
    """Chat completions of the prompts at ``url`` (see the module docstring). ``scrape``: the server serves the
    drafter (read its counters); ``per_request``: use its per-request fields when it sends them;
    ``concurrency``: requests in flight (default ``accept.concurrency``; a baseline pass is timed at its
    drafter pass's)."""
    from draftgen.backends import api_key_for, open_backend
    from draftgen.backends.http import HttpBackend

    g = _greedy_cfg(cfg, server)
    c = concurrency or cfg.accept.concurrency
    async with open_backend(g, api_key_for(g), base_urls=[url], connections=cfg.accept.concurrency + 2) as be:
        assert isinstance(be, HttpBackend)  # one URL: one backend; its session scrapes /metrics too
        done, figs, seconds, figures, notes = await _measured(_VllmSender(cfg, be, url, c), prompts, scrape=scrape,
                                                              one_at_a_time=one_at_a_time, per_request=per_request)
    alone = bool(figs) and all(f is None or f.source == "vllm-metrics" for f in figs)  # timed one at a time
    rows: list[PromptAcceptance] = []
    ids: list[tuple[list[int] | None, list[int]] | None] = []
    for i, (p, (comp, _)) in enumerate(zip(prompts, done, strict=True)):
        out = comp.output_ids
        tokens = int(comp.usage.completion_tokens) if comp.usage is not None and comp.usage.completion_tokens \
            else len(out or [])
        p_tok = len(comp.prompt_ids) if comp.prompt_ids else p.prompt_tokens
        rows.append(_prompt_row(p, tokens, comp.finish_reason == "stop", figs[i] if figs else None,
                                list(out) if out is not None else None, p_tok))
        ids.append((list(comp.prompt_ids) if comp.prompt_ids else None, list(out)) if out is not None else None)
    tokens = sum(r.completion_tokens for r in rows)
    if figures is not None:
        figures.completion_tokens = tokens
    return Pass(_throughput(url, len(prompts), tokens, seconds), figures, rows, bool(figs), ids, notes,
                1 if alone else max(1, min(c, len(prompts))))


class _GenReply(msgspec.Struct):
    meta_info: SGLangMeta | None = None
    output_ids: list[int] | None = None


async def sglang_pass(cfg: RunConfig, server: str, url: str, prompts: Sequence[PromptRecord],
                      ids: Sequence[list[int]]) -> tuple[Pass, list[SGLangMeta]]:
    """SGLang's native ``/generate`` of the prompts' ids ``ids`` at ``url``, ``accept.concurrency`` in flight;
    each prompt's counters from its ``meta_info``."""
    from draftgen.backends import api_key_for, open_backend
    from draftgen.backends.sglang import SGLangBackend

    g = _greedy_cfg(cfg, server)
    c = max(1, min(cfg.accept.concurrency, len(prompts)))
    sem = asyncio.Semaphore(c)
    policy = _policy(cfg)
    dec = msgspec.json.Decoder(_GenReply)
    max_tokens = cfg.accept.max_tokens

    async with open_backend(g, api_key_for(g), base_urls=[url], connections=cfg.accept.concurrency + 2) as be:
        if not isinstance(be, SGLangBackend):
            raise ConfigError(f"accept.server {server!r}: acceptance from meta_info needs SGLang's native /generate")
        target = be.base_url + "/generate"

        async def post(body: dict[str, Any]) -> _GenReply:
            data = await be.generate_raw(body, max_tokens=max_tokens)
            try:
                reply = dec.decode(data)
            except msgspec.DecodeError as exc:
                raise APIError(f"POST {target}: not an SGLang /generate reply ({exc})") from None
            if reply.meta_info is None:
                raise APIError(f"POST {target}: the reply has no meta_info")
            return reply

        send = _sglang_sender(post, sem, policy, max_tokens)
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(send(list(i)) for i in ids))
        seconds = time.perf_counter() - t0
    metas = [r.meta_info for r in replies if r.meta_info is not None]
    rows = [PromptAcceptance(sample_id=p.sample_id, dataset=p.dataset, drafts=float(m.spec_verify_ct),
                             accepted=float(m.completion_tokens - m.spec_verify_ct) if m.spec_verify_ct else 0.0,
                             completion_tokens=m.completion_tokens, verify_calls=m.spec_verify_ct,
                             ended=m.finished_by_stop(), output_ids=r.output_ids, source="sglang-meta_info",
                             prompt_tokens=len(i), length_bucket=length_bucket(len(i)), tags=p.tags)
            for p, m, r, i in zip(prompts, metas, replies, ids, strict=True)]
    out_ids: list[tuple[list[int] | None, list[int]] | None] = [
        (list(i), list(r.output_ids)) if r.output_ids is not None else None for i, r in zip(ids, replies, strict=True)]
    tokens = sum(m.completion_tokens for m in metas)
    return Pass(_throughput(url, len(prompts), tokens, seconds), sglang_acceptance(metas), rows, True,
                out_ids, [], c), metas


def _sglang_sender(post: Callable[[dict[str, Any]], Awaitable[_GenReply]], sem: asyncio.Semaphore,
                   policy: RetryPolicy, max_tokens: int) -> Callable[[list[int]], Awaitable[_GenReply]]:
    from draftgen.engine.retry import retrying

    async def one(p_ids: list[int]) -> _GenReply:
        body = {"input_ids": p_ids, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0},
                "stream": False}
        async with sem:
            reply: _GenReply = await retrying(lambda: post(body), policy)
            return reply

    return one
