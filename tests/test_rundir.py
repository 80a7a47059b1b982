"""rundir.claim.writer: no dead end on the first command (issue 23, item 1).

A command that fails before its first real write leaves the run directory as it found it; a run directory
holding only the stamp of a failed start says how to reset it; every command that can say "pass --force"
has the flag, and ``run --force`` reaches prepare.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from _common_helpers import config_dict, load, write_config
from draftgen.cli import cli
from draftgen.errors import RunDirError
from draftgen.rundir.claim import writer


def _cfg(tmp: Path, run: Path, **model: str) -> Path:
    (tmp / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    data = config_dict(tmp, ["chat"], run_dir=str(run), progress="off")
    data["model"] = {**data["model"], **model}
    return write_config(tmp, data, name=f"cfg-{len(model)}.yaml")


@pytest.mark.parametrize("existed", [False, True])
def test_a_command_failing_before_its_first_write_leaves_the_folder_as_it_found_it(tmp_path: Path,
                                                                                  existed: bool) -> None:
    run = tmp_path / "runs" / "r1"
    if existed:
        run.mkdir(parents=True)
    bad = _cfg(tmp_path, run, tokenizer="./nope")
    for command in ("plan", "prepare", "run"):
        res = CliRunner().invoke(cli, [command, str(bad)])
        assert res.exit_code != 0 and "tokenizer folder not found" in res.output, res.output
        assert run.is_dir() == existed and (not existed or not any(run.iterdir())), command
        assert (tmp_path / "runs").exists() == existed  # the parents the claim made go too
    # Fixing the tokenizer is enough: no stamp of the failed start stands in the way.
    res = CliRunner().invoke(cli, ["prepare", str(_cfg(tmp_path, run))])
    assert res.exit_code == 0, res.output


def test_a_stamp_only_run_dir_says_how_to_reset_it_and_a_real_one_does_not(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with writer(load(_cfg(tmp_path, run, tokenizer="./nope")), "plan"):
        pass  # what an older draftgen's failed start left: run.json and the lock
    good = load(_cfg(tmp_path, run))
    with pytest.raises(RunDirError) as err, writer(good, "prepare"):
        pass
    msg = str(err.value)
    assert "model.tokenizer" in msg and "--force" in msg
    assert f"delete {run / 'run.json'} to start afresh" in msg
    (run / "prepared").mkdir()
    (run / "prepared" / "x.jsonl").write_text("{}\n")
    with pytest.raises(RunDirError) as err, writer(good, "prepare"):
        pass
    assert "start afresh" not in str(err.value)
    with writer(good, "prepare", force=True) as rd:  # --force accepts it
        assert rd.root == run


def test_every_command_whose_message_may_suggest_force_has_it() -> None:
    writers = ("prepare", "generate", "plan", "audit", "merge", "extract", "train", "import", "run", "report")
    for name in writers:
        assert "--force" in {o for p in cli.commands[name].params for o in getattr(p, "opts", [])}, name


def test_run_force_reaches_prepare(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with writer(load(_cfg(tmp_path, run, tokenizer="./nope")), "plan"):
        pass
    good = _cfg(tmp_path, run)
    res = CliRunner().invoke(cli, ["run", str(good), "--dry-run"])
    assert res.exit_code == 1 and "--force" in res.output
    res = CliRunner().invoke(cli, ["run", str(good), "--dry-run", "--force"])
    assert res.exit_code == 0, res.output
    assert (run / "prepared" / "chat" / "prompts.jsonl").is_file()


def test_a_refused_writer_names_the_holder_that_has_not_yet_written_its_name(tmp_path: Path) -> None:
    """The holder writes its name into ``.draftgen.lock`` just after taking the flock; a writer refused in
    between waits for it (the race CI once hit with the hidden-state lock), and a name left by a process
    that no longer runs names nobody."""
    import fcntl
    import os
    import subprocess
    import sys
    import threading
    import time

    from draftgen.config import load_config
    from draftgen.records import LockHolder
    from draftgen.store import encode_json

    run = tmp_path / "run"
    cfg = load_config(_cfg(tmp_path, run))
    with writer(cfg, "prepare"):
        pass
    lock = run / ".draftgen.lock"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_bytes(encode_json(LockHolder(pid=dead.pid, command="merge", since=time.time())) + b"\n")
    with open(lock, "r+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        me = encode_json(LockHolder(pid=os.getpid(), command="generate", since=time.time())) + b"\n"
        timer = threading.Timer(0.5, lambda: lock.write_bytes(me))
        timer.start()
        with pytest.raises(RunDirError, match=rf"`draftgen generate` \(pid {os.getpid()},"), writer(cfg, "merge"):
            pass
        timer.join()
        lock.write_bytes(b"")
        with pytest.raises(RunDirError, match="another draftgen command is writing"), writer(cfg, "merge"):
            pass
