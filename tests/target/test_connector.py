"""``target.connector.ConnectorFolder``'s claims on real files and real flocks: what ``sweep`` removes and which
claims it keeps."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from draftgen.target.connector import ConnectorFolder


def _write(path: Path) -> None:
    path.write_bytes(b"states")
    (path.parent / (path.name + ".lock")).touch()


def test_sweep_keeps_the_claim_of_a_file_whose_writer_still_holds_its_lock(tmp_path: Path) -> None:
    """A claimed file whose writer still holds the lock is left as it is, with its claim (removing it would
    let the writer's late write bring it back unclaimed); once the writer lets go, the next sweep removes it.
    A file with no writer left goes with its claim; a file draftgen never claimed is never touched."""
    folder, claims = tmp_path / "hs", tmp_path / "claims"
    folder.mkdir()
    conn = ConnectorFolder(str(folder), claims=str(claims))
    done, held, foreign = folder / "a.safetensors", folder / "b.safetensors", folder / "c.safetensors"
    for f in (done, held, foreign):
        _write(f)
    conn.claim(os.path.realpath(done))
    conn.claim(os.path.realpath(held))
    fd = os.open(folder / "b.safetensors.lock", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the writer, still at it
    try:
        assert conn.sweep() == (1, 0)
        assert sorted(p.name for p in claims.iterdir()) == ["b.safetensors"]
        assert not done.exists() and held.exists() and foreign.exists()
        held.write_bytes(b"late")  # the late write, then the writer lets go
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert conn.sweep() == (1, 0)
    assert not list(claims.iterdir()) and sorted(p.name for p in folder.iterdir()) == [
        "c.safetensors", "c.safetensors.lock"]
