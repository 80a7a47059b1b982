"""What the samples left will generate when some were cut off mid-stream: a censored fit of the lengths.

After an interrupt the responses in the raw logs are the samples that finished first, the short ones; the
long tail was still streaming. Averaging the finished ones undercounts what is left (2.8× on the realistic
emulator). Here every sample seen is an observation of its completion length:

- a response of ``L`` completion tokens: ``L`` (one cut at ``max_tokens``, ``finish_reason`` length: at
  least ``L``, right-censored);
- a sample not done whose attempts received ``N`` tokens before they ended without a response (an
  interrupt's ``abandoned`` attempt, ``AttemptRecord.streamed_tokens``; the most of its attempts): at least
  ``N``, right-censored.

The lengths are fitted as log-normal by maximum likelihood with the censored ones counted as such (EM on
the log lengths: a censored one contributes its expected value beyond its cut). Each sample left is then
expected to generate ``E[min(L, M) | L > N]`` (``N``: what it already streamed, 0 for one never sent; ``M``:
its partition's ``max_tokens``), in closed form. The range beside it: every cut sample ending where it was
cut (low) or running to ``max_tokens`` (high). The estimate is *uncertain* when the cut samples are a large
share of those seen (``UNCERTAIN_SHARE``) or the finished ones too few to fit (``MIN_FINISHED``).

Reads the raw log and failures' attempts of one dataset (``logs/attempts.jsonl``) and its prepared prompts'
partitions; writes nothing.
"""

from __future__ import annotations

import math

import msgspec

from draftgen.config import RunConfig
from draftgen.records import AttemptRecord, PromptIdView, ResponseMetricsView
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl

__all__ = ["MIN_FINISHED", "UNCERTAIN_SHARE", "LengthsLeft", "describe", "lengths_left", "lognormal_fit", "mean_beyond"]

#: Finished responses needed to fit the lengths (fewer: no fit, the plain mean stands).
MIN_FINISHED = 5
#: Cut samples above this share of the samples seen: the estimate is called uncertain.
UNCERTAIN_SHARE = 0.2
_EM_ROUNDS = 200


class LengthsLeft(msgspec.Struct, kw_only=True):
    """One dataset's expected completion tokens still to come, counting the cut samples."""

    finished: int
    cut: int
    """Samples not done that streamed some tokens before their attempt was cut off."""
    cut_streamed: int
    """What those had streamed, in all."""
    left: int
    """Samples not done (cut or never sent)."""
    expected_tokens: float
    low_tokens: float
    high_tokens: float
    mu: float
    sigma: float

    @property
    def mean_left(self) -> float:
        return self.expected_tokens / self.left if self.left else 0.0

    @property
    def uncertain(self) -> bool:
        seen = self.finished + self.cut
        return self.finished < MIN_FINISHED or (seen > 0 and self.cut / seen > UNCERTAIN_SHARE)


def _q(x: float) -> float:
    """P(Z > x) for a standard normal Z."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def _hazard(a: float) -> float:
    """φ(a) / P(Z > a), the inverse Mills ratio (its asymptote where the tail underflows)."""
    q = _q(a)
    if q < 1e-300:
        return a + 1.0 / a if a > 0 else 0.0
    return math.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi) / q


def lognormal_fit(finished: list[float], censored: list[float]) -> tuple[float, float]:
    """(mu, sigma) of log L by maximum likelihood: ``finished`` lengths seen whole, ``censored`` known only
    to be at least as long (EM on the logs; lengths under 1 count as 1)."""
    xs = [math.log(max(1.0, x)) for x in finished]
    cs = [math.log(max(1.0, c)) for c in censored]
    everything = xs + cs
    mu = sum(everything) / len(everything)
    var = sum((x - mu) ** 2 for x in everything) / max(1, len(everything) - 1)
    sigma = math.sqrt(var) if var > 1e-12 else 0.5
    n = len(everything)
    for _ in range(_EM_ROUNDS):
        s1, s2 = sum(xs), sum(x * x for x in xs)
        for c in cs:
            lam = _hazard((c - mu) / sigma)
            s1 += mu + sigma * lam
            s2 += mu * mu + sigma * sigma + sigma * lam * (c + mu)
        new_mu = s1 / n
        new_sigma = math.sqrt(max(1e-6, s2 / n - new_mu * new_mu))
        done = abs(new_mu - mu) < 1e-9 and abs(new_sigma - sigma) < 1e-9
        mu, sigma = new_mu, new_sigma
        if done:
            break
    return mu, sigma


def mean_beyond(mu: float, sigma: float, streamed: float, cap: float) -> float:
    """``E[min(L, cap) | L > streamed]`` for log-normal ``L`` (``streamed`` 0: unconditional); at least
    ``streamed`` and at most ``cap``."""
    if streamed >= cap:
        return cap
    b = (math.log(cap) - mu) / sigma
    above_cap = _q(b)
    shifted = math.exp(mu + sigma * sigma / 2.0)
    if streamed <= 0:
        below = 1.0 - _q(b - sigma)  # P(Z < b - sigma)
        return min(cap, shifted * below + cap * above_cap)
    a = (math.log(streamed) - mu) / sigma
    p_beyond = _q(a)
    if p_beyond < 1e-12:  # cut far beyond anything the fit expects: say no more than what is known
        return streamed
    between = _q(a - sigma) - _q(b - sigma)  # P(a - sigma < Z < b - sigma)
    return max(streamed, min(cap, (shifted * between + cap * above_cap) / p_beyond))


def _streamed(rd: RunDir, dataset: str, done: set[str]) -> dict[str, int]:
    """Per sample not done: the most tokens one of its attempts received before it was cut off."""
    out: dict[str, int] = {}
    for _, a in iter_jsonl(rd.attempts, AttemptRecord):
        if a.dataset == dataset and a.streamed_tokens > 0 and a.sample_id not in done:
            out[a.sample_id] = max(out.get(a.sample_id, 0), a.streamed_tokens)
    return out


def lengths_left(cfg: RunConfig, dataset: str) -> LengthsLeft | None:
    """The censored estimate for ``dataset`` (module docstring), or None when no sample was cut off (the
    finished mean is then the estimate) or too few finished to fit."""
    rd = RunDir(cfg.run_path)
    caps = {"short": cfg.partitions.short.max_tokens, "long": cfg.partitions.long.max_tokens}
    part: dict[str, str] = {p.sample_id: p.partition for _, p in iter_jsonl(rd.prepared(dataset), PromptIdView)}
    finished: list[float] = []
    censored: list[float] = []
    done: set[str] = set()
    for _, row in iter_jsonl(rd.raw(dataset), ResponseMetricsView):
        if row.sample_id in done or row.usage is None or row.sample_id not in part:
            continue
        done.add(row.sample_id)
        (censored if row.finish_reason == "length" else finished).append(float(row.usage.completion_tokens))
    streamed = {k: v for k, v in _streamed(rd, dataset, done).items() if k in part}
    if not streamed or len(finished) < MIN_FINISHED:
        return None
    cut = [float(v) for v in streamed.values()]
    mu, sigma = lognormal_fit(finished, censored + cut)
    left = [sid for sid in part if sid not in done]
    expected = low = high = 0.0
    for sid in left:
        cap = float(caps.get(part[sid], caps["short"]))
        n = float(streamed.get(sid, 0))
        e = mean_beyond(mu, sigma, n, cap)
        expected += e
        low += min(n, cap) if n else e
        high += cap if n else e
    return LengthsLeft(finished=len(finished), cut=len(streamed), cut_streamed=sum(streamed.values()),
                       left=len(left), expected_tokens=expected, low_tokens=low, high_tokens=high, mu=mu, sigma=sigma)


def describe(est: LengthsLeft, dataset: str) -> str:
    """The note plan prints: what the estimate counts, its range, and whether it is uncertain."""
    text = (f"{dataset}: {est.cut:,} samples were cut off mid-stream ({est.cut_streamed:,} tokens received, at "
            f"least that long); the {est.left:,} left are expected to generate {est.expected_tokens:,.0f} tokens "
            f"(a log-normal fit of {est.finished:,} finished and {est.cut:,} cut lengths; between "
            f"{est.low_tokens:,.0f} if each cut one ends where it stopped and {est.high_tokens:,.0f} if each runs "
            "to max_tokens)")
    if est.uncertain:
        text += ("; uncertain: too few samples have finished to know the long tail, "
                 "a pilot or more finished samples would narrow it")
    return text
