"""Progress display and the run log: drawing what ``engine.stats.RunStats`` counts.

- On a TTY (``progress: auto`` or ``rich``): a rich ``Live`` panel redrawn twice a second on rich's own
  thread: per-dataset progress, tokens/s, requests in flight (and the adaptive limit), dollars spent and
  remaining, ETA, errors by kind and the provider mix.
- Otherwise (``plain``): one status line every ``interval`` seconds on stderr.
- Always: the same status line every ``interval`` seconds in ``logs/generate.log``, plus every retry and
  failure with its reason (written by the scheduler through ``RunLog``).

The log is UTF-8 text, one ``YYYY-MM-DD HH:MM:SS message`` line per event. Lines pass through
``secrets.redact``; nothing that logs here ever holds an API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..report.format import fmt_duration  # a leaf (standard library only): one duration format everywhere
from ..secrets import redact
from ..store import storage_error
from .stats import RunStats

__all__ = ["Display", "RunLog", "make_display", "status_line", "summary_lines"]


class RunLog:
    """Append-only text log of one run (``run_dir/logs/generate.log``)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed by close())
            except OSError as exc:
                raise storage_error(path, exc) from None

    def write(self, message: str) -> None:
        if self._fh is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = " ".join(redact(message).splitlines())  # one line per event, never a key
        try:
            self._fh.write(f"{stamp} {line}\n")
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        """A log that cannot be written stops the run with its path; later writes are no-ops."""
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()
        assert self.path is not None
        raise storage_error(self.path, exc) from None

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError as exc:
                self._fh = None
                raise storage_error(self.path or Path("?"), exc) from None
            self._fh = None


def _k(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}"


def _money(stats: RunStats) -> str:
    spent = stats.spend_prior + stats.spend_session
    rem = f", ${stats.remaining:.2f} left" if stats.remaining is not None else ""
    return f"${spent:.2f} spent{rem}"


def _top(counter: Any, n: int = 4) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common(n))


def status_line(stats: RunStats) -> str:
    tok_s, _ = stats.rates()
    total = stats.to_do
    done = stats.done
    pct = f" ({100.0 * done / total:.0f}%)" if total else ""
    flight = " ".join(f"{p} {stats.in_flight.get(p, 0)}/{stats.limit.get(p, 0)}" for p in sorted(stats.limit))
    bits = [
        f"done {done}/{total}{pct}",
        f"failed {stats.failed}",
        f"in flight {flight}" if flight else "in flight 0",
        f"{_k(tok_s)} tok/s",
        _money(stats),
        f"ETA {fmt_duration(stats.eta())}",
    ]
    if stats.retries:
        bits.append(f"retries: {_top(stats.retries)}")
    if stats.providers:
        bits.append(f"providers: {_top(stats.providers, 3)}")
    if stats.cooling:
        bits.append(f"cooling down: {', '.join(stats.cooling)}")
    if stats.stopping:
        bits.append(f"stopping: {stats.stopping}")
    return " | ".join(bits)


def summary_lines(stats: RunStats) -> list[str]:
    lines = []
    for d in stats.datasets.values():
        extra = f" ({d.skipped})" if d.skipped else ""
        lines.append(
            f"{d.name}: {d.done} done now, {d.done_before} before, {d.failed} failed, "
            f"{_k(d.completion_tokens)} completion tokens, ${d.cost:.4f}{extra}"
        )
    tok_s = stats.completion_tokens / stats.elapsed if stats.elapsed > 0 else 0.0
    lines.append(
        f"total: {stats.done} done, {stats.failed} failed, {_k(stats.completion_tokens)} completion tokens "
        f"({_k(tok_s)} tok/s), ${stats.spend_session:.4f} this run (${stats.spend_prior + stats.spend_session:.4f} "
        f"in this run dir), {fmt_duration(stats.elapsed)}"
    )
    if stats.failures:
        lines.append(f"failures by kind: {_top(stats.failures, 8)}")
    if stats.kept_unusable:
        lines.append(f"unusable responses kept as flagged records (quality.keep_unusable): {_top(stats.kept_unusable, 4)}")
    if stats.cooldowns:
        lines.append(f"providers cooled down: {_top(stats.cooldowns, 8)}")
    return lines


class Display:
    """Status every ``interval`` seconds to the log (and stderr when plain); subclasses draw more."""

    def __init__(self, stats: RunStats, log: RunLog, *, interval: float = 10.0, echo: Callable[[str], None] | None = None) -> None:
        self.stats = stats
        self.log = log
        self.interval = interval
        self.echo = echo
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, self.interval))
            self.stats.sample()
            now = time.monotonic()
            if now - last >= self.interval:
                last = now
                self.emit(status_line(self.stats))

    def emit(self, line: str) -> None:
        line = redact(line)
        self.log.write(line)
        if self.echo is not None:
            self.echo(line)

    def print(self, line: str) -> None:
        """A one-off message for the user (and the log)."""
        line = redact(line)
        self.log.write(line)
        self._print(line)

    def _print(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.log.write(status_line(self.stats))


class RichDisplay(Display):
    def __init__(self, stats: RunStats, log: RunLog, *, interval: float = 10.0) -> None:
        super().__init__(stats, log, interval=interval)
        from rich.console import Console

        self.console = Console(stderr=True)
        self._live: Any = None

    def _render(self) -> Any:
        from rich.table import Table

        s = self.stats
        tok_s, req_s = s.rates()
        table = Table(title="draftgen generate", expand=False, show_edge=False)
        for col in ("dataset", "done", "to do", "failed", "tokens", "cost"):
            table.add_column(col, justify="right" if col != "dataset" else "left")
        for d in s.datasets.values():
            pct = f" {100.0 * d.done / d.to_do:.0f}%" if d.to_do else ""
            table.add_row(d.name, f"{d.done}{pct}", str(d.to_do), str(d.failed), _k(d.completion_tokens),
                          f"${d.cost:.3f}")
        flight = "  ".join(f"{p} {s.in_flight.get(p, 0)}/{s.limit.get(p, 0)}" for p in sorted(s.limit))
        table.caption = (
            f"{_k(tok_s)} tok/s  {req_s:.1f} req/s  in flight: {flight}  {_money(s)}  "
            f"ETA {fmt_duration(s.eta())}  elapsed {fmt_duration(s.elapsed)}"
            + (f"\nerrors: {_top(s.retries + s.failures, 6)}" if (s.retries or s.failures) else "")
            + (f"\nproviders: {_top(s.providers, 5)}" if s.providers else "")
            + (f"\ncooling down: {', '.join(s.cooling)}" if s.cooling else "")
            + (f"\nstopping: {s.stopping}" if s.stopping else "")
        )
        return table

    def _print(self, line: str) -> None:
        self.console.print(line)

    def start(self) -> None:
        from rich.live import Live

        self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=2, transient=False)
        self._live.start()
        super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._live is not None:
            self._live.stop()
            self._live = None


def make_display(mode: str, stats: RunStats, log: RunLog, *, interval: float = 10.0) -> Display:
    """``auto``: rich on a TTY, plain otherwise; ``off``: log file only."""
    if mode == "auto":
        mode = "rich" if sys.stderr.isatty() else "plain"
    if mode == "rich":
        return RichDisplay(stats, log, interval=interval)
    if mode == "plain":
        return Display(stats, log, interval=interval, echo=lambda line: print(line, file=sys.stderr, flush=True))
    return Display(stats, log, interval=interval)
