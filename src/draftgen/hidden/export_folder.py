"""An export folder of ``draftgen export-hidden`` (and ``train``'s inputs): who owns it, what it lists, and
whether what it lists is still there as written.

Ownership: a folder is draftgen's once it holds ``.draftgen-export.json`` (``HiddenOwnerMarker``), written
first; a non-empty folder without it is refused before anything is written or deleted, unless its valid
``export.json`` shows an export made before markers (adopted: ``claim_export``). ``export.json`` lists every
file its export wrote (``files``): the next export removes exactly those and overwrites nothing else
(``claim_and_clear``). ``.draftgen-export.pending`` lists what the export in progress began writing, so a rerun
after a death removes it, and the death's temps.

Verification: ``up_to_date`` (the folder's ``export.json`` is of this set, format and flag choice),
``broken_files`` (the listed files missing, or changed: a link, another size, or another sha256 for a file
modified since ``export.json``), ``describe_broken``; ``publish_report`` writes ``export.json`` and drops the
journal. Reads and writes only inside the folder it is given.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import msgspec

from draftgen.errors import InputError, RunDirError
from draftgen.hidden.files import BytesWriter, atomic_save, file_digest, is_temp
from draftgen.hidden.format import owner_marker, read_owner_marker
from draftgen.hidden.speculators import ARROW_FILES, ARROW_SHARD, SAMPLE_IDS, TOKEN_FREQ
from draftgen.records import HiddenExportReport, HiddenExportSample
from draftgen.records.hidden import OWNER_HIDDEN_EXPORT
from draftgen.store import encode_json, iter_jsonl, read_json

__all__ = [
    "EXPORT_JOURNAL",
    "EXPORT_MARKER",
    "EXPORT_REPORT",
    "broken_files",
    "claim_and_clear",
    "claim_export",
    "describe_broken",
    "inside",
    "keep_up_to_date",
    "legacy_files",
    "publish_report",
    "read_report",
    "up_to_date",
]

# Names inside an export folder (not run-directory layout names).
EXPORT_MARKER = ".draftgen-export.json"  # the owner marker, written first
EXPORT_JOURNAL = ".draftgen-export.pending"  # files the export in progress has begun writing, one a line
EXPORT_REPORT = "export.json"


def read_report(out: Path) -> HiddenExportReport | None:
    """``out``'s ``export.json``; None when there is none or it cannot be read."""
    try:
        return read_json(out / EXPORT_REPORT, HiddenExportReport) if (out / EXPORT_REPORT).is_file() else None
    except InputError:
        return None


def up_to_date(out: Path, kind: str, fingerprint: str, include_flagged: bool) -> HiddenExportReport | None:
    """``out``'s ``export.json`` when it is of this format, set (manifest fingerprint) and flag choice; else None."""
    rep = read_report(out)
    same = rep is not None and (rep.format == kind and rep.manifest_fingerprint == fingerprint
                                and rep.include_flagged == include_flagged)
    return rep if same else None


def claim_export(out: Path) -> list[str]:
    """Make ``out`` an export folder of draftgen's before anything there is written or deleted, and return
    what earlier exports there wrote (the files the next export removes). Refuses (RunDirError, nothing
    touched) a file, a folder with another kind of marker, and a non-empty folder without the marker unless
    its ``export.json`` is valid (an export made before markers: adopted, the marker written)."""
    marker = out / EXPORT_MARKER
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out}: is a file, not a folder; give --out a new or empty folder")
    if marker.is_file():
        read_owner_marker(marker.read_bytes(), OWNER_HIDDEN_EXPORT, str(marker))
    else:
        legacy = read_report(out)
        # only the temp of a marker whose write died: still empty
        if legacy is None and out.is_dir() and not all(is_temp(p.name, EXPORT_MARKER) for p in out.iterdir()):
            raise RunDirError(f"{out}: this folder is not empty and was not made by draftgen (it has no "
                              f"{EXPORT_MARKER}); export-hidden writes only into its own folders: give --out a "
                              "new or empty folder")
        out.mkdir(parents=True, exist_ok=True)
        atomic_save(marker, BytesWriter(owner_marker(OWNER_HIDDEN_EXPORT, adopted=legacy is not None)))
    return _previous_files(out)


def _previous_files(out: Path) -> list[str]:
    """The files earlier exports into ``out`` wrote: the last ``export.json``'s listing (for one made
    before listings: its sample files and the names its format writes), plus the pending journal."""
    rep = read_report(out)
    files: list[str] = []
    if rep is not None:
        files = list(rep.files) or legacy_files(out, rep)
    journal = out / EXPORT_JOURNAL
    if journal.is_file():
        files += [ln for ln in journal.read_text(encoding="utf-8", errors="replace").splitlines() if ln]
    return list(dict.fromkeys(files))


def legacy_files(out: Path, rep: HiddenExportReport) -> list[str]:
    files = [SAMPLE_IDS, EXPORT_REPORT]
    with contextlib.suppress(InputError, OSError):
        files += [s.file for _, s in iter_jsonl(out / SAMPLE_IDS, HiddenExportSample)]
    if rep.format == "speculators":
        files += [TOKEN_FREQ, *ARROW_FILES, *sorted(p.name for p in out.iterdir() if ARROW_SHARD.fullmatch(p.name))]
    return files


def inside(out: Path, rel: str) -> Path | None:
    """``out/rel`` when ``rel`` is a plain relative path below ``out`` (a listing never reaches outside)."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        return None
    return out / rel


def _clean_temps(out: Path, listed: list[str]) -> None:
    """Remove draftgen's temps (``is_temp``, files or folders) in ``out`` and in the folders of ``listed``."""
    folders = {out} | {p.parent for p in (inside(out, r) for r in listed) if p is not None}
    for folder in folders:
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if not is_temp(p.name):
                continue
            with contextlib.suppress(OSError):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()


def _remove_listed(out: Path, listed: list[str]) -> None:
    """Remove exactly the listed files still present (then their folders, once empty); the listing stays
    in the journal until they are gone, so a death here leaves nothing unlisted."""
    journal = out / EXPORT_JOURNAL
    atomic_save(journal, BytesWriter("".join(f"{r}\n" for r in listed).encode()))
    folders: set[Path] = set()
    for rel in listed:
        path = inside(out, rel)
        if path is None or not (path.is_file() or path.is_symlink()):
            continue
        path.unlink()
        folders.update(q for q in path.parents if q != out and out in q.parents)
    for folder in sorted(folders, key=lambda q: -len(q.parts)):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only an empty one: a file draftgen did not write keeps its folder
    journal.unlink()


def keep_up_to_date(out: Path, done: HiddenExportReport) -> None:
    """An up-to-date folder is claimed too (an export made before markers is adopted) and loses a death's temps."""
    _clean_temps(out, claim_export(out))
    if done.files:  # a death after export.json, before the journal went: all it lists is listed there
        (out / EXPORT_JOURNAL).unlink(missing_ok=True)


def claim_and_clear(out: Path) -> None:
    """Before an export writes into ``out``: claim it, remove leftover temps and what earlier exports
    listed (their ``export.json`` first, so the folder never looks up to date half-cleared)."""
    listed = claim_export(out)
    _clean_temps(out, listed)
    if EXPORT_REPORT in listed:
        listed = [EXPORT_REPORT] + [r for r in listed if r != EXPORT_REPORT]
    _remove_listed(out, listed)


def broken_files(out: Path, rep: HiddenExportReport) -> dict[str, str]:
    """The files ``rep`` lists that ``out`` no longer holds as written: rel → ``missing`` or ``changed`` (a
    link where the file was; another size; or, for a file modified since export.json was written, another
    sha256: the rule extract's resume follows, so an intact folder is verified without reading its files).
    An export made before sizes and digests were recorded is checked for existence only."""
    since = (out / EXPORT_REPORT).stat().st_mtime_ns
    broken: dict[str, str] = {}
    for rel in rep.files or legacy_files(out, rep):
        path = inside(out, rel)
        if rel == EXPORT_REPORT or path is None:
            continue
        if path.is_symlink() or (path.exists() and not path.is_file()):
            broken[rel] = "changed"
        elif not path.exists():
            broken[rel] = "missing"
        else:
            st, size, sha = path.stat(), rep.sizes.get(rel), rep.sha256.get(rel)
            if (size is not None and st.st_size != size) or (
                    sha and st.st_mtime_ns >= since and file_digest(path)[1] != sha):
                broken[rel] = "changed"
    return broken


def describe_broken(broken: dict[str, str], rep: HiddenExportReport, most: int = 5) -> str:
    parts = []
    for why in ("missing", "changed"):
        rels = [r for r, w in broken.items() if w == why]
        if rels:
            more = f" and {len(rels) - most} more" if len(rels) > most else ""
            parts.append(f"{why}: {', '.join(rels[:most])}{more}")
    of = f" of {len(rep.files)}" if rep.files else ""
    return f"{len(broken)}{of} listed files broken ({'; '.join(parts)})"


def publish_report(out: Path, rep: HiddenExportReport) -> None:
    """``export.json``, atomically; then the journal goes (every file it names is listed there now)."""
    atomic_save(out / EXPORT_REPORT, BytesWriter(msgspec.json.format(encode_json(rep), indent=2) + b"\n"))
    (out / EXPORT_JOURNAL).unlink(missing_ok=True)
