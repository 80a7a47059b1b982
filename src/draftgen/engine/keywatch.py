"""The API key's limit, followed during a run: ``GET /key`` again every ``budget.key_recheck_s``.

Reads the key through the backend (``Backend.get_key_info``) and writes nothing but the budget's account
cap (``BudgetGovernor.session_cap``) and a log line when the limit changed. The cap on this session's
spend becomes what the session has spent plus the key's ``limit_remaining`` now (and never more than the
credits cap read at start): a limit lowered mid-run is followed at once, so no request is admitted past
it, and when nothing is left the run stops with a message naming the key's limit (never ``$None``). A
read that fails is logged and the last cap kept; the server refuses requests past the key's limit
anyway (402).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from draftgen.backends.base import Backend, KeyInfo
from draftgen.engine.budget import BudgetGovernor
from draftgen.engine.progress import RunLog
from draftgen.errors import APIError

__all__ = ["key_limit_label", "watch_key"]


def key_limit_label(key: KeyInfo) -> str:
    """How messages name the key's cap: ``the API key's limit ($5.00)``."""
    return f"the API key's limit (${key.limit:.2f})" if key.limit is not None else "the API key's limit"


async def watch_key(backend: Backend, governor: BudgetGovernor, *, interval_s: float, credits_cap: float | None,
                    log: RunLog, stop: Callable[[str], None]) -> None:
    """Reread the key every ``interval_s`` until cancelled (see the module docstring); ``stop(message)``
    stops the run once the key's limit leaves nothing."""
    last: float | None = None
    while True:
        await asyncio.sleep(interval_s)
        try:
            key = await backend.get_key_info()
        except APIError as exc:
            log.write(f"GET /key during the run failed: {exc}; keeping the last limit")
            continue
        if key is None or key.limit_remaining is None or not math.isfinite(key.limit_remaining):
            continue
        remaining = key.limit_remaining
        cap = governor.session + max(remaining, 0.0)
        if credits_cap is not None:
            cap = min(cap, credits_cap)
        if last is not None and abs(remaining - last) > 1e-9:
            log.write(f"key: limit remaining now ${remaining:.4f} (limit "
                      f"{'none' if key.limit is None else f'${key.limit:.4f}'}); this run may spend up to "
                      f"${cap - governor.session:.4f} more")
        last = remaining
        governor.session_cap = cap
        governor.session_cap_source = key_limit_label(key)
        if remaining <= 0 or cap - governor.session <= 0:
            stop(f"{key_limit_label(key)} is reached: ${remaining:.4f} remaining (GET /key, read during the run); "
                 "raise the key's limit or use another key, then rerun to resume")
            return
