"""``run_extract``: the merged train rows → the target's hidden states in ``draftgen.hidden/1`` (``hidden.format``).

merged rows → length-sorted batches → one worker → an executor → a sink:

- reads ``merged/manifest.json`` and the train shards it lists (``sample_id``, ``input_ids``, ``loss_mask``)
  in merged order (``target.rows.read_merged_rows``); skips what the destination validly holds
  (``batches.resume_state``: published, indexed, same row and file digests);
- cuts the pending rows into batches (``batches.split_batches``: rows sorted by length inside windows of
  merged order, up to ``hidden_states.batch_tokens`` padded tokens), the same whatever runs them;
- hands them to ONE executor (``executor``): this process (``executor.InProcess``), one process per
  ``hidden_states.devices`` entry (``proc_pool.Processes``) or a Ray Data actor pool with
  ``hidden_states.ray`` (``ray_pool.RayPool``), each running the same ``worker.Worker`` (capture → encode →
  check → the sink: each file published, then one index part per batch);
- ``drive``, the one driver loop: each ``BatchResult`` into the ``Tally`` (each sample once), progress
  lines; then the sink's ``close``: ``manifest.json`` LAST, every done sample in merged order, the check
  summary and the measured throughput (tokens / the results' wall-clock span).

Provider fidelity (``fidelity``): the merged rows' providers are read too (``target.rows.read_merged_providers``);
``fidelity.choose`` marks the rows whose agreement with the target the worker measures (``ExtractRow.fidelity``),
and the manifest's check summary carries each provider's figures and flag (``checks.fidelity``), printed as a
table; a set that is up to date gets its manifest rewritten when they change (another ``fidelity_margin`` or
``fidelity_action``: nothing is extracted again).

Imports: run → executor, proc_pool, ray_pool → worker → batches; nothing imports run back.

Resume: a kill at any moment loses at most the batches in flight (``worker.FINISHING`` + 1). A temp file never counts; a published
file no index part lists is redone (overwritten with the same bytes: capture is deterministic for a batch);
the manifest lists each sample once, and so does the index: before anything is written, the records that
no longer count (samples to redo, an older draftgen's second listings) are pruned
(``HiddenStore.prune_index``). The target is checked first too (``batches.check_weights``: its weights
digest against the set's; ``force`` accepts other weights of the same final norm and config.json, and the
set records it). ``limit``/``pilot`` stop after that many new samples and write a manifest with
``complete: false`` (``plan`` reads its throughput).

More than ``hidden_states.max_flagged_fraction`` flagged samples: the manifest is written, then
``ThresholdBroken`` (exit 3). Credentials (storage_options, AWS_* variables) are never echoed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from draftgen import __version__
from draftgen.errors import ConfigError, ThresholdBroken
from draftgen.hidden.codec import SCHEMA
from draftgen.hidden.format import HiddenStore
from draftgen.hidden.lock import destination_lock
from draftgen.hidden.norm import WeightsDigest
from draftgen.hidden.stream import Sink, hidden_url
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.phases.extract.batches import (
    Resume,
    check_settings,
    check_weights,
    resume_state,
    split_batches,
)
from draftgen.phases.extract.executor import Executor, InProcess
from draftgen.phases.extract.proc_pool import Processes
from draftgen.phases.extract.ray_pool import RayPool
from draftgen.phases.extract.worker import TIMING_KEYS, BatchResult
from draftgen.records import (
    HiddenChecksSummary,
    HiddenCounts,
    HiddenFidelity,
    HiddenIdentity,
    HiddenIndexRecord,
    HiddenLayerIds,
    HiddenManifest,
    HiddenSampleEntry,
)
from draftgen.rundir import HiddenLayout, RunDir
from draftgen.rundir.claim import writer
from draftgen.runview.chain import fidelity_lines
from draftgen.target.fidelity import choose, summarize
from draftgen.target.identity import identity_of
from draftgen.target.layers import CONVENTION
from draftgen.target.rows import read_merged_providers, read_merged_rows

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.target import ExtractBackend, ExtractRow, TargetInfo
    from draftgen.tokens import Profile

__all__ = ["ExtractReport", "Tally", "drive", "phase_run", "run_extract"]


class ExtractReport(msgspec.Struct, omit_defaults=True):
    output: str
    samples: int  # merged train rows
    done_before: int
    extracted: int
    tokens: int  # tokens extracted by this run
    flagged: int  # flagged samples among all done
    failed_by_check: dict[str, int]
    teacher_checked: int
    complete: bool
    throughput_tokens_per_s: float | None = None
    elapsed_s: float = 0.0
    # capture/check/encode/publish seconds (summed over batches: they overlap), first_result, pool (the loop),
    # process_cpu (this process's CPU seconds in the loop), ray_init
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    bytes_written: int = 0
    replaced: int = 0  # samples held but redone: merged row changed, no digest (older draftgen), file changed
    fidelity: HiddenFidelity | None = None  # each provider's agreement with the target (the manifest's)


def _summary(done: dict[str, HiddenIndexRecord], fraction: float) -> HiddenChecksSummary:
    by_check: Counter[str] = Counter()
    flagged: list[str] = []
    teacher: list[float] = []
    chance: float | None = None
    for sid, rec in done.items():
        if rec.failed:
            flagged.append(sid)
            by_check.update(rec.failed)
        if rec.teacher is not None and rec.teacher.positions:
            teacher.append(rec.teacher.logprob_mean)
            chance = rec.teacher.chance_logprob
    out = HiddenChecksSummary(failed_by_check=dict(sorted(by_check.items())), flagged_sample_ids=sorted(flagged)[:1000],
                              teacher_checked=len(teacher), teacher_fraction=fraction, chance_logprob=chance)
    if teacher:
        teacher.sort()
        q = {f"p{int(p * 100)}": teacher[min(len(teacher) - 1, int(p * (len(teacher) - 1) + 0.5))]
             for p in (0.0, 0.05, 0.5, 0.95, 1.0)}
        out.teacher_logprob_quantiles = q
        lo, hi = teacher[0], teacher[-1]
        step = (hi - lo) / 10 or 1.0
        counts = Counter(min(9, int((x - lo) / step)) for x in teacher)
        out.teacher_logprob_histogram = [(round(lo + i * step, 4), counts.get(i, 0)) for i in range(10)]
    return out


def _held(rows: Sequence[ExtractRow], res: Resume) -> dict[str, HiddenIndexRecord]:
    """The merged rows the destination holds, in merged order: row id -> its record (a repeat: its base's)."""
    return {r.sample_id: rec for r in rows if (rec := res.record(r.sample_id)) is not None}


def _checks(cfg: RunConfig, held: dict[str, HiddenIndexRecord],
            providers: Mapping[str, str]) -> HiddenChecksSummary:
    """The check summary of the rows ``held``, provider fidelity included."""
    out = _summary(held, cfg.hidden_states.teacher_fraction)
    out.fidelity = summarize(held, providers, cfg.hidden_states)
    return out


def _manifest(cfg: RunConfig, info: TargetInfo, rows: Sequence[ExtractRow], res: Resume,
              throughput: float | None, ident: HiddenIdentity | None,
              providers: Mapping[str, str]) -> HiddenManifest:
    """Every merged row once, in merged order; a weight repeat names its base's file; the target as
    ``info`` describes it, with the weights digest and forced differences ``identity.json`` (``ident``)
    records."""
    aux = list(info.layers.aux)
    held = _held(rows, res)
    entries = [HiddenSampleEntry(sample_id=sid, file=rec.file, length=rec.length, file_sha256=rec.file_sha256)
               for sid, rec in held.items()]
    flagged = sum(1 for rec in held.values() if rec.failed)
    mine = identity_of(info)
    weights = WeightsDigest.of(ident.target) if ident is not None else None
    target = msgspec.structs.replace(mine.target, weights_sha256=weights and weights.sampled,
                                     files_sha256=weights and weights.files)
    return HiddenManifest(
        schema=SCHEMA, target=target,
        layer_ids=HiddenLayerIds(aux=aux, final=info.layers.final, convention=CONVENTION,
                                 sglang_aux=info.layers.sglang_aux, hf_hidden_states_index=aux),
        hidden_size=info.hidden_size, num_layers=info.num_layers, vocab_size=info.vocab_size,
        dtype=cfg.hidden_states.dtype,
        norm_weight_sha256=mine.norm_weight_sha256, norm_eps=info.norm_eps,
        counts=HiddenCounts(samples=len(entries), tokens=sum(e.length for e in entries), flagged=flagged),
        samples=entries, checks=_checks(cfg, held, providers),
        throughput_tokens_per_s=throughput, complete=len(entries) == len(rows),
        backend=cfg.hidden_states.backend, draftgen_version=__version__,
        forced=list(ident.forced) if ident is not None else [],
    )


def run_extract(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
                rd: RunDir | None = None, limit: int | None = None, pilot: int | None = None,
                backend: ExtractBackend | None = None) -> ExtractReport:
    """Extract the hidden states of every merged train row (see the module docstring). ``profile``: not
    needed (the rows hold their token ids; the backend loads the target model itself). ``force``: hold a run
    directory made with another target (``rundir.claim.writer``). ``rd``: a run directory the caller already holds
    (``draftgen run``); else this takes the writer lock. ``limit``/``pilot``: stop after that many new
    samples. ``backend``: an already loaded backend (tests, benchmarks); else the configured one is loaded."""
    if rd is None:
        with writer(cfg, "extract", force=force) as held:
            return _extract(cfg, held, echo, limit, pilot, backend, force)
    return _extract(cfg, rd, echo, limit, pilot, backend, force)


def _extract(cfg: RunConfig, rd: RunDir, echo: Echo, limit: int | None, pilot: int | None,
             backend: ExtractBackend | None, force: bool) -> ExtractReport:
    hs = cfg.hidden_states
    for name, value in (("limit", limit), ("pilot", pilot)):
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be >= 1")
    if hs.batch_tokens < 1:
        raise ConfigError("hidden_states.batch_tokens must be >= 1")
    if not 0.0 <= hs.teacher_fraction <= 1.0:
        raise ConfigError("hidden_states.teacher_fraction must be in [0, 1]")
    if hs.fidelity_samples < 0 or not 0.0 <= hs.fidelity_margin < 1.0:
        raise ConfigError("hidden_states.fidelity_samples must be >= 0 and hidden_states.fidelity_margin in [0, 1)")
    rows = read_merged_rows(rd)
    providers = read_merged_providers(rd)
    store = HiddenStore(hidden_url(cfg), dict(hs.storage_options))
    store.claim()  # a foreign destination is refused before anything there is deleted or written (even the lock)
    with destination_lock(store, str(rd.root)) as refresh:
        def echo_refresh(line: str) -> None:
            refresh()  # the owner file on an object store stays fresh while progress lines come
            echo(line)

        return _extract_held(cfg, store, rows, providers, echo_refresh, limit, pilot, backend, force)


def _extract_held(cfg: RunConfig, store: HiddenStore, rows: Sequence[ExtractRow], providers: Mapping[str, str],
                  echo: Echo, limit: int | None, pilot: int | None, backend: ExtractBackend | None,
                  force: bool) -> ExtractReport:
    """``_extract`` once the destination is held (one writer per destination)."""
    hs = cfg.hidden_states
    store.clean_temps()
    res = resume_state(store, rows)
    _echo_replaced(echo, res)
    done = res.done
    measure = choose([r for r in rows if r.sample_id not in res.alias], providers, hs.fidelity_samples)
    pending = [dataclasses.replace(r, fidelity=r.sample_id in measure) for r in rows
               if r.sample_id not in res.alias and r.sample_id not in done]
    cap = pilot if pilot is not None else limit
    if cap is not None:
        pending = pending[:cap]
    done_before = sum(1 for r in rows if res.record(r.sample_id) is not None)
    t_start = time.monotonic()
    check_settings(store, done, cfg, None)  # the backend half (and the identity) runs in each worker
    check_weights(store, cfg, force=force, echo=echo)
    _prune(store, res, echo)
    if not pending and store.has_manifest():
        m = store.read_manifest()
        if m.complete and m.counts.samples == len(rows):
            echo(f"extract: up to date ({len(rows):,} samples in {store.url})")
            m = _refreshed(store, m, _checks(cfg, _held(rows, res), providers))
            _echo_fidelity(echo, m)
            _threshold(m, hs.max_flagged_fraction, store)
            return _report(store, rows, done_before, Tally([], {}), m, 0.0, res.replaced)
    batches = list(split_batches(pending, hs.batch_tokens))
    probe = dict([next(iter(done.items()))]) if done else {}
    executor = _executor(cfg, store, probe, backend, bool(pending))
    try:
        executor.start()
        head = f"{len(pending):,} of {len(rows):,} samples to do ({done_before:,} done before) in {len(batches):,} batches"
        for line in executor.describe(head, store.url):
            echo(line)
        tally = drive(executor, batches, pending, done, echo, total=len(rows), done_before=done_before)
        info = executor.target()
    finally:
        executor.close()
    throughput = tally.tokens / tally.seconds if tally.tokens and tally.seconds > 0 else None
    if throughput is None and store.has_manifest():
        throughput = store.read_manifest().throughput_tokens_per_s
    man = _manifest(cfg, info, rows, res, throughput, store.read_identity(), providers)
    sink: Sink = store
    sink.close(man)  # the stream's end: manifest.json, last
    tally.timings.update(executor.timings)
    rep = _report(store, rows, done_before, tally, man, time.monotonic() - t_start, res.replaced)
    _echo_summary(echo, rep, man, pilot, rows, store)
    _threshold(man, hs.max_flagged_fraction, store)
    return rep


def _executor(cfg: RunConfig, store: HiddenStore, probe: dict[str, HiddenIndexRecord],
              backend: ExtractBackend | None, pending: bool) -> Executor:
    """Ray with ``hidden_states.ray``, one process per device with two or more ``hidden_states.devices`` (and
    batches to run), else this process (always with a given ``backend``)."""
    hs = cfg.hidden_states
    if backend is None and hs.ray:
        return RayPool(cfg, store, probe)
    if backend is None and pending and len(hs.devices) > 1:
        return Processes(cfg, store, probe)
    return InProcess(cfg, store, probe, backend)


class Tally:
    """What the results add up to. Each pending sample counts ONCE: a record of a sample already done, or
    not pending, is a re-run task's repeat (Ray re-ran a task of a killed actor: the same file, written
    again) and is skipped. ``seconds``: the results' wall-clock span, first batch begun to last ended, over
    every worker (their start-up, mostly loading the target, is not in it)."""

    def __init__(self, pending: Sequence[ExtractRow], done: dict[str, HiddenIndexRecord]) -> None:
        self.length = {r.sample_id: len(r.input_ids) for r in pending}
        self.done = done
        self.timings: dict[str, float] = dict.fromkeys(TIMING_KEYS, 0.0)
        self.per_worker: Counter[str] = Counter()
        self.extracted = self.tokens = self.written = 0
        self.began, self.ended = math.inf, -math.inf

    def add(self, res: BatchResult) -> None:
        self.began, self.ended = min(self.began, res.began), max(self.ended, res.ended)
        for k, v in res.timings.items():
            self.timings[k] = self.timings.get(k, 0.0) + v
        self.written += res.written
        for rec in res.records:
            if rec.sample_id in self.done or rec.sample_id not in self.length:
                continue
            self.done[rec.sample_id] = rec
            self.per_worker[res.worker] += 1
            self.extracted += 1
            self.tokens += self.length[rec.sample_id]

    @property
    def seconds(self) -> float:
        return max(self.ended - self.began, 0.0) if self.extracted else 0.0


def drive(executor: Executor, batches: Sequence[Sequence[ExtractRow]], pending: Sequence[ExtractRow],
          done: dict[str, HiddenIndexRecord], echo: Echo, *, total: int, done_before: int) -> Tally:
    """THE driver loop, whatever the executor: each result into the tally (adds to ``done``), a progress
    line every ~5% of the pending samples, then one line per worker of a pool."""
    tally = Tally(pending, done)
    every = max(1, len(pending) // 20)
    next_echo = every
    t0, cpu0 = time.monotonic(), time.process_time()
    first: float | None = None
    for res in executor.results(batches):
        first = time.monotonic() - t0 if first is None else first
        before = tally.extracted
        tally.add(res)
        if tally.extracted > before and (tally.extracted >= next_echo or tally.extracted == len(pending)):
            next_echo = tally.extracted + every
            flagged = sum(1 for r in res.records if r.failed)
            echo(f"extract{executor.label}: {done_before + tally.extracted:,}/{total:,} samples, {tally.tokens:,} "
                 f"tokens this run, {tally.tokens / max(time.monotonic() - t0, 1e-9):,.0f} tokens/s"
                 + (f", {flagged} flagged in the last batch" if flagged else ""))
    if executor.unit:
        for worker, n in sorted(tally.per_worker.items()):
            echo(f"extract{executor.label}: {executor.unit} {worker}: {n:,} samples")
    # process_cpu: this process's CPU seconds over the loop, every thread (a pool's workers are not in it)
    tally.timings.update(first_result=first or 0.0, pool=time.monotonic() - t0,
                         process_cpu=time.process_time() - cpu0)
    return tally


def _threshold(man: HiddenManifest, limit: float, store: HiddenStore) -> None:
    frac = man.counts.flagged / max(man.counts.samples, 1)
    if man.counts.flagged and frac > limit:
        worst = ", ".join(f"{k} ×{v}" for k, v in sorted(man.checks.failed_by_check.items(), key=lambda kv: -kv[1]))
        raise ThresholdBroken(f"extract: {man.counts.flagged:,} of {man.counts.samples:,} samples ({frac:.1%}) failed "
                              f"checks ({worst}), over hidden_states.max_flagged_fraction {limit}; they are "
                              f"stored, and listed in {store.url}/{HiddenLayout.manifest} (checks.flagged_sample_ids)")


def _report(store: HiddenStore, rows: Sequence[ExtractRow], done_before: int, tally: Tally, man: HiddenManifest,
            elapsed: float, replaced: int) -> ExtractReport:
    return ExtractReport(output=store.url, samples=len(rows), done_before=done_before, extracted=tally.extracted,
                         tokens=tally.tokens, flagged=man.counts.flagged, failed_by_check=man.checks.failed_by_check,
                         teacher_checked=man.checks.teacher_checked, complete=man.complete,
                         throughput_tokens_per_s=man.throughput_tokens_per_s, elapsed_s=elapsed,
                         timings=tally.timings,
                         bytes_written=tally.written, replaced=replaced, fidelity=man.checks.fidelity)


def _echo_replaced(echo: Echo, res: Resume) -> None:
    parts = [f"{n:,} {what}" for n, what in ((res.stale, "whose merged row changed"),
                                              (res.legacy, "indexed without digests by an older draftgen"),
                                              (res.corrupt, "whose file changed after extraction")) if n]
    if parts:
        echo(f"extract: redoing {res.replaced:,} stored samples ({'; '.join(parts)})")


def _prune(store: HiddenStore, res: Resume, echo: Echo) -> None:
    """The index lists each sample once, and only by a record that counts: the others (samples about to be
    redone, earlier records of a sample an older draftgen listed twice) go before this run writes."""
    keep = res.keep()
    if store.listed > len(keep):
        n = store.prune_index(keep)
        echo(f"extract: index: removed {n:,} record(s) that no longer count (samples to redo, or listed twice)")


def _echo_summary(echo: Echo, rep: ExtractReport, man: HiddenManifest, pilot: int | None,
                  rows: Sequence[ExtractRow], store: HiddenStore) -> None:
    rate = f"{rep.throughput_tokens_per_s:,.0f} tokens/s" if rep.throughput_tokens_per_s else "no new tokens"
    echo(f"extract: {man.counts.samples:,}/{rep.samples:,} samples stored ({man.counts.tokens:,} tokens), "
         f"{rep.extracted:,} this run at {rate}; {rep.flagged:,} flagged"
         + (f" ({', '.join(f'{k} ×{v}' for k, v in rep.failed_by_check.items())})" if rep.flagged else "")
         + f"; teacher-checked {rep.teacher_checked:,}")
    from draftgen.hidden.algorithms import feeds_lines

    for line in feeds_lines(man.layer_ids.aux, man.num_layers, man.hidden_size, man.dtype, man.counts.tokens):
        echo(f"extract: {line}")
    _echo_fidelity(echo, man)
    if pilot is not None and rep.throughput_tokens_per_s:
        left = sum(len(r.input_ids) for r in rows) - man.counts.tokens
        echo(f"extract pilot: the remaining {left:,} tokens would take about "
             f"{left / rep.throughput_tokens_per_s / 3600:.2f} h at this rate (recorded for draftgen plan)")
    if not man.complete:
        echo(f"extract: stopped after the limit; rerun without --limit/--pilot to finish ({store.url})")


def _refreshed(store: HiddenStore, m: HiddenManifest, checks: HiddenChecksSummary) -> HiddenManifest:
    """The up-to-date set's manifest with the check summary recomputed from its index: rewritten (last, as
    ever) only when the provider fidelity changed (another ``fidelity_margin``/``fidelity_action``)."""
    if checks.fidelity == m.checks.fidelity:
        return m
    m = msgspec.structs.replace(m, checks=msgspec.structs.replace(m.checks, fidelity=checks.fidelity))
    sink: Sink = store
    sink.close(m)
    return m


def _echo_fidelity(echo: Echo, man: HiddenManifest) -> None:
    if man.checks.fidelity is not None:
        for line in fidelity_lines(man.checks.fidelity):
            echo(f"extract: {line}")


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``extract`` row of ``phases.PHASES``: a failed check is the run's exit 3, the report still runs."""
    try:
        run_extract(ctx.cfg, echo=ctx.echo, profile=ctx.profile, force=ctx.options.force, rd=ctx.rd)
    except ThresholdBroken as exc:
        message = str(exc).splitlines()[0] if str(exc) else "extract checks failed"
        ctx.echo(message)
        return PhaseOutcome(ThresholdBroken.exit_code, message)
    return PhaseOutcome()
