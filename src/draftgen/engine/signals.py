"""SIGINT/SIGTERM handlers on the running asyncio loop, for the generate runners (sync and batch).

``install_signal_handlers(on_signal)`` calls ``on_signal(name)`` ("SIGINT", "SIGTERM") from the loop and
returns the function that removes them. A loop that cannot take signal handlers (not the main thread, a
platform without them) gets none: Python's default Ctrl-C then applies. Reads and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

__all__ = ["install_signal_handlers"]


def install_signal_handlers(on_signal: Callable[[str], None]) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig.name)
        except (NotImplementedError, RuntimeError, ValueError):  # no handlers here: the default Ctrl-C applies
            continue
        installed.append(sig)

    def uninstall() -> None:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)

    return uninstall
