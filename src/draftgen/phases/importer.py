"""``draftgen import CONFIG --dataset NAME FILE``: bring records made elsewhere into a run, checked.

The one way in for responses that ``generate`` did not write: a local SGLang run's ``{sample_id,
output_ids}`` rows (the reference project's first 90 tok/s records), or another run directory's
``raw_responses.jsonl``. Dropping files into ``raw/`` by hand is not a way in: every phase refuses records
without provenance.

Reads FILE (JSONL, one ``records.ResponseRecord`` per line; only ``sample_id`` and ``output_ids`` are
required) and the dataset's ``prepared/<dataset>/prompts.jsonl`` (running ``prepare`` first when needed).
Appends to ``raw/<dataset>/raw_responses.jsonl``, under the run directory's writer lock.

Checks, per line (a failure names FILE:line and stops the import before anything is written):
- the line decodes as a record of a known ``schema_version``; ``output_ids`` is present and non-empty;
- every id of ``output_ids`` and ``prompt_ids`` is in ``[0, vocab)`` of the config's tokenizer;
- ``dataset``, when given, is the target dataset;
- ``provenance``, when given, matches the config (``--force`` accepts a difference and the record keeps
  its own); without one the record is stamped with the config's, plus ``imported_from``.
Skipped and counted, not errors: ids already in the raw log or earlier in FILE (duplicates), and ids
that are not in the current prepared set (they would never be merged).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from draftgen import rundir
from draftgen.config import RunConfig
from draftgen.errors import InputError
from draftgen.phases import Echo
from draftgen.provenance import check_provenance, expected_provenance
from draftgen.records import PromptIdView, ResponseRecord, check_ids
from draftgen.store import JsonlWriter, iter_jsonl, scan_responses
from draftgen.tokens import Profile, profile_from_config

__all__ = ["ImportReport", "run_import"]

_BATCH = 512


class ImportReport(msgspec.Struct, kw_only=True):
    dataset: str
    source: str
    imported: int = 0
    duplicates: int = 0
    not_prepared: int = 0
    forced: list[str] = msgspec.field(default_factory=list)


def run_import(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
               dataset: str, source: Path) -> ImportReport:
    """Check every line of ``source`` and append the new ones to the ``dataset``'s raw log (module docstring).
    ``profile``: the already loaded profile of ``cfg.model`` (default: loaded here). ``force``: accept
    records (and a run directory) of another provenance."""
    cfg.dataset(dataset)  # ConfigError naming the known datasets
    if not source.is_file():
        raise InputError(f"{source}: file not found; give the JSONL file of records to import")
    with rundir.writer(cfg, "import", force=force) as rd:
        profile = profile if profile is not None else profile_from_config(cfg)
        if not rd.prepared(dataset).is_file():
            from draftgen.phases.prepare import run_prepare

            run_prepare(cfg, echo=echo, profile=profile, force=force)
        prepared = {r.sample_id for _, r in iter_jsonl(rd.prepared(dataset), PromptIdView)}
        want = expected_provenance(cfg, profile.tokenizer_sha256)
        forced: set[str] = set()
        done = scan_responses(rd.raw(dataset), check=lambda p, where: check_provenance(
            p, want, where, force=force, forced=forced)).done
        rep = ImportReport(dataset=dataset, source=str(source))
        vocab = profile.tokenizer.vocab_size
        take: set[int] = set()  # line numbers to import; the records are read again to write them
        for lineno, rec in iter_jsonl(source, ResponseRecord, skip_partial_tail=False):
            where = f"{source}:{lineno}"
            if not rec.output_ids:
                raise InputError(f"{where}: no output_ids; an imported record needs the ids the model produced")
            check_ids(rec.output_ids, vocab, where, "output_ids")
            check_ids(rec.prompt_ids, vocab, where, "prompt_ids")
            if rec.dataset and rec.dataset != dataset:
                raise InputError(f"{where}: the record is of dataset {rec.dataset!r}, not {dataset!r}; "
                                 "import it with --dataset " + rec.dataset)
            if rec.provenance is not None:
                check_provenance(rec.provenance, want, where, force=force, forced=forced)
            if rec.sample_id in done:
                rep.duplicates += 1
            elif rec.sample_id not in prepared:
                rep.not_prepared += 1
            else:
                done.add(rec.sample_id)
                take.add(lineno)
        stamp = msgspec.structs.replace(want, imported_from=str(source.resolve()))
        if take:
            with JsonlWriter(rd.raw(dataset)) as w:
                batch: list[ResponseRecord] = []
                for lineno, rec in iter_jsonl(source, ResponseRecord, skip_partial_tail=False):
                    if lineno not in take:
                        continue
                    rec.dataset = dataset
                    if rec.provenance is None:
                        rec.provenance = stamp
                    batch.append(rec)
                    if len(batch) >= _BATCH:
                        w.write_many(batch)
                        batch.clear()
                w.write_many(batch)
        rep.imported = len(take)
        rep.forced = sorted(forced)
    echo(f"import: {rep.imported:,} records from {source} → {rd.raw(dataset)}"
         f" ({rep.duplicates:,} already there, {rep.not_prepared:,} not in the prepared set; both skipped)")
    for f in rep.forced:
        echo(f"import: --force accepted records whose {f}")
    return rep
