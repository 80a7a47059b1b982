"""The checking proxy (``phases.train.proxy``) of ``train --online``.

Its window (``train.online_window_mb``): the files on disk at once, handed to a trainer that has not deleted
them yet or being captured, stay within the window's bytes; a request waits for room and goes on once the
trainer deletes a file; a sample larger than the whole window still runs, alone.

Its outcomes (issue 31 items 6, 7, 8, 9, 10, 11 and 2), against a hostile server: a real HTTP man-in-the-middle
(``_hostile_extract.ExtractMITM``) in front of the emulator. Every answer is one outcome, passed or excluded
(never an HTTP error), and every connector file a request was named is removed: an unreadable file, one without
its keys or with one layer too many, other prompt ids, a lock held past the timeout (and the late write after
it); what a killed proxy (kill -9 of its process) left is swept by the next one's start, and nothing it was not
named is touched. What the trainer is handed is a copy of the bytes checked, which the server cannot change.
Every request asks for ``prompt_logprobs`` and two proxies over the same 100 rows check different samples,
exactly 5 of the 100 each (the default ``teacher_fraction``).

A tiny Qwen3 target served by ``draftgen emulate --model`` in extract mode (vLLM's protocol), the merged rows of
an emulator run, and the proxy in front of the server. The test plays the trainer: it asks for samples as
speculators' online client does (``POST /v1/completions`` with the ids) from several threads at once, holds
the files it is given, and deletes them when it chooses.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run  # noqa: E402
from _hostile_extract import ExtractMITM  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread  # noqa: E402
from draftgen.phases.train.proxy import CheckingProxy  # noqa: E402
from draftgen.rundir import RunDir  # noqa: E402
from draftgen.target import ExtractRow  # noqa: E402
from draftgen.target.rows import read_merged_rows  # noqa: E402
from draftgen.target.vllm import VllmClientOptions, VllmExtractBackend  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("proxy")
    target = build_tiny_model(tmp / "target", layers=8, hidden=32)
    cfg_path = make_merged_run(tmp, n_chat=6, n_code=4, max_tokens=24)
    with start_in_thread(
        ModelServerOptions(model=str(target), port=0, threads=1, extract_dir=str(tmp / "hs"))
    ) as srv:
        data = yaml.safe_load(cfg_path.read_text())
        data["hidden_states"] = {
            "model": str(target),
            "base_urls": [srv.root_url],
            "connector_dir": str(tmp / "hs"),
            "teacher_fraction": 0.0,
            "teacher_min_margin": None,
        }
        cfg = load_config(write_config(tmp, data, "proxy.yaml"))
        rows = sorted(read_merged_rows(RunDir(tmp / "run")), key=lambda r: len(r.input_ids))
        yield {"cfg": cfg, "rows": rows, "hs": tmp / "hs", "target": target, "handover": tmp / "handover",
               "url": srv.root_url, "cfg_path": tmp / "proxy.yaml", "run": tmp / "run"}


def _proxy(s: dict[str, Any], window_bytes: int) -> CheckingProxy:
    cfg = s["cfg"]
    return CheckingProxy(
        VllmExtractBackend(cfg),
        cfg.hidden_states,
        s["rows"],
        model_name=str(s["target"]),
        handover=s["handover"],
        max_files=16,
        window_bytes=window_bytes,
    )


def _ask(url: str, row: ExtractRow) -> str:
    """One sample, as speculators' online client asks for it; returns the file it is handed."""
    r = httpx.post(
        f"{url}/completions",
        json={
            "model": "m",
            "prompt": [int(t) for t in row.input_ids],
            "max_tokens": 1,
            "return_token_ids": True,
        },
        timeout=60,
    )
    r.raise_for_status()
    return str(r.json()["kv_transfer_params"]["hidden_states_path"])


def _ask_all(url: str, rows: list[ExtractRow]) -> tuple[list[str], list[threading.Thread]]:
    got: list[str] = []
    threads = [threading.Thread(target=lambda r=r: got.append(_ask(url, r)), daemon=True) for r in rows]
    for t in threads:
        t.start()
    return got, threads


def _settle(got: list[str], n: int | None = None, wait_s: float = 3.0) -> None:
    """Wait until ``n`` files were handed (or, with None, until no more arrive for a while)."""
    end, seen = time.monotonic() + 60, -1
    while time.monotonic() < end:
        if n is not None and len(got) >= n:
            return
        if n is None and len(got) == seen:
            return
        seen = len(got)
        time.sleep(wait_s if n is None else 0.05)
    raise AssertionError(f"{len(got)} files handed, expected {n}")


def _drain(got: list[str], total: int, threads: list[threading.Thread]) -> None:
    """Play the trainer that has read what it was handed: delete it, so that the waiting requests get room,
    one at least each time, until ``total`` were handed; then wait for the askers and delete the rest."""
    while len(got) < total:
        n = len(got)
        for p in list(got):
            if os.path.exists(p):
                os.remove(p)
        _settle(got, n + 1)
    for t in threads:
        t.join(60)
    for p in got:
        if os.path.exists(p):
            os.remove(p)


def test_files_on_disk_stay_within_the_window_and_a_deleted_file_makes_room(served: dict[str, Any]) -> None:
    rows: list[ExtractRow] = served["rows"]
    short, rest = rows[0], rows[-6:]
    with _proxy(served, window_bytes=10**9) as probe:  # the bytes a token takes in this server's files
        path = _ask(probe.url, short)
        per_token = os.path.getsize(path) / len(short.input_ids)
        os.remove(path)
    window = int(0.5 * per_token * sum(len(r.input_ids) for r in rest))  # about half of the six rows' files
    with _proxy(served, window) as proxy:
        os.remove(_ask(proxy.url, short))  # learns the bytes per token (the shortest row: the most per token)
        got, threads = _ask_all(proxy.url, rest)
        _settle(got)
        held = sum(os.path.getsize(p) for p in got)
        assert 1 <= len(got) < len(rest), f"{len(got)} of {len(rest)} handed with a window of half their bytes"
        assert held <= window
        _drain(got, len(rest), threads)
        stats = proxy.stats
    assert stats.passed == len(rest) + 1 and stats.excluded == 0
    assert stats.peak_files >= 2 and stats.peak_bytes <= window  # concurrent, and within the window
    assert not list(served["hs"].rglob("*.safetensors"))


def test_a_sample_larger_than_the_window_runs_alone(served: dict[str, Any]) -> None:
    rows: list[ExtractRow] = served["rows"][-3:]
    with _proxy(served, window_bytes=1) as proxy:
        got, threads = _ask_all(proxy.url, rows)
        _settle(got)
        assert len(got) == 1  # one at a time: nothing else fits beside it
        _drain(got, len(rows), threads)
        assert proxy.stats.passed == len(rows) and proxy.stats.peak_files == 1


# -- one outcome for every state that arrives (issue 31) ---------------------------------------------------------


def _hostile(s: dict[str, Any], url: str, tmp: Path, *, fraction: float = 0.0, rows: list[ExtractRow] | None = None,
             timeout_s: float = 30.0) -> CheckingProxy:
    """A proxy in front of ``url`` (one attempt per sample, ``timeout_s`` for a connector file), its claims and
    copies under ``tmp``."""
    opts = VllmClientOptions(base_urls=(url,), connector_dir=str(s["hs"]), file_timeout_s=timeout_s, max_attempts=1,
                             teacher_fraction=fraction, claims=str(tmp / "claims"))
    return CheckingProxy(VllmExtractBackend.from_parts(s["target"], opts), s["cfg"].hidden_states,
                         rows or s["rows"], model_name=str(s["target"]), handover=tmp / "handover")


def _post(url: str, row: ExtractRow) -> httpx.Response:
    return httpx.post(f"{url}/completions", json={"model": "m", "prompt": [int(t) for t in row.input_ids],
                                                  "max_tokens": 1, "return_token_ids": True}, timeout=60)


def _quietly(url: str, row: ExtractRow) -> None:
    with contextlib.suppress(httpx.HTTPError):
        _post(url, row)


def _connector_files(s: dict[str, Any]) -> list[str]:
    return sorted(p.name for p in s["hs"].iterdir())


def test_every_answer_is_one_outcome_and_every_named_file_is_removed(served: dict[str, Any], tmp_path: Path) -> None:
    """Items 7, 8, 9 and 6: an unreadable file, one without token_ids, one with a layer too many after the
    preflight, other prompt ids, a lock held past the timeout: each a 200 excluding the sample by kind, its file
    and lock gone (the held one as soon as its late write lands); an honest sample is handed over."""
    plan = ["truncate", "nokeys", "layers", "ids", "hold", None]
    rows: list[ExtractRow] = served["rows"][: len(plan)]
    with ExtractMITM(served["url"], lambda n, _b, _s: plan[n - 1] if n <= len(plan) else None,
                      hold_s=4.0) as mitm, \
            _hostile(served, mitm.url, tmp_path, timeout_s=2.0) as proxy:
        answers = [_post(proxy.url, r) for r in rows]
        assert [a.status_code for a in answers] == [200] * len(plan)
        kinds = [a.json().get("draftgen_excluded") for a in answers]
        assert kinds == [["bad_hidden_states"], ["bad_hidden_states"], ["bad_hidden_states"], ["ids_mismatch"],
                         ["hidden_states_timeout"], None]
        handed = answers[-1].json()["kv_transfer_params"]["hidden_states_path"]
        assert os.path.isfile(handed) and not handed.startswith(str(served["hs"]))
        os.remove(handed)  # the trainer read it
        for t in mitm.holds:  # the held lock ends with a late write of the file the proxy gave up on
            t.join(30)
        assert _connector_files(served) != []
        os.remove(_post(proxy.url, rows[-1]).json()["kv_transfer_params"]["hidden_states_path"])
        assert _connector_files(served) == []  # the next request's room tidied it
        st = proxy.stats
        assert st.passed + st.excluded == st.requests == len(plan) + 1 and st.excluded == 5
        assert st.excluded_by_check == {"bad_hidden_states": 3, "ids_mismatch": 1, "hidden_states_timeout": 1}
        assert "cannot read the connector's safetensors file" in st.examples["bad_hidden_states"]
    assert [k for _, k in mitm.attacked] == plan[:-1] and len(mitm.named) >= len(plan)
    assert _connector_files(served) == [] and not list((tmp_path / "handover").iterdir())
    assert not list((tmp_path / "claims").iterdir())


def test_the_trainer_reads_what_was_checked(served: dict[str, Any], tmp_path: Path) -> None:
    """Item 11: the server rewrites its files (NaN) after the proxy checked them; the trainer is handed a copy
    of the bytes checked, in draftgen's folder, which the rewrite cannot reach."""
    from safetensors.torch import load_file

    rows: list[ExtractRow] = served["rows"][:3]
    with ExtractMITM(served["url"], lambda *_: None) as mitm, _hostile(served, mitm.url, tmp_path) as proxy:
        handed = [_post(proxy.url, r).json()["kv_transfer_params"]["hidden_states_path"] for r in rows]
        mitm.rewrite()  # too late: nothing the trainer reads is the server's
        loaded = [load_file(p) for p in handed]
        assert proxy.stats.passed == 3
    for row, path, st in zip(rows, handed, loaded, strict=True):
        assert torch.isfinite(st["hidden_states"]).all() and st["token_ids"].tolist() == row.input_ids.tolist()
        assert Path(path).parent == tmp_path / "handover" and Path(path).parent != served["hs"]
    assert not os.path.exists(handed[0])  # the proxy removed the copies the trainer never took
    assert _connector_files(served) == []


_KILLED = """
import sys, time
from pathlib import Path
from draftgen.config import load_config
from draftgen.target.rows import read_merged_rows
from draftgen.target.vllm import VllmClientOptions, VllmExtractBackend
from draftgen.phases.train.proxy import CheckingProxy
from draftgen.rundir import RunDir

cfg_path, url, claims, handover, target, hs, run = sys.argv[1:]
cfg = load_config(cfg_path)
opts = VllmClientOptions(base_urls=(url,), connector_dir=hs, max_attempts=1, claims=claims)
proxy = CheckingProxy(VllmExtractBackend.from_parts(Path(target), opts), cfg.hidden_states,
                      read_merged_rows(RunDir(Path(run))), model_name=target, handover=handover)
print(proxy.start(), flush=True)
time.sleep(600)
"""


def test_a_killed_proxy_leaves_nothing_the_next_start_does_not_sweep(served: dict[str, Any], tmp_path: Path) -> None:
    """Item 10: kill -9 of a process serving the proxy while a capture waits on a held lock and a copy waits for
    the trainer; the next proxy's start removes both (claimed by the first), and neither a file in the connector
    folder no request of draftgen's was named nor a file of another name in its own folder."""
    rows: list[ExtractRow] = served["rows"]
    foreign = served["hs"] / "cmpl-someone-else-0.safetensors"
    foreign.write_bytes(b"another client's file")
    mine = tmp_path / "handover" / "notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("a user's file")
    plan = {2: "hold"}
    with ExtractMITM(served["url"], lambda n, _b, _s: plan.get(n), hold_s=600) as mitm:
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED, str(served["cfg_path"]), mitm.url, str(tmp_path / "claims"),
             str(tmp_path / "handover"), str(served["target"]), str(served["hs"]), str(served["run"])],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            url = (child.stdout.readline() if child.stdout else "").strip()
            handed = _post(url, rows[0]).json()["kv_transfer_params"]["hidden_states_path"]  # never read
            threading.Thread(target=_quietly, args=(url, rows[1]), daemon=True).start()
            deadline = time.monotonic() + 30
            while len(mitm.holds) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            held = mitm.named[-1]
            assert os.path.exists(held) and os.path.exists(handed)
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        mitm.release.set()
        for t in mitm.holds:
            t.join(30)
        assert os.path.exists(held) and os.path.exists(handed)  # what the kill left
        with _hostile(served, mitm.url, tmp_path) as proxy:
            assert proxy.stats.swept == 2
    assert not os.path.exists(held) and not os.path.exists(held + ".lock") and not os.path.exists(handed)
    assert foreign.read_bytes() == b"another client's file" and mine.read_text() == "a user's file"
    foreign.unlink()
    assert _connector_files(served) == []


def test_a_proxy_stopped_mid_request_removes_the_file_its_answer_names_when_it_lands(
        served: dict[str, Any], tmp_path: Path) -> None:
    """The trainer stops (the gate broke, or it finished) while a capture is in flight and the server's file is
    already written: stopping the proxy waits for that answer, then removes the file it names and its claim
    (closing the sessions first left the file, named to nobody, in the connector folder)."""
    rows: list[ExtractRow] = served["rows"]
    with ExtractMITM(served["url"], lambda _n, _b, _s: "late", hold_s=2.0) as mitm:
        proxy = _hostile(served, mitm.url, tmp_path)
        with proxy:
            threading.Thread(target=_quietly, args=(proxy.url, rows[0]), daemon=True).start()
            deadline = time.monotonic() + 30
            while not mitm.attacked and time.monotonic() < deadline:
                time.sleep(0.02)
            assert mitm.attacked and _connector_files(served) != []  # written; its answer not sent yet
        assert len(mitm.named) == 1
    assert _connector_files(served) == [] and not list((tmp_path / "claims").iterdir())


def test_every_request_asks_the_same_question_and_the_checked_samples_are_a_secret(
        served: dict[str, Any], tmp_path: Path) -> None:
    """Item 2: at the default teacher_fraction (0.05) every request carries prompt_logprobs, and two proxies
    over the same 100 rows (the same sample ids, the same requests) each check exactly 5 of them, not the
    same 5 (two equal draws: 1 in 75 million)."""
    np = pytest.importorskip("numpy")
    gen = np.random.default_rng(0)
    rows = [ExtractRow(f"spot-{i}", gen.integers(10, 5000, 10).astype(np.int64),
                       np.array([0, 0] + [1] * 8, dtype=np.uint8)) for i in range(100)]
    checked: list[set[str]] = []
    for k in range(2):
        with ExtractMITM(served["url"], lambda *_: None) as mitm, \
                _hostile(served, mitm.url, tmp_path / str(k), fraction=0.05, rows=rows) as proxy:
            for r in rows:
                os.remove(_post(proxy.url, r).json()["kv_transfer_params"]["hidden_states_path"])
            assert proxy.stats.passed == 100 and proxy.stats.teacher_checked == 5
            checked.append(set(proxy.stats.checked_ids))
        assert len(mitm.bodies) == 100 and all(b.get("prompt_logprobs") == 0 for b in mitm.bodies)
    assert len(checked[0]) == len(checked[1]) == 5 and checked[0] != checked[1]
