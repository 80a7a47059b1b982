"""The checking proxy's window (``phases.extract.proxy``, ``train.online_window_mb``): the connector files on disk
at once, handed to a trainer that has not deleted them yet or being captured, stay within the window's bytes; a
request waits for room and goes on once the trainer deletes a file; a sample larger than the whole window still
runs, alone.

A tiny Qwen3 target served by ``draftgen emulate --model`` in extract mode (vLLM's protocol), the merged rows of
an emulator run, and the proxy in front of the server. The test plays the trainer: it asks for samples as
speculators' online client does (``POST /v1/completions`` with the ids) from several threads at once, holds
the files it is given, and deletes them when it chooses.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _common_helpers import write_config  # noqa: E402
from _extract_helpers import build_tiny_model, make_merged_run  # noqa: E402
from draftgen.config import load_config  # noqa: E402
from draftgen.emulator.real.server import ModelServerOptions, start_in_thread  # noqa: E402
from draftgen.phases.extract.batches import read_merged_rows  # noqa: E402
from draftgen.phases.extract.capture import ExtractRow  # noqa: E402
from draftgen.phases.extract.capture.vllm import VllmExtractBackend  # noqa: E402
from draftgen.phases.extract.proxy import CheckingProxy  # noqa: E402
from draftgen.rundir import RunDir  # noqa: E402


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
        }
        cfg = load_config(write_config(tmp, data, "proxy.yaml"))
        rows = sorted(read_merged_rows(RunDir(tmp / "run")), key=lambda r: len(r.input_ids))
        yield {"cfg": cfg, "rows": rows, "hs": tmp / "hs", "target": target}


def _proxy(s: dict[str, Any], window_bytes: int) -> CheckingProxy:
    cfg = s["cfg"]
    return CheckingProxy(
        VllmExtractBackend(cfg),
        cfg.hidden_states,
        s["rows"],
        model_name=str(s["target"]),
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
