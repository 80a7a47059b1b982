"""``draftgen run CONFIG``: prepare → generate → audit → merge → report, resuming where it stopped.

Every phase is resumable on its own: ``prepare`` is a no-op when its fingerprint matches, ``generate``
skips samples already in the raw logs, and ``audit`` and ``merge`` rebuild their outputs from the raw
logs. So a rerun after a crash or Ctrl-C simply runs the phases again. To avoid redoing finished work,
``pipeline.json`` in the run directory records, per phase, a fingerprint of its inputs (config hash and
the relevant config section, plus the size and mtime of every raw log): audit and merge are skipped when
their output exists and the fingerprint is unchanged.

The whole run holds the run directory's writer lock (``rundir.writer``); each phase re-enters it.

Outcomes (exit codes in ``errors``): generate stopping early (budget, auth, interrupt) ends the pipeline
after writing the report (Ctrl-C ends it at once); when the run holds no usable record at all (every
request failed), audit and merge are skipped too. Some samples failing is not an early stop: audit and
merge run over what is done, and the run exits 4 (finished with failures). A broken audit threshold skips
merge (the data failed a gate the user set), still writes the report, and exits 3. The report's path is
printed last.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from .config import RunConfig, config_hash
from .errors import EXIT_FAILURES, EXIT_INTERRUPTED, EXIT_OK, ThresholdBroken
from .rundir import RunDir, writer
from .store import atomic_write_json, read_json

__all__ = ["PhaseMark", "PipelineReport", "PipelineState", "run_pipeline"]

Echo = Callable[[str], object]


class PhaseMark(msgspec.Struct, kw_only=True):
    fingerprint: str
    finished_at: float


class PipelineState(msgspec.Struct, kw_only=True):
    """pipeline.json: the inputs each finished phase saw."""

    phases: dict[str, PhaseMark] = msgspec.field(default_factory=dict)


class PipelineReport(msgspec.Struct, kw_only=True):
    exit_code: int = 0
    report_path: str | None = None
    phases_run: list[str] = msgspec.field(default_factory=list)
    phases_skipped: list[str] = msgspec.field(default_factory=list)
    message: str | None = None


def _fingerprint(cfg: RunConfig, phase: str) -> str:
    rd = RunDir(cfg.run_path)
    h = hashlib.sha256()
    h.update(config_hash(cfg).encode())
    h.update(msgspec.json.encode(getattr(cfg, phase)))
    h.update(msgspec.json.encode([d.name for d in cfg.datasets]))
    if phase == "merge":
        h.update(msgspec.json.encode([[d.weight, d.cap] for d in cfg.datasets]))
        if rd.audit_json.is_file():
            h.update(rd.audit_json.read_bytes())
    for d in cfg.datasets:
        for name, path in (("raw", rd.raw(d.name)), ("prepared", rd.prepared(d.name))):
            try:
                st = path.stat()
                h.update(f"{name}:{d.name}:{st.st_size}:{st.st_mtime_ns}".encode())
            except FileNotFoundError:
                h.update(f"{name}:{d.name}:-".encode())
    if phase == "audit":
        ref = cfg.path(cfg.audit.reference) if cfg.audit.reference else rd.ground_truth
        if ref.is_file():
            st = ref.stat()
            h.update(f"ref:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


class _State:
    def __init__(self, rd: RunDir) -> None:
        self.path = rd.pipeline
        self.state = read_json(self.path, PipelineState) if self.path.is_file() else PipelineState()

    def current(self, phase: str, fingerprint: str, output: Path) -> bool:
        mark = self.state.phases.get(phase)
        return mark is not None and mark.fingerprint == fingerprint and output.exists()

    def mark(self, phase: str, fingerprint: str) -> None:
        self.state.phases[phase] = PhaseMark(fingerprint=fingerprint, finished_at=round(time.time(), 3))
        atomic_write_json(self.path, self.state)

    def forget(self, phase: str) -> None:
        if self.state.phases.pop(phase, None) is not None:
            atomic_write_json(self.path, self.state)


def _banner(echo: Echo, phase: str) -> None:
    echo(f"── {phase} " + "─" * max(0, 60 - len(phase)))


def run_pipeline(
    cfg: RunConfig,
    *,
    argv: list[str],
    datasets: list[str] | None = None,
    partition: str = "all",
    base_url_flag: str | None = None,
    force: bool = False,
    echo: Echo = print,
) -> PipelineReport:
    """Run every phase in order (see the module docstring); returns the exit code and the report's path."""
    with writer(cfg, "run", argv=argv, force=force) as rd:
        return _run(cfg, rd, argv, datasets, partition, base_url_flag, force, echo)


def _run(cfg: RunConfig, rd: RunDir, argv: list[str], datasets: list[str] | None, partition: str,
         base_url_flag: str | None, force: bool, echo: Echo) -> PipelineReport:
    from .audit import run_audit
    from .generate import GenerateOptions, run_generate
    from .merge import run_merge
    from .prepare import run_prepare
    from .report.html import run_report

    state = _State(rd)
    rep = PipelineReport()

    _banner(echo, "prepare")
    run_prepare(cfg, echo=echo)
    rep.phases_run.append("prepare")

    _banner(echo, "generate")
    gen = run_generate(cfg, GenerateOptions(datasets=list(datasets or []), partition=partition, argv=list(argv),
                                            base_url_flag=base_url_flag, force=force), echo=echo)
    rep.phases_run.append("generate")
    usable = sum(d.done_before + d.done for d in gen.datasets)
    if gen.exit_code == EXIT_INTERRUPTED:
        rep.exit_code, rep.message = EXIT_INTERRUPTED, gen.message
        return rep
    if gen.exit_code not in (EXIT_OK, EXIT_FAILURES) or not usable:
        rep.exit_code = gen.exit_code or EXIT_FAILURES
        rep.message = gen.message or "generate produced no usable record"
        echo(f"generate {'stopped early' if gen.exit_code != EXIT_FAILURES else 'finished'} ({rep.message})"
             + ("" if usable else "; nothing usable to merge") + "; skipping audit and merge, writing the report")
    else:
        code = _audit_and_merge(cfg, state, rep, echo, run_audit, run_merge, force)
        rep.exit_code = code or gen.exit_code
        if not code and gen.exit_code:
            rep.message = gen.message

    _banner(echo, "report")
    path = run_report(cfg)
    rep.report_path = str(path)
    rep.phases_run.append("report")
    if rep.message:
        echo(f"finished with problems: {rep.message}")
    echo(f"report: {path}")
    return rep


def _audit_and_merge(cfg: RunConfig, state: _State, rep: PipelineReport, echo: Echo,
                     run_audit: Callable[..., object], run_merge: Callable[..., object], force: bool) -> int:
    rd = RunDir(cfg.run_path)
    _banner(echo, "audit")
    fp = _fingerprint(cfg, "audit")
    broken: list[str] = []
    if state.current("audit", fp, rd.audit_json):
        echo("audit: up to date (no new responses since the last audit)")
        rep.phases_skipped.append("audit")
        from .records import AuditReport

        broken = read_json(rd.audit_json, AuditReport).thresholds_broken
    else:
        try:
            audit = run_audit(cfg, echo=echo, force=force)
            broken = list(getattr(audit, "thresholds_broken", []) or [])
        except ThresholdBroken as exc:
            broken = [str(exc).splitlines()[0] if str(exc) else "audit threshold broken"]
        state.mark("audit", fp)
        rep.phases_run.append("audit")
    if broken:
        rep.message = "audit thresholds broken: " + "; ".join(broken)
        echo(f"{rep.message}; merge skipped (fix the data or relax the audit thresholds)")
        state.forget("merge")
        return ThresholdBroken.exit_code

    _banner(echo, "merge")
    fp = _fingerprint(cfg, "merge")
    if state.current("merge", fp, rd.merged_manifest):
        echo("merge: up to date")
        rep.phases_skipped.append("merge")
    else:
        run_merge(cfg, echo=echo, force=force)
        state.mark("merge", fp)
        rep.phases_run.append("merge")
    return 0
