"""The run directory's layout: every file and folder name, spelled once, and ``RunDir``, which joins them.

Layout (paths relative to the run directory)::

    run.json                           RunManifest: the run marker, written when draftgen claims the folder
    .draftgen.lock                     the writer lock (flock); its text (LockHolder) names the holder
    pipeline.json                      what each phase of ``draftgen run`` last saw (pipeline)
    prepared/<dataset>/prompts.jsonl   PromptRecord       prepared/<dataset>/stats.json  DatasetStats
    raw/<dataset>/raw_responses.jsonl  ResponseRecord     raw/<dataset>/failures.jsonl   FailureRecord
    raw/<dataset>/replaced.jsonl       ResponseRecord: records ``generate --redo`` took out of the raw log (their
                                       samples are generated again); kept for their spend, never merged
    audit/audit.json                   AuditReport
    merged/                            the training rows: <split>-NNNNN-of-MMMMM.parquet shards, README.md (the
                                       dataset card: its YAML ``configs`` name the shards per split, so
                                       ``datasets.load_dataset("merged")`` loads them), stats.json (MergeStats), and
                                       manifest.json (MergeManifest, every file merge wrote), written last
    exports/<format>/train.jsonl       the train rows in a peer trainer's format (exporters.EXPORTERS), one folder each,
                                       so ``speculators prepare-data --data exports/speculators/`` reads only them
    exports/validation/<format>/       the validation rows in the same format (``merge.val_fraction`` > 0)
    logs/attempts.jsonl                AttemptRecord: every request attempt (provider health, report timelines)
    logs/health.jsonl                  HealthEvent: providers sent to and back from the cool-down
    logs/settlements.jsonl             SettlementRecord: what requests abandoned on the wire were billed
    logs/probe.json                    ProbeMeasurement: the stream probe's request measured (plan's rate)
    rounds/round-<n>.json              RoundPlan: a later round of generation, proposed by ``plan --next-round``,
                                       started by ``generate --round N`` (round 1, the run as configured, has none)
    openrouter-batches/journal.jsonl   BatchEvent: every OpenRouter batch of ``endpoint.mode: batch`` (records.batches)
    report.html, logs/<command>.log, emulator/ground_truth.jsonl, plan/pilot/ (a run directory of its own)
    hidden/                            (coming) the extract phase's hidden states: per-sample files, index, manifest
    train/                             the train phase: inputs/ (or online/), vocab/, checkpoints/, drafter/, eagle3/,
                                       log.jsonl, speculators.log, train.json; online also handover/ (the checked
                                       states handed to the trainer, which deletes each once read) and
                                       connector-claims/ (a marker per server connector file being answered);
                                       previous/ (drafter/, eagle3/, train.json as published before a run whose
                                       drafter was refused); draft-lm/ (train --draft-lm: the baseline draft LM)

Every name above is spelled once, in the constants below; ``LAYOUT_NAMES`` holds them all and
tests/test_rundir_layout.py fails on any of them written as a string anywhere else in the package.

Claiming a folder, its writer lock and ``run.json`` (the rules of who writes here) are ``rundir.claim``'s.
"""

from __future__ import annotations

from pathlib import Path

from draftgen.records import MergeManifest

__all__ = [
    "LAYOUT_DIRS",
    "LAYOUT_FILES",
    "LAYOUT_NAMES",
    "LOCK_NAME",
    "MARKER",
    "HiddenLayout",
    "RunDir",
]

# The layout's names, each spelled once (RunDir joins them; nothing else in the package spells them).
MARKER = "run.json"
LOCK_NAME = ".draftgen.lock"
_PIPELINE = "pipeline.json"
_REPORT = "report.html"
_LOGS, _ATTEMPTS, _HEALTH, _SETTLEMENTS = "logs", "attempts.jsonl", "health.jsonl", "settlements.jsonl"
_PREPARED, _PROMPTS, _STATS = "prepared", "prompts.jsonl", "stats.json"
_RAW, _RESPONSES, _FAILURES = "raw", "raw_responses.jsonl", "failures.jsonl"
_REPLACED = "replaced.jsonl"
_PROGRESS = "progress.json"  # in logs/: generate's latest display figures (records.ProgressRecord)
_PROBE = "probe.json"  # in logs/: what probe's request measured (records.ProbeMeasurement)
_AUDIT, _AUDIT_JSON = "audit", "audit.json"
_MERGED, _CARD, _MANIFEST = "merged", "README.md", "manifest.json"
_EXPORTS = "exports"
_EMULATOR, _GROUND_TRUTH = "emulator", "ground_truth.jsonl"
_PLAN, _PILOT = "plan", "pilot"
_ROUNDS = "rounds"
_HIDDEN = "hidden"
_HIDDEN_STATES, _HIDDEN_INDEX = "states", "index"  # inside a hidden-state destination (HiddenLayout)
_HIDDEN_MARKER = ".draftgen-hidden.json"  # a hidden-state destination's owner marker (HiddenLayout)
_TRAIN = "train"
# inside train/ (the train phase): speculators' inputs, the vocab mapping, its checkpoints, the published drafter
# in the speculators format and in the flat EAGLE-3 format, the training log, speculators' own log, the report
_TRAIN_INPUTS, _TRAIN_VOCAB, _TRAIN_CKPTS = "inputs", "vocab", "checkpoints"
_TRAIN_DRAFTER, _TRAIN_EAGLE = "drafter", "eagle3"
_TRAIN_PREVIOUS = "previous"  # the published drafter a refused run set aside (phases.train.run)
_TRAIN_DRAFT_LM = "draft-lm"  # the independent draft LM matched to the drafter (train --draft-lm)
_TRAIN_LOG, _TRAIN_SPEC_LOG, _TRAIN_REPORT = "log.jsonl", "speculators.log", "train.json"
# online training (train --online): speculators' inputs made from the merged rows, and what they were made from
_TRAIN_ONLINE, _TRAIN_ONLINE_JSON = "online", "online.json"
# online training: copies of checked states handed to the trainer; claims on the servers' connector files
_TRAIN_HANDOVER, _TRAIN_CLAIMS = "handover", "connector-claims"
_ACCEPT, _ACCEPT_JSON = "accept", "acceptance.json"
_HIDDEN_EXPORTS = "hidden-exports"
_BATCHES, _BATCH_JOURNAL = "openrouter-batches", "journal.jsonl"

#: every file name of the layout
LAYOUT_FILES: frozenset[str] = frozenset({
    MARKER, LOCK_NAME, _PIPELINE, _REPORT, _ATTEMPTS, _HEALTH, _PROMPTS, _STATS, _RESPONSES, _FAILURES, _REPLACED,
    _AUDIT_JSON, _CARD, _MANIFEST, _HIDDEN_MARKER, _GROUND_TRUTH, _TRAIN_LOG, _TRAIN_SPEC_LOG, _TRAIN_REPORT, _ACCEPT_JSON,
    _BATCH_JOURNAL, _TRAIN_ONLINE_JSON, _PROGRESS, _SETTLEMENTS, _PROBE,
})
#: every folder name of the layout (some are also ordinary words: ``train`` is a split, ``audit`` a command)
LAYOUT_DIRS: frozenset[str] = frozenset({
    _LOGS, _PREPARED, _RAW, _AUDIT, _MERGED, _EXPORTS, _EMULATOR, _PLAN, _PILOT, _HIDDEN, _TRAIN,
    _HIDDEN_STATES, _HIDDEN_INDEX, _TRAIN_INPUTS, _TRAIN_VOCAB, _TRAIN_CKPTS, _TRAIN_DRAFTER, _TRAIN_EAGLE,
    _ACCEPT, _HIDDEN_EXPORTS, _BATCHES, _TRAIN_ONLINE, _TRAIN_HANDOVER, _TRAIN_CLAIMS, _TRAIN_PREVIOUS, _ROUNDS,
    _TRAIN_DRAFT_LM,
})
LAYOUT_NAMES: frozenset[str] = LAYOUT_FILES | LAYOUT_DIRS
# Files a failed first claim may leave behind; a folder holding only these still counts as empty.


class HiddenLayout:
    """Relative names inside a hidden-state destination (``<run>/hidden`` or any fsspec URL, so plain
    strings joined with ``/``): ``.draftgen-hidden.json`` (the owner marker, written first),
    ``states/<k[:2]>/<k>.safetensors``, ``index/part-*.jsonl``, ``manifest.json`` (written last)."""

    marker = _HIDDEN_MARKER
    states = _HIDDEN_STATES
    index = _HIDDEN_INDEX
    manifest = _MANIFEST


class RunDir:
    """Every path of one run directory. Nothing else spells a file name of the layout.

    A pilot run (``plan --pilot``) is a run directory of its own: ``RunDir(rd.pilot)`` spells its paths.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- the run as a whole
    @property
    def marker(self) -> Path:
        return self.root / MARKER

    @property
    def lock(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def pipeline(self) -> Path:
        return self.root / _PIPELINE

    @property
    def report_html(self) -> Path:
        return self.root / _REPORT

    @property
    def logs(self) -> Path:
        return self.root / _LOGS

    def log(self, command: str) -> Path:
        return self.logs / f"{command}.log"

    @property
    def attempts(self) -> Path:
        return self.logs / _ATTEMPTS

    @property
    def probe(self) -> Path:
        """``logs/probe.json``: the stream probe's request measured (``records.ProbeMeasurement``)."""
        return self.logs / _PROBE

    @property
    def health(self) -> Path:
        return self.logs / _HEALTH

    @property
    def progress(self) -> Path:
        """``logs/progress.json``: the live display's latest figures (``ProgressRecord``), for ``status``."""
        return self.logs / _PROGRESS

    @property
    def settlements(self) -> Path:
        """``logs/settlements.jsonl``: what requests abandoned on the wire were billed (``SettlementRecord``)."""
        return self.logs / _SETTLEMENTS

    @property
    def batch_journal(self) -> Path:
        """``openrouter-batches/journal.jsonl``: the batch journal (``records.batches``)."""
        return self.root / _BATCHES / _BATCH_JOURNAL

    # -- per dataset
    @property
    def prepared_root(self) -> Path:
        """``prepared/``: one folder per dataset."""
        return self.root / _PREPARED

    def prepared(self, dataset: str) -> Path:
        return self.prepared_root / dataset / _PROMPTS

    def prepared_stats(self, dataset: str) -> Path:
        return self.prepared_root / dataset / _STATS

    @property
    def raw_root(self) -> Path:
        """``raw/``: one folder per dataset."""
        return self.root / _RAW

    def raw_dir(self, dataset: str) -> Path:
        return self.raw_root / dataset

    def raw(self, dataset: str) -> Path:
        return self.raw_dir(dataset) / _RESPONSES

    def failures(self, dataset: str) -> Path:
        return self.raw_dir(dataset) / _FAILURES

    def replaced(self, dataset: str) -> Path:
        """Records ``generate --redo`` moved out of the raw log (``phases.generate.rerun``): spent, never merged."""
        return self.raw_dir(dataset) / _REPLACED

    # -- phase outputs
    @property
    def audit_json(self) -> Path:
        return self.root / _AUDIT / _AUDIT_JSON

    @property
    def merged(self) -> Path:
        return self.root / _MERGED

    def merged_shard(self, split: str, index: int, count: int) -> Path:
        """One Parquet shard of a split (the Hugging Face ``<split>-NNNNN-of-MMMMM`` naming)."""
        return self.merged / f"{split}-{index:05d}-of-{count:05d}.parquet"

    @property
    def dataset_card(self) -> Path:
        return self.merged / _CARD

    @property
    def merged_manifest(self) -> Path:
        return self.merged / _MANIFEST

    @property
    def merged_stats(self) -> Path:
        return self.merged / _STATS

    def merged_listed(self, manifest: MergeManifest, path: str) -> Path:
        """Where a file that ``merged/manifest.json`` lists lies: ``path`` is relative to the run directory
        (``layout`` 2 and later), or to merged/ (layout 1: manifests without the field, exports inside
        merged/). The one place that reads ``MergeManifest.layout``."""
        return (self.root if manifest.layout >= 2 else self.merged) / path

    @property
    def exports(self) -> Path:
        return self.root / _EXPORTS

    def export_dir(self, kind: str, split: str = "train") -> Path:
        """The folder of one export format's split: ``exports/<kind>/`` holds the train split only (a peer
        that reads a whole folder, such as speculators' ``--data DIR``, must not see validation rows), the
        other splits sit under ``exports/<split>/<kind>/``."""
        return self.exports / kind if split == "train" else self.exports / split / kind

    def export_file(self, kind: str, split: str) -> Path:
        return self.export_dir(kind, split) / f"{split}.jsonl"

    @property
    def hidden(self) -> Path:
        """``hidden/``: the extract phase's output (per-sample hidden states, index, manifest)."""
        return self.root / _HIDDEN

    @property
    def hidden_exports(self) -> Path:
        """``hidden-exports/``: the hidden states in a trainer's format, one folder per format."""
        return self.root / _HIDDEN_EXPORTS

    @property
    def train(self) -> Path:
        """``train/``: the train phase's output (drafter checkpoints, vocab mapping, training log)."""
        return self.root / _TRAIN

    @property
    def train_inputs(self) -> Path:
        """``train/inputs/``: what speculators reads (its Arrow dataset, hidden_states/, token_freq.pt)."""
        return self.train / _TRAIN_INPUTS

    @property
    def train_online(self) -> Path:
        """``train/online/``: speculators' inputs for online training (its Arrow dataset of the merged rows,
        token_freq.pt, sample_ids.jsonl) and ``online.json`` (the rows and servers they were made for)."""
        return self.train / _TRAIN_ONLINE

    @property
    def train_online_report(self) -> Path:
        return self.train_online / _TRAIN_ONLINE_JSON

    @property
    def train_handover(self) -> Path:
        """``train/handover/``: online, each checked sample's states as draftgen read them from the server's
        file (the server cannot change them), handed to the trainer, which deletes each once loaded."""
        return self.train / _TRAIN_HANDOVER

    @property
    def train_connector_claims(self) -> Path:
        """``train/connector-claims/``: online, one marker per server connector file a request of draftgen's
        was named and has not removed yet (``ConnectorFolder.claim``): a killed run's are swept at the next start."""
        return self.train / _TRAIN_CLAIMS

    @property
    def train_vocab(self) -> Path:
        return self.train / _TRAIN_VOCAB

    @property
    def train_checkpoints(self) -> Path:
        return self.train / _TRAIN_CKPTS

    @property
    def train_drafter(self) -> Path:
        """The trained drafter in the speculators format (``vllm serve`` loads it)."""
        return self.train / _TRAIN_DRAFTER

    @property
    def train_eagle(self) -> Path:
        """The trained drafter in the flat EAGLE-3 format (SGLang's draft model path)."""
        return self.train / _TRAIN_EAGLE

    @property
    def train_draft_lm(self) -> Path:
        """``train/draft-lm/``: the independent draft LM matched to the drafter (``drafter.draftlm``)."""
        return self.train / _TRAIN_DRAFT_LM

    @property
    def train_previous(self) -> Path:
        """``train/previous/``: the drafter/, eagle3/ and train.json published before a run whose drafter was
        refused (that run publishes nothing; these stay servable, apart from its own)."""
        return self.train / _TRAIN_PREVIOUS

    @property
    def train_log(self) -> Path:
        return self.train / _TRAIN_LOG

    @property
    def train_speculators_log(self) -> Path:
        return self.train / _TRAIN_SPEC_LOG

    @property
    def train_report(self) -> Path:
        return self.train / _TRAIN_REPORT

    @property
    def accept(self) -> Path:
        """``accept/``: one folder per drafter measured (a report per pass in it), and the run's latest."""
        return self.root / _ACCEPT

    @property
    def accept_json(self) -> Path:
        """``accept/acceptance.json``: a copy of the latest report of the run's own drafter
        (``phases.accept.run``: its measurement over the configured prompts)."""
        return self.accept / _ACCEPT_JSON

    def accept_report(self, key: str, name: str) -> Path:
        """``accept/<key>/<name>.json``: the report of one pass (``name``: its server and prompt set) of the
        drafter whose key is ``key``; a draftgen before schema 4 wrote one ``acceptance.json`` per drafter."""
        return self.accept / key / f"{name}.json"

    def accept_prompts(self, key: str, name: str) -> Path:
        """``accept/<key>/<name>.prompts.jsonl``: that pass's acceptance per held-out prompt, one
        ``records.PromptAcceptance`` a line (written whole, with its report)."""
        return self.accept / key / f"{name}.prompts.jsonl"

    def accept_reports(self) -> list[Path]:
        """Every pass's report, ordered by drafter key, then name."""
        return sorted(self.accept.glob("*/*.json"))

    # -- around the phases
    @property
    def ground_truth(self) -> Path:
        """What the embedded emulator really generated (``GroundTruthRecord``), for ``audit``."""
        return self.root / _EMULATOR / _GROUND_TRUTH

    @property
    def rounds(self) -> Path:
        """``rounds/``: one ``round-<n>.json`` (``records.RoundPlan``) per round after the first."""
        return self.root / _ROUNDS

    def round_plan(self, n: int) -> Path:
        return self.rounds / f"round-{n}.json"

    @property
    def pilot(self) -> Path:
        """``plan --pilot``'s run directory (a run directory of its own, inside this one)."""
        return self.root / _PLAN / _PILOT
