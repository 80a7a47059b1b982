"""``run_extract``: the merged train rows → the target's hidden states in ``draftgen.hidden/1`` (format.py).

Reads ``merged/manifest.json`` and the train shards it lists (columns ``sample_id``, ``input_ids``,
``loss_mask``), in merged order. Skips the samples the destination already has (``HiddenStore.done``: in an
index part and published), captures the rest with the configured backend (``capture``) in batches
(``batches.split_batches``: rows sorted by length inside windows of merged order, up to
``hidden_states.batch_tokens`` padded tokens), checks each stored sample (``checks``), publishes its file,
writes one index part per batch (``batches.extract_batch``), and writes ``manifest.json`` LAST: every done
sample in merged order, the check summary and the measured throughput. With ``hidden_states.ray`` the
pending batches run on a Ray Data actor pool instead (``ray_pool``), with ``hidden_states.devices`` on one
process per device (``proc_pool``); each of their workers (``worker.ExtractActor``) runs the same
``extract_batch``; the manifest is still written here, last. Imports: run → {proc_pool, ray_pool} →
{worker, batches}; nothing imports run back.

Resume: a kill at any moment loses at most the batch in flight. A temp file never counts; a published file
no index part lists is redone (overwritten with the same bytes: capture is deterministic for a batch); the
manifest lists each sample once. ``limit``/``pilot`` stop after that many new samples and write a manifest
with ``complete: false`` (``plan`` reads its throughput).

More than ``hidden_states.max_flagged_fraction`` flagged samples: the manifest is written, then
``ThresholdBroken`` (exit 3). Credentials (storage_options, AWS_* variables) are never echoed.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from draftgen import __version__
from draftgen.errors import ConfigError, ThresholdBroken
from draftgen.hidden.format import SCHEMA, HiddenStore
from draftgen.hidden.lock import destination_lock
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.phases.extract.batches import (
    Resume,
    check_settings,
    extract_batch,
    read_merged_rows,
    resume_state,
    split_batches,
)
from draftgen.phases.extract.layers import CONVENTION
from draftgen.records import (
    HiddenChecksSummary,
    HiddenCounts,
    HiddenIndexRecord,
    HiddenLayerIds,
    HiddenManifest,
    HiddenSampleEntry,
    HiddenTarget,
)
from draftgen.rundir import HiddenLayout, RunDir, writer

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.phases.extract.capture import ExtractBackend, ExtractRow, TargetInfo
    from draftgen.tokens import Profile

__all__ = ["ExtractReport", "hidden_destination", "phase_run", "run_extract"]


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
    timings: dict[str, float] = msgspec.field(default_factory=dict)  # capture/check/encode/publish seconds
    bytes_written: int = 0
    replaced: int = 0  # samples held but redone: merged row changed, no digest (older draftgen), file changed


def hidden_destination(cfg: RunConfig, rd: RunDir) -> str:
    """``hidden_states.output`` as a URL or absolute path (relative paths from the config file); default
    ``<run>/hidden``."""
    out = cfg.hidden_states.output
    if not out:
        return str(rd.hidden)
    return out if "://" in out else str(cfg.path(out).resolve())


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


def _manifest(cfg: RunConfig, info: TargetInfo, rows: Sequence[ExtractRow], res: Resume,
              throughput: float | None) -> HiddenManifest:
    """Every merged row once, in merged order; a weight repeat names its base's file."""
    aux = list(info.layers.aux)
    held = {r.sample_id: rec for r in rows if (rec := res.record(r.sample_id)) is not None}
    entries = [HiddenSampleEntry(sample_id=sid, file=rec.file, length=rec.length, file_sha256=rec.file_sha256)
               for sid, rec in held.items()]
    flagged = sum(1 for rec in held.values() if rec.failed)
    return HiddenManifest(
        schema=SCHEMA, target=HiddenTarget(name=info.name, revision=info.revision, config_sha256=info.config_sha256),
        layer_ids=HiddenLayerIds(aux=aux, final=info.layers.final, convention=CONVENTION,
                                 sglang_aux=info.layers.sglang_aux, hf_hidden_states_index=aux),
        hidden_size=info.hidden_size, num_layers=info.num_layers, vocab_size=info.vocab_size,
        dtype=cfg.hidden_states.dtype,
        norm_weight_sha256=hashlib.sha256(info.norm_weight.float().numpy().tobytes()).hexdigest(),
        norm_eps=info.norm_eps,
        counts=HiddenCounts(samples=len(entries), tokens=sum(e.length for e in entries), flagged=flagged),
        samples=entries, checks=_summary(held, cfg.hidden_states.teacher_fraction),
        throughput_tokens_per_s=throughput, complete=len(entries) == len(rows),
        backend=cfg.hidden_states.backend, draftgen_version=__version__,
    )


def run_extract(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
                rd: RunDir | None = None, limit: int | None = None, pilot: int | None = None,
                backend: ExtractBackend | None = None) -> ExtractReport:
    """Extract the hidden states of every merged train row (see the module docstring). ``profile``: not
    needed (the rows hold their token ids; the backend loads the target model itself). ``force``: hold a run
    directory made with another target (``rundir.writer``). ``rd``: a run directory the caller already holds
    (``draftgen run``); else this takes the writer lock. ``limit``/``pilot``: stop after that many new
    samples. ``backend``: an already loaded backend (tests, benchmarks); else the configured one is loaded."""
    if rd is None:
        with writer(cfg, "extract", force=force) as held:
            return _extract(cfg, held, echo, limit, pilot, backend)
    return _extract(cfg, rd, echo, limit, pilot, backend)


def _extract(cfg: RunConfig, rd: RunDir, echo: Echo, limit: int | None, pilot: int | None,
             backend: ExtractBackend | None) -> ExtractReport:
    hs = cfg.hidden_states
    for name, value in (("limit", limit), ("pilot", pilot)):
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be >= 1")
    if hs.batch_tokens < 1:
        raise ConfigError("hidden_states.batch_tokens must be >= 1")
    if not 0.0 <= hs.teacher_fraction <= 1.0:
        raise ConfigError("hidden_states.teacher_fraction must be in [0, 1]")
    rows = read_merged_rows(rd)
    store = HiddenStore(hidden_destination(cfg, rd), dict(hs.storage_options))
    store.claim()  # a foreign destination is refused before anything there is deleted or written (even the lock)
    with destination_lock(store, str(rd.root)) as refresh:
        def echo_refresh(line: str) -> None:
            refresh()  # the owner file on an object store stays fresh while progress lines come
            echo(line)

        return _extract_held(cfg, store, rows, echo_refresh, limit, pilot, backend)


def _extract_held(cfg: RunConfig, store: HiddenStore, rows: Sequence[ExtractRow], echo: Echo, limit: int | None,
                  pilot: int | None, backend: ExtractBackend | None) -> ExtractReport:
    """``_extract`` once the destination is held (one writer per destination)."""
    from draftgen.phases.extract.capture import open_extract_backend

    hs = cfg.hidden_states
    store.clean_temps()
    res = resume_state(store, rows)
    _echo_replaced(echo, res)
    done = res.done
    pending = [r for r in rows if r.sample_id not in res.alias and r.sample_id not in done]
    cap = pilot if pilot is not None else limit
    if cap is not None:
        pending = pending[:cap]
    done_before = sum(1 for r in rows if res.record(r.sample_id) is not None)
    t_start = time.monotonic()
    if not pending and store.has_manifest():
        check_settings(store, done, cfg, None)
        m = store.read_manifest()
        if m.complete and m.counts.samples == len(rows):
            echo(f"extract: up to date ({len(rows):,} samples in {store.url})")
            _threshold(m, hs.max_flagged_fraction, store)
            return _report(store, rows, done_before, 0, 0, m, 0.0, {}, 0, res.replaced)
    if hs.ray and backend is None:
        return _extract_ray(cfg, store, rows, pending, res, done_before, echo, pilot, t_start)
    if len(hs.devices) > 1 and backend is None and pending:
        return _extract_ray(cfg, store, rows, pending, res, done_before, echo, pilot, t_start, processes=True)
    own = backend is None
    be = open_extract_backend(cfg) if backend is None else backend
    try:
        check_settings(store, done, cfg, be)
        info = be.info
        echo(f"extract: {len(pending):,} of {len(rows):,} samples to do ({done_before:,} done before) → {store.url}; "
             f"target {info.name} ({info.num_layers} layers, hidden {info.hidden_size}), aux layers "
             f"{list(info.layers.aux)} + final {info.layers.final} (vLLM convention), {hs.dtype}")
        timings = dict.fromkeys(("capture", "check", "encode", "publish"), 0.0)
        extracted = tokens = written = 0
        every = max(1, len(pending) // 20)
        next_echo = every
        t0 = time.monotonic()
        for batch in split_batches(pending, hs.batch_tokens):
            records, nbytes = extract_batch(be, store, hs, batch, timings)
            written += nbytes
            for r in records:
                done[r.sample_id] = r
            extracted += len(batch)
            tokens += sum(len(r.input_ids) for r in batch)
            if extracted >= next_echo or extracted == len(pending):
                next_echo += every
                rate = tokens / max(time.monotonic() - t0, 1e-9)
                flagged_now = sum(1 for r in records if r.failed)
                echo(f"extract: {done_before + extracted:,}/{len(rows):,} samples, {tokens:,} tokens this run, "
                     f"{rate:,.0f} tokens/s" + (f", {flagged_now} flagged in the last batch" if flagged_now else ""))
        loop_s = time.monotonic() - t0
        throughput = tokens / loop_s if tokens and loop_s > 0 else None
        if throughput is None and store.has_manifest():
            throughput = store.read_manifest().throughput_tokens_per_s
        man = _manifest(cfg, be.info, rows, res, throughput)
        store.write_manifest(man)
    finally:
        if own:
            be.close()
    rep = _report(store, rows, done_before, extracted, tokens, man, time.monotonic() - t_start, timings, written,
                  res.replaced)
    _echo_summary(echo, rep, man, pilot, rows, store)
    _threshold(man, hs.max_flagged_fraction, store)
    return rep


def _extract_ray(cfg: RunConfig, store: HiddenStore, rows: Sequence[ExtractRow], pending: Sequence[ExtractRow],
                 res: Resume, done_before: int, echo: Echo, pilot: int | None,
                 t_start: float, *, processes: bool = False) -> ExtractReport:
    """``hidden_states.ray``: the pending rows on a Ray Data actor pool (``ray_pool``), or with ``processes``
    (``hidden_states.devices``) on one process per device (``proc_pool``); each worker runs ``extract_batch``
    and writes its own index parts; then the manifest here, last, as in one process."""
    from draftgen.phases.extract.proc_pool import extract_with_processes
    from draftgen.phases.extract.ray_pool import extract_with_ray

    done = res.done
    check_settings(store, done, cfg, None)  # the backend half (and the identity) runs in each worker
    pool_fn = extract_with_processes if processes else extract_with_ray
    pool = pool_fn(cfg, store, pending, done, echo, total=len(rows), done_before=done_before)
    throughput = pool.tokens / pool.seconds if pool.tokens and pool.seconds > 0 else None
    if throughput is None and store.has_manifest():
        throughput = store.read_manifest().throughput_tokens_per_s
    man = _manifest(cfg, pool.info, rows, res, throughput)
    store.write_manifest(man)
    rep = _report(store, rows, done_before, pool.extracted, pool.tokens, man, time.monotonic() - t_start,
                  pool.timings, pool.written, res.replaced)
    _echo_summary(echo, rep, man, pilot, rows, store)
    _threshold(man, cfg.hidden_states.max_flagged_fraction, store)
    return rep


def _threshold(man: HiddenManifest, limit: float, store: HiddenStore) -> None:
    frac = man.counts.flagged / max(man.counts.samples, 1)
    if man.counts.flagged and frac > limit:
        worst = ", ".join(f"{k} ×{v}" for k, v in sorted(man.checks.failed_by_check.items(), key=lambda kv: -kv[1]))
        raise ThresholdBroken(f"extract: {man.counts.flagged:,} of {man.counts.samples:,} samples ({frac:.1%}) failed "
                              f"checks ({worst}), over hidden_states.max_flagged_fraction {limit}; they are "
                              f"stored, and listed in {store.url}/{HiddenLayout.manifest} (checks.flagged_sample_ids)")


def _report(store: HiddenStore, rows: Sequence[ExtractRow], done_before: int, extracted: int, tokens: int,
            man: HiddenManifest, elapsed: float, timings: dict[str, float], written: int,
            replaced: int) -> ExtractReport:
    return ExtractReport(output=store.url, samples=len(rows), done_before=done_before, extracted=extracted,
                         tokens=tokens, flagged=man.counts.flagged, failed_by_check=man.checks.failed_by_check,
                         teacher_checked=man.checks.teacher_checked, complete=man.complete,
                         throughput_tokens_per_s=man.throughput_tokens_per_s, elapsed_s=elapsed,
                         timings=timings, bytes_written=written, replaced=replaced)


def _echo_replaced(echo: Echo, res: Resume) -> None:
    parts = [f"{n:,} {what}" for n, what in ((res.stale, "whose merged row changed"),
                                              (res.legacy, "indexed without digests by an older draftgen"),
                                              (res.corrupt, "whose file changed after extraction")) if n]
    if parts:
        echo(f"extract: redoing {res.replaced:,} stored samples ({'; '.join(parts)})")


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
    if pilot is not None and rep.throughput_tokens_per_s:
        left = sum(len(r.input_ids) for r in rows) - man.counts.tokens
        echo(f"extract pilot: the remaining {left:,} tokens would take about "
             f"{left / rep.throughput_tokens_per_s / 3600:.2f} h at this rate (recorded for draftgen plan)")
    if not man.complete:
        echo(f"extract: stopped after the limit; rerun without --limit/--pilot to finish ({store.url})")


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``extract`` row of ``phases.PHASES``: a failed check is the run's exit 3, the report still runs."""
    try:
        run_extract(ctx.cfg, echo=ctx.echo, profile=ctx.profile, force=ctx.options.force, rd=ctx.rd)
    except ThresholdBroken as exc:
        message = str(exc).splitlines()[0] if str(exc) else "extract checks failed"
        ctx.echo(message)
        return PhaseOutcome(ThresholdBroken.exit_code, message)
    return PhaseOutcome()
