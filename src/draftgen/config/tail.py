"""The ``tail`` section: slow streams, stalls and hedging, what keeps a run's last requests from dominating it.
Pure data; the engine's ``engine.tail`` applies it."""

from __future__ import annotations

from draftgen.config.base import Section


class TailConfig(Section):
    """How generate treats requests that stop making progress on the wire.

    A request is **stalled** while no text has arrived for ``stall_s`` or 4 × the run's p95 time to first
    token, whichever is longer (the display marks it, with its age). A stream that receives fewer than
    ``min_tokens_per_s`` × ``slow_window_s`` tokens in the last ``slow_window_s`` (a streamed request with no
    first byte included: its window counts from when it went out) is **cancelled and retried on another
    provider** (``slow_stream``), long before its idle timeout or its total deadline. Once a partition has no prompt left to start and slots are idle, its oldest stalled requests are
    **hedged**: the same request is sent again on another provider, the first good response is the record
    and the other is cancelled. What hedges cost beyond one request per sample is booked in the dollar budget
    and capped by ``hedge_max_extra_spend``."""

    min_tokens_per_s: float = 2.0
    """A stream slower than this over ``slow_window_s`` is cancelled and retried on another provider."""
    slow_window_s: float = 60.0
    """The window of the rate floor, counted from the stream's first data, or from when the request went out while it has sent none (a streamed request with no first byte for this long is retried elsewhere; 0: no rate floor)."""
    stall_s: float = 2.0
    """The shortest silence that marks a request stalled; the run's own p95 time to first token × 4 when that is longer (30 s until 20 responses are in)."""
    hedge_max_extra_spend: float = 0.03
    """Hedges may cost at most this share of this run's spend beyond one request per sample (0: no hedging)."""

    def __post_init__(self) -> None:
        for key in ("min_tokens_per_s", "slow_window_s", "stall_s"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"tail.{key} must be >= 0")
        if not 0.0 <= self.hedge_max_extra_spend <= 1.0:
            raise ValueError("tail.hedge_max_extra_spend must be in [0, 1] (a share of this run's spend)")
