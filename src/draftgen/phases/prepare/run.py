"""``draftgen prepare``: prompt datasets → ``prepared/<dataset>/prompts.jsonl`` + ``stats.json``.

Per dataset (in config order):

1. read rows from the source (``datasets.sources``) and adapt each to a conversation (``datasets.formats``);
2. cut the prompt(s) to regenerate (``multi_turn``: ``last`` or ``all``, see ``datasets.conversation``);
3. key each prompt by the sha256 of its canonical (messages, tools); ``sample_id = <dataset>-<hash[:16]>``,
   so ids are stable across runs and machines; repeated prompts are dropped (``prepare.dedupe``);
4. with ``max_samples``, keep the N prompts with the smallest ``sha256(seed, hash)`` (a seeded bottom-k
   sample: stable when the source grows) in source order; each round ``generate --round`` started
   (``rounds/round-<n>.json``) adds its prompts for the dataset, and each prompt records the round that
   drew it (round 1: the first ``max_samples`` by key, round 2: the next ones, or the next ones of each tag
   where round 2 adds per tag, ...; ``draw``);
5. with ``tags_field``, each prompt carries its row's tags (a string or a list of strings; a row without the
   field has none; any other value is a bad row): sorted, repeats and empty strings dropped. Tags change no
   sample id or content hash; ``stats.json`` counts the prompts written and left out per tag;
6. count prompt tokens with the target tokenizer and chat template, and pick the partition (the dataset's
   ``partition``, else ``long`` when the prompt has at least ``prepare.long_prompt_tokens`` tokens).

Bounds: the context length is ``model.context_length``, else the tokenizer config's ``model_max_length``,
else 131,072 tokens. A source row over ``datasets.line_byte_limit`` of it (32 bytes per token, at least
8 MiB) is never held whole, and a prompt over the context length in tokens is a bad row (both name
``file:line``; ``--skip-bad`` skips them). A dataset that yields no prompt at all is an InputError at once.

Files: ``prompts.jsonl`` (``records.PromptRecord``) is written to a temp file of its own (``mkstemp`` in the
same folder, so concurrent writers never share one) and renamed over the old file atomically; ``stats.json``
(``records.DatasetStats``) is written last and marks the dataset complete. Its ``fingerprint`` hashes
everything that decides the output (source files' size and mtime, dataset and prepare settings, the
tokenizer); a rerun with an equal fingerprint does nothing, and a rerun after a change rewrites the file
with the same ids for the same prompts.

A row that cannot be read or adapted (or that the chat template rejects) stops the run with
``file:line: what is wrong; fix or pass --skip-bad``; with ``prepare.skip_bad`` it is skipped and counted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from draftgen.config import DatasetConfig, RunConfig
from draftgen.datasets import (
    CutPrompt,
    RowError,
    content_hash,
    iter_rows,
    line_byte_limit,
    prompts_from,
    source_fingerprint,
    source_label,
    source_where,
    to_conversation,
)
from draftgen.errors import ConfigError, DraftgenError, InputError, TokenizerError
from draftgen.phases import Echo, PhaseContext, PhaseOutcome
from draftgen.phases.prepare.draw import Draw, Picked
from draftgen.records import UNTAGGED, DatasetStats, PromptRecord, tag_keys
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer
from draftgen.runview.rounds import read_rounds, started_draws
from draftgen.store import JsonlWriter, atomic_write_json, publish, read_json, temp_beside
from draftgen.tokens import DEFAULT_CONTEXT_LENGTH, Profile, context_length_of, profile_from_config

__all__ = ["PrepareReport", "phase_run", "prepare_dataset", "run_prepare"]


@dataclass
class PrepareReport:
    run_dir: Path
    datasets: list[DatasetStats] = field(default_factory=list)
    #: datasets whose stats.json fingerprint matched: nothing was rewritten
    unchanged: list[str] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.datasets)


def _fingerprint(cfg: RunConfig, ds: DatasetConfig) -> str:
    keyed = {
        "source": source_fingerprint(ds, Path(cfg.base_dir or ".")),
        "dataset": msgspec.to_builtins(ds),
        "prepare": {
            "long_prompt_tokens": cfg.prepare.long_prompt_tokens,
            "multi_turn": cfg.prepare.multi_turn,
            "dedupe": cfg.prepare.dedupe,
            "seed": cfg.prepare.seed,
        },
        "model": {k: v for k, v in msgspec.to_builtins(cfg.model).items() if k != "id"},
    }
    # Merge-time knobs (and the serving traffic plan weighs by) do not change prompts.jsonl.
    for k in ("weight", "cap", "token_budget", "traffic"):
        keyed["dataset"].pop(k, None)
    draws = started_draws(read_rounds(cfg.run_path), ds.name) if ds.max_samples is not None else []
    if any(d.added for d in draws):
        keyed["rounds"] = [d.added for d in draws]
    if any(d.by_tag for d in draws):
        keyed["round_tags"] = [d.by_tag for d in draws]
    return hashlib.sha256(msgspec.json.encode(keyed, order="sorted")).hexdigest()[:16]


def _sample_key(seed: int, h: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{h}".encode()).digest()[:8], "big")


class _Bad:
    def __init__(self, skip: bool, echo: Echo, name: str) -> None:
        self.skip, self.echo, self.name, self.count = skip, echo, name, 0

    def __call__(self, where: str, what: str, fix: str | None = None) -> None:
        if not self.skip:
            raise InputError(f"{where}: {what}; {fix or 'fix or pass --skip-bad'}")
        self.count += 1
        if self.count <= 3:
            self.echo(f"  {self.name}: skipped {where}: {what}")


def context_length(cfg: RunConfig, profile: Profile) -> tuple[int, str]:
    """The longest prompt prepare accepts, in tokens, and where that number comes from."""
    if cfg.model.context_length is not None:
        if cfg.model.context_length <= 0:
            raise ConfigError(f"model.context_length must be a positive number of tokens, not {cfg.model.context_length}")
        return cfg.model.context_length, "model.context_length"
    n = context_length_of(profile.config)
    if n is not None:
        return n, "the tokenizer config's model_max_length"
    return DEFAULT_CONTEXT_LENGTH, "the default"


def _no_prompts(ds: DatasetConfig, base: Path, detail: str) -> InputError:
    where = source_where(ds, base)
    checks = ["path", f"format ({ds.format})", f"field ({ds.field or 'the format default'})"]
    if ds.hf is not None or Path(where).is_dir():
        checks.append(f"split ({ds.split})")
    return InputError(f"dataset {ds.name}: no prompts from {where} ({detail}); check its {', '.join(checks[:-1])} "
                      f"and {checks[-1]}, or remove the dataset from the config")


#: prompts of at most this many characters are always counted whole (at most ~256k tokens)
_COUNT_WHOLE_CHARS = 1 << 18


def _over_context(profile: Profile, cut: CutPrompt, ctx: int) -> tuple[int, int] | None:
    """For a prompt far over ``ctx`` tokens: a lower bound on its tokens and the characters it was counted
    on, without tokenizing the whole text (a whole 8 MB prompt takes about 1 GB and 15 s); else None.

    A long text (over 256k characters and 2 characters per token of the context) is counted on prefixes of
    doubling length from 2 × ``ctx`` characters until one alone is over the context, so refusing it costs
    about what tokenizing 2 × ``ctx`` tokens costs."""
    size = 2 * ctx
    if sum(len(m.content or "") + len(m.reasoning_content or "") for m in cut.messages) <= max(size, _COUNT_WHOLE_CHARS):
        return None
    text = profile.render_prompt(cut.messages, cut.tools)
    while size < len(text):
        # Cutting the text changes the tokens at the cut only: keep a margin below the prefix's count.
        at_least = len(profile.tokenizer.encode(text[:size])) - 64 - ctx // 100
        if at_least > ctx:
            return at_least, size
        size *= 2
    return None


def prepare_dataset(cfg: RunConfig, ds: DatasetConfig, profile: Profile, *, echo: Echo = print) -> DatasetStats:
    """Prepare one dataset and write its files (see the module docstring). Returns its stats."""
    base = Path(cfg.base_dir or ".")
    bad = _Bad(cfg.prepare.skip_bad, echo, ds.name)
    stats = DatasetStats(dataset=ds.name, source=source_label(ds), multi_turn=ds.multi_turn or cfg.prepare.multi_turn,
                         fingerprint=_fingerprint(cfg, ds))
    ctx = context_length(cfg, profile)
    picked = _select(cfg, ds, line_byte_limit(ctx[0]), bad, stats)
    if not picked:
        got = (f"{stats.rows_read:,} rows read, {bad.count:,} bad rows skipped, "
               f"{stats.duplicates_removed:,} duplicates removed" if stats.rows_read else "no rows")
        raise _no_prompts(ds, base, got)
    rd = RunDir(cfg.run_path)
    out = rd.prepared(ds.name)
    stats_path = rd.prepared_stats(ds.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    stats_path.unlink(missing_ok=True)  # the dataset is incomplete until the new stats.json exists
    tmp = temp_beside(out)  # the umask's mode: mkstemp's 0600 would make prompts.jsonl private
    try:
        with JsonlWriter(tmp, fsync=False) as w:
            batch: list[PromptRecord] = []
            for p in picked:
                rec = _record(cfg, ds, profile, p, ctx, bad)
                if rec is None:
                    continue
                batch.append(rec)
                _count(stats, rec)
                if len(batch) >= 512:
                    w.write_many(batch)
                    batch = []
            w.write_many(batch)
        if not stats.samples:
            raise _no_prompts(ds, base, f"all {len(picked):,} prompts were skipped: over the context length or "
                                        "rejected by the chat template")
        publish(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    stats.bad_lines_skipped = bad.count
    if not set(stats.tags) - {UNTAGGED} and not set(stats.tags_not_selected) - {UNTAGGED}:
        stats.tags, stats.tags_not_selected = {}, {}  # no prompt carries a tag: the dataset has none
    atomic_write_json(stats_path, stats)
    return stats


def _tags(data: Any, name: str) -> list[str] | None:
    """The tags in the row's column ``name`` (``datasets[].tags_field``): sorted, unique, empty strings dropped;
    None when the row has no such column or no tag. Raises RowError for any value but a string or a list of
    strings."""
    value = data.get(name) if isinstance(data, dict) else None
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        shown = msgspec.json.encode(value).decode()
        raise RowError(f"its tags column {name!r} (datasets[].tags_field) holds "
                       f"{shown if len(shown) <= 40 else shown[:40] + '…'}, not a string or a list of strings")
    return sorted({v for v in value if v}) or None


def _select(cfg: RunConfig, ds: DatasetConfig, max_line_bytes: int, bad: _Bad, stats: DatasetStats) -> list[Picked]:
    """The prompts of ``ds`` to write, in source order: rows read and adapted, prompts cut, repeats dropped
    (``prepare.dedupe``) and, with ``max_samples``, the seeded draw of every round (``draw``). Counts into
    ``stats``."""
    seen: dict[str, int] = {}
    draws = started_draws(read_rounds(cfg.run_path), ds.name) if ds.max_samples is not None else []
    draw = Draw(ds.max_samples, draws)
    for row in iter_rows(ds, Path(cfg.base_dir or "."), max_line_bytes=max_line_bytes):
        stats.rows_read += 1
        if row.error is not None:
            bad(row.where, row.error, row.fix)
            continue
        try:
            cuts = prompts_from(to_conversation(row.data, ds.format, ds.field), stats.multi_turn)
        except RowError as exc:
            bad(row.where, str(exc))
            continue
        try:
            tags = _tags(row.data, ds.tags_field) if ds.tags_field else None
        except RowError as exc:
            bad(row.where, str(exc), "fix the row, point tags_field at the column of tags, or pass --skip-bad")
            continue
        for cut in cuts:
            h = content_hash(cut.messages, cut.tools)
            n_seen = seen.get(h, 0)
            seen[h] = n_seen + 1
            if n_seen and cfg.prepare.dedupe:
                stats.duplicates_removed += 1
                continue
            # Without dedupe a repeated prompt keeps a distinct, still stable, id.
            ident = h if not n_seen else f"{h}-{n_seen}"
            draw.offer(Picked(-_sample_key(cfg.prepare.seed, ident), draw.seen, row.where, ident, cut, tags))
    picked = draw.picked()
    stats.not_selected, left = draw.not_selected(picked)
    if set(left) - {UNTAGGED}:  # some prompt carries a tag: what each tag has left
        stats.tags_not_selected = left
    return picked


def _record(
    cfg: RunConfig, ds: DatasetConfig, profile: Profile, p: Picked, ctx: tuple[int, str], bad: _Bad
) -> PromptRecord | None:
    """The record of one picked prompt: tokens counted, partition chosen; None (and ``bad`` told) for a
    prompt the chat template rejects or one over the context length ``ctx`` (tokens, where it comes from)."""
    limit, limit_from = ctx
    try:
        over = _over_context(profile, p.cut, limit)
        n_tok = len(profile.prompt_ids(p.cut.messages, p.cut.tools)) if over is None else over[0]
    except TokenizerError as exc:
        bad(p.where, f"the chat template rejected this prompt ({exc})")
        return None
    if n_tok > limit:
        count = f"{n_tok:,} tokens" if over is None else (
            f"at least {n_tok:,} tokens in its first {over[1]:,} characters")
        bad(p.where, f"the prompt has {count}, over the context length of {limit:,} ({limit_from})",
            "raise model.context_length or pass --skip-bad to skip such prompts")
        return None
    long_at = cfg.prepare.long_prompt_tokens
    part = ds.partition if ds.partition != "auto" else ("long" if n_tok >= long_at else "short")
    return PromptRecord(
        sample_id=f"{ds.name}-{p.hash[:16]}" + (p.hash[64:] if len(p.hash) > 64 else ""),
        dataset=ds.name,
        messages=p.cut.messages,
        tools=p.cut.tools,
        partition=part,
        prompt_tokens=n_tok,
        content_hash=p.hash[:64],
        source=p.where,
        turn_index=p.cut.turn_index,
        round=p.round,
        tags=p.tags,
    )


def _count(stats: DatasetStats, rec: PromptRecord) -> None:
    """Add one written prompt to the dataset's totals."""
    n_tok = rec.prompt_tokens or 0  # ``_record`` always counts them
    stats.samples += 1
    stats.prompt_tokens += n_tok
    stats.max_prompt_tokens = max(stats.max_prompt_tokens, n_tok)
    if rec.partition == "long":
        stats.long += 1
    else:
        stats.short += 1
    for t in tag_keys(rec.tags):
        stats.tags[t] = stats.tags.get(t, 0) + 1


def _is_current(cfg: RunConfig, ds: DatasetConfig) -> DatasetStats | None:
    rd = RunDir(cfg.run_path)
    stats_path = rd.prepared_stats(ds.name)
    if not (stats_path.is_file() and rd.prepared(ds.name).is_file()):
        return None
    try:
        st = read_json(stats_path, DatasetStats)
    except DraftgenError:
        return None
    return st if st.fingerprint == _fingerprint(cfg, ds) else None


def run_prepare(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None,
                force: bool = False) -> PrepareReport:
    """Prepare every dataset of ``cfg`` under the run directory's writer lock (``rundir.claim.writer``).
    ``profile``: the already loaded profile of ``cfg.model`` (default: loaded here, only if a dataset needs it).
    ``force``: hold a run directory made with another target (``rundir.claim.writer``)."""
    with writer(cfg, "prepare", force=force) as rd:
        return _run_prepare(cfg, rd, echo, profile)


def _run_prepare(cfg: RunConfig, rd: RunDir, echo: Echo, profile: Profile | None) -> PrepareReport:
    """Prepare every dataset of the config whose prepared files are missing or out of date."""
    report = PrepareReport(run_dir=cfg.run_path)
    for ds in cfg.datasets:
        current = _is_current(cfg, ds)
        if current is not None:
            report.datasets.append(current)
            report.unchanged.append(ds.name)
            echo(f"{ds.name}: already prepared ({current.samples} prompts); unchanged")
            continue
        if profile is None:
            profile = profile_from_config(cfg)
        st = prepare_dataset(cfg, ds, profile, echo=echo)
        report.datasets.append(st)
        extra = [f"{st.duplicates_removed} duplicates removed"]
        if st.bad_lines_skipped:
            extra.append(f"{st.bad_lines_skipped} bad rows skipped")
        if st.not_selected:
            extra.append(f"{st.not_selected} left out by max_samples")
        if st.tags:
            extra.append(f"{len(set(st.tags) - {UNTAGGED})} tags")
        echo(
            f"{ds.name}: {st.samples} prompts ({', '.join(extra)}), {st.prompt_tokens:,} prompt tokens, "
            f"{st.short} short / {st.long} long → {rd.prepared(ds.name)}"
        )
    return report


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``prepare`` row of ``phases.PHASES``: prepare, then go on."""
    run_prepare(ctx.cfg, echo=ctx.echo, profile=ctx.profile, force=ctx.options.force)
    return PhaseOutcome()
