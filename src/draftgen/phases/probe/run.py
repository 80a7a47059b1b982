"""``draftgen probe CONFIG``: one real request that proves the setup before money is spent.

It checks, in order: the key (``GET /key``: valid, limit remaining), the account's credits
(``GET /credits``, only with a management key), the model's endpoints (``GET /models/{model}/endpoints``),
all read by ``account.read_account`` where the backend's capabilities have them, then sends ``probe.prompt``
with ``probe.max_tokens`` (unset: 4096 for a thinking model, 512 otherwise) and reports which provider and
quantization served it, which field carried the reasoning, the content, the cost and implied $/M output tokens, the
reasoning-token share, and whether the target profile rebuilds as many token ids as were billed.

Failures (``ok`` false, the CLI exits 1): the tokenizer or profile does not load, the key is missing or
rejected, no credits or limit left, the model is unknown, the request fails, the served provider is one the
routing excludes (``ignore``, ``only``, ``quantizations``), the rebuilt token count is off the billed one
beyond ``quality.billing_tolerance`` (``engine.health.HealthPolicy.billing_off``, the audit's ``billing_off``
rule: the wrong profile or tokenizer). Every problem found is listed in one pass: a
tokenizer that does not load still lets the key and the endpoints be checked, a missing key the endpoint
list; the request is sent only when nothing found so far rules it out (a tokenizer that did not load
included: its answer could not be checked). Warnings (``ok`` stays true): a model id that does not look like
the profile's family (``tokens.profile_fit``), missing reasoning on a thinking model, truncation of
the answer, a rebuilt count off the billed one within the tolerance (a provider's end token), an ambiguous
quantization, a provider serving
a quantization known to change outputs (``fp4``, ``nvfp4``) that ``routing.quantizations`` does not list.
A thinking model cut inside its reasoning is no warning: one neutral ``note`` line says so.

While it waits for the answer, a line every ``PROGRESS_EVERY_S`` seconds says how long it has waited and
what has arrived (``wait_with_progress``: no data yet, or the tokens streamed so far and their rate).

The last line is the verdict: ``probe OK``, ``probe OK with N warnings`` or ``probe FAILED (N problems)``;
the CLI exits non-zero only on failure.

With ``endpoint: emulator`` and no ``base_url`` the embedded emulator is started for the probe. A probe
that passes records what its answer's stream measured (tokens per second after the first token, the time to
it) in the run directory's ``logs/probe.json`` (``records.ProbeMeasurement``; the run directory claimed as
every writing command claims it): ``plan`` uses that rate while the run has no response of its own. It
writes nothing else. The API key is never printed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

import msgspec

from draftgen.backends import (
    EMULATOR_KEY,
    Backend,
    Completion,
    CompletionRequest,
    EndpointInfo,
    WireMeter,
    api_key_for,
    capabilities,
    endpoint_urls,
    open_backend,
)
from draftgen.backends.account import AccountSnapshot, read_account
from draftgen.backends.pricing import eligible_endpoints, endpoint_matches, matching_endpoints
from draftgen.config import RunConfig
from draftgen.engine.health import HealthPolicy
from draftgen.errors import APIError, AuthError, DraftgenError, PaymentRequired
from draftgen.phases import Echo
from draftgen.records import Message
from draftgen.tokens import profile_fit

if TYPE_CHECKING:
    from draftgen.tokens import Profile

__all__ = ["EMULATOR_KEY", "OUTPUT_CHANGING_QUANTIZATIONS", "PROGRESS_EVERY_S", "ProbeReport", "api_key_for",
           "probe_max_tokens", "run_probe", "verdict", "wait_with_progress"]

#: Quantizations known to change a model's outputs against its reference weights: a probe served by one
#: warns unless ``routing.quantizations`` lists it (the user chose it).
OUTPUT_CHANGING_QUANTIZATIONS = frozenset({"fp4", "nvfp4"})
THINKING_MAX_TOKENS = 4096
PLAIN_MAX_TOKENS = 512
#: seconds between two "still waiting" lines while the probe's request is out
PROGRESS_EVERY_S = 5.0


def progress_line(started: float, now: float, meter: WireMeter) -> str:
    """What the probe has received by ``now`` (``time.monotonic()``), its request out since ``started``."""
    waited = now - started
    if not meter.events or meter.first_at is None:
        return f"  {'waiting':<12} {waited:.0f}s: no data yet (the provider is still reading the prompt, or queued)"
    tokens = meter.tokens()
    rate = tokens / max(now - meter.first_at, 1e-9)
    via = f" from {meter.provider}" if meter.provider else ""
    return f"  {'waiting':<12} {waited:.0f}s: ~{tokens:,.0f} tokens streamed so far{via} (~{rate:,.0f} tok/s)"


async def wait_with_progress(aw: Awaitable[Completion], meter: WireMeter, echo: Echo, *,
                             every_s: float = PROGRESS_EVERY_S) -> Completion:
    """``await aw``, echoing ``progress_line`` every ``every_s`` seconds until it is done."""
    task = asyncio.ensure_future(aw)
    t0 = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait([task], timeout=every_s)
            if done:
                return task.result()
            echo(progress_line(t0, time.monotonic(), meter))
    finally:
        if not task.done():
            task.cancel()


def probe_max_tokens(cfg: RunConfig) -> int:
    """The probe's max_tokens: ``probe.max_tokens``, else 4096 for a thinking model and 512 otherwise."""
    if cfg.probe.max_tokens is not None:
        return cfg.probe.max_tokens
    return THINKING_MAX_TOKENS if cfg.model.thinking else PLAIN_MAX_TOKENS


class ProbeReport(msgspec.Struct, kw_only=True):
    ok: bool = False
    base_url: str | None = None
    model: str = ""
    max_tokens: int | None = None
    """The max_tokens the probe request was sent with."""
    key_valid: bool | None = None
    key_limit: float | None = None
    key_limit_remaining: float | None = None
    key_usage: float | None = None
    credits_remaining: float | None = None
    endpoints: int | None = None
    eligible_endpoints: int | None = None
    provider: str | None = None
    endpoint_tag: str | None = None
    quantization: str | None = None
    listed_usd_per_m_output: float | None = None
    reasoning_field: str | None = None
    reasoning: str | None = None
    content: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_usd: float | None = None
    usd_per_m_output: float | None = None
    reasoning_share: float | None = None
    rebuilt_tokens: int | None = None
    rebuilt_reasoning_tokens: int | None = None
    recon_flags: list[str] = msgspec.field(default_factory=list)
    latency_s: float | None = None
    ttft_s: float | None = None
    """Seconds to the first data of the answer's stream (None: not streamed)."""
    warnings: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


def _usd(x: float | None) -> str:
    if x is None:
        return "–"
    return f"${x:.6f}" if abs(x) < 0.01 else f"${x:,.4f}"


class _Probe:
    def __init__(self, cfg: RunConfig, echo: Echo) -> None:
        self.cfg = cfg
        self.echo = echo
        self.rep = ProbeReport(model=cfg.model.id)

    def fail(self, msg: str) -> None:
        self.rep.errors.append(msg)
        self.echo(f"  ✗ {msg}")

    def warn(self, msg: str) -> None:
        self.rep.warnings.append(msg)

    def line(self, label: str, text: str) -> None:
        self.echo(f"  {label:<12} {text}")

    def account(self, snap: AccountSnapshot) -> bool:
        """Key and credits from the account snapshot. False when nothing more can be checked."""
        rep = self.rep
        if snap.key_error is not None:
            self.fail(f"GET /key failed: {snap.key_error}")
            return False
        info = snap.key
        if info is not None:
            rep.key_valid = True
            rep.key_limit, rep.key_limit_remaining, rep.key_usage = info.limit, info.limit_remaining, info.usage
            limit = ("no limit" if info.limit is None
                     else f"limit {_usd(info.limit)}, {_usd(info.limit_remaining)} remaining")
            self.line("key", f"valid ({limit}; used {_usd(info.usage)})")
            if info.limit_remaining is not None and info.limit_remaining <= 0:
                self.fail("the key's limit is used up; raise it on openrouter.ai/settings/keys")
        elif not rep.errors:
            self.line("key", "not checked (this endpoint has no /key)")
        if snap.credits_error is not None:
            self.warn(f"GET /credits failed ({snap.credits_error}); "
                      f"is {self.cfg.endpoint.management_key_env} a management key?")
        credits = snap.credits
        if credits is not None:
            rep.credits_remaining = credits.remaining
            self.line("credits", f"{_usd(credits.remaining)} remaining of {_usd(credits.total_credits)}")
            if credits.remaining <= 0:
                self.fail("no credits left; add credits on openrouter.ai/settings/credits")
        return True

    def endpoints(self, snap: AccountSnapshot) -> list[EndpointInfo] | None:
        """The model's endpoints from the snapshot, checked against the routing."""
        if snap.endpoints_error is not None:
            self.fail(f"model {self.cfg.model.id!r}: cannot list its endpoints ({snap.endpoints_error}); check model.id")
            return None
        eps = snap.endpoints
        if eps is None:
            return None
        ok = eligible_endpoints(eps, self.cfg.routing)
        self.rep.endpoints, self.rep.eligible_endpoints = len(eps), len(ok)
        self.line("endpoints", f"{len(eps)} listed, {len(ok)} allowed by the routing config")
        if eps and not ok:
            self.fail("the routing config (ignore/only/quantizations/max_price) excludes every endpoint")
        return eps

    def served_by(self, comp: Completion, eps: list[EndpointInfo] | None) -> None:
        rep, routing = self.rep, self.cfg.routing
        rep.provider = comp.provider
        if not comp.provider:
            self.warn("the response names no provider")
            return
        cands = matching_endpoints(comp.provider, eps or [])
        allowed = eligible_endpoints(cands, routing)
        chosen = allowed or cands
        quants = sorted({ep.quantization or "unknown" for ep in chosen})
        if len(chosen) == 1:
            rep.endpoint_tag, rep.quantization = chosen[0].tag or None, chosen[0].quantization
            rep.listed_usd_per_m_output = chosen[0].pricing.completion * 1e6
        elif len(quants) == 1:
            rep.quantization = quants[0]
        elif chosen:
            risky = self._unallowed_risky(quants)
            self.warn(f"{comp.provider} serves several quantizations ({', '.join(quants)}); which one ran is unknown"
                      + (f"; if {'/'.join(risky)}, outputs may differ from the reference model's "
                         f"({self._quant_fix(comp.provider, chosen, risky)})" if risky else ""))
        where = comp.provider
        if rep.endpoint_tag:
            where += f" · tag {rep.endpoint_tag}"
        where += f" · quantization {rep.quantization or '?'}"
        if rep.listed_usd_per_m_output is not None:
            where += f" · listed ${rep.listed_usd_per_m_output:.2f}/M output"
        self.line("provider", where)
        if eps is None:
            return
        # A provider with several endpoints (variants) violates a rule only if all of them do.
        named = cands or [EndpointInfo(provider_name=comp.provider)]
        if routing.ignore and all(any(endpoint_matches(p, ep) for p in routing.ignore) for ep in named):
            self.fail(f"provider {comp.provider} is on routing.ignore but served the request")
        if routing.only is not None and not any(endpoint_matches(p, ep) for p in routing.only for ep in named):
            self.fail(f"provider {comp.provider} is not in routing.only but served the request")
        if routing.quantizations is not None and rep.quantization is not None and \
                rep.quantization.lower() not in {q.lower() for q in routing.quantizations}:
            self.fail(f"quantization {rep.quantization} is not in routing.quantizations "
                      f"({', '.join(routing.quantizations)})")
        elif rep.quantization is not None and self._unallowed_risky([rep.quantization]):
            self.warn(f"provider {comp.provider} served the probe in {rep.quantization}, a quantization known to "
                      f"change outputs against the reference model's; {self._quant_fix(comp.provider, chosen, [rep.quantization])}")

    def _unallowed_risky(self, quants: list[str]) -> list[str]:
        """Those of ``quants`` known to change outputs that ``routing.quantizations`` does not list."""
        allowed = {q.lower() for q in self.cfg.routing.quantizations or []}
        return [q for q in quants if q.lower() in OUTPUT_CHANGING_QUANTIZATIONS and q.lower() not in allowed]

    def _quant_fix(self, provider: str, eps: list[EndpointInfo], quants: list[str]) -> str:
        """How to avoid, or knowingly accept, ``provider``'s endpoints in ``quants``."""
        tags = sorted({ep.tag or ep.provider_name for ep in eps if (ep.quantization or "").lower()
                       in {q.lower() for q in quants}}) or [provider]
        return (f"avoid it with routing.ignore: [{', '.join(tags)}], or accept it by listing "
                f"{'/'.join(quants)} in routing.quantizations (with the other quantizations you allow)")

    def response(self, comp: Completion, latency: float) -> None:
        rep = self.rep
        rep.latency_s, rep.ttft_s = latency, comp.ttft_s
        rep.reasoning_field, rep.reasoning, rep.content = comp.reasoning_field, comp.reasoning, comp.content
        rep.finish_reason = comp.finish_reason
        if comp.reasoning:
            self.line("reasoning", f"came back in `{comp.reasoning_field}` ({len(comp.reasoning):,} characters)")
        else:
            self.line("reasoning", "none returned")
            if self.cfg.model.thinking:
                self.warn("no reasoning text came back although model.thinking is on "
                          "(hidden reasoning or reasoning switched off); the data would lack reasoning")
        content = comp.content or ""
        shown = content if len(content) <= 400 else content[:400] + f"… (+{len(content) - 400:,} characters)"
        self.line("content", repr(shown))
        self.line("finish", f"{comp.finish_reason} (native {comp.native_finish_reason}) in {latency:.2f}s")
        if comp.finish_reason == "length":
            n = probe_max_tokens(self.cfg)
            if self.cfg.model.thinking and not content.strip():
                # Cut inside the reasoning of a thinking model: says nothing about the setup, so no warning.
                self.line("note", f"the reasoning was cut at probe.max_tokens={n} before the answer; "
                          f"set probe.max_tokens higher (e.g. {2 * n}) to see one")
            else:
                self.warn(f"the response was truncated at probe.max_tokens={n}; "
                          "raise it, or expect truncated samples at the partitions' max_tokens")
        u = comp.usage
        if u is None:
            self.warn("the response carried no usage (no token counts or cost)")
            return
        rep.prompt_tokens, rep.completion_tokens, rep.reasoning_tokens = u.prompt_tokens, u.completion_tokens, u.reasoning_tokens
        cost = u.cost + (u.upstream_cost or 0.0 if u.is_byok else 0.0)
        rep.cost_usd = cost
        if u.completion_tokens:
            rep.usd_per_m_output = cost / u.completion_tokens * 1e6
            rep.reasoning_share = u.reasoning_tokens / u.completion_tokens
        self.line("cost", f"{_usd(cost)} for {u.completion_tokens:,} completion + {u.prompt_tokens:,} prompt tokens"
                  + (f" → ${rep.usd_per_m_output:.2f}/M output tokens" if rep.usd_per_m_output is not None else ""))
        if rep.reasoning_share is not None:
            self.line("share", f"{u.reasoning_tokens:,} of {u.completion_tokens:,} completion tokens are reasoning "
                      f"({rep.reasoning_share:.1%})")

    def rebuild(self, comp: Completion, profile: Profile) -> None:
        rep = self.rep
        billed = comp.usage.completion_tokens if comp.usage else None
        if comp.output_ids is not None:
            rep.rebuilt_tokens = len(comp.output_ids)
            how = "exact ids from the server"
        else:
            rec = profile.build_output(comp.reasoning, comp.content, comp.finish_reason,
                                       reasoning_tokens=comp.usage.reasoning_tokens if comp.usage else 0)
            rep.rebuilt_tokens, rep.rebuilt_reasoning_tokens, rep.recon_flags = len(rec.ids), rec.reasoning_token_count, rec.flags
            how = f"rebuilt with profile {self.cfg.model.profile}"
        flags = f" (flags: {', '.join(rep.recon_flags)})" if rep.recon_flags else ""
        if billed is None:
            self.line("rebuild", f"{rep.rebuilt_tokens:,} ids {how}; nothing billed to compare{flags}")
            return
        diff = rep.rebuilt_tokens - billed
        mark = "= billed ✓" if diff == 0 else f"vs {billed:,} billed ({diff:+d})"
        self.line("rebuild", f"{rep.rebuilt_tokens:,} ids {how} {mark}{flags}")
        if not diff:
            return
        policy = HealthPolicy(billing_tolerance=self.cfg.quality.billing_tolerance)
        if policy.billing_off(rep.rebuilt_tokens, billed):
            self.fail(f"rebuilt {rep.rebuilt_tokens} ids but {billed} completion tokens were billed ({diff:+d}, beyond "
                      f"quality.billing_tolerance {self.cfg.quality.billing_tolerance:g}): the audit would exclude such "
                      f"samples; check model.profile ({self.cfg.model.profile}) and model.tokenizer against "
                      f"{self.cfg.model.id}")
        else:
            self.warn(f"rebuilt {rep.rebuilt_tokens} ids but {billed} completion tokens were billed; "
                      "within the tolerance (a difference of 1-2 can be a provider's end token)")

    async def run(self, base_urls: list[str] | None, profile: Profile | None, key: str | None) -> None:
        """Everything the endpoint can tell: the key and credits, the model's endpoints, then (when nothing
        so far rules it out) one request, its provider, response and rebuild (``profile``: None when it did
        not load; ``key``: None when it is missing)."""
        cfg = self.cfg
        self.rep.base_url = (base_urls or endpoint_urls(cfg))[0]
        self.echo(f"probe {cfg.model.id} at {self.rep.base_url}")
        async with open_backend(cfg, key, base_urls=base_urls, connections=4) as backend:
            eps, send = await self._account_and_endpoints(backend, key)
            if not send:
                self.line("request", "not sent (fix the problems above first)")
                return
            if profile is None:  # its answer could not be checked: not worth the wait, nor the money
                self.line("request", "not sent: the tokenizer did not load (fix it first; the answer could "
                          "not be checked without it)")
                return
            got = await self._request(backend)
        if got is None:
            return
        comp, latency = got
        self.served_by(comp, eps)
        self.response(comp, latency)
        if profile is not None:
            self.rebuild(comp, profile)
        else:
            self.line("rebuild", "not checked: the profile did not load")

    async def _account_and_endpoints(self, backend: Backend, key: str | None) -> tuple[list[EndpointInfo] | None, bool]:
        """The key, the credits and the model's endpoints; returns the endpoints and whether the probe's
        request is worth sending (not without a key, credits or an endpoint the routing allows)."""
        cfg = self.cfg
        before = len(self.rep.errors)  # the problems found before (a profile that did not load is the run's)
        if key is None:
            snap = await self._endpoints_only(backend)
            send = False
        else:
            try:
                snap = await read_account(backend, cfg)
                send = self.account(snap)
            except AuthError as exc:
                self.rep.key_valid = False
                self.fail(str(exc))  # the AuthError says it was rejected and what to check, once
                snap, send = await self._endpoints_only(backend), False
        eps = self.endpoints(snap)
        return eps, send and len(self.rep.errors) == before

    async def _endpoints_only(self, backend: Backend) -> AccountSnapshot:
        """The model's endpoints without the key's account (a missing or rejected key)."""
        caps = capabilities(self.cfg.endpoint.kind)
        snap = AccountSnapshot(backend=backend.name, has_account=caps.account, has_prices=caps.prices)
        if caps.prices:
            try:
                snap.endpoints = await backend.get_model_endpoints(self.cfg.model.id)
            except AuthError:
                self.line("endpoints", "not checked: this endpoint lists them only with a valid key")
            except APIError as exc:
                snap.endpoints_error = str(exc)
        return snap

    async def _request(self, backend: Backend) -> tuple[Completion, float] | None:
        """Send the probe's prompt; None (and the problem recorded) when it fails."""
        meter = WireMeter()
        req = CompletionRequest(sample_id="probe", messages=[Message(role="user", content=self.cfg.probe.prompt)],
                                max_tokens=self.rep.max_tokens or PLAIN_MAX_TOKENS, meter=meter)
        t0 = time.monotonic()
        self.line("request", f"sent (max_tokens {req.max_tokens:,}); waiting for the answer")
        try:
            comp = await wait_with_progress(backend.complete(req), meter, self.echo)
        except AuthError as exc:
            self.rep.key_valid = False
            self.fail(str(exc))
            return None
        except PaymentRequired as exc:
            self.fail(f"payment required ({exc}); add credits or raise the key's limit")
            return None
        except APIError as exc:
            self.fail(f"the request failed: {exc}")
            return None
        return comp, time.monotonic() - t0


def run_probe(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None,
              force: bool = False) -> ProbeReport:
    """Send one request and report what came back; ``ok`` is false on any failure. Every problem found is
    listed in one pass: the profile's fit to the model id, a tokenizer that does not load, a missing key,
    then what the endpoint says (``_Probe.run``). ``profile``: the already loaded profile of ``cfg.model``
    (default: loaded here, once: the embedded emulator and the rebuild share it). ``force``: record the
    measured rate in a run directory made with another target (``rundir.claim.writer``)."""
    probe = _Probe(cfg, echo)
    rep = probe.rep
    rep.max_tokens = probe_max_tokens(cfg)
    fit = profile_fit(cfg.model.id, cfg.model.profile)
    if fit is not None:
        probe.warn(fit)
    profile, key = _local_checks(cfg, probe, profile)
    if rep.max_tokens < 1:
        probe.fail(f"probe.max_tokens is {rep.max_tokens}; set it to 1 or more (or leave it unset)")
    elif profile is None and _embedded(cfg):
        probe.line("endpoint", "not checked: the embedded emulator serves the model's tokenizer, which did not load")
    else:
        from draftgen.emulator.embedded import (
            embedded_endpoint,  # here: importing probe loads no emulator module
        )

        try:
            with embedded_endpoint(cfg, profile=profile) as urls:
                asyncio.run(probe.run(urls, profile, key))
        except DraftgenError as exc:
            probe.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    for w in rep.warnings:
        echo(f"  ! warning: {w}")
    rep.ok = not rep.errors
    if rep.ok:
        _record(cfg, rep, echo, force)
    echo(verdict(rep))
    return rep


def _record(cfg: RunConfig, rep: ProbeReport, echo: Echo, force: bool) -> None:
    """The answer's stream rate into the run directory's ``logs/probe.json`` (claimed as every writing command
    claims it), for ``plan`` while the run has no response of its own; a run directory that cannot be
    claimed (another target's, held by a running command) is said, and nothing is written."""
    from draftgen.errors import RunDirError
    from draftgen.records import ProbeMeasurement
    from draftgen.rundir.claim import writer
    from draftgen.store import atomic_write_json

    if rep.latency_s is None or not rep.completion_tokens:
        return
    decode = rep.latency_s - (rep.ttft_s or 0.0)
    if decode <= 0:
        return
    m = ProbeMeasurement(model=rep.model, provider=rep.provider, completion_tokens=rep.completion_tokens,
                         latency_s=round(rep.latency_s, 4), ttft_s=rep.ttft_s,
                         tokens_per_s=round(rep.completion_tokens / decode, 3), at=round(time.time(), 3))
    try:
        with writer(cfg, "probe", force=force) as rd:
            rd.logs.mkdir(parents=True, exist_ok=True)
            atomic_write_json(rd.probe, m)
    except RunDirError as exc:
        echo(f"  {'rate':<12} {m.tokens_per_s:,.0f} tokens/s, not recorded for plan: {exc}")
        return
    echo(f"  {'rate':<12} {m.tokens_per_s:,.0f} tokens/s after the first token; recorded in {rd.probe} for plan")


def _local_checks(cfg: RunConfig, probe: _Probe, profile: Profile | None) -> tuple[Profile | None, str | None]:
    """What can be checked without the endpoint: the profile and tokenizer load, the API key is there.
    Returns the profile and the key (None for what failed, each failure recorded)."""
    from draftgen.tokens import profile_from_config

    if profile is None:
        try:
            profile = profile_from_config(cfg)
        except DraftgenError as exc:
            probe.fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    key: str | None = None
    try:
        key = api_key_for(cfg)
    except DraftgenError as exc:
        probe.fail(str(exc).splitlines()[0])
    return profile, key


def _embedded(cfg: RunConfig) -> bool:
    """The probe would start the embedded emulator (no base URL of its own)."""
    ep = cfg.endpoint
    return capabilities(ep.kind).embedded_server and not (ep.base_url or ep.base_urls)


def verdict(rep: ProbeReport) -> str:
    """The probe's one-line verdict: ``probe OK``, ``probe OK with N warnings`` or ``probe FAILED (N problems)``."""
    def n(k: int, what: str) -> str:
        return f"{k} {what}{'s' if k != 1 else ''}"

    if rep.errors:
        return f"probe FAILED ({n(len(rep.errors), 'problem')})"
    return f"probe OK with {n(len(rep.warnings), 'warning')}" if rep.warnings else "probe OK"
