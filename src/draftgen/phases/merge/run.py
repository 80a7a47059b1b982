"""``draftgen merge``: raw responses of every dataset → one shuffled, training-ready ``merged/``.

Reads, per dataset in config order: ``raw/<dataset>/raw_responses.jsonl`` (``records.ResponseRecord``;
legacy rows with only ``sample_id`` + ``output_ids`` get their prompt ids by re-rendering the prepared
prompt), ``prepared/<dataset>/prompts.jsonl`` (prompt content hashes; messages for re-rendering and the
SpecForge export) and ``audit/audit.json`` (``failed_sample_ids``; without it that filter is skipped with a
note). Writes the Parquet shards of ``merged/`` and the peer formats of ``exports/<format>/`` through
``exporters.write_split``, the dataset card ``merged/README.md`` (``exporters.write_card``), ``merged/stats.json``
(``records.MergeStats``) and, last, ``merged/manifest.json`` (``records.MergeManifest``, every file written,
with size and sha256): the output is complete iff the manifest exists. A merge that would keep no row
writes nothing and fails (``ThresholdBroken``, exit 3): an empty dataset is never a success. A rerun first removes exactly the
files the previous manifest lists (``_clear``), nothing else.

Steps, each deterministic:

1. scan: per response (the last record per sample id of the current prepared set: a sample the audit
   excluded is generated again; others are orphans),
   drop by reason: the audit's exclusion reason (``structural:<kind>``, ``reasoning_dropped``,
   ``semantic_mismatch``, ``billing_off``; see ``audit.verdict``), ``reasoning_dropped`` and ``unusable``
   from the record's own flags even without an audit (``unusable:*`` rows are kept, flagged, only with
   ``quality.keep_unusable``), ``no_output``, ``truncated`` (only with ``drop_truncated``: truncated rows
   are the model's real tokens, with no invented end marker), ``min_tokens``/``max_tokens``, ``no_prompt``;
   cap at ``max_seq_len`` (``truncate``: keep the first max_seq_len tokens, dropped when the prompt alone
   fills them; ``drop``). Ids go into one int32 buffer (4 bytes a token), never into per-row Python lists;
   the text stays on disk and the exports re-read it by byte offset.
2. dedupe across datasets on ``dedupe_key`` (prompt content hash, or prompt + completion ids): datasets in
   config order, then sample ids in sorted order, first wins; so raw line order never matters.
3. weight and cap per dataset: a seeded hash order picks ``round(n × weight)`` samples (weight ≤ 1), or
   repeats them (weight > 1, the fraction drawn the same way); ``cap`` keeps the first copies first.
4. split by sample id (repeats stay on one side), ``val_fraction`` of distinct samples to validation.
5. shuffle by ``sha256(seed, sample_id, copy)``: the same inputs and seed give byte-identical files.

``loss_mask`` is 0 over the prompt and 1 over the completion: the number of ones is the completion length
(``len(output_ids)`` unless capped), minus the reasoning tokens with ``mask_reasoning``. The reasoning
length is the ids through the profile's end-of-think token.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from draftgen.config import RunConfig
from draftgen.errors import InputError, ThresholdBroken
from draftgen.exporters import (
    MergedRow,
    RowSource,
    check_exports,
    export_usage,
    file_entry,
    write_card,
    write_split,
)
from draftgen.fmt import render_text
from draftgen.hidden.estimate import (
    DatasetTokens,
    format_hidden_report,
    hidden_states_report,
    tokens_under_cap,
)
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.provenance import check_provenance, expected_provenance
from draftgen.records import (
    MANIFEST_LAYOUT,
    AuditReport,
    MergedDatasetStats,
    MergedFile,
    MergeManifest,
    MergeStats,
    PromptIdView,
    PromptRecord,
    ResponseMergeView,
    check_ids,
)
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.runview.rounds import read_rounds, round_of_ids
from draftgen.store import JsonlReader, atomic_write_json, iter_jsonl_offsets, read_json, superseded_lines
from draftgen.tokens import Profile, profile_from_config

__all__ = ["MergeReport", "phase_run", "reasoning_length", "run_merge"]

_WHAT_IF_CAPS = (4096, 8192, 16384, 32768)


@dataclass
class MergeReport:
    merged_dir: Path
    stats: MergeStats
    files: list[MergedFile] = field(default_factory=list)
    train_rows: int = 0
    validation_rows: int = 0


def reasoning_length(profile: Profile, output_ids: Sequence[int], *, has_content: bool) -> int:
    """Ids through the end-of-think token; all of a cut output that never closed its reasoning; else 0."""
    end = profile.think_end_id
    if not profile.thinking or end is None:
        return 0
    ids = output_ids if isinstance(output_ids, list) else list(output_ids)
    try:
        return ids.index(end) + 1
    except ValueError:
        ended = bool(output_ids) and output_ids[-1] in profile.end_of_turn_ids
        return 0 if (ended or has_content) else len(output_ids)


def _key(seed: int, tag: str, ident: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{tag}\0{ident}".encode()).digest()[:12]


def _raw_nonempty(raw: msgspec.Raw) -> bool:
    return bytes(raw) not in (b"", b"null", b'""', b"[]")


class _Scanner:
    """Step 1 for all datasets: fills one id buffer and a list of candidate rows."""

    def __init__(self, cfg: RunConfig, profile: Profile, echo: Echo, *, force: bool = False) -> None:
        self.cfg, self.profile, self.echo = cfg, profile, echo
        self.force = force
        self.forced: set[str] = set()
        self.provenance = expected_provenance(cfg, profile.tokenizer_sha256)
        self.values = array("i")
        self.offsets = array("q", [0])
        self.rows: dict[str, list[MergedRow]] = {}
        self.stats: dict[str, MergedDatasetStats] = {}
        self.notes: list[str] = []
        self.failed: dict[str, dict[str, str]] = {}  # dataset -> sample id -> the audit's exclusion reason
        self.audit_checked = False

    def load_audit(self) -> None:
        path = RunDir(self.cfg.run_path).audit_json
        if not self.cfg.merge.drop_audit_failed:
            return
        if not path.is_file():
            self.notes.append("audit/audit.json not found: samples were not filtered by the audit "
                              "(run `draftgen audit` first to drop failed samples)")
            return
        report = read_json(path, AuditReport)
        self.audit_checked = True
        for d in report.datasets:
            reasons = self.failed.setdefault(d.dataset, {})
            reasons.update(dict.fromkeys(d.failed_sample_ids, "audit_failed"))
            reasons.update((e.sample_id, e.reason) for e in d.excluded)

    def _prompt_index(self, path: Path) -> dict[str, tuple[int, str]]:
        return {rec.sample_id: (off, rec.content_hash) for _, off, rec in iter_jsonl_offsets(path, PromptIdView)}

    def scan(self, name: str) -> None:
        """Read one dataset's responses: count each into its stats and add the kept ones to the buffer."""
        cfg = self.cfg
        st = MergedDatasetStats(dataset=name)
        self.stats[name] = st
        self.rows[name] = []
        rd = RunDir(cfg.run_path)
        raw_path = rd.raw(name)
        if not raw_path.is_file():
            self.notes.append(f"{name}: no {raw_path.relative_to(cfg.run_path)}; nothing to merge from it")
            return
        ppath = rd.prepared(name)
        pindex = self._prompt_index(ppath) if ppath.is_file() else {}
        preader = JsonlReader(ppath, PromptRecord) if pindex else None
        if not pindex:
            self.notes.append(f"{name}: {ppath.relative_to(cfg.run_path)} is missing or empty; only samples of "
                              "the prepared set are merged (run `draftgen prepare`)")
        failed = self.failed.get(name, {})
        superseded = superseded_lines(raw_path)
        vocab = self.profile.tokenizer.vocab_size
        try:
            for lineno, off, rec in iter_jsonl_offsets(raw_path, ResponseMergeView):
                where = f"{raw_path}:{lineno}"
                check_provenance(rec.provenance, self.provenance, where, force=self.force, forced=self.forced)
                check_ids(rec.output_ids, vocab, where, "output_ids")
                check_ids(rec.prompt_ids, vocab, where, "prompt_ids")
                sid = rec.sample_id
                if lineno in superseded:  # the sample's last record is its record (generated again)
                    reason: str | None = "duplicate_record"
                else:
                    if sid not in pindex:
                        st.orphans += 1
                        continue
                    st.records += 1
                    reason = self._drop_reason(rec, failed) or self._add(name, rec, off, pindex[sid], preader)
                if reason is not None:
                    st.dropped[reason] = st.dropped.get(reason, 0) + 1
        finally:
            if preader is not None:
                preader.close()

    def _drop_reason(self, rec: ResponseMergeView, failed: dict[str, str]) -> str | None:
        """Why a record of the prepared set is dropped before its prompt is looked at, or None."""
        m, keep_unusable = self.cfg.merge, self.cfg.quality.keep_unusable
        out = rec.output_ids
        if rec.sample_id in failed:
            return failed[rec.sample_id]
        unusable = any(f.startswith("unusable:") for f in rec.recon_flags)
        if unusable and not keep_unusable:
            return "unusable"
        if "reasoning_dropped" in rec.recon_flags and not (unusable and keep_unusable):
            return "reasoning_dropped"
        if not out:
            return "no_output"
        truncated = rec.finish_reason == "length" or any(f.startswith("truncated") for f in rec.recon_flags)
        if m.drop_truncated and truncated:
            return "truncated"
        if len(out) < m.min_tokens:
            return "min_tokens"
        if m.max_tokens is not None and len(out) > m.max_tokens:
            return "max_tokens"
        return None

    def _add(
        self, name: str, rec: ResponseMergeView, off: int, pinfo: tuple[int, str], preader: JsonlReader | None
    ) -> str | None:
        """Add a record that passed ``_drop_reason`` as a row (ids capped at ``max_seq_len``); returns the
        reason it is dropped instead (no prompt ids, or over the cap), or None once added."""
        m, cap = self.cfg.merge, self.cfg.merge.max_seq_len
        out = rec.output_ids or []
        prompt = rec.prompt_ids
        if prompt is None:
            if preader is None:
                return "no_prompt"
            p: PromptRecord = preader.at(pinfo[0])
            prompt = self.profile.prompt_ids(p.messages, p.tools)
        p_len, c_len = len(prompt), len(out)
        total = p_len + c_len
        capped = total > cap
        if capped and (m.overflow == "drop" or p_len >= cap):
            return "over_max_seq_len" if m.overflow == "drop" else "prompt_over_max_seq_len"
        keep_c = min(c_len, cap - p_len)
        r_len = min(reasoning_length(self.profile, out, has_content=_raw_nonempty(rec.content)), keep_c)
        self.rows[name].append(MergedRow(
            dataset=name, sample_id=rec.sample_id, buf_index=len(self.offsets) - 1,
            prompt_len=p_len, completion_len=keep_c, reasoning_len=r_len, uncapped_len=total,
            capped=capped, finish_reason=rec.finish_reason, provider=rec.provider,
            ids_source=rec.ids_source, is_tool_call=_raw_nonempty(rec.tool_calls)
            or rec.finish_reason == "tool_calls",
            raw_offset=off, prompt_offset=pinfo[0], key=self._dedupe_key(prompt, out, pinfo[1]),
        ))
        self.values.extend(prompt)
        self.values.extend(out if keep_c == c_len else out[:keep_c])
        self.offsets.append(len(self.values))
        return None

    def _dedupe_key(self, prompt: Sequence[int], out: Sequence[int], content_hash: str) -> str:
        """``merge.dedupe_key``: sha256 of prompt + completion ids, or the prompt's content hash (its ids'
        sha256 for a prompt without one)."""
        if self.cfg.merge.dedupe_key == "sequence":
            h = hashlib.sha256(array("i", prompt).tobytes())
            h.update(array("i", out).tobytes())
            return h.hexdigest()
        if content_hash:
            return content_hash
        return hashlib.sha256(array("i", prompt).tobytes()).hexdigest()

    def id_array(self) -> Any:
        import pyarrow as pa

        values = pa.Array.from_buffers(pa.int32(), len(self.values), [None, pa.py_buffer(self.values)])
        offsets = pa.Array.from_buffers(pa.int64(), len(self.offsets), [None, pa.py_buffer(self.offsets)])
        return pa.LargeListArray.from_arrays(offsets, values)


def _select(cfg: RunConfig, scanner: _Scanner) -> tuple[list[MergedRow], list[MergedRow]]:
    """Steps 2-5: dedupe, weight/cap, split, shuffle. Returns (train, validation) in output order."""
    m, seed = cfg.merge, cfg.merge.seed
    seen: set[str] = set()
    chosen: list[MergedRow] = []
    for ds in cfg.datasets:
        rows = sorted(scanner.rows.get(ds.name, []), key=lambda r: r.sample_id)
        dropped = scanner.stats[ds.name].dropped if ds.name in scanner.stats else {}
        unique: list[MergedRow] = []
        for r in rows:
            if m.dedupe and r.key in seen:
                dropped["duplicate"] = dropped.get("duplicate", 0) + 1
                continue
            seen.add(r.key)
            unique.append(r)
        order = sorted(unique, key=lambda r: _key(seed, "weight", r.sample_id))
        whole = math.floor(ds.weight)
        part = round(len(order) * (ds.weight - whole))
        entries = [(k, r) for k in range(whole) for r in order] + [(whole, r) for r in order[:part]]
        # A cap keeps first copies first, each in the seeded order.
        entries.sort(key=lambda e: (e[0], _key(seed, "weight", f"{e[1].sample_id}\0{e[0]}")))
        if ds.cap is not None and len(entries) > ds.cap:
            entries = entries[: ds.cap]
        kept_ids = {r.sample_id for _, r in entries}
        not_kept = len(unique) - len(kept_ids)
        if not_kept:
            dropped["weight_or_cap"] = dropped.get("weight_or_cap", 0) + not_kept
        chosen.extend(r if k == 0 else replace(r, copy=k) for k, r in entries)
    ids = sorted({r.sample_id for r in chosen}, key=lambda s: _key(seed, "split", s))
    n_val = round(len(ids) * m.val_fraction)
    val_ids = set(ids[:n_val])
    chosen.sort(key=lambda r: _key(seed, "shuffle", f"{r.sample_id}\0{r.copy}"))
    train = [r for r in chosen if r.sample_id not in val_ids]
    val = [r for r in chosen if r.sample_id in val_ids]
    return train, val


def _stats(cfg: RunConfig, scanner: _Scanner, train: list[MergedRow], val: list[MergedRow]) -> MergeStats:
    per = {ds.name: scanner.stats.get(ds.name, MergedDatasetStats(dataset=ds.name)) for ds in cfg.datasets}
    uniq: dict[str, set[str]] = {name: set() for name in per}
    round_of = round_of_ids(cfg.run_path, list(per)) if read_rounds(cfg.run_path) else {}
    for split, rows in (("train", train), ("validation", val)):
        for r in rows:
            st = per[r.dataset]
            st.samples += 1
            n = str(round_of.get(r.sample_id, 1))
            st.rounds[n] = st.rounds.get(n, 0) + 1
            if split == "train":
                st.train += 1
            else:
                st.validation += 1
            uniq[r.dataset].add(r.sample_id)
            st.prompt_tokens += r.prompt_len
            st.completion_tokens += r.completion_len
            st.reasoning_tokens += r.reasoning_len
            st.supervised_tokens += r.completion_len - (r.reasoning_len if cfg.merge.mask_reasoning else 0)
            st.tokens_uncapped += r.uncapped_len
            st.capped += r.capped
            st.truncated += r.finish_reason == "length"
    total = MergedDatasetStats(dataset="all")
    for name, st in per.items():
        st.unique_samples = len(uniq[name])
        st.reasoning_share = st.reasoning_tokens / st.completion_tokens if st.completion_tokens else 0.0
        for f in ("records", "orphans", "samples", "unique_samples", "train", "validation", "prompt_tokens",
                  "completion_tokens", "reasoning_tokens", "supervised_tokens", "capped", "truncated", "tokens_uncapped"):
            setattr(total, f, getattr(total, f) + getattr(st, f))
        for k, v in st.dropped.items():
            total.dropped[k] = total.dropped.get(k, 0) + v
        for k, v in st.rounds.items():
            total.rounds[k] = total.rounds.get(k, 0) + v
    total.reasoning_share = total.reasoning_tokens / total.completion_tokens if total.completion_tokens else 0.0
    return MergeStats(datasets=list(per.values()), total=total, notes=list(scanner.notes))


def _table_lines(stats: MergeStats) -> list[str]:
    """The merge's table, drawn as plan's and status's are (rich), then what was excluded as wrong data."""
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for col in ("dataset", "samples", "prompt tok", "completion tok", "reasoning", "truncated", "capped", "dropped"):
        table.add_column(col, justify="left" if col in ("dataset", "dropped") else "right")
    for r in stats.datasets:
        table.add_row(*_row_cells(r))
    table.add_section()
    table.add_row(*_row_cells(stats.total), style="bold")
    out = render_text(table).splitlines()
    excluded = {k: v for k, v in stats.total.dropped.items()
                if k.startswith("structural:") or k in ("reasoning_dropped", "semantic_mismatch", "billing_off",
                                                        "unusable", "audit_failed")}
    if excluded:
        out.append("not merged (wrong data, excluded by default): "
                   + ", ".join(f"{k} {v}" for k, v in sorted(excluded.items(), key=lambda kv: -kv[1])))
    return out


def _row_cells(r: MergedDatasetStats) -> tuple[str, ...]:
    drops = ", ".join(f"{k} {v}" for k, v in sorted(r.dropped.items())) or "-"
    trunc = f"{r.truncated / r.samples:.1%}" if r.samples else "-"
    return (r.dataset, f"{r.samples:,}", f"{r.prompt_tokens:,}", f"{r.completion_tokens:,}", f"{r.reasoning_share:.1%}",
            trunc, f"{r.capped:,}", drops)


def _hidden(cfg: RunConfig, stats: MergeStats, train: list[MergedRow], val: list[MergedRow], echo: Echo) -> None:
    hs = cfg.hidden_states
    if hs.hidden_size is None:
        return
    lines = [DatasetTokens(dataset=s.dataset, tokens=s.prompt_tokens + s.completion_tokens,
                           tokens_uncapped=s.tokens_uncapped, samples=s.samples) for s in stats.datasets]
    rep = hidden_states_report(lines, hidden_size=hs.hidden_size, slots=hs.slots, dtype=hs.dtype,
                               max_seq_len=cfg.merge.max_seq_len)
    stats.hidden_states = rep
    uncapped = [r.uncapped_len for r in (*train, *val)]
    what_if = {c: tokens_under_cap(uncapped, c) for c in _WHAT_IF_CAPS if c != cfg.merge.max_seq_len}
    what_if = {c: t for c, t in what_if.items() if t != rep.tokens}  # only caps that would change something
    for line in format_hidden_report(rep, cap_options=what_if):
        echo(line)


def _clear(rd: RunDir) -> None:
    """Remove what the previous merge wrote, as its manifest lists it; nothing else is touched.

    Only paths inside merged/ or exports/ are removed, and then the folders that held them once empty.
    A layout-1 manifest (older runs: exports inside merged/) has paths relative to merged/."""
    if not rd.merged_manifest.is_file():
        return
    old = read_json(rd.merged_manifest, MergeManifest)
    rd.merged_manifest.unlink()  # the output is incomplete from here until the new manifest
    tops = (rd.merged.resolve(), rd.exports.resolve())
    for f in old.files:
        path = rd.merged_listed(old, f.path).resolve()
        top = next((t for t in tops if path.is_relative_to(t) and path != t), None)
        if top is None:
            continue
        path.unlink(missing_ok=True)
        folder = path.parent
        while folder != top:  # folders the merge made, once empty
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent
    rd.merged_stats.unlink(missing_ok=True)  # not listed by layout-1 manifests
    with contextlib.suppress(OSError):
        rd.exports.rmdir()


def _nothing_merged(rd: RunDir, stats: MergeStats, echo: Echo) -> None:
    """A merge that keeps no row: ``merged/stats.json`` says why, no manifest is written (the output is
    not complete) and it fails: an empty dataset is never a success."""
    atomic_write_json(rd.merged_stats, stats)
    for line in _table_lines(stats):
        echo(line)
    if len(stats.total.rounds) > 1:
        echo("rows by round of generation: " + " · ".join(f"round {k}: {v:,}" for k, v in
                                                         sorted(stats.total.rounds.items(), key=lambda kv: int(kv[0]))))
    for n in stats.notes:
        echo(f"note: {n}")
    t = stats.total
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(t.dropped.items(), key=lambda kv: -kv[1]))
    why = ", ".join(x for x in (dropped, f"orphans {t.orphans}" if t.orphans else "") if x)
    raise ThresholdBroken(f"merge: no row to write ({t.records:,} records of the prepared sets"
                          + (f"; left out: {why}" if why else "") + f"); no manifest written, see {rd.merged_stats} "
                          "(rerun generate: samples whose record the audit excluded are generated again)")


def run_merge(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None,
              force: bool = False) -> MergeReport:
    """Build merged/ from the run directory (see the module docstring). ``profile``: the already loaded
    profile of ``cfg.model`` (default: loaded here). ``force``: accept records of another provenance."""
    with writer(cfg, "merge", force=force) as rd:
        return _merge(cfg, rd, echo, force, profile)


def _merge(cfg: RunConfig, rd: RunDir, echo: Echo, force: bool, profile: Profile | None) -> MergeReport:
    if not any(rd.raw(ds.name).is_file() for ds in cfg.datasets):
        raise InputError(f"{rd.raw_root}: no raw_responses.jsonl for any dataset; run `draftgen generate` first")
    if profile is None:
        profile = profile_from_config(cfg)
    scanner = _Scanner(cfg, profile, echo, force=force)
    scanner.load_audit()
    for ds in cfg.datasets:
        scanner.scan(ds.name)
    train, val = _select(cfg, scanner)
    stats = _stats(cfg, scanner, train, val)

    orphans = sum(st.orphans for st in stats.datasets)
    if orphans:
        stats.notes.append(f"{orphans:,} records are not in the current prepared set (orphans) and were not merged")
    if scanner.forced:
        stats.notes.append("--force accepted records whose " + "; ".join(sorted(scanner.forced)))
    out_dir = rd.merged
    exports = list(dict.fromkeys(cfg.merge.exports))
    check_exports(exports)
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear(rd)
    if not train and not val:
        _nothing_merged(rd, stats, echo)
    ids = scanner.id_array()
    sources = {ds.name: RowSource(rd.raw(ds.name), rd.prepared(ds.name) if rd.prepared(ds.name).is_file() else None)
               for ds in cfg.datasets}
    files: list[MergedFile] = []
    for split, rows in (("train", train), ("validation", val)):
        if split == "validation" and not rows:
            continue
        files += write_split(rows, split, rd, ids, profile=profile, sources=sources, exports=exports,
                             mask_reasoning=cfg.merge.mask_reasoning, note=stats.notes.append)
    del ids
    for line in _table_lines(stats):
        echo(line)
    if len(stats.total.rounds) > 1:
        echo("rows by round of generation: " + " · ".join(f"round {k}: {v:,}" for k, v in
                                                         sorted(stats.total.rounds.items(), key=lambda kv: int(kv[0]))))
    _hidden(cfg, stats, train, val, echo)
    for n in stats.notes:
        echo(f"note: {n}")
    files.append(write_card(rd, files, model=cfg.model.id, profile=profile.name,
                            tokenizer_sha256=profile.tokenizer_sha256, seed=cfg.merge.seed,
                            mask_reasoning=cfg.merge.mask_reasoning))
    atomic_write_json(rd.merged_stats, stats)
    files.append(file_entry(rd, rd.merged_stats, "all", "stats", 0))
    manifest = MergeManifest(files=files, seed=cfg.merge.seed, merge=msgspec.to_builtins(cfg.merge),
                             datasets=[ds.name for ds in cfg.datasets], profile=profile.name,
                             forced=sorted(scanner.forced), layout=MANIFEST_LAYOUT)
    atomic_write_json(rd.merged_manifest, manifest)
    echo(f"merged: {len(train):,} train + {len(val):,} validation rows → {out_dir}")
    for kind in exports:
        echo(f"export {kind}: {export_usage(rd, kind)}")
    return MergeReport(merged_dir=out_dir, stats=stats, files=files, train_rows=len(train), validation_rows=len(val))


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``merge`` row of ``phases.PHASES``: merge, then go on."""
    run_merge(ctx.cfg, echo=ctx.echo, profile=ctx.profile, force=ctx.options.force)
    return PhaseOutcome()
