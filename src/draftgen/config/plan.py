"""The ``plan`` and ``probe`` sections: estimates before spending, and the one-request probe. Pure data."""

from __future__ import annotations

from draftgen.config.base import Section


class PlanConfig(Section):
    """What ``draftgen plan`` bases its estimates on."""

    pilot: int = 0
    """Prompts per dataset to send as a pilot; their responses are kept and reused by the run."""
    avg_output_tokens: int | None = None
    """Used when there is no pilot."""
    avg_latency_s: float | None = None
    """Mean request latency assumed for the time estimate when there is no pilot."""
    confirm_above_usd: float = 1.0
    """``draftgen run`` prints the plan first; when its expected cost (USD) is over this, it asks before
    generating (on a terminal; without one it refuses unless ``--yes``). Backends that cost nothing (the
    emulator, self-hosted servers) and costs that are not known never ask."""
    round_alpha: float = 0.5
    """``plan --next-round``: the exponent of the law each dataset's acceptance length is assumed to follow in
    its training tokens n, AL(n) = (k + 1) - c * n**-round_alpha (c from the measured AL); larger: faster
    returns on data."""


class ProbeConfig(Section):
    """The one request ``draftgen probe`` sends."""

    prompt: str = "In one short paragraph, why is the sky blue?"
    """The probe's user prompt."""
    max_tokens: int | None = None
    """The probe's max_tokens; unset: 4096 when ``model.thinking`` is on (room for a short reasoning to
    finish and the answer to follow), else 512. A thinking model cut inside its reasoning is not a warning:
    the probe says so on one neutral line, with how to raise this."""
