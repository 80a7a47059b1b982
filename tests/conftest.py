"""Shared fixtures: the shared assets folder and a loaded Qwen3 profile (bundled, offline)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "assets" / "tokenizers").is_dir():
        pytest.skip("../shared/assets/tokenizers is not present beside the checkout")
    return SHARED


@pytest.fixture(scope="session")
def tokenizer_assets(shared_dir: Path) -> Path:
    return shared_dir / "assets" / "tokenizers"


@pytest.fixture(scope="session")
def qwen3_profile():  # type: ignore[no-untyped-def]
    from draftgen.tokens import load_profile

    return load_profile("qwen3", "bundled:qwen3")


@pytest.fixture()
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
