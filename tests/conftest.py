"""Shared fixtures (the tokenizer assets folder, a loaded Qwen3 profile, a free port, a key file, the learned tiny
target trained once per session) and the end-of-run lines: the tests skipped for something missing on this
machine, with how to provide it, and the slow tests a plain pytest left out, with how to run them.

The assets folder is ``DRAFTGEN_TEST_ASSETS`` (default ``<checkout>/../shared/assets/tokenizers``); see
``_common_helpers``. pytest's default import mode puts this folder (``tests/``) on ``sys.path``, which is
what lets every test file, in ``tests/<package>/`` or ``tests/reliability/``, import ``_common_helpers`` and
the others, also when pytest is given one file. The folders mirroring ``src/draftgen`` have no
``__init__.py`` (a package ``tests/datasets`` on ``sys.path`` would hide HF's ``datasets``), so each test
file's name is unique across them (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _common_helpers import FAKE_KEY, SKIP_HINTS, need_assets
from _common_helpers import free_port as _free_port


@pytest.fixture(scope="session")
def tokenizer_assets() -> Path:
    """The folder holding ``qwen3/``, ``deepseek-r1/``, …; skips the test when it is not there."""
    return need_assets()


@pytest.fixture(scope="session")
def qwen3_profile():  # type: ignore[no-untyped-def]
    from draftgen.tokens import load_profile

    return load_profile("qwen3", "bundled:qwen3")


@pytest.fixture(scope="session")
def learned_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The learned tiny target of the CPU chain (``drafter.learned.build_learned_target``: about three
    CPU-minutes of training), trained once per test session and shared by every test that asks for it.
    ``DRAFTGEN_TEST_LEARNED_TARGET`` names a folder to keep it in between sessions (reused while it holds this
    recipe's target, its model file matching its recorded digest); by default a fresh temporary one."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from draftgen.drafter.learned import build_learned_target

    kept = os.environ.get("DRAFTGEN_TEST_LEARNED_TARGET")
    folder = Path(kept) if kept else tmp_path_factory.mktemp("learned-target") / "target"
    return build_learned_target(folder, echo=lambda _s: None)


@pytest.fixture()
def free_port() -> int:
    return _free_port()


@pytest.fixture()
def key_file() -> Iterator[Path]:
    """``FAKE_KEY`` in a key file kept outside pytest's temp folders: the reliability suite scans those for
    the key after the session, and a key there is a leak (tests/reliability/conftest.py)."""
    folder = Path(tempfile.mkdtemp(prefix="draftgen-keyfile-"))
    path = folder / "openrouter.key"
    path.write_text(FAKE_KEY + "\n", encoding="utf-8")
    yield path
    shutil.rmtree(folder, ignore_errors=True)


def _skip_reason(report: Any) -> str:
    """The reason of a skip report (test or collection; also after a trip through pytest-xdist)."""
    longrepr = report.longrepr
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per known cause of skips, e.g. ``draftgen: 87 tests skipped: tokenizer assets not found at
    /x (set DRAFTGEN_TEST_ASSETS ...)``, and one counting the deselected tests marked slow, e.g.
    ``draftgen: 17 slow tests deselected: the CPU training chains (...)``. ``write_line`` prints at any
    verbosity, ``-q -q`` included."""
    counts: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(report)
        for prefix in SKIP_HINTS:
            if reason.startswith(prefix):
                counts[reason] += 1
                break
    for reason, n in sorted(counts.items()):
        hint = next(h for p, h in SKIP_HINTS.items() if reason.startswith(p))
        noun = "test" if n == 1 else "tests"
        terminalreporter.write_line(f"draftgen: {n} {noun} skipped: {reason} ({hint})")
    slow = sum(1 for item in terminalreporter.stats.get("deselected", []) if item.get_closest_marker("slow"))
    if slow:
        noun = "test" if slow == 1 else "tests"
        terminalreporter.write_line(
            f"draftgen: {slow} slow {noun} deselected: the CPU training chains (a plain pytest runs -m 'not slow'; "
            f"scripts/test runs everything, as CI does; or pass -m slow for these alone, -m '' for all)")
