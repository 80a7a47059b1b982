"""The ``endpoint``, ``emulator`` and ``routing`` sections: where requests go and OpenRouter's provider routing. Pure data."""

from __future__ import annotations

from typing import Literal

import msgspec

from draftgen.config.base import Section


class EmulatorConfig(Section):
    """The embedded emulator used when ``endpoint: emulator``."""

    scenario: str = "fast"
    """fast | realistic | chaos, or a path to a scenario YAML file."""
    seed: int = 0
    """Seed of the emulated model and its faults; a fixed seed reproduces a run."""
    credits: float = 100.0
    """Starting credits of the emulated account, in USD."""
    ground_truth: bool = True
    """Write the emulator's true ids to ``<run_dir>/emulator/ground_truth.jsonl`` (for the BPE audit)."""


class BatchConfig(Section):
    """``endpoint.mode: batch``: OpenRouter's Batch API (``docs/batch.md``; ``engine.batch``)."""

    max_requests: int = 5000
    """Requests per batch, at most OpenRouter's limit of 5,000."""
    max_bytes: int = 200_000_000
    """Encoded size of one batch's submission, at most OpenRouter's limit of 200 MB."""
    max_open: int = 20
    """Batches submitted and not yet finished at once."""
    retry: Literal["sync", "batch"] = "sync"
    """Where failed items and the items of failed or expired batches go: synchronous requests after the batches, or a later batch (up to ``retry.max_attempts`` in all)."""
    poll_interval_s: float = 30.0
    """First wait before a batch's status is read again; each wait grows by half, up to ``poll_max_interval_s``."""
    poll_max_interval_s: float = 600.0
    """Longest wait between two reads of one batch's status."""
    expected_hours: float = 2.0
    """What ``plan`` assumes one batch takes (OpenRouter: most finish in minutes, all within the 24 h window)."""
    url: str | None = None
    """Batch API root; default: ``base_url`` (``https://openrouter.ai/api/v1/batches``); the beta quickstart's is ``https://openrouter.ai/api/beta``."""


class EndpointConfig(Section):
    """Where requests go."""

    kind: str = "openrouter"
    """Backend protocol, one of the kinds registered in ``draftgen.backends.BACKENDS``."""
    base_url: str | None = None
    """API root. OpenRouter: https://openrouter.ai/api/v1 (the default for kind openrouter)."""
    base_urls: list[str] = msgspec.field(default_factory=list)
    """Several API roots to load-balance across (local servers)."""
    api_key_env: str = "OPENROUTER_API_KEY"
    """Environment variable holding the API key."""
    api_key_file: str | None = None
    """File holding only the API key (overrides the environment variable)."""
    management_key_env: str | None = None
    """Environment variable holding a management key, to reconcile spend with /credits."""
    stream: bool = True
    """Stream responses (SSE); long reasoning streams are then bounded by the idle timeout only."""
    connect_timeout_s: float = 30.0
    """Seconds to establish a connection."""
    idle_timeout_s: float = 180.0
    """A request with no data for this long is a retryable timeout (keep-alive comments do not count as data)."""
    request_timeout_s: float | None = None
    """Total deadline of one request; default: ``connect_timeout_s + idle_timeout_s + max_tokens / slow_tokens_per_s``."""
    slow_tokens_per_s: float = 5.0
    """The slowest generation rate still considered alive; sets the default ``request_timeout_s``."""
    max_body_bytes: int | None = None
    """Largest response body accepted; default: derived from ``max_tokens`` (a larger body is invalid and retried)."""
    emulator: EmulatorConfig = msgspec.field(default_factory=EmulatorConfig)
    mode: Literal["sync", "batch"] = "sync"
    """``sync``: one request per sample, answers in minutes; ``batch``: OpenRouter's Batch API, about half the price, answers within 24 h (``endpoint.batch``; ``docs/batch.md``)."""
    service_tier: Literal["default", "flex", "priority", "fast"] | None = None
    """OpenRouter's ``service_tier`` sent with every synchronous request: ``flex`` (cheaper, slower, only flex endpoints), ``priority``/``fast`` (faster, dearer); the tier served is recorded per record. Not with ``mode: batch``."""
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)


#: the quantizations OpenRouter's ``provider.quantizations`` accepts
Quantization = Literal["int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32",
                       "unknown"]


class RoutingConfig(Section):
    """OpenRouter's ``provider`` object, sent as is (omitted fields are not sent)."""

    order: list[str] | None = None
    """Providers to try first, in this order (routing slugs such as ``siliconflow/int4``)."""
    only: list[str] | None = None
    """Allow-list of providers; a base slug (``deepinfra``) also matches its variants."""
    ignore: list[str] | None = None
    """Providers never to use (the reference run ignored the NVFP4/FP4 ones)."""
    sort: Literal["price", "throughput", "latency"] | None = None
    """``price``, ``throughput`` or ``latency``."""
    allow_fallbacks: bool | None = None
    """Whether OpenRouter may fall back to other providers (default true upstream)."""
    quantizations: list[Quantization] | None = None
    """Allowed quantizations, e.g. ``[int4, int8, fp8, fp16, bf16]`` (keeps out FP4/NVFP4 hosts, and any new
    ``*/fp4`` one, and hosts that do not say: ``unknown``): int4, int8, fp4, mxfp4, nvfp4, fp6, fp8, mxfp8,
    fp16, bf16, fp32, unknown."""
    require_parameters: bool | None = None
    """Route only to providers supporting every parameter sent (e.g. logprobs)."""
    data_collection: Literal["allow", "deny"] | None = None
    """``allow`` or ``deny``."""
    max_price: dict[Literal["prompt", "completion", "request", "image"], float | str] | None = None
    """Price ceilings in USD per million tokens: ``{prompt: 0.6, completion: 2.5}`` (numbers or numeric strings, as OpenRouter's spec types them)."""
