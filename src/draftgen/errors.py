"""The one error root of draftgen and its tree.

Every failure that reaches a user is a ``DraftgenError``; the CLI prints its message on one line and exits
non-zero. Messages are built by the raiser and say what failed, where (file, line, field) and what to do.
Messages never contain an API key: backends pass keys only in headers, never into exception text.

    DraftgenError
    ├── ConfigError                 bad YAML, unknown key, bad value, bad flag, unregistered name
    ├── InputError                  malformed prompt/record file (file:line)
    ├── TokenizerError              missing/wrong tokenizer file, sha256 mismatch
    ├── RunDirError                 run directory written by another config, unreadable state
    ├── StorageError                disk full / write failure (nothing written is corrupted)
    ├── BudgetExhausted             dollar or token budget cannot cover the next request
    ├── ThresholdBroken             audit threshold failed (exit code 3)
    └── APIError                    a request to a backend failed
        ├── RetryableAPIError       429, 5xx, timeouts, resets, empty 200s, mid-stream errors
        │   └── RateLimited         429 / in-flight-budget 402: also shrinks concurrency
        └── PermanentAPIError       400/401/403/404, context too long: becomes a failure record
            ├── AuthError           401: the key is wrong
            └── PaymentRequired     402 for lack of credits: stop scheduling

Foreign exceptions (aiohttp, JSON, tokenizers, storage) are translated in one place each: HTTP errors
(statuses, error envelopes, aiohttp/asyncio/OS exceptions) in ``backends.errors``, chat response bodies in
``backends.wire``, JSON files in ``store``, tokenizer loading in ``tokens.loader``, hidden-state storage
(fsspec/s3fs/botocore, a full disk, truncated safetensors/torch files) in ``hidden.files`` (``storage_faults``).

Exit codes are the CLI's contract: ``EXIT_CODES`` below, rendered into docs/cli.md.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_FAILURES",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_THRESHOLD",
    "EXIT_USAGE",
    "APIError",
    "AuthError",
    "BudgetExhausted",
    "ConfigError",
    "DraftgenError",
    "InputError",
    "PaymentRequired",
    "PermanentAPIError",
    "RateLimited",
    "RetryableAPIError",
    "RunDirError",
    "StorageError",
    "ThresholdBroken",
    "TokenizerError",
]


EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_THRESHOLD = 3
EXIT_FAILURES = 4
EXIT_INTERRUPTED = 130

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "all done"),
    (EXIT_ERROR, "error: the one line on stderr says what and where (a failed request, a bad file, a run "
                 "directory that is not draftgen's or is held by another command)"),
    (EXIT_USAGE, "usage or config error: a bad flag, key or value"),
    (EXIT_THRESHOLD, "an audit threshold was broken (`audit`, and `run`, which then skips merge; a mostly "
                     "excluded run is one), or `merge` would keep no row (an empty dataset is never a success), "
                     "or `train` would publish a drafter that trained on fewer samples than "
                     "`train.min_trained_fraction` (nothing is published)"),
    (EXIT_FAILURES, "finished with failures: some samples failed (raw/<dataset>/failures.jsonl says why; a rerun "
                    "retries them). `run` merges what is done, or stops before merge when nothing is usable"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM): completed work is on disk and the next run resumes"),
)


class DraftgenError(Exception):
    """Root of every error draftgen raises on purpose. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class ConfigError(DraftgenError):
    """The run configuration (file or flags) is invalid."""

    exit_code = 2


class InputError(DraftgenError):
    """An input file is malformed; the message names file:line and what is wrong."""


class TokenizerError(DraftgenError):
    """A tokenizer or profile could not be loaded, or does not match what was declared."""


class RunDirError(DraftgenError):
    """The run directory cannot be used as it is (other config, unreadable state)."""


class StorageError(DraftgenError):
    """Writing to disk failed (for example ENOSPC). Completed lines on disk stay valid."""


class BudgetExhausted(DraftgenError):
    """What remains of a budget cannot cover the next request."""


class ThresholdBroken(DraftgenError):
    """An audit threshold configured by the user was broken."""

    exit_code = 3


class APIError(DraftgenError):
    """A backend request failed. ``kind`` is a short stable label used in failure records and stats."""

    def __init__(
        self,
        message: str,
        *,
        kind: str = "api_error",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after


class RetryableAPIError(APIError):
    """Worth another attempt after a backoff."""


class RateLimited(RetryableAPIError):
    """Throttled: back off and shrink concurrency."""


class PermanentAPIError(APIError):
    """Retrying the same request cannot succeed."""


class AuthError(PermanentAPIError):
    """The API key was rejected."""


class PaymentRequired(PermanentAPIError):
    """Out of credits or over the key limit: stop scheduling new requests."""
