"""The ETA of one partition during a run: its requests on the wire and its samples not sent yet, as
``engine.timemodel`` (the model ``plan`` uses) sees them, from what ``engine.stats`` counts. Reads the
counters only; the display (``engine.progress``) draws the result.
"""

from __future__ import annotations

from draftgen.engine.flight import Flight
from draftgen.engine.stats import PartitionCounts, RunStats
from draftgen.engine.timemodel import MIN_RATE_TOKENS, Eta, Lengths, Stream, eta

__all__ = ["FLOOR_SHARE", "partition_eta"]

#: A stream on the wire is taken at least as fast as this share of the streams seen (see ``partition_eta``).
FLOOR_SHARE = 0.05


def partition_eta(pc: PartitionCounts, stats: RunStats, now: float, cpt: float) -> Eta | None:
    """The partition's time left (``timemodel.eta``; None before any stream's rate is known). A request on the
    wire streams at its own rate once it has received ``MIN_RATE_TOKENS``, but never slower than the rate
    ``FLOOR_SHARE`` of the streams seen (finished and on the wire) are slower than: a stream whose text lags its
    tokens (a provider that drops the reasoning text) or one stalled for a moment is not taken for the slowest
    stream ever (the tail guard deals with streams really stalled); before that at any of the rates seen,
    after what is left of the run's mean wait for a first token."""
    left = max(pc.planned - pc.done - pc.failed, 0)
    if not left:
        return Eta(0.0, "streams")
    wire = [(fl, fl.meter.tokens(cpt)) for fl in list(pc.flight.values())]
    measured = {fl.key: got / (now - fl.meter.first_at) for fl, got in wire
                if fl.meter.first_at is not None and got >= MIN_RATE_TOKENS and now > fl.meter.first_at}
    seen = sorted([*pc.rates, *measured.values()])
    floor = seen[int(FLOOR_SHARE * len(seen))] if seen else 0.0
    own = {k: max(r, floor) for k, r in measured.items()}
    rates = [*pc.rates, *own.values()]
    if not rates:
        return None
    ttft = sum(stats.first_data) / len(stats.first_data) if stats.first_data else 0.0
    anyrate = tuple(rates)
    running = [Stream(got, (own[fl.key],)) if fl.key in own else _young(fl, got, now, anyrate, ttft) for fl, got in wire]
    max_tokens = pc.max_tokens or int(max([*pc.lengths, *(got for _, got in wire), 1]))
    lengths = Lengths.observed(pc.lengths, [got for _, got in wire], max_tokens)
    slots = stats.limit.get(pc.name, 0) or max(len(running), 1)
    return eta(running, max(left - len(running), 0), slots, lengths, rates, ttft)


def _young(fl: Flight, got: float, now: float, rates: tuple[float, ...], ttft: float) -> Stream:
    """A stream short of ``MIN_RATE_TOKENS``: at any of the ``rates`` it could have (once it has sent text, one
    that would have sent more by now is not; a stream with none yet may be one whose provider holds its
    reasoning back), after what is left of the mean wait for a first token."""
    first = fl.meter.first_at
    if first is None:
        return Stream(got, rates, max(ttft - (now - fl.started), 0.0))
    if not got:
        return Stream(got, rates)
    bound = (got + MIN_RATE_TOKENS) / max(now - first, 1e-9)
    return Stream(got, tuple(r for r in rates if r <= bound) or (min(rates),))
