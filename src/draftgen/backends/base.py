"""Typed requests, completions and account data shared by every backend, and the backend protocol.

A backend turns one ``CompletionRequest`` into one ``Completion`` or raises an ``errors.APIError``
subclass (classified in ``backends.errors``). Everything constant for a run (model, routing, reasoning,
sampling) is fixed when the backend is opened; a request carries only what differs per sample.

Nothing here does I/O. The structs are plain msgspec Structs so they cost little to build at thousands
of requests per second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import msgspec

from draftgen.records import Message, ResponseFields, Tool, Usage

if TYPE_CHECKING:
    import aiohttp

    from draftgen.backends.http import Bounds, HttpBackend
    from draftgen.config import RunConfig

__all__ = [
    "Backend",
    "BackendKind",
    "Billing",
    "Capabilities",
    "Completion",
    "CompletionRequest",
    "Credits",
    "EndpointInfo",
    "EndpointPricing",
    "GenerationCost",
    "KeyInfo",
    "LogprobToken",
    "SpecDecodeMetrics",
    "WireMeter",
    "reasoning_body",
    "sampling_body",
    "token_limit",
]


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend kind can do; callers decide behaviour from these, never from a backend's name.

    ``exact_ids``: the server returns the generated token ids. ``needs_prompt_ids``: requests must carry
    ``CompletionRequest.prompt_ids`` (a token-level API). ``output_is_raw_ids``: the reasoning/content text
    is absent or untrusted and must be parsed from the output ids by the model profile. ``logprobs``: the
    protocol can return per-token logprobs. ``account``: ``GET /key`` and ``/credits`` (a key with money on
    it). ``prices``: a model's provider endpoints with prices. ``hidden_states``: the server can return
    hidden states. ``requires_key``: no request without an API key; ``placeholder_key``: the key sent when
    none is configured. ``default_url``: the base URL when none is configured. ``attribution_headers``:
    send the app's ``HTTP-Referer``/``X-Title``. ``self_hosted``: a server of one's own; requests cost
    nothing. ``embedded_server``: with no base URL configured, draftgen starts the offline emulator in
    process and points the backend at it (``emulator.embedded``). ``play_money``: its prices and charges
    are an emulator's play credits, never real money (``run`` does not ask before spending them).
    ``acceptance``: where a speculative-decoding server reports its drafter's acceptance: ``metrics``
    (vLLM's Prometheus ``/metrics`` counters) or ``meta_info`` (SGLang's per-request ``meta_info``).
    ``batch_api``: OpenRouter's Batch API (``endpoint.mode: batch``, ``backends.openrouter_batch``) and
    its ``service_tier``.
    """

    exact_ids: bool = False
    needs_prompt_ids: bool = False
    output_is_raw_ids: bool = False
    logprobs: bool = False
    account: bool = False
    prices: bool = False
    hidden_states: bool = False
    requires_key: bool = False
    placeholder_key: str | None = None
    default_url: str | None = None
    attribution_headers: bool = False
    self_hosted: bool = False
    embedded_server: bool = False
    play_money: bool = False
    acceptance: Literal["metrics", "meta_info"] | None = None
    batch_api: bool = False


#: ``factory(cfg, session, base_url, bounds)``: one backend bound to one base URL and its pool.
BackendFactory = Callable[["RunConfig", "aiohttp.ClientSession", str, "Bounds"], "HttpBackend"]


class BackendKind(msgspec.Struct, frozen=True):
    """One ``endpoint.kind``: its capabilities and how to build a backend for it (registered in
    ``backends.BACKENDS``, whose ``doc`` of each kind ``docs/config.md`` lists)."""

    capabilities: Capabilities
    factory: BackendFactory


def sampling_body(cfg: RunConfig) -> dict[str, Any]:
    """The run's sampling fields as plain data, as a request body carries them."""
    out: dict[str, Any] = msgspec.to_builtins(cfg.sampling)
    return out


def reasoning_body(cfg: RunConfig) -> dict[str, Any]:
    """The run's reasoning fields as a request body carries them; a target profile that does not reason
    asks for that prompt variant."""
    reasoning: dict[str, Any] = msgspec.to_builtins(cfg.reasoning)
    if not cfg.model.thinking and not reasoning:
        reasoning = {"enabled": False}
    return reasoning


def token_limit(max_tokens: int) -> int:
    """The most output tokens a response to a request with ``max_tokens`` may carry: ``max_tokens`` plus a
    small slack, ``max(16, 1 %)``, for end markers a rebuild adds or a provider counts. More output ids,
    more billed completion tokens or more rebuilt ids than this make the response invalid (retried)."""
    return max_tokens + max(16, -(-max_tokens // 100))


class WireMeter:
    """What one streamed request has received so far, updated by the backend as data events arrive and read
    by whoever waits for it (the engine's display and tail guard, probe's progress lines).

    ``events``: data events (keep-alive comments are no data); ``chars``: characters of reasoning and content
    text; ``ids``: token ids (servers that send them); ``first_at`` / ``last_at``: ``time.monotonic()`` of the
    first data event and of the last one that carried text or ids (None: none yet); ``provider``: who serves
    it, once the stream said so; ``generation_id``: the server's id of this generation, once its headers or
    stream named it (what ``GET /generation`` looks up when the request is abandoned). A backend that does not
    stream leaves it untouched until the body is in.
    """

    __slots__ = ("chars", "events", "first_at", "generation_id", "ids", "last_at", "provider")

    def __init__(self) -> None:
        self.generation_id: str | None = None
        self.events = 0
        self.chars = 0
        self.ids = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.provider: str | None = None

    def data(self, chars: int, ids: int, now: float, provider: str | None = None) -> None:
        """One data event: the text and ids received so far in all (cumulative), and its time."""
        self.events += 1
        if self.first_at is None:
            self.first_at = now
        if chars > self.chars or ids > self.ids:
            self.last_at = now
        self.chars = max(self.chars, chars)
        self.ids = max(self.ids, ids)
        if provider is not None:
            self.provider = provider

    def tokens(self, chars_per_token: float = 4.0) -> float:
        """Tokens received: the ids where the server sends them, else the text at ``chars_per_token``."""
        return float(self.ids) if self.ids else self.chars / max(chars_per_token, 1e-9)


class CompletionRequest(msgspec.Struct, kw_only=True):
    """One sample to generate. ``prompt_ids`` is required only by token-level backends (SGLang).

    ``provider_ignore``: routing slugs this attempt must avoid on top of the configured routing (providers
    that dropped this sample's reasoning, providers in the run's cool-down); OpenRouter sends them in
    ``provider.ignore``, other protocols have no providers to route around and ignore it.
    ``meter``: where a streaming backend counts what has arrived (``WireMeter``); never sent.
    """

    sample_id: str
    messages: list[Message]
    max_tokens: int
    tools: list[Tool] | None = None
    prompt_ids: list[int] | None = None
    provider_ignore: list[str] | None = None
    meter: WireMeter | None = None


class LogprobToken(msgspec.Struct, array_like=True):
    """One generated token as a logprob entry reports it: its text and, when given, its raw bytes."""

    token: str
    bytes: list[int] | None = None


class SpecDecodeMetrics(msgspec.Struct, kw_only=True):
    """One request's speculative decoding as vLLM reports it with ``--per-request-spec-decode-metrics summary``
    (or ``detailed``; vLLM PR #48915): the response's top-level ``metrics.speculative_decoding`` (a stream's
    last chunk with usage). ``acceptance_histogram[j]``: the verify steps that accepted exactly ``j`` of the
    ``num_spec_tokens`` drafted tokens; ``num_spec_steps`` the verify steps (vLLM's ``num_drafts``);
    ``per_step_accepted`` (``detailed`` only) each step's accepted count. Decoded as sent: whether the counts
    agree with each other is checked by the reader that relies on them (``accept``)."""

    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int
    num_spec_tokens: int
    acceptance_histogram: list[int] = msgspec.field(default_factory=list)
    mean_acceptance_length: float | None = None
    draft_acceptance_rate: float | None = None
    per_step_accepted: list[int] | None = None


class Completion(ResponseFields, kw_only=True):
    """What one successful request returned, with the text exactly as the server sent it.

    The fields it shares with the record it becomes (reasoning, content, finish reasons, provider, usage,
    ids, ...) are ``records.ResponseFields``; ``ResponseRecord.from_completion`` builds the record.
    ``output_ids``/``prompt_ids`` are set only when the server returned token ids (vLLM, SGLang).
    ``cost_missing``: ``usage`` came without a ``cost`` (plain servers, some providers); the engine then
    computes it from the token counts and the routed prices.
    ``ttft_s``: seconds from sending the request to the first data event of a stream (None unstreamed).
    ``flags``: what the wire said that the record must carry (``usage_coerced``, ``cost_invalid``,
    ``reasoning_fields_mixed``, ``reasoning_fields_disagree``, ``extra_choices``); the engine adds them to
    the record's ``recon_flags``. ``providers`` / ``models``: every distinct ``provider`` and ``model``
    the body or the stream's chunks named, in order (``provider`` / ``model`` hold the last one).
    ``text_bytes``: UTF-8 bytes of text received (reasoning, content, tool arguments), for booking a
    response whose usage is missing. ``spec_decode``: the server's per-request speculative-decoding counts
    (vLLM with ``--per-request-spec-decode-metrics``), None when it sent none; one it sent in another shape is
    None with the flag ``spec_decode_unreadable``.
    """

    backend: str
    logprobs: list[LogprobToken] | None = None
    cost_missing: bool = False
    flags: list[str] = msgspec.field(default_factory=list)
    providers: list[str] = msgspec.field(default_factory=list)
    models: list[str] = msgspec.field(default_factory=list)
    text_bytes: int = 0
    spec_decode: SpecDecodeMetrics | None = None


class Billing(msgspec.Struct, kw_only=True):
    """What a response the client rejected was billed, as far as its body says: attached to the error
    (``backends.errors.bill``) so the engine books it although no completion came of it.

    ``usage``: the leniently decoded usage (None when the body had none that could be read);
    ``cost_known``: its ``cost`` is a real, non-negative number (else the engine computes the cost from the
    token counts and the routed prices); ``text_bytes``: UTF-8 bytes of text the body carried (the last
    resort when there is no usage: priced as completion tokens).
    """

    usage: Usage | None = None
    cost_known: bool = False
    text_bytes: int = 0


class KeyInfo(msgspec.Struct, kw_only=True):
    """``GET /key``: the key's limit and usage in USD (None where the key has no limit)."""

    label: str | None = None
    limit: float | None = None
    limit_remaining: float | None = None
    usage: float = 0.0
    usage_daily: float | None = None
    is_free_tier: bool = False
    is_management_key: bool = False
    include_byok_in_limit: bool = False


class GenerationCost(msgspec.Struct, kw_only=True):
    """``GET /generation?id=``: what one generation was billed in USD (``total_cost``, plus
    ``upstream_inference_cost`` on BYOK), and whether the request was cancelled."""

    id: str = ""
    total_cost: float = 0.0
    upstream_inference_cost: float | None = None
    is_byok: bool = False
    cancelled: bool = False
    provider_name: str | None = None
    tokens_prompt: int = 0
    tokens_completion: int = 0


class Credits(msgspec.Struct, kw_only=True):
    """``GET /credits`` (management key only): account credits and usage in USD."""

    total_credits: float = 0.0
    total_usage: float = 0.0

    @property
    def remaining(self) -> float:
        return self.total_credits - self.total_usage


class EndpointPricing(msgspec.Struct, kw_only=True):
    """USD per token (OpenRouter sends strings; parsed to floats)."""

    prompt: float = 0.0
    completion: float = 0.0
    request: float = 0.0
    internal_reasoning: float = 0.0


class EndpointInfo(msgspec.Struct, kw_only=True):
    """One provider endpoint of a model (``/models/{author}/{slug}/endpoints``)."""

    provider_name: str
    tag: str = ""
    quantization: str | None = None
    context_length: int | None = None
    max_completion_tokens: int | None = None
    pricing: EndpointPricing = msgspec.field(default_factory=EndpointPricing)
    status: int | None = None


@runtime_checkable
class Backend(Protocol):
    """A protocol client bound to one or more base URLs, owning one connection pool per URL."""

    name: str
    #: responses carry ``usage.cost`` (OpenRouter); plain servers do not
    reports_cost: bool

    async def complete(self, req: CompletionRequest) -> Completion:
        """Send one request; return the completion or raise an ``APIError`` subclass. Every request is
        bounded in time (a total deadline, and an idle timeout counting data events only) and in size."""
        ...

    async def get_key_info(self) -> KeyInfo | None:
        """``GET /key`` (OpenRouter); None for protocols without it."""
        ...

    async def get_credits(self, management_key: str | None = None) -> Credits | None:
        """``GET /credits`` with a management key (OpenRouter); None without a key or protocol support."""
        ...

    async def get_generation(self, generation_id: str) -> GenerationCost | None:
        """What one generation was billed (``GET /generation?id=``): None where the server keeps no such
        record (a self-hosted server), or not yet (OpenRouter answers 404 for a while after the end)."""
        ...

    async def get_model_endpoints(self, model: str) -> list[EndpointInfo] | None:
        """A model's provider endpoints and prices (OpenRouter); None for other protocols."""
        ...

    async def aclose(self) -> None:
        """Close the connection pools."""
        ...
