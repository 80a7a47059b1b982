"""Issue 21 item 1: a vllm server in extract mode cannot make the client read or delete files outside the
connector folder; and the vllm capture backend's HTTP goes through the backends' layer and the one retry
policy.

A hostile server (aiohttp on loopback, the response shape of ``draftgen emulate --model --extract-dir``:
``prompt_token_ids`` echoed, top-level ``kv_transfer_params.hidden_states_path``) names a path the test
chooses. Each victim is a valid connector file with the very ids sent and an unlocked ``.lock``, so only the
path check can stop the client: a ``../`` path, an absolute path outside, a symlink inside pointing outside,
draftgen's own export file, files in the folder without the connector's naming. Each is a permanent error
naming the path, never retried, and the victim and its lock are left byte-identical. A connector file inside
the folder with wrong token ids is rejected (``ids_mismatch``) and removed with its lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
st = pytest.importorskip("safetensors.torch")

from _common_helpers import AppServer  # noqa: E402
from draftgen.errors import ConfigError, PermanentAPIError  # noqa: E402
from draftgen.hidden.format import sample_path  # noqa: E402
from draftgen.target import ExtractRow  # noqa: E402
from draftgen.target.vllm import VllmClientOptions, VllmExtractBackend  # noqa: E402

L, H, N_SLOTS = 8, 16, 4  # default aux ids [2, 4, 5] + the final id 8
IDS = [5, 6, 7, 8, 9]


class HostileServer(AppServer):
    """``/v1/models`` and ``/v1/completions``; ``name(sent_ids)`` is the hidden_states_path it answers with;
    ``faults`` are statuses the next completions get, one each, before answering properly."""

    def __init__(self, name: Callable[[list[int]], str], faults: list[int] | None = None) -> None:
        self.name = name
        self.faults = list(faults or [])
        self.completions = 0
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.completions += 1
        if self.faults:
            status = self.faults.pop(0)
            return web.json_response({"error": {"message": f"injected {status}", "code": status}}, status=status)
        sent = [int(t) for t in body["prompt"]]
        return web.json_response({
            "id": "cmpl-x", "object": "text_completion", "model": body["model"],
            "choices": [{"index": 0, "text": "a", "finish_reason": "length", "prompt_token_ids": sent,
                         "token_ids": [1]}],
            "usage": {"prompt_tokens": len(sent), "completion_tokens": 1, "total_tokens": len(sent) + 1},
            "kv_transfer_params": {"hidden_states_path": self.name(sent)}})

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.complete)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The few tensors of a target the client reads (config, final norm)."""
    d = tmp_path_factory.mktemp("target")
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": L, "hidden_size": H, "vocab_size": 32,
                                               "rms_norm_eps": 1e-6}), encoding="utf-8")
    st.save_file({"model.norm.weight": torch.ones(H)}, str(d / "model.safetensors"))
    return d


def connector_file(path: Path, ids: list[int]) -> None:
    """A file exactly as the connector writes it, with its (released) lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    st.save_file({"hidden_states": torch.randn(len(ids), N_SLOTS, H),
                  "token_ids": torch.tensor(ids, dtype=torch.int64)}, str(path))
    Path(str(path) + ".lock").write_bytes(b"")


def snapshot(*paths: Path) -> dict[str, bytes | str]:
    """Each path's bytes, or a symlink's target (the link itself, not followed)."""
    return {str(p): os.readlink(p) if p.is_symlink() else p.read_bytes() for p in paths}


def backend(target: Path, server: HostileServer, folder: Path, destination: Path | None = None) -> VllmExtractBackend:
    opts = VllmClientOptions(base_urls=(server.url,), connector_dir=str(folder), file_timeout_s=5.0,
                             base_delay_s=0.01, max_delay_s=0.05,
                             destination=str(destination) if destination is not None else None)
    return VllmExtractBackend.from_parts(target, opts)


def row() -> ExtractRow:
    return ExtractRow("s-1", np.array(IDS, dtype=np.int64), np.array([0, 0, 1, 1, 1], dtype=np.uint8))


@pytest.fixture
def place(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the connector folder, a folder beside it holding the victims)."""
    folder, outside = tmp_path / "hs", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    yield folder, outside


def _refused(target: Path, folder: Path, named: str, victims: list[Path], destination: Path | None = None) -> None:
    before = snapshot(*victims)
    with HostileServer(lambda _ids: named) as server:
        be = backend(target, server, folder, destination)
        try:
            with pytest.raises(PermanentAPIError) as ei:
                be.capture([row()])
        finally:
            be.close()
        assert server.completions == 1 and be.retries == 0  # permanent: never retried
    assert ei.value.kind == "foreign_hidden_states_path"
    assert repr(named) in str(ei.value) and "hidden_states.connector_dir" in str(ei.value)
    assert "\n" not in str(ei.value)
    assert snapshot(*victims) == before  # neither read-and-removed nor touched


def test_item01_a_dotdot_path_is_refused_and_its_file_kept(target: Path, place: tuple[Path, Path]) -> None:
    folder, _ = place
    victim = folder.parent / "outside.safetensors"
    connector_file(victim, IDS)
    _refused(target, folder, f"{folder}/../outside.safetensors", [victim, Path(f"{victim}.lock")])


def test_item01_a_bare_relative_dotdot_path_is_refused(target: Path, place: tuple[Path, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = place
    victim = folder.parent / "outside.safetensors"
    connector_file(victim, IDS)
    monkeypatch.chdir(folder)  # "../outside.safetensors" names the victim from here
    _refused(target, folder, "../outside.safetensors", [victim, Path(f"{victim}.lock")])


def test_item01_an_absolute_path_outside_is_refused(target: Path, place: tuple[Path, Path]) -> None:
    folder, outside = place
    victim = outside / "cmpl-abc-0.safetensors"
    connector_file(victim, IDS)
    _refused(target, folder, str(victim), [victim, Path(f"{victim}.lock")])


def test_item01_a_symlink_inside_pointing_outside_is_refused(target: Path, place: tuple[Path, Path]) -> None:
    folder, outside = place
    victim = outside / "precious.safetensors"
    connector_file(victim, IDS)
    link = folder / "cmpl-abc-0.safetensors"
    link.symlink_to(victim)
    lock_link = folder / "cmpl-abc-0.safetensors.lock"
    lock_link.symlink_to(f"{victim}.lock")
    _refused(target, folder, str(link), [victim, Path(f"{victim}.lock"), link, lock_link])
    assert link.is_symlink() and lock_link.is_symlink()  # not even the links were removed


def test_item01_draftgens_own_export_file_is_refused(target: Path, place: tuple[Path, Path]) -> None:
    folder, outside = place
    dest = outside / "hidden"
    export = dest / sample_path("s-1")  # states/<k[:2]>/<k>.safetensors: a name of the connector's shape
    connector_file(export, IDS)
    _refused(target, folder, str(export), [export, Path(f"{export}.lock")], destination=dest)


def test_item01_a_connector_folder_inside_the_export_destination_is_refused(
        target: Path, place: tuple[Path, Path]) -> None:
    """With the folder inside the destination, draftgen's own files would be direct entries of it."""
    _, outside = place
    dest = outside / "hidden"
    states = dest / Path(sample_path("s-1")).parent
    states.mkdir(parents=True)
    with HostileServer(lambda _ids: "x") as server, pytest.raises(ConfigError, match=r"overlaps hidden_states\.output"):
        backend(target, server, states, destination=dest)


@pytest.mark.parametrize("name", [".cmpl-abc-0.safetensors", "cmpl-abc-0.json", "sub/cmpl-abc-0.safetensors"])
def test_item01_a_file_inside_without_the_connector_naming_is_refused(
        target: Path, place: tuple[Path, Path], name: str) -> None:
    folder, _ = place
    victim = folder / name
    connector_file(victim, IDS)
    _refused(target, folder, str(victim), [victim, Path(f"{victim}.lock")])


def test_item01_a_file_inside_with_wrong_ids_is_rejected_and_removed(target: Path, place: tuple[Path, Path]) -> None:
    folder, outside = place
    keep = outside / "other.safetensors"
    connector_file(keep, IDS)
    before = snapshot(keep)
    path = folder / "cmpl-wrong-0.safetensors"

    def name(sent: list[int]) -> str:
        connector_file(path, [t + 1 for t in sent])  # the server's file holds other tokens
        return str(path)

    with HostileServer(name) as server:
        be = backend(target, server, folder)
        try:
            with pytest.raises(PermanentAPIError, match=r"sample s-1: .*cmpl-wrong-0\.safetensors holds token_ids") as ei:
                be.capture([row()])
        finally:
            be.close()
        assert server.completions == 1 and be.retries == 0
    assert ei.value.kind == "ids_mismatch"
    assert not path.exists() and not Path(f"{path}.lock").exists()  # read, rejected, removed with its lock
    assert list(folder.iterdir()) == [] and snapshot(keep) == before


def test_item01_an_accepted_file_is_read_and_removed(target: Path, place: tuple[Path, Path]) -> None:
    folder, _ = place
    path = folder / "cmpl-ok-0.safetensors"

    def name(sent: list[int]) -> str:
        connector_file(path, sent)
        return str(path)

    with HostileServer(name) as server:
        be = backend(target, server, folder)
        try:
            [got] = be.capture([row()])
        finally:
            be.close()
    assert got.sample_id == "s-1" and tuple(got.aux.shape) == (len(IDS), 3 * H) and tuple(got.final.shape) == (5, H)
    assert list(folder.iterdir()) == []


def test_item01_without_a_connector_folder_the_backend_refuses_to_start(target: Path) -> None:
    with pytest.raises(ConfigError, match=r"^hidden_states\.connector_dir: not set; .*shared_storage_path") as ei:
        VllmExtractBackend.from_parts(target, VllmClientOptions(base_urls=("http://127.0.0.1:9",)))
    assert "\n" not in str(ei.value)


# -- the shared HTTP layer and the one retry policy ----------------------------------------------------------


def test_the_capture_backend_retries_a_503_with_the_one_policy(target: Path, place: tuple[Path, Path]) -> None:
    folder, _ = place
    path = folder / "cmpl-ok-0.safetensors"

    def name(sent: list[int]) -> str:
        connector_file(path, sent)
        return str(path)

    with HostileServer(name, faults=[503]) as server:
        be = backend(target, server, folder)
        try:
            [got] = be.capture([row()])
        finally:
            be.close()
        assert server.completions == 2 and be.retries == 1 and be.requests == 2
    assert got.sample_id == "s-1" and list(folder.iterdir()) == []


def test_the_capture_backend_does_not_retry_a_400(target: Path, place: tuple[Path, Path]) -> None:
    folder, _ = place
    with HostileServer(lambda _ids: "unused", faults=[400]) as server:
        be = backend(target, server, folder)
        try:
            with pytest.raises(PermanentAPIError, match=r"HTTP 400, POST http://127\.0\.0\.1:\d+/v1/completions") as ei:
                be.capture([row()])
        finally:
            be.close()
        assert server.completions == 1 and be.retries == 0
    assert ei.value.kind == "http_400"


def test_the_capture_backend_gives_up_after_the_policys_attempts(target: Path, place: tuple[Path, Path]) -> None:
    from draftgen.errors import RetryableAPIError

    folder, _ = place
    with HostileServer(lambda _ids: "unused", faults=[503] * 6) as server:
        be = backend(target, server, folder)  # max_attempts 6 (retry.max_attempts' default)
        try:
            with pytest.raises(RetryableAPIError, match=r"sample s-1: gave up after 6 attempts: .*HTTP 503") as ei:
                be.capture([row()])
        finally:
            be.close()
        assert server.completions == 6 and be.retries == 5
    assert ei.value.kind == "http_503"

