"""``python _batch_kill.py STEP DRAFTGEN-ARGS…``: runs ``draftgen DRAFTGEN-ARGS`` and SIGKILLs this process
(a real kill -9) at one step of a batch's life, for ``test_batch_kill9.py``. draftgen knows nothing of it:
this launcher wraps, in this process only, the journal's ``append``, the Batch API client's ``submit`` and
the sinks' ``flush``, then calls the CLI. STEP:

- ``prepared``: the batch's ``prepared`` line is on disk, its submission not sent;
- ``submit``: OpenRouter answered the submission (the batch exists there), its id is not journalled;
- ``status``: a status read while polling is journalled;
- ``ingest:N``: records are written in chunks of N; the first chunk of a finished batch is durable.
"""

from __future__ import annotations

import os
import signal
import sys

from draftgen.backends.openrouter_batch import BatchClient, WireBatch
from draftgen.cli import main
from draftgen.engine import batch_ingest
from draftgen.engine.batch_journal import BatchJournal
from draftgen.engine.sinks import Sinks
from draftgen.records import BatchEvent

STEPS = ("prepared", "submit", "status", "ingest")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(step: str) -> None:
    """Wrap the one function after whose return ``step`` is reached."""
    name, _, n = step.partition(":")
    if name not in STEPS:
        raise SystemExit(f"_batch_kill.py: unknown step {step!r} (one of {', '.join(STEPS)})")
    if name in ("prepared", "status"):
        append = BatchJournal.append

        def append_then_die(self: BatchJournal, ev: BatchEvent) -> None:
            append(self, ev)
            if ev.event == name:
                _die()

        BatchJournal.append = append_then_die  # type: ignore[method-assign]
    elif name == "submit":
        submit = BatchClient.submit

        async def submit_then_die(self: BatchClient, body: bytes) -> WireBatch:
            await submit(self, body)
            _die()
            raise AssertionError("unreachable")

        BatchClient.submit = submit_then_die  # type: ignore[method-assign]
    else:
        batch_ingest.CHUNK = int(n)
        flush = Sinks.flush

        async def flush_then_die(self: Sinks) -> None:
            await flush(self)
            _die()

        Sinks.flush = flush_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    arm(sys.argv[1])
    sys.argv = ["draftgen", *sys.argv[2:]]
    main()
