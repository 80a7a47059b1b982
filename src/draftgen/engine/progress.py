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
import bisect
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
    "Display", "RowFigures", "RunLog", "Snapshot", "footer_lines", "footer_segments", "main_cells", "make_display",
    "pack", "plain_line", "render", "row_cells", "snapshot", "status_line", "summary_lines", "tail_line",
    "tokens_left", "wire_cells",
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
    """One line of the display: a partition, or the total (``name == "total"``). ``planned`` and ``done``
    count the whole run directory's samples of the selection (a resumed run's earlier records included),
    ``done_now`` only this run's."""

    name: str
    planned: int  # samples of the selection: done before this run, plus those this run set out to finish
    done: int
    failed: int
    tok_s: float  # tokens received on the wire per second (streams still running included)
    resp_s: float
    in_flight: int
    concurrency: int
    spent: float  # dollars spent by this run on this row's samples
    eta_s: float | None
    retries: int
    oldest: str | None = None  # the sample id of the request longest on the wire (it starts with its dataset)
    oldest_age_s: float | None = None
    stalled: int = 0  # requests on the wire with no text for the stall time (``tail``)
    stalled_s: float | None = None  # the longest silence among them
    done_now: int | None = None  # done by this run (None: the same as ``done``)

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
    token_budgets: tuple[tuple[str, int, int], ...] = ()  # (dataset, completion tokens done, its budget)
    hedges: tuple[int, int, float] = (0, 0, 0.0)  # hedges sent, won, what their losers cost


def _eta(remaining: int, per_s: float) -> float | None:
    return remaining / per_s if per_s > 0 and remaining > 0 else None


def tokens_left(lengths: list[int], received: list[float], queued: int) -> float | None:
    """Tokens still to come: for each request on the wire, the mean length of this run's responses longer
    than what it has received, less what it has (half as much again when it is past every length seen);
    for each sample not on the wire, the mean length. None before any response is in."""
    n = len(lengths)
    if not n:
        return None
    suffix = [0] * (n + 1)  # suffix[i]: the sum of lengths[i:]
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + lengths[i]
    left = queued * suffix[0] / n
    for got in received:
        i = bisect.bisect_right(lengths, got)
        left += suffix[i] / (n - i) - got if i < n else 0.5 * got
    return left


def _row(pc: PartitionCounts, stats: RunStats, now: float, cpt: float) -> RowFigures:
    rates = window_rates(pc.window)
    tok_s, resp_s = rates if rates is not None else (0.0, 0.0)
    first = pc.oldest()
    label, age = (None, None) if first is None else (first[0][1], max(now - first[1], 0.0))
    left = max(pc.planned - pc.done - pc.failed, 0)
    received = [fl.meter.tokens(cpt) for fl in list(pc.flight.values())]
    todo = tokens_left(pc.lengths, received, max(left - len(received), 0)) if left else 0.0
    eta = (todo / tok_s if tok_s > 0 and todo else None) if todo is not None else _eta(left, resp_s)
    return RowFigures(pc.name, pc.planned + pc.done_before, pc.done + pc.done_before, pc.failed, tok_s, resp_s,
                      stats.in_flight.get(pc.name, 0), stats.limit.get(pc.name, 0), pc.cost, eta, pc.retries,
                      label, age, pc.stalled, pc.stalled_s, pc.done)


def _total(rows: list[RowFigures], stats: RunStats, now: float) -> RowFigures:
    tok_s, resp_s = stats.rates()
    etas = [r.eta_s for r in rows if r.remaining]
    aged = [r for r in rows if r.oldest_age_s is not None]
    oldest = max(aged, key=lambda r: r.oldest_age_s or 0.0) if aged else None
    silences = [r.stalled_s for r in rows if r.stalled_s is not None]
    return RowFigures(
        "total", sum(r.planned for r in rows), sum(r.done for r in rows), sum(r.failed for r in rows), tok_s, resp_s,
        sum(stats.in_flight.values()), sum(stats.limit.values()), stats.spend_session,
        max(e for e in etas if e is not None) if etas and None not in etas else None,  # partitions run side by side
        sum(stats.retries.values()), oldest.oldest if oldest else None, oldest.oldest_age_s if oldest else None,
        sum(r.stalled for r in rows), max(silences) if silences else None, sum(r.done_now or 0 for r in rows),
    )


def snapshot(stats: RunStats) -> Snapshot:
    """The figures of ``stats`` now (call on the event loop thread, where the counters change)."""
    now = stats.clock()
    cpt = stats.chars_per_token
    names = set(stats.partitions) | set(stats.limit)
    rows = [_row(stats.partitions.get(n) or PartitionCounts(n), stats, now, cpt)
            for n in sorted(names, key=lambda n: (n != "short", n))]  # short, long, then others
    rows.append(_total(rows, stats, now))
    # ``stats.remaining`` (the governor's) already takes reservations off; ``left`` shows them as such.
    usd_left = stats.remaining + stats.reserved if stats.remaining is not None else None
    grace = max(stats.grace_until - now, 0.0) if stats.grace_until is not None else None
    budgets = tuple((d.name, d.tokens_before + d.completion_tokens, d.token_budget)
                    for d in stats.datasets.values() if d.token_budget is not None)
    return Snapshot(
        rows=tuple(rows), spent=stats.spend_prior + stats.spend_session, left=usd_left, reserved=stats.reserved,
        retries=tuple(stats.retries.most_common()), failures=tuple(stats.failures.most_common()),
        providers=tuple(stats.providers.most_common(3)), cooling=tuple(stats.cooling),
        elapsed_s=stats.elapsed, stopping=stats.stopping, interrupt=stats.interrupt, grace_left_s=grace,
        aborting=stats.aborting, token_budgets=budgets,
        hedges=(stats.hedges, stats.hedges_won, stats.hedge_extra_usd),
    )


# -- drawing: the same cells, with the same names, on a terminal and in plain lines -------------------------


def main_cells(r: RowFigures) -> list[str]:
    """What a row must show whatever the width: progress (the whole run directory's), ETA, spend, failures."""
    pct = f" ({100.0 * r.done / r.planned:.0f}%)" if r.planned else ""
    return [f"done {r.done:,}/{r.planned:,}{pct}", f"ETA {fmt_duration(r.eta_s)}", f"${r.spent:.2f} spent",
            f"failed {r.failed:,}"]


def wire_cells(r: RowFigures) -> list[str]:
    """The rest of a row: what is left, the wire's throughput, slots, stalls, retries, the oldest request."""
    stalled = f"stalled {r.stalled:,}" + (f" ({fmt_duration(r.stalled_s)})" if r.stalled and r.stalled_s else "")
    return [
        f"{r.remaining:,} remaining",
        f"{_k(r.tok_s)} tok/s {r.resp_s:.1f} resp/s",
        f"in flight {r.in_flight}/{r.concurrency}",
        stalled,
        f"retries {r.retries:,}",
        f"oldest {fmt_duration(r.oldest_age_s)}" if r.oldest else "oldest –",
    ]


def row_cells(r: RowFigures) -> list[str]:
    """The figures of one row, each a self-named text (shared by the terminal and the plain lines). The
    oldest request's id is in ``footer_lines`` (ids are long; the row keeps its age)."""
    return [*main_cells(r), *wire_cells(r)]


def _pairs(pairs: tuple[tuple[str, int], ...], n: int) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in pairs[:n])


def footer_segments(snap: Snapshot) -> list[list[str]]:
    """Run-wide figures, as lines of segments (a narrow terminal packs the segments of a line onto as many
    lines as it needs; none is ever cut): the dollar budget (what is left includes what requests in flight
    reserve, named as such), failures and retries by kind; the token budgets; the oldest request in flight
    per partition, by id and age, providers, hedges; and a stop in progress."""
    money = [f"budget: ${snap.spent:.2f} spent"]
    if snap.left is not None:
        money.append(f"${snap.left:.2f} left (${snap.reserved:.2f} reserved)")
    else:
        money.append(f"no dollar cap (${snap.reserved:.2f} reserved)")
    first = [*money, f"failures: {_pairs(snap.failures, 4) or '0'}", f"retries: {_pairs(snap.retries, 4) or '0'}"]
    lines = [first]
    if snap.token_budgets:
        lines.append([f"token budget {name}: {_k(used)}/{_k(budget)} ({100.0 * used / budget if budget else 0.0:.0f}%)"
                      for name, used, budget in snap.token_budgets])
    oldest = [f"{r.name} {r.oldest} {fmt_duration(r.oldest_age_s)}" for r in snap.rows[:-1] if r.oldest]
    second = [f"oldest in flight: {oldest[0] if oldest else '–'}", *oldest[1:]]
    if snap.providers:
        second.append(f"providers: {_pairs(snap.providers, 3)}")
    if snap.cooling:
        second.append(f"cooling down: {', '.join(snap.cooling)}")
    sent, won, extra = snap.hedges
    if sent:
        second.append(f"hedged {sent:,} ({won:,} won, ${extra:.4f} extra)")
    second.append(f"elapsed {fmt_duration(snap.elapsed_s)}")
    lines.append(second)
    stop = stop_line(snap)
    if stop:
        lines.append([stop])
    return lines


def footer_lines(snap: Snapshot) -> list[str]:
    """The run-wide lines at any width (``footer_segments``, one line each)."""
    return [" · ".join(segs) for segs in footer_segments(snap)]


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


def pack(segments: list[str], width: int, *, indent: str = "", sep: str = " · ") -> list[str]:
    """``segments`` joined by ``sep`` into lines of at most ``width`` characters, never splitting one (a
    segment wider than the line gets a line of its own); lines after the first start with ``indent``."""
    lines: list[str] = []
    cur = ""
    for seg in segments:
        if cur and len(cur) + len(sep) + len(seg) > width:
            lines.append(cur)
            cur = indent + seg
        else:
            cur = cur + sep + seg if cur else seg
    if cur:
        lines.append(cur)
    return lines


#: the narrowest bar drawn; a row whose figures leave less room puts them on the lines below
MIN_BAR = 10


def render(snap: Snapshot, width: int | None = None) -> Any:
    """The terminal display of ``snap`` at ``width`` columns (default: the console's, when drawn): per
    partition and for the total, a bar of done out of planned and ``row_cells``, then the run-wide lines.
    Nothing is cut: when a row's figures do not fit on its bar's line, the bar's line keeps what matters
    (``main_cells``: progress, ETA, spend, failures) and the rest follows on indented lines; the run-wide
    segments are packed the same way. At a wide terminal a row is one line and the bar takes the room left."""
    from rich.console import Console, ConsoleOptions, RenderResult

    class _Fitted:
        def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
            yield _draw(snap, width or options.max_width)

    return _Fitted() if width is None else _draw(snap, width)


def _draw(snap: Snapshot, width: int) -> Any:
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    name_w = max((len(r.name) for r in snap.rows), default=5)
    full = [" · ".join(row_cells(r)) for r in snap.rows]
    one_line = all(name_w + len(t) + MIN_BAR + 2 <= width for t in full)
    heads = full if one_line else [" · ".join(main_cells(r)) for r in snap.rows]
    text_w = max((len(t) for t in heads), default=0)
    beside = name_w + text_w + MIN_BAR + 2 <= width  # the row's first figures fit beside its bar
    parts: list[Any] = []
    for r, head in zip(snap.rows, heads, strict=True):
        grid = Table.grid(expand=True, padding=(0, 1, 0, 0))
        grid.add_column(no_wrap=True, width=name_w)
        grid.add_column(ratio=1)
        if beside:
            grid.add_column(no_wrap=True, width=text_w)
        bar = ProgressBar(total=max(r.planned, r.done, 1), completed=r.done)
        if beside:
            grid.add_row(r.name, bar, head)
        else:
            grid.add_row(r.name, bar)
        parts.append(grid)
        rest = [] if one_line else wire_cells(r)
        if not beside:
            rest = [*main_cells(r), *rest]
        parts += [Text("  " + line) for line in pack(rest, width - 2)]
    for segs in footer_segments(snap):
        parts += [Text(line) for line in pack(segs, width, indent="  ")]
    return Group(*parts)


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
    tail = tail_line(stats)
    if tail:
        lines.append(tail)
    return lines


def tail_line(stats: RunStats) -> str | None:
    """The tail's work (``tail.*``): hedges and what they cost beyond one request per sample, slow streams
    cancelled; None when there was none."""
    parts = []
    if stats.hedges:
        share = stats.hedge_extra_usd / stats.spend_session if stats.spend_session > 0 else 0.0
        parts.append(f"{stats.hedges:,} hedged ({stats.hedges_won:,} won), ${stats.hedge_extra_usd:.4f} extra "
                     f"({share:.1%} of this run's spend)")
    if stats.slow_streams:
        parts.append(f"{stats.slow_streams:,} slow streams cancelled and retried elsewhere")
    return "tail: " + "; ".join(parts) if parts else None


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
