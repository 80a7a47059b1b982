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
Skipped and counted, not errors: ids already in the raw log or earlier in FILE (duplicates), ids that
are not in the current prepared set (they would never be merged), and records the one intake of every
response refuses (``engine.intake.check_response``, as for a synchronous response or a batch result),
counted by kind: the sample stays pending and ``generate`` makes it. What that intake can check of a
record is what the record carries:
- tokens: more ``output_ids`` (or billed completion tokens) than its ``max_tokens`` allows, or, for a
  record that names none, the ``max_tokens`` of its prompt's partition in the config (``too_many_tokens``);
- identity: a ``model`` that is not the config's (nor a dated version or a ``quality.model_aliases``
  entry: ``model_mismatch``); a ``provider`` the config's routing excludes by name (``routing.ignore`` /
  ``only``; its quantization is not known here: ``provider_excluded``);
- completeness: no ``finish_reason``, or ``length`` under ``quality.min_length_fraction`` of its
  ``max_tokens`` (``incomplete``). A bare ``{sample_id, output_ids}`` row (no model, provider, usage or
  finish reason: a local SGLang run's) says nothing of its end, so only its ids are checked;
- reasoning: never refused here: every imported record carries the ids themselves, which is what the
  dropped-reasoning check asks of a response.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import msgspec

from draftgen.backends.base import Completion
from draftgen.config import RunConfig
from draftgen.engine import RoutingGuard
from draftgen.engine.intake import IntakeRules, check_response
from draftgen.errors import InputError, RetryableAPIError
from draftgen.phases import Echo
from draftgen.provenance import check_provenance, expected_provenance
from draftgen.records import PromptIdView, ResponseFields, ResponseRecord, check_ids
from draftgen.rundir.claim import writer
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
    #: records the intake refused, by kind (``model_mismatch``, ``incomplete``, ``too_many_tokens``, …)
    unusable: dict[str, int] = msgspec.field(default_factory=dict)
    forced: list[str] = msgspec.field(default_factory=list)


def run_import(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
               dataset: str, source: Path) -> ImportReport:
    """Check every line of ``source`` and append the new ones to the ``dataset``'s raw log (module docstring).
    ``profile``: the already loaded profile of ``cfg.model`` (default: loaded here). ``force``: accept
    records (and a run directory) of another provenance."""
    cfg.dataset(dataset)  # ConfigError naming the known datasets
    if not source.is_file():
        raise InputError(f"{source}: file not found; give the JSONL file of records to import")
    with writer(cfg, "import", force=force) as rd:
        profile = profile if profile is not None else profile_from_config(cfg)
        if not rd.prepared(dataset).is_file():
            from draftgen.phases.prepare.run import run_prepare

            run_prepare(cfg, echo=echo, profile=profile, force=force)
        prepared = {r.sample_id: r.partition for _, r in iter_jsonl(rd.prepared(dataset), PromptIdView)}
        intake = _Intake(cfg)
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
            elif intake.refuses(rec, prepared[rec.sample_id], where):
                pass
            else:
                done.add(rec.sample_id)
                take.add(lineno)
        rep.unusable = dict(intake.kinds)
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
    if intake.kinds:
        kinds = ", ".join(f"{k} {n:,}" for k, n in intake.kinds.most_common())
        echo(f"import: {sum(intake.kinds.values()):,} records not imported, refused as a response would be "
             f"({kinds}; first: {intake.first}); generate makes those samples")
    for f in rep.forced:
        echo(f"import: --force accepted records whose {f}")
    return rep


class _Intake:
    """The one intake of every response (``engine.intake.check_response``) applied to imported records, on
    what they carry (module docstring); counts what it refuses, by kind."""

    def __init__(self, cfg: RunConfig) -> None:
        r = cfg.routing
        self.rules = IntakeRules.from_config(cfg)
        self.bare = dataclasses.replace(self.rules, finish_required=False)
        self.guard = RoutingGuard(None, ignore=r.ignore, only=r.only)
        parts = cfg.partitions
        self.max_tokens = {name: getattr(parts, name).max_tokens for name in parts.__struct_fields__}
        self.kinds: Counter[str] = Counter()
        self.first: str | None = None

    def refuses(self, rec: ResponseRecord, partition: str, where: str) -> bool:
        """Whether ``rec`` (of a prompt of ``partition``) is refused; counted (and the first named) if so."""
        comp = Completion(backend=rec.backend or "import",
                          **{name: getattr(rec, name) for name in ResponseFields.__struct_fields__})
        bare = rec.model is None and rec.provider is None and rec.usage is None and rec.finish_reason is None
        limit = rec.max_tokens or self.max_tokens.get(partition) or max(self.max_tokens.values())
        try:
            check_response(comp, limit, self.bare if bare else self.rules, guard=self.guard)
        except RetryableAPIError as exc:
            self.kinds[exc.kind] += 1
            if self.first is None:
                self.first = f"{where}: {exc}"
            return True
        return False
