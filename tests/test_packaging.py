"""The package's metadata builds without a deprecation banner: setuptools prints one, three times an install,
for a ``project.license`` written as a TOML table (an SPDX string instead, PEP 639). The metadata is prepared
by setuptools' own PEP 517 hook in a copy of the checkout's pyproject, README and sources."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_metadata_builds_without_a_deprecation_warning(tmp_path: Path) -> None:
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src" / "draftgen", src / "src" / "draftgen",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "meta").mkdir()
    res = subprocess.run([sys.executable, "-W", "default", "-c",
                          "import setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel('../meta'))"],
                         cwd=src, capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Deprecat" not in res.stderr, res.stderr[-2000:]
    meta = next((tmp_path / "meta").glob("*.dist-info")) / "METADATA"
    assert "License-Expression: Apache-2.0" in meta.read_text(encoding="utf-8")
