"""What every test file shares: where the tokenizer assets are, why a test was skipped, one free port,
one fake API key, and one config factory. Importable from every test folder (``tests/<package>/``,
``tests/reliability/``, ...) as ``from _common_helpers import ...`` (pytest puts ``tests/`` on ``sys.path``,
see ``conftest``).

Tokenizer assets: ``DRAFTGEN_TEST_ASSETS`` names the folder holding ``qwen3/``, ``deepseek-r1/``, … ;
unset, it is ``<checkout>/../shared/assets/tokenizers``. Tests that need it skip with
``ASSETS_MISSING`` (and the browser test with ``BROWSER_MISSING``); ``conftest`` counts those skips at
the end of the run, so every skip reason here must stay recognisable by its prefix.

Config factory: ``config_dict`` (a plain mapping with the house defaults), ``write_config`` (YAML on
disk), ``load`` (the ``RunConfig``). The other ``make_config``/``base_config`` helpers are thin
wrappers over these. Writes only the files it is asked to.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import pytest
import yaml

from draftgen.config import RunConfig, load_config

CHECKOUT = Path(__file__).resolve().parents[1]

# -- tokenizer assets and the skip reasons the summary counts ------------------------------------------

ASSETS_ENV = "DRAFTGEN_TEST_ASSETS"
ASSETS = Path(os.environ.get(ASSETS_ENV) or CHECKOUT.parent / "shared" / "assets" / "tokenizers").resolve()
ASSETS_MISSING = f"tokenizer assets not found at {ASSETS}"
ASSETS_HINT = f"set {ASSETS_ENV} to the folder holding qwen3/, deepseek-r1/, glm-4.5/, gpt-oss/, kimi-k2.5/, ..."

BROWSER_MISSING = "Chromium not found"
BROWSER_HINT = "install Debian's chromium: apt-get install -y chromium; scripts/test does it as root"

# prefix of a skip reason -> how to provide what was missing (tests/conftest.py prints one line each)
SKIP_HINTS: dict[str, str] = {ASSETS_MISSING: ASSETS_HINT, BROWSER_MISSING: BROWSER_HINT}


def have_assets() -> bool:
    return (ASSETS / "qwen3").is_dir()


def need_assets() -> Path:
    """The tokenizer assets folder, or skip the calling test with the one recognisable reason."""
    if not have_assets():
        pytest.skip(ASSETS_MISSING)
    return ASSETS


# -- ports and keys ---------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The fake OpenRouter key: the right shape (so redaction and key checks treat it as a key) and recognisable
# in a scan of files (tests/reliability/conftest.py scans pytest's temp folders for it). Tests of key
# detection itself keep their own specific shapes.
FAKE_KEY = "sk-or-v1-" + "S3CR3T" * 8

# -- configs ------------------------------------------------------------------------------------------------

DEFAULT_MODEL: dict[str, Any] = {"id": "qwen/qwen3-8b", "profile": "qwen3", "tokenizer": "bundled:qwen3"}


def dataset_specs(datasets: Sequence[str | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A name becomes ``{"name": n, "path": "n.jsonl"}``; a mapping is taken as it is."""
    return [{"name": d, "path": f"{d}.jsonl"} if isinstance(d, str) else dict(d) for d in datasets]


def config_dict(tmp: Path, datasets: Sequence[str | Mapping[str, Any]] = ("chat",), *,
                replace: bool = False, **sections: Any) -> dict[str, Any]:
    """A config mapping over ``tmp``: run directory ``tmp/run``, the embedded emulator, bundled Qwen3.

    ``sections`` override top-level keys. A mapping given for a key whose default is a mapping is merged
    into it one level deep (``endpoint={"base_url": u}`` keeps the other endpoint keys), unless
    ``replace`` is true, when every section replaces its default whole.
    """
    data: dict[str, Any] = {
        "run_dir": str(tmp / "run"),
        "model": dict(DEFAULT_MODEL),
        "endpoint": "emulator",
        "datasets": dataset_specs(datasets),
    }
    for key, value in sections.items():
        base = data.get(key)
        if not replace and isinstance(value, Mapping) and isinstance(base, dict):
            data[key] = {**base, **value}
        else:
            data[key] = value
    return data


def write_config(folder: Path, data: Mapping[str, Any], name: str = "cfg.yaml") -> Path:
    """``data`` as YAML in ``folder/name`` (key order kept); returns the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def load(path: Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The ``RunConfig`` of a config file, as the CLI loads it (relative paths from the file's folder)."""
    return load_config(path, dict(overrides) if overrides else None)


@contextlib.contextmanager
def moto_s3(log_dir: Path, bucket: str, secret: str = "testing") -> Iterator[str]:
    """A real moto S3 server subprocess on a free loopback port with ``bucket`` made (boto3), the AWS_*
    variables set to test credentials (``secret`` as the secret key) while it runs; yields its URL."""
    import subprocess
    import sys
    import time

    port = free_port()
    with open(log_dir / "moto.log", "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY=secret, AWS_DEFAULT_REGION="us-east-1")
    try:
        import boto3

        end = time.monotonic() + 60
        while True:
            try:
                boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
                break
            except Exception:
                if time.monotonic() > end or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class AppServer:
    """A fake HTTP server of a test on a free loopback port, served in a thread by draftgen's own harness
    (``backends.serve.start_in_thread``, the emulator's and the online proxy's): a subclass defines ``routes(app)``; ``with Sub() as srv: srv.port``."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: Any = None

    def routes(self, app: Any) -> None:
        raise NotImplementedError

    def _app(self) -> Any:
        from aiohttp import web

        app = web.Application()
        self.routes(app)
        return app

    def __enter__(self) -> Self:
        from draftgen.backends.serve import ThreadedServer, start_in_thread

        serving = start_in_thread(self._app, "127.0.0.1", self.port, close=lambda: None, what="test server",
                                  thread_name=type(self).__name__)
        self._server = ThreadedServer(serving, "127.0.0.1")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
