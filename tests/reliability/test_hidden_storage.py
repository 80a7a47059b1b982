"""The hidden-state storage boundary (issue 21, items 12 and 14): credentials in the config refused without
being echoed, and storage faults as one line naming the path or URL and the fix, never "a bug in draftgen".

Item 12: ``hidden_states.storage_options`` credentials (also nested) and ``user:password@`` in any storage
URL are refused at config load (``draftgen extract`` run as a real subprocess, and in-process), and by
``HiddenStore`` for a URL given on the command line (``export-hidden --hidden``).

Item 14: a truncated stored state (export-hidden), a truncated connector file (the vllm backend's reader,
and a whole ``draftgen extract`` against a fake vLLM server on loopback that serves one), a
truncated checkpoint / torch file (``read_safetensors`` / ``read_torch``), a full disk during export-hidden
(every format; the disk is simulated as tests/reliability/test_full_disk.py does: the file handle of the
one atomic writer, ``atomic_write_bytes``, is wrapped so that writes fail with ENOSPC once a byte budget is
spent), and on S3 (a real moto server on loopback, as tests/integration/test_extract_s3.py): the endpoint stopping
mid-extract, an unknown AWS_PROFILE, a missing bucket.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from _common_helpers import AppServer, config_dict, free_port, write_config
from _extract_helpers import build_tiny_model, make_merged_run, with_hidden
from _hidden_export_helpers import make_hidden_set
from draftgen.cli import cli
from draftgen.errors import ConfigError, InputError, StorageError

SECRET = "draftgen-storage-secret-9f8e7d6c5b4a"
AK = "AKIAIOSFODNN7EXAMPLE"


def _one_error_line(res: Any, code: int, *needles: str) -> str:
    """The CLI failed with ``code`` and exactly one ``Error:`` line holding every needle; no traceback, no
    "bug in draftgen", and the secret nowhere. Returns that line."""
    if isinstance(res, subprocess.CompletedProcess):
        out, got = res.stdout + res.stderr, res.returncode
    else:  # click's Result: output holds stdout and stderr
        out, got = res.output, res.exit_code
    assert got == code, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, out[-3000:]
    assert "Traceback" not in out and "bug in draftgen" not in out and "unexpected" not in lines[0], out[-3000:]
    assert SECRET not in out and AK not in out
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(cli, args, catch_exceptions=True)


# -- a small world: a tiny target, a hidden set, a merged run --------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hs")
    model = build_tiny_model(root / "target", layers=8, hidden=32)
    hidden, _rows = make_hidden_set(model, root / "hidden", n=4)
    run_cfg = make_merged_run(root / "r", n_chat=2, n_code=1, max_tokens=16, model=str(model),
                              teacher_fraction=0.0, teacher_min_margin=None)
    return {"model": model, "hidden": hidden, "run_cfg": run_cfg, "root": root}


def _cfg(tmp: Path, **hidden_states: Any) -> Path:
    return write_config(tmp, config_dict(tmp, hidden_states=hidden_states))


# -- item 12: credentials in the config ------------------------------------------------------------------------


def test_item12_secret_in_storage_options_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, output="s3://bucket/x", storage_options={"key": AK, "secret": SECRET})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    res = subprocess.run([sys.executable, "-m", "draftgen.cli", "extract", str(cfg)], capture_output=True, text=True,
                         env=env, timeout=300)
    _one_error_line(res, 2, "hidden_states.storage_options.key is a credential", "AWS_ACCESS_KEY_ID", "AWS_PROFILE")
    assert not (tmp_path / "run").exists(), "refused before anything is written"


@pytest.mark.parametrize("options, path", [
    ({"client_kwargs": {"aws_secret_access_key": SECRET}}, "storage_options.client_kwargs.aws_secret_access_key"),
    ({"aws_access_key_id": AK}, "storage_options.aws_access_key_id"),
    ({"token": SECRET}, "storage_options.token"),
    ({"config_kwargs": {"x": [{"aws_session_token": SECRET}]}}, "storage_options.config_kwargs.x[0].aws_session_token"),
    ({"password": SECRET}, "storage_options.password"),
])
def test_item12_nested_and_named_credentials_refused(tmp_path: Path, options: dict[str, Any], path: str) -> None:
    cfg = _cfg(tmp_path, output="s3://bucket/x", storage_options=options)
    _one_error_line(_invoke(["extract", str(cfg)]), 2, f"hidden_states.{path} is a credential")


def test_item12_userinfo_in_endpoint_url_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, output="s3://bucket/x",
               storage_options={"endpoint_url": f"http://{AK}:{SECRET}@127.0.0.1:9000"})
    _one_error_line(_invoke(["extract", str(cfg)]), 2,
                    "hidden_states.storage_options.endpoint_url holds a user:password@ part", "http://host:9000")


def test_item12_userinfo_in_output_and_train_hidden_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, output=f"s3://{AK}:{SECRET}@bucket/x")
    _one_error_line(_invoke(["extract", str(cfg)]), 2, "hidden_states.output holds a user:password@ part")
    data = config_dict(tmp_path, train={"hidden": f"s3://{AK}:{SECRET}@bucket/x"})
    cfg2 = write_config(tmp_path, data, "cfg-train.yaml")
    _one_error_line(_invoke(["train", str(cfg2)]), 2, "train.hidden holds a user:password@ part")


def test_item12_url_on_the_command_line_refused(world: dict[str, Path], tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, model=str(world["model"]))
    res = _invoke(["export-hidden", str(cfg), "--format", "modelopt", "--hidden", f"s3://{AK}:{SECRET}@bucket/x",
                   "--out", str(tmp_path / "out")])
    _one_error_line(res, 2, "the hidden-state URL holds a user:password@ part")


def test_item12_plain_storage_options_accepted(tmp_path: Path) -> None:
    from draftgen.config import load_config

    opts = {"endpoint_url": "http://127.0.0.1:9000", "client_kwargs": {"region_name": "us-east-1"},
            "config_kwargs": {"signature_version": "s3v4"}, "sse_kms_key_id": "alias/mine", "anon": False}
    cfg = load_config(_cfg(tmp_path, output="s3://bucket/x", storage_options=opts))
    assert cfg.hidden_states.storage_options == opts


# -- item 14: truncated files ----------------------------------------------------------------------------------


def test_item14_truncated_state_named(world: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    hidden = tmp_path / "hidden"
    shutil.copytree(world["hidden"], hidden)
    victim = sorted(hidden.rglob("*.safetensors"))[1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    cfg = _cfg(tmp_path, model=str(world["model"]), output=str(hidden))
    res = _invoke(["export-hidden", str(cfg), "--format", "modelopt", "--out", str(tmp_path / "out")])
    _one_error_line(res, 1, str(victim), "truncated or corrupt", "rerun")


def test_item14_truncated_connector_file_named(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save

    from draftgen.target.vllm import read_connector_file

    data = save({"hidden_states": torch.zeros(6, 4, 8), "token_ids": torch.arange(6)})
    path = tmp_path / "req-1.safetensors"
    path.write_bytes(data[: len(data) - 40])
    with pytest.raises(StorageError) as info:
        read_connector_file(str(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}: cannot read the connector's safetensors file (") and "\n" not in msg
    assert "use_synchronization_lock" in msg


class _CutShort(AppServer):
    """A vLLM server in extract mode (the response shape of ``draftgen emulate --model --extract-dir``) whose
    connector file for each request is cut short: written with its released lock, but missing its tail."""

    def __init__(self, folder: Path, hidden: int, slots: int) -> None:
        self.folder, self.hidden, self.slots = folder, hidden, slots
        self.files: list[Path] = []
        super().__init__()

    async def models(self, _request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def complete(self, request: Any) -> Any:
        import torch
        from aiohttp import web
        from safetensors.torch import save

        sent = [int(t) for t in (await request.json())["prompt"]]
        path = self.folder / f"cmpl-{len(self.files)}-0.safetensors"
        data = save({"hidden_states": torch.zeros(len(sent), self.slots, self.hidden),
                     "token_ids": torch.tensor(sent, dtype=torch.int64)})
        path.write_bytes(data[: len(data) // 2])
        Path(f"{path}.lock").write_bytes(b"")
        self.files.append(path)
        return web.json_response({"id": "cmpl-x", "object": "text_completion", "model": "tiny",
                                  "choices": [{"index": 0, "text": "a", "finish_reason": "length",
                                               "prompt_token_ids": sent, "token_ids": [1]}],
                                  "kv_transfer_params": {"hidden_states_path": str(path)}})

    def routes(self, app: Any) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.complete)


def test_item14_truncated_connector_file_in_a_vllm_extract_named(world: dict[str, Path], tmp_path: Path) -> None:
    """``draftgen extract`` with ``hidden_states.backend: vllm`` against a server whose connector file is
    truncated: one line naming that file and the fix, a non-zero exit, no traceback; nothing is stored (no
    state, index part or manifest), and the file and its lock are removed: named to draftgen's request, it is
    draftgen's to remove, readable or not (issue 31)."""
    folder = tmp_path / "connector"
    folder.mkdir()
    out = tmp_path / "hidden"
    with _CutShort(folder, hidden=32, slots=4) as server:  # the tiny target: hidden 32, aux [2, 4, 5] + final 8
        cfg = with_hidden(world["run_cfg"], "cfg-vllm-cut.yaml", backend="vllm", model=str(world["model"]),
                          base_urls=[f"http://127.0.0.1:{server.port}"], connector_dir=str(folder), output=str(out),
                          concurrency=1)
        before = {p: p.read_bytes() for p in folder.iterdir()}
        res = _invoke(["extract", str(cfg)])
    assert server.files and not before
    named = [p for p in server.files if str(p) in res.output]
    _one_error_line(res, StorageError.exit_code, "cannot read the connector's safetensors file",
                    "use_synchronization_lock", "rerun")
    assert len(named) == 1, res.output
    assert not (out / "manifest.json").exists() and not list(out.glob("states/**/*.safetensors"))
    assert not list(out.glob("index/*"))
    assert not list(folder.iterdir())


def test_item14_truncated_checkpoint_named(tmp_path: Path) -> None:
    import io

    import torch
    from safetensors.torch import save

    from draftgen.hidden.format import read_safetensors, read_torch

    ckpt = tmp_path / "epoch_1" / "model.safetensors"
    ckpt.parent.mkdir()
    data = save({"w": torch.ones(64, 64)})
    ckpt.write_bytes(data[: len(data) // 3])
    with pytest.raises(InputError, match=r"model\.safetensors: unreadable \(.*\): truncated or corrupt") as a:
        read_safetensors(ckpt)
    buf = io.BytesIO()
    torch.save({1: 2}, buf)
    freq = tmp_path / "token_freq.pt"
    freq.write_bytes(buf.getvalue()[:30])
    with pytest.raises(InputError, match=r"token_freq\.pt: unreadable torch file") as b:
        read_torch(freq)
    with pytest.raises(InputError, match=r"missing\.safetensors: not found"):
        read_safetensors(tmp_path / "missing.safetensors")
    for e in (a.value, b.value):
        assert str(e).startswith(str(tmp_path)) and "\n" not in str(e)


# -- item 14: a full disk in export-hidden ---------------------------------------------------------------------


class _FullDiskFile:
    """A file handle on a disk with ``left[0]`` bytes free: a short write, then ENOSPC (as a real disk)."""

    def __init__(self, real: Any, left: list[int]) -> None:
        self._real, self._left = real, left

    def write(self, data: Any) -> int:
        n = min(len(data), self._left[0])
        self._left[0] -= n
        if n < len(data):
            if n:
                self._real.write(bytes(data[:n]))
            raise OSError(errno.ENOSPC, "No space left on device")
        written: int = self._real.write(data)
        return written

    def __enter__(self) -> _FullDiskFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.parametrize("kind", ["speculators", "specforge", "modelopt"])
def test_item14_disk_full_in_export_hidden_named(world: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    out = tmp_path / "out"
    cfg = _cfg(tmp_path, model=str(world["model"]), output=str(world["hidden"]))
    real_fdopen = os.fdopen
    left = [20_000]  # room for about one sample file

    def fdopen(fd: int, *a: Any, **kw: Any) -> Any:
        fh = real_fdopen(fd, *a, **kw)
        return _FullDiskFile(fh, left) if str(out) in os.readlink(f"/proc/self/fd/{fd}") else fh

    monkeypatch.setattr(os, "fdopen", fdopen)
    res = _invoke(["export-hidden", str(cfg), "--format", kind, "--out", str(out)])
    monkeypatch.undo()
    line = _one_error_line(res, 1, "disk full (no space left on device)", "rerun")
    assert line.startswith(f"Error: {out}/"), line
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], "a temp file was left behind"
    assert not (out / "export.json").exists()


# -- item 14: S3 faults (a real moto server) -------------------------------------------------------------------


def _moto(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    import boto3

    port = free_port()
    with open(tmp / f"moto-{port}.log", "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while True:
        try:
            boto3.client("s3", endpoint_url=url).create_bucket(Bucket="hidden")
            return proc, url
        except Exception:
            if time.monotonic() > end or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)


@pytest.fixture()
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Credentials from the AWS_* variables only (empty config files), no s3fs instance kept between tests."""
    import s3fs

    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    (tmp_path / "aws-empty").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-empty"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-empty"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture()
def moto(aws: None, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    proc, url = _moto(tmp_path)
    try:
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_item14_s3_endpoint_stops_mid_extract(world: dict[str, Path], moto: tuple[Any, str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from draftgen.hidden.format import HiddenStore

    proc, url = moto
    cfg = with_hidden(world["run_cfg"], "cfg-stop.yaml", output="s3://hidden/stop", batch_tokens=1,
                      storage_options={"endpoint_url": url})
    real_write = HiddenStore.write_index_part

    def write(self: HiddenStore, records: Any) -> str:  # a batch (one sample) listed: then the endpoint goes away
        rel = real_write(self, records)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        return rel

    monkeypatch.setattr(HiddenStore, "write_index_part", write)
    res = _invoke(["extract", str(cfg)])
    _one_error_line(res, 1, "s3://hidden/stop/", "the storage endpoint cannot be reached",
                    "storage_options.endpoint_url", "rerun")


def test_item14_unknown_aws_profile_named(world: dict[str, Path], moto: tuple[Any, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _proc, url = moto
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    cfg = with_hidden(world["run_cfg"], "cfg-prof.yaml", output="s3://hidden/prof",
                      storage_options={"endpoint_url": url})
    _one_error_line(_invoke(["extract", str(cfg)]), 2, "s3://hidden/prof", "AWS_PROFILE 'no-such-profile' is not a "
                    "profile", "unset it")


def test_item14_missing_bucket_named(world: dict[str, Path], moto: tuple[Any, str]) -> None:
    _proc, url = moto
    cfg = with_hidden(world["run_cfg"], "cfg-nob.yaml", output="s3://no-such-bucket/x",
                      storage_options={"endpoint_url": url})
    line = _one_error_line(_invoke(["extract", str(cfg)]), 2, "s3://no-such-bucket/x",
                           "bucket 'no-such-bucket' does not exist", "hidden_states.output")
    assert "FileNotFoundError" not in line
    res = _invoke(["export-hidden", str(cfg), "--format", "modelopt", "--out", str(world["root"] / "nob")])
    _one_error_line(res, 2, "bucket 'no-such-bucket' does not exist")


def test_item14_credentials_in_endpoint_url_refused_by_the_store(aws: None) -> None:
    from draftgen.hidden.format import HiddenStore

    with pytest.raises(ConfigError) as info:
        HiddenStore("s3://hidden/x", {"endpoint_url": f"http://{AK}:{SECRET}@127.0.0.1:9/"})
    msg = str(info.value)
    assert msg.startswith("storage_options.endpoint_url holds a user:password@ part;") and "AWS_PROFILE" in msg
    assert SECRET not in msg and AK not in msg
