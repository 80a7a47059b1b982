"""Reliability-suite fixtures: after the session, no file under pytest's temp folders holds a suite key.

Every run of the suite uses ``_helpers.FAKE_KEY`` (or ``OTHER_FAKE_KEY``), passed only through the
environment or key files kept outside pytest's temp folders. Run directories, logs, reports and the
emulator's logs all live under the temp folders, so this scan covers them all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._helpers import files_holding


@pytest.fixture(scope="session", autouse=True)
def no_key_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    hits = files_holding(tmp_path_factory.getbasetemp())
    assert not hits, "an API key was written to disk:\n" + "\n".join(hits[:20])
