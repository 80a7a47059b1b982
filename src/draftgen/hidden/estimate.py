"""Hidden-state disk estimate for EAGLE-3 training data, and what a length cap or a dropped dataset saves.

EAGLE-3 trainers store ``slots`` hidden vectors per token (the peers: 3 auxiliary layers + the final one,
so 4), each ``hidden_size`` values of ``dtype``::

    bytes = tokens × hidden_size × slots × bytes_per_value(dtype)

Kimi-K2.5 (hidden 7,168), 90.9M tokens, 4 slots: 5.21 TB in bf16, 2.61 TB in fp8 (decimal units, as disks
are sold). Token ids, loss masks and file-format overhead are not counted (they are < 0.1% of this).

``merge`` prints the estimate for the merged data; ``plan`` reuses ``hidden_states_report`` on its
projected token counts. Pure arithmetic: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from draftgen.records import HiddenDatasetLine, HiddenStatesReport

__all__ = [
    "DTYPE_BYTES",
    "DatasetTokens",
    "HiddenDatasetLine",
    "HiddenStatesReport",
    "estimate_hidden_states",
    "format_bytes",
    "format_hidden_report",
    "hidden_states_report",
    "tokens_under_cap",
]

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def estimate_hidden_states(tokens: int, hidden_size: int, slots: int = 4, dtype: str = "bf16") -> int:
    """Bytes of hidden states for ``tokens`` tokens."""
    try:
        width = DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPE_BYTES)}") from None
    if tokens < 0 or hidden_size < 1 or slots < 1:
        raise ValueError("tokens must be >= 0, hidden_size and slots >= 1")
    return tokens * hidden_size * slots * width


def format_bytes(n: float) -> str:
    """Decimal units (1 TB = 10^12 bytes), three significant digits: ``5.21 TB``."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}" if n / scale < 100 else f"{n / scale:.0f} {unit}"
    return f"{int(n)} B"


def tokens_under_cap(lengths: Iterable[int], cap: int | None) -> int:
    """Total tokens of sequences of ``lengths`` when each is truncated to ``cap`` (None: no cap)."""
    if cap is None:
        return sum(lengths)
    return sum(min(n, cap) for n in lengths)


class DatasetTokens(msgspec.Struct, omit_defaults=True):
    """Tokens of one dataset: ``tokens`` as kept (after any cap), ``tokens_uncapped`` before it."""

    dataset: str
    tokens: int
    tokens_uncapped: int | None = None
    samples: int = 0


def hidden_states_report(
    datasets: Sequence[DatasetTokens],
    *,
    hidden_size: int,
    slots: int = 4,
    dtype: str = "bf16",
    max_seq_len: int | None = None,
) -> HiddenStatesReport:
    """The estimate per dataset and in total, with what the cap saved and what dropping each dataset saves."""
    lines: list[HiddenDatasetLine] = []
    total = total_unc = 0
    for d in datasets:
        unc = d.tokens if d.tokens_uncapped is None else d.tokens_uncapped
        b = estimate_hidden_states(d.tokens, hidden_size, slots, dtype)
        saved = estimate_hidden_states(max(unc - d.tokens, 0), hidden_size, slots, dtype)
        lines.append(HiddenDatasetLine(dataset=d.dataset, samples=d.samples, tokens=d.tokens, bytes=b,
                                       drop_saves=b, cap_saved=saved))
        total += d.tokens
        total_unc += max(unc, d.tokens)
    return HiddenStatesReport(
        hidden_size=hidden_size,
        slots=slots,
        dtype=dtype,
        tokens=total,
        bytes=estimate_hidden_states(total, hidden_size, slots, dtype),
        tokens_uncapped=total_unc,
        bytes_uncapped=estimate_hidden_states(total_unc, hidden_size, slots, dtype),
        cap_saved=estimate_hidden_states(total_unc - total, hidden_size, slots, dtype),
        max_seq_len=max_seq_len,
        datasets=lines,
        by_dtype={dt: estimate_hidden_states(total, hidden_size, slots, dt) for dt in ("bf16", "fp8", "fp32")},
    )


def format_hidden_report(rep: HiddenStatesReport, *, cap_options: dict[int, int] | None = None) -> list[str]:
    """Lines for the terminal. ``cap_options`` maps other caps to the tokens they would keep (what-if)."""
    head = (
        f"hidden states ({rep.slots} slots × hidden {rep.hidden_size:,} × {rep.dtype}): "
        f"{format_bytes(rep.bytes)} for {rep.tokens:,} tokens"
        f" (fp8 {format_bytes(rep.by_dtype['fp8'])}, half of bf16 {format_bytes(rep.by_dtype['bf16'])}:"
        " hidden_states.dtype: fp8 halves the disk)"
    )
    out = [head]
    if rep.cap_saved:
        out.append(
            f"  the length cap ({rep.max_seq_len:,} tokens) saves {format_bytes(rep.cap_saved)}; "
            f"uncapped would be {format_bytes(rep.bytes_uncapped)}"
        )
    for cap, toks in sorted((cap_options or {}).items()):
        b = estimate_hidden_states(toks, rep.hidden_size, rep.slots, rep.dtype)
        out.append(f"  with a cap of {cap:,} tokens: {format_bytes(b)} ({toks:,} tokens)")
    width = max((len(d.dataset) for d in rep.datasets), default=7)
    for d in sorted(rep.datasets, key=lambda x: -x.bytes):
        share = d.bytes / rep.bytes if rep.bytes else 0.0
        line = f"  drop {d.dataset:<{width}}  saves {format_bytes(d.drop_saves):>9} ({share:5.1%})"
        if d.cap_saved:
            line += f"; its cap saved {format_bytes(d.cap_saved)}"
        out.append(line)
    return out
