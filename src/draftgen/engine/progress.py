"""Progress display and the run log: drawing what ``engine.stats.RunStats`` counts.

- Every figure drawn comes from a ``Snapshot`` (a plain value taken on the event loop twice a second by
  ``snapshot``); drawing is a function of it alone (``render``, ``plain_line``), so it is testable.
- On a TTY (``progress: auto`` or ``rich``): ``rich.progress`` lines redrawn twice a second over the whole
  terminal width, one per partition and one for the total: a bar of done out of planned samples, remaining
  samples, tokens/s and responses/s, in flight out of concurrency, dollars spent, ETA, retries, failures, the
  oldest request in flight and its age; then the dollar budget (spent, left, and the part of it reserved by
  requests in flight), retries and failures by kind, and, while stopping, the grace period and that a second
  Ctrl-C aborts.
- Otherwise (``plain``): one status line every ``interval`` seconds on stderr, with the same figures under the
  same names (``row_cells``, ``footer_lines``).
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from draftgen.engine.stats import PartitionCounts, RunStats, window_rates
from draftgen.fmt import fmt_duration  # a leaf (standard library only): one duration format everywhere
from draftgen.secrets import redact
from draftgen.store import storage_error

__all__ = [
    "Display", "RowFigures", "RunLog", "Snapshot", "footer_lines", "make_display", "plain_line", "render",
    "row_cells", "snapshot", "status_line", "summary_lines",
]


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


def _top(counter: Any, n: int = 4) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common(n))


# -- the snapshot: every figure the display shows, taken on the event loop ----------------------------------


@dataclass(frozen=True)
class RowFigures:
    """One line of the display: a partition, or the total (``name == "total"``)."""

    name: str
    planned: int  # samples this run set out to finish
    done: int
    failed: int
    tok_s: float
    resp_s: float
    in_flight: int
    concurrency: int
    spent: float  # dollars spent by this run on this row's samples
    eta_s: float | None
    retries: int
    oldest: str | None = None  # the sample id of the request longest on the wire (it starts with its dataset)
    oldest_age_s: float | None = None

    @property
    def remaining(self) -> int:
        return max(self.planned - self.done - self.failed, 0)


@dataclass(frozen=True)
class Snapshot:
    """What the display draws, a plain value: ``render`` and ``plain_line`` are functions of it alone."""

    rows: tuple[RowFigures, ...]  # one per partition, then the total (last)
    spent: float  # dollars spent in this run directory (earlier runs included): what the dollar budget counts
    left: float | None  # dollars of the budget not yet spent, reservations included; None without a cap
    reserved: float  # dollars held by requests in flight (part of ``left``)
    retries: tuple[tuple[str, int], ...] = ()  # by kind, most first
    failures: tuple[tuple[str, int], ...] = ()  # by kind, most first
    providers: tuple[tuple[str, int], ...] = ()
    cooling: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    stopping: str | None = None
    interrupt: str | None = None  # SIGINT/SIGTERM when the user stopped the run
    grace_left_s: float | None = None  # seconds before what is still in flight is cancelled
    aborting: bool = False


def _eta(remaining: int, per_s: float) -> float | None:
    return remaining / per_s if per_s > 0 and remaining > 0 else None


def snapshot(stats: RunStats) -> Snapshot:
    """The figures of ``stats`` now (call on the event loop thread, where the counters change)."""
    now = stats.clock()
    rows: list[RowFigures] = []
    oldest: tuple[str, float] | None = None
    names = set(stats.partitions) | set(stats.limit)
    for name in sorted(names, key=lambda n: (n != "short", n)):  # short, long, then others
        pc = stats.partitions.get(name) or PartitionCounts(name)
        rates = window_rates(pc.window)
        tok_s, resp_s = rates if rates is not None else (0.0, 0.0)
        first = pc.oldest()
        label, age = (None, None) if first is None else (first[0][1], max(now - first[1], 0.0))
        if first is not None and label is not None and (oldest is None or first[1] < oldest[1]):
            oldest = (label, first[1])
        left = max(pc.planned - pc.done - pc.failed, 0)
        rows.append(RowFigures(pc.name, pc.planned, pc.done, pc.failed, tok_s, resp_s,
                               stats.in_flight.get(name, 0), stats.limit.get(name, 0), pc.cost,
                               _eta(left, resp_s), pc.retries, label, age))
    tok_s, resp_s = stats.rates()
    planned = stats.to_do  # = the partitions' planned samples, summed (both count what was pending at start)
    done, failed = stats.done, stats.failed
    rows.append(RowFigures(
        "total", planned, done, failed, tok_s, resp_s, sum(stats.in_flight.values()), sum(stats.limit.values()),
        stats.spend_session, _eta(max(planned - done - failed, 0), resp_s), sum(stats.retries.values()),
        oldest[0] if oldest else None, max(now - oldest[1], 0.0) if oldest else None,
    ))
    # ``stats.remaining`` (the governor's) already takes reservations off; ``left`` shows them as such.
    usd_left = stats.remaining + stats.reserved if stats.remaining is not None else None
    grace = max(stats.grace_until - now, 0.0) if stats.grace_until is not None else None
    return Snapshot(
        rows=tuple(rows), spent=stats.spend_prior + stats.spend_session, left=usd_left, reserved=stats.reserved,
        retries=tuple(stats.retries.most_common()), failures=tuple(stats.failures.most_common()),
        providers=tuple(stats.providers.most_common(3)), cooling=tuple(stats.cooling),
        elapsed_s=stats.elapsed, stopping=stats.stopping, interrupt=stats.interrupt, grace_left_s=grace,
        aborting=stats.aborting,
    )


# -- drawing: the same cells, with the same names, on a terminal and in plain lines -------------------------


def row_cells(r: RowFigures) -> list[str]:
    """The figures of one row, each a self-named text (shared by the terminal and the plain lines). The
    oldest request's id is in ``footer_lines`` (ids are long; the row keeps its age)."""
    pct = f" ({100.0 * r.done / r.planned:.0f}%)" if r.planned else ""
    return [
        f"done {r.done:,}/{r.planned:,}{pct}",
        f"{r.remaining:,} remaining",
        f"{_k(r.tok_s)} tok/s {r.resp_s:.1f} resp/s",
        f"in flight {r.in_flight}/{r.concurrency}",
        f"${r.spent:.2f} spent",
        f"ETA {fmt_duration(r.eta_s)}",
        f"retries {r.retries:,}",
        f"failed {r.failed:,}",
        f"oldest {fmt_duration(r.oldest_age_s)}" if r.oldest else "oldest –",
    ]


def _pairs(pairs: tuple[tuple[str, int], ...], n: int) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in pairs[:n])


def footer_lines(snap: Snapshot) -> list[str]:
    """Run-wide figures: the dollar budget (what is left includes what requests in flight reserve, named as
    such), retries and failures by kind; the oldest request in flight per partition, by id and age; providers;
    and a stop in progress."""
    money = f"budget: ${snap.spent:.2f} spent"
    if snap.left is not None:
        money += f" · ${snap.left:.2f} left (${snap.reserved:.2f} reserved)"
    else:
        money += f" · no dollar cap (${snap.reserved:.2f} reserved)"
    first = [money, f"retries: {_pairs(snap.retries, 4) or '0'}", f"failures: {_pairs(snap.failures, 4) or '0'}"]
    oldest = ", ".join(f"{r.name} {r.oldest} {fmt_duration(r.oldest_age_s)}" for r in snap.rows[:-1] if r.oldest)
    second = [f"oldest in flight: {oldest or '–'}"]
    if snap.providers:
        second.append(f"providers: {_pairs(snap.providers, 3)}")
    if snap.cooling:
        second.append(f"cooling down: {', '.join(snap.cooling)}")
    second.append(f"elapsed {fmt_duration(snap.elapsed_s)}")
    lines = [" · ".join(first), " · ".join(second)]
    stop = stop_line(snap)
    if stop:
        lines.append(stop)
    return lines


def stop_line(snap: Snapshot) -> str | None:
    """What a stop in progress is doing: the grace period and how to cut it short."""
    if snap.stopping is None:
        return None
    flight = snap.rows[-1].in_flight if snap.rows else 0
    if snap.aborting:
        return f"aborting: cancelling {flight:,} requests in flight; finished records are on disk ({snap.stopping})"
    if snap.grace_left_s is not None:
        who = snap.interrupt or "stop"
        return (f"{who}: grace period, finishing {flight:,} requests in flight ({fmt_duration(snap.grace_left_s)} "
                "left, then they are cancelled); press Ctrl-C again to abort now")
    return f"stopping: {snap.stopping}"


def plain_line(snap: Snapshot) -> str:
    """One status line with the figures of ``render``, under the same names."""
    rows = [f"{r.name}: " + " · ".join(row_cells(r)) for r in (snap.rows[-1], *snap.rows[:-1])]
    return " | ".join([*rows, *footer_lines(snap)])


def status_line(stats: RunStats) -> str:
    return plain_line(snapshot(stats))


def render(snap: Snapshot) -> Any:
    """The terminal display of ``snap``: a ``rich.progress`` line per partition and a total line (a bar of done
    out of planned, then ``row_cells``), then the run-wide lines. Cells never wrap: at a narrow terminal they
    are cut with an ellipsis; at a wide one the bar takes the room left."""
    from rich.console import Group
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Column
    from rich.text import Text

    ncells = len(row_cells(snap.rows[0])) if snap.rows else 0
    cols: list[Any] = [
        TextColumn("{task.description}", markup=False, table_column=Column(no_wrap=True, min_width=5)),
        BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=8)),
    ]
    cols += [TextColumn(f"{{task.fields[c{i}]}}", markup=False,
                        table_column=Column(no_wrap=True, overflow="ellipsis"))
             for i in range(ncells)]
    progress = Progress(*cols, expand=True, auto_refresh=False)
    for r in snap.rows:
        fields: dict[str, Any] = {f"c{i}": c for i, c in enumerate(row_cells(r))}
        progress.add_task(r.name, total=max(r.planned, r.done, 1), completed=r.done, **fields)
    footer = [Text(line, no_wrap=True, overflow="ellipsis") for line in footer_lines(snap)]
    return Group(progress.make_tasks_table(progress.tasks), *footer)


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
    """Status every ``interval`` seconds to the log (and stderr when plain); subclasses draw more.

    Every ``tick`` seconds, on the event loop (where the counters change), it samples the throughput and takes
    a ``Snapshot``; everything drawn is drawn from the latest snapshot."""

    tick = 0.5

    def __init__(self, stats: RunStats, log: RunLog, *, interval: float = 10.0, echo: Callable[[str], None] | None = None) -> None:
        self.stats = stats
        self.log = log
        self.interval = interval
        self.echo = echo
        self.snap: Snapshot | None = None
        self._task: asyncio.Task[None] | None = None

    def refresh(self) -> Snapshot:
        """Sample the throughput and take a fresh snapshot."""
        self.stats.sample()
        self.snap = snapshot(self.stats)
        return self.snap

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(self.tick, self.interval))
            snap = self.refresh()
            now = time.monotonic()
            if now - last >= self.interval:
                last = now
                self.emit(plain_line(snap))

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
        self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.log.write(plain_line(self.refresh()))


class RichDisplay(Display):
    """A ``rich.progress`` display (``render``) on stderr, redrawn twice a second from the latest snapshot, over
    the whole width of the terminal."""

    def __init__(self, stats: RunStats, log: RunLog, *, interval: float = 10.0) -> None:
        super().__init__(stats, log, interval=interval)
        from rich.console import Console

        self.console = Console(stderr=True)
        self._live: Any = None

    def _render(self) -> Any:
        snap = self.snap if self.snap is not None else snapshot(self.stats)
        return render(snap)

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)

    def start(self) -> None:
        from rich.live import Live

        super().start()
        self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=2, transient=False)
        self._live.start()

    async def stop(self) -> None:
        await super().stop()
        if self._live is not None:
            self._live.refresh()
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
