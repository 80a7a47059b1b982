"""Progress display and the run log: drawing what ``engine.stats.RunStats`` counts.

- Every figure drawn comes from a ``Snapshot`` (a plain value taken on the event loop twice a second by
  ``snapshot``); drawing is a function of it alone (``render``, ``plain_line``), so it is testable.
- On a TTY (``progress: auto`` or ``rich``): ``rich.progress`` lines redrawn twice a second over the whole
  terminal width, one per partition and one for the total: a bar of done out of planned samples, remaining
  samples, tokens/s and responses/s, in flight out of concurrency, dollars spent, ETA, retries, failures, the
  oldest request in flight and its age; then the dollar budget (spent, with what requests abandoned on the
  wire hold at their worst case named apart, left, and the part of it reserved by requests in flight), retries and failures by kind, and, while stopping, the grace period and that a second
  Ctrl-C aborts.
- Otherwise (``plain``): one status line every ``interval`` seconds on stderr, with the same figures under the
  same names (``row_cells``, ``footer_lines``).
- The ETA is ``engine.eta.partition_eta`` (``engine.timemodel``, the time model ``plan`` uses): per
  partition, the streams in flight all done, each at its own speed with what it still has to produce (this run's lengths, the streams in flight
  counted as at least as long as what they have received), and the samples not sent yet in waves at the
  current concurrency; the cell names the part that decides it (``ETA 8m 30s (in flight)``, ``(waves)``),
  or ``(resp/s)`` before any stream's rate is known (samples left over responses per second). It is computed
  every ``RunStats.eta_every_s`` seconds (2; it counts down in between). The total's is the longest partition's.
- The pace, under one definition (``engine.stats``) and labelled so: ``tok/s (30s)`` the live rate on the
  wire, ``elapsed (this run)`` and ``mean tok/s (this run)``.
- Always: the same status line every ``interval`` seconds in ``logs/generate.log``, plus every retry and
  failure with its reason (written by the scheduler through ``RunLog``); and, when given a path
  (``logs/progress.json``), the total's figures as a ``records.ProgressRecord`` (``progress_record``) at the
  same times and at the end, which ``status`` shows for a run in progress.

The log is UTF-8 text, one ``YYYY-MM-DD HH:MM:SS message`` line per event. Lines pass through
``secrets.redact``; nothing that logs here ever holds an API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from draftgen.engine.eta import partition_eta
from draftgen.engine.stats import RATE_WINDOW_S, PartitionCounts, RunStats, window_rates
from draftgen.fmt import fmt_duration, fmt_held  # a leaf (standard library only): one format everywhere
from draftgen.records import ProgressRecord
from draftgen.secrets import redact
from draftgen.store import atomic_write_json, storage_error

__all__ = [
    "Display", "RowFigures", "RunLog", "Snapshot", "eta_text", "fit_line", "footer_lines", "footer_segments",
    "main_cells", "make_display", "pace_text", "pack", "plain_line", "progress_record", "render", "row_cells",
    "snapshot", "status_line", "summary_lines", "tail_line", "wire_cells",
]

#: What the ETA cell calls each basis of ``timemodel.Eta``, and the fallback before any rate is known.
ETA_BASIS = {"streams": "in flight", "waves": "waves", "resp/s": "resp/s"}


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
    eta_basis: str | None = None  # what decides ``eta_s``: ``ETA_BASIS``'s names

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
    held: float = 0.0  # part of ``spent``: the worst cases of requests abandoned on the wire, not settled yet
    abandoned: int = 0  # ... how many requests hold them
    retries: tuple[tuple[str, int], ...] = ()  # by kind, most first
    failures: tuple[tuple[str, int], ...] = ()  # by kind, most first
    providers: tuple[tuple[str, int], ...] = ()
    cooling: tuple[str, ...] = ()
    elapsed_s: float = 0.0  # since this run started (``RunStats.elapsed``)
    mean_tok_s: float = 0.0  # this run's completion tokens over ``elapsed_s``
    stopping: str | None = None
    interrupt: str | None = None  # SIGINT/SIGTERM when the user stopped the run
    grace_left_s: float | None = None  # seconds before what is still in flight is cancelled
    aborting: bool = False
    token_budgets: tuple[tuple[str, int, int], ...] = ()  # (dataset, completion tokens done, its budget)
    hedges: tuple[int, int, float] = (0, 0, 0.0)  # hedges sent, won, what their losers cost


def _eta(pc: PartitionCounts, stats: RunStats, now: float, cpt: float, resp_s: float) -> tuple[float | None, str | None]:
    """The ETA shown and its basis: ``partition_eta`` every ``stats.eta_every_s`` seconds, counting down in between;
    samples left over responses per second before any rate is known."""
    cached = pc.eta_cache
    if cached is None or now - cached[0] >= stats.eta_every_s or now < cached[0]:
        cached = pc.eta_cache = (now, partition_eta(pc, stats, now, cpt))
    at, est = cached
    if est is not None:
        return max(est.seconds - (now - at), 0.0), ETA_BASIS[est.basis]
    left = max(pc.planned - pc.done - pc.failed, 0)
    return (left / resp_s, ETA_BASIS["resp/s"]) if resp_s > 0 and left else (None, None)


def _row(pc: PartitionCounts, stats: RunStats, now: float, cpt: float) -> RowFigures:
    rates = window_rates(pc.window)
    tok_s, resp_s = rates if rates is not None else (0.0, 0.0)
    first = pc.oldest()
    label, age = (None, None) if first is None else (first[0][1], max(now - first[1], 0.0))
    eta_s, basis = _eta(pc, stats, now, cpt, resp_s)
    return RowFigures(pc.name, pc.planned + pc.done_before, pc.done + pc.done_before, pc.failed, tok_s, resp_s,
                      stats.in_flight.get(pc.name, 0), stats.limit.get(pc.name, 0), pc.cost, eta_s, pc.retries,
                      label, age, pc.stalled, pc.stalled_s, pc.done, basis)


def _total(rows: list[RowFigures], stats: RunStats, now: float) -> RowFigures:
    tok_s, resp_s = stats.rates()
    etas = [r for r in rows if r.remaining]
    aged = [r for r in rows if r.oldest_age_s is not None]
    oldest = max(aged, key=lambda r: r.oldest_age_s or 0.0) if aged else None
    silences = [r.stalled_s for r in rows if r.stalled_s is not None]
    # partitions run side by side: the total's ETA is the longest partition's (none while one has none)
    last = max(etas, key=lambda r: r.eta_s or 0.0) if etas and all(r.eta_s is not None for r in etas) else None
    return RowFigures(
        "total", sum(r.planned for r in rows), sum(r.done for r in rows), sum(r.failed for r in rows), tok_s, resp_s,
        sum(stats.in_flight.values()), sum(stats.limit.values()), stats.spend_session,
        last.eta_s if last else None,
        sum(stats.retries.values()), oldest.oldest if oldest else None, oldest.oldest_age_s if oldest else None,
        sum(r.stalled for r in rows), max(silences) if silences else None, sum(r.done_now or 0 for r in rows),
        last.eta_basis if last else None,
    )


def snapshot(stats: RunStats) -> Snapshot:
    """The figures of ``stats`` now (call on the event loop thread, where the counters change)."""
    now = stats.clock()
    cpt = stats.chars_per_token
    names = set(stats.partitions) | set(stats.limit)
    rows = [_row(stats.partitions.get(n) or PartitionCounts(n), stats, now, cpt)
            for n in sorted(names, key=lambda n: (n != "short", n))]  # short, long, then others
    rows.append(_total(rows, stats, now))
    gov = stats.governor
    if gov is not None:  # one reading of the budget: spent + left never passes it
        spent, usd_left, reserved, held, abandoned = gov.spent, gov.left, gov.reserved, gov.held, gov.abandoned
    else:  # ``stats.remaining`` already takes reservations off; ``left`` shows them as such
        spent, reserved, held, abandoned = stats.spend_prior + stats.spend_session, stats.reserved, 0.0, 0
        usd_left = stats.remaining + stats.reserved if stats.remaining is not None else None
    grace = max(stats.grace_until - now, 0.0) if stats.grace_until is not None else None
    budgets = tuple((d.name, d.tokens_before + d.completion_tokens, d.token_budget)
                    for d in stats.datasets.values() if d.token_budget is not None)
    return Snapshot(
        rows=tuple(rows), spent=spent, left=usd_left, reserved=reserved, held=held, abandoned=abandoned,
        retries=tuple(stats.retries.most_common()), failures=tuple(stats.failures.most_common()),
        providers=tuple(stats.providers.most_common(3)), cooling=tuple(stats.cooling),
        elapsed_s=stats.elapsed, mean_tok_s=stats.mean_tok_s, stopping=stats.stopping, interrupt=stats.interrupt, grace_left_s=grace,
        aborting=stats.aborting, token_budgets=budgets,
        hedges=(stats.hedges, stats.hedges_won, stats.hedge_extra_usd),
    )


# -- drawing: the same cells, with the same names, on a terminal and in plain lines -------------------------


def eta_text(eta_s: float | None, basis: str | None) -> str:
    """The ETA cell: the time left and what decides it (``ETA 8m 30s (in flight)``)."""
    return f"ETA {fmt_duration(eta_s)}" + (f" ({basis})" if basis and eta_s is not None else "")


def pace_text(elapsed_s: float, mean_tok_s: float) -> str:
    """This run's pace under its one definition (``engine.stats``), labelled: shared by the display's footer,
    the final summary and ``status``."""
    return f"elapsed {fmt_duration(elapsed_s)} · mean {_k(mean_tok_s)} tok/s (this run)"


def main_cells(r: RowFigures) -> list[str]:
    """What a row must show whatever the width: progress (the whole run directory's), ETA, spend, failures."""
    pct = f" ({100.0 * r.done / r.planned:.0f}%)" if r.planned else ""
    return [f"done {r.done:,}/{r.planned:,}{pct}", eta_text(r.eta_s, r.eta_basis), f"${r.spent:.2f} spent",
            f"failed {r.failed:,}"]


def wire_cells(r: RowFigures) -> list[str]:
    """The rest of a row: what is left, the wire's throughput, slots, stalls, retries, the oldest request."""
    stalled = f"stalled {r.stalled:,}" + (f" ({fmt_duration(r.stalled_s)})" if r.stalled and r.stalled_s else "")
    return [
        f"{r.remaining:,} remaining",
        f"{_k(r.tok_s)} tok/s {r.resp_s:.1f} resp/s ({RATE_WINDOW_S:g}s)",
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
    held = fmt_held(snap.spent - snap.held, snap.held, snap.abandoned, usd=_usd2)
    money = [f"budget: ${snap.spent:.2f} spent" + (f" ({held})" if held else "")]
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
    second.append(pace_text(snap.elapsed_s, snap.mean_tok_s))
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


def progress_record(snap: Snapshot, *, finished: bool = False) -> ProgressRecord:
    """The total row and pace of ``snap`` as the record ``status`` reads."""
    t = snap.rows[-1]
    return ProgressRecord(written_at=time.time(), pid=os.getpid(), elapsed_s=round(snap.elapsed_s, 3),
                          mean_tok_s=round(snap.mean_tok_s, 3), tok_s=round(t.tok_s, 3), done=t.done,
                          planned=t.planned, failed=t.failed, finished=finished,
                          eta_s=0.0 if finished else (None if t.eta_s is None else round(t.eta_s, 3)),
                          eta_basis=None if finished else t.eta_basis)


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


#: The width the end-of-run lines fit in (a terminal's narrowest usual width).
SUMMARY_WIDTH = 80


def fit_line(line: str, width: int = SUMMARY_WIDTH) -> list[str]:
    """``line`` broken between words into lines of at most ``width`` characters, the later ones indented."""
    return textwrap.wrap(line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False) or [line]


def summary_lines(stats: RunStats) -> list[str]:
    lines = []
    for d in stats.datasets.values():
        extra = f" ({d.skipped})" if d.skipped else ""
        lines.append(
            f"{d.name}: {d.done} done now, {d.done_before} before, {d.failed} failed, "
            f"{_k(d.completion_tokens)} completion tokens, ${d.cost:.4f}{extra}"
        )
    gov = stats.governor
    session, spent = (gov.session, gov.spent) if gov is not None else (stats.spend_session,
                                                                      stats.spend_prior + stats.spend_session)
    held = fmt_held(gov.billed, gov.held, gov.abandoned, usd=_usd4) if gov is not None else ""
    lines.append(
        f"total: {stats.done} done, {stats.failed} failed, {_k(stats.completion_tokens)} completion tokens "
        f"({pace_text(stats.elapsed, stats.mean_tok_s)}), ${session:.4f} this run (${spent:.4f} in this run dir"
        + (f": {held}" if held else "") + ")"
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
    return [part for line in lines for part in fit_line(line)]


def _usd2(x: float) -> str:
    return f"${x:.2f}"


def _usd4(x: float) -> str:
    return f"${x:.4f}"


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

    def __init__(self, stats: RunStats, log: RunLog, *, interval: float = 10.0, echo: Callable[[str], None] | None = None,
                 record: Path | None = None) -> None:
        self.stats = stats
        self.log = log
        self.interval = interval
        self.echo = echo
        self.record = record  # logs/progress.json: written with each status line and at the end
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
                self.write_record(snap)

    def emit(self, line: str) -> None:
        line = redact(line)
        self.log.write(line)
        if self.echo is not None:
            self.echo(line)

    def write_record(self, snap: Snapshot, *, finished: bool = False) -> None:
        """The total's figures to ``record`` (atomically), for ``status``."""
        if self.record is None:
            return
        try:
            atomic_write_json(self.record, progress_record(snap, finished=finished))
        except OSError as exc:
            raise storage_error(self.record, exc) from None

    def print(self, line: str) -> None:
        """A one-off message for the user (and the log)."""
        line = redact(line)
        self.log.write(line)
        self._print(line)

    def _print(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def start(self) -> None:
        self.write_record(self.refresh())
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        snap = self.refresh()
        self.log.write(plain_line(snap))
        self.write_record(snap, finished=True)


class RichDisplay(Display):
    """A ``rich.progress`` display (``render``) on stderr, redrawn twice a second from the latest snapshot, over
    the whole width of the terminal."""

    def __init__(self, stats: RunStats, log: RunLog, *, interval: float = 10.0, record: Path | None = None) -> None:
        super().__init__(stats, log, interval=interval, record=record)
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


def make_display(mode: str, stats: RunStats, log: RunLog, *, interval: float = 10.0,
                 record: Path | None = None) -> Display:
    """``auto``: rich on a TTY, plain otherwise; ``off``: log file only. ``record``: where the progress record
    goes (``logs/progress.json``; None: nowhere)."""
    if mode == "auto":
        mode = "rich" if sys.stderr.isatty() else "plain"
    if mode == "rich":
        return RichDisplay(stats, log, interval=interval, record=record)
    if mode == "plain":
        return Display(stats, log, interval=interval, echo=lambda line: print(line, file=sys.stderr, flush=True),
                       record=record)
    return Display(stats, log, interval=interval, record=record)
