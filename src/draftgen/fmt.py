"""Number formatting shared by the terminal status, the generate progress line and log, ``plan`` and the
HTML report (so all print the same), and ``render_text``, a rich table (or any rich renderable) as the text
``status``, ``plan`` and ``merge`` print.

A leaf: it imports only the standard library (rich inside ``render_text``, when it renders), so any layer
(``engine`` included) may import it without pulling in the rest of ``report``. Unknown values print as an
en dash.
"""

from __future__ import annotations

import datetime as _dt
import io
import shutil
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["fmt_duration", "fmt_float", "fmt_held", "fmt_int", "fmt_pct", "fmt_time", "fmt_usd", "render_text"]


def fmt_int(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x * 100:.{digits}f}%"


def fmt_float(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def fmt_usd(x: float | None) -> str:
    if x is None:
        return "–"
    if x == 0:
        return "$0"
    if abs(x) < 0.01:
        return f"${x:.6f}"
    if abs(x) < 100:
        return f"${x:,.4f}"
    return f"${x:,.2f}"


def fmt_held(billed: float, held: float, abandoned: int, usd: Callable[[float], str] = fmt_usd) -> str:
    """A booked spend that holds the worst case of requests abandoned on the wire, named apart (the display,
    generate's summary, ``status`` and the report all say it so): ``billed $1.91 + $2.03 held for 66
    abandoned requests, worst case``; ``""`` when nothing is held."""
    if held <= 0 or abandoned <= 0:
        return ""
    return (f"billed {usd(billed)} + {usd(held)} held for {abandoned:,} abandoned "
            f"request{'' if abandoned == 1 else 's'}, worst case")


def fmt_duration(seconds: float | None) -> str:
    """A duration for people: ``7.3s`` (under 10 s), ``42s``, ``3m 07s``, ``5h 02m``, ``2d 03h``; ``–`` if unknown.

    Two units at most, the second zero-padded, so a status line's width stays steady as it counts down.
    """
    if seconds is None:
        return "–"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h {m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d {h:02d}h"


def fmt_time(epoch: float | None) -> str:
    """UTC, so the page reads the same wherever it is opened."""
    if epoch is None:
        return "–"
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_text(renderable: RenderableType) -> str:
    """Render to a string at the terminal's width; colour only when stdout is a terminal."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(
        file=buf,
        width=max(80, shutil.get_terminal_size((110, 24)).columns),
        force_terminal=sys.stdout.isatty(),
        highlight=False,
    )
    console.print(renderable)
    return buf.getvalue().rstrip("\n")
