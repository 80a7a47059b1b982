"""Scenarios: the emulated providers, their prices, speeds, quirks and fault rates.

A ``Scenario`` is plain data (dataclasses), built in Python or loaded from YAML:

    from draftgen.emulator.scenarios import builtin_scenario

    sc = builtin_scenario("fast").with_provider("chutes", faults={"rate_limit": 0.5}, retry_after_s=0.05)
    sc = sc.replace(in_flight_budget_usd=0.01, time_scale=0.001)

YAML (``draftgen emulate --scenario my.yaml``) has the same keys as ``Scenario``; ``base:`` names a
built-in to start from, and ``providers:`` (when given) replaces its provider list entirely::

    base: realistic
    time_scale: 0.01
    providers:
      - {name: Chutes, tag: chutes/int4, quantization: int4, price_prompt: 0.44, price_completion: 2.0,
         ttft_s: [1, 8], tokens_per_s: [20, 70], faults: {rate_limit: 0.2}, repeat_finish_chunk: true}

Built-ins:

- ``fast``: zero latency, no faults, no quirks, batches done at once; for tests and benchmarks.
- ``realistic``: Kimi-K2.5-like provider roster (research file "openrouter-providers-and-quirks"):
  int4 hosts at 20–70 tok/s with 1–8 s TTFT, fp4 hosts at 150–350 tok/s with 0.3–1 s TTFT, rare faults,
  each provider with the quirks seen on the wire.
- ``chaos``: every fault kind, often, on a compressed clock (``time_scale`` 0.01); a request stops
  drawing faults after ``max_faulty_attempts`` faulty attempts, so a patient client always finishes.

Units: prices in USD per million tokens; times in seconds, multiplied by ``time_scale`` (except
``hang_s``, which must outlast any client idle timeout); rates are probabilities per attempt.

Fault kinds (``Provider.faults`` keys), and what a plain HTTP client sees:

    rate_limit            429, Retry-After, error.availability{capacity_exhausted, retryable}
    unavailable           503, Retry-After, error.availability{temporarily_unavailable, retryable}
    server_error          502 "Provider returned error" (error_type provider_unavailable)
    legacy_raw            429 with the legacy metadata.raw / provider_name shape
    cloudflare_1015       429 text/plain "error code: 1015"
    edge_timeout          524 text/plain "error code: 524" after edge_timeout_s
    error_in_200          200 whose body is only {"error": …} (no choices)
    error_in_200_choices  200 with a top-level error and choices[0].finish_reason "error", no text
    finish_error          200, partial output, choices[0].finish_reason "error" + choices[0].error
    midstream_error       stream: partial output then an error chunk (non-streamed: as finish_error)
    empty_200             200, content null, 0 completion tokens, finish_reason "stop"
    hang                  stops sending (before headers, or mid-stream) for hang_s, then closes
    reset                 TCP reset (before any byte, or mid-stream)

The first four are provider errors OpenRouter falls back from (``FALLBACK_FAULTS``) when
``provider.allow_fallbacks`` is not false and another provider is left.

Faults that test a client's bounds (``BOUND_FAULT_KINDS``; never drawn by the built-ins, ``chaos``
included, since a client without bounds would wait ``hang_s`` on each):

    keepalive_only        200, then only ": OPENROUTER PROCESSING" comments every keepalive_s for hang_s, then
                          a reset (non-streamed: blank-line padding instead); no data ever
    trickle               200, then an empty data chunk every keepalive_s for hang_s, then a reset: data that
                          never ends (non-streamed: padding, as keepalive_only)
    huge_body             200 whose body is about the provider's huge_body_bytes (50 MB by default): token_ids
                          far beyond max_tokens (``huge_body_ids``), or that much content text, with usage
                          billing 5 completion tokens; not billed

A rate-limit storm over every provider (OpenRouter's own 429s, as in a surge) is ``storm_s: [start,
length]``: requests arriving in that window after the first one get 429 with ``Retry-After:
storm_retry_after_s``.

Service tiers: a provider with ``tier: flex`` (or ``priority``) is that tier's endpoint, with the tier's
prices and a tier-suffixed tag (``openai/flex``); ``emulator.tiers`` routes to it only when a request asks.
The Batch API's behaviour (speed, failed, expired and partially failed batches, the discount) is the
``batch:`` mapping (``BatchBehaviour``; presets in ``emulator.batch.BATCH_PRESETS``).

A ``Retry-After`` of a day is ``retry_after_s: 86400`` with ``time_scale: 1`` and a ``rate_limit`` fault;
a provider that sends no ``usage.cost`` (as plain OpenAI-compatible servers do) is ``omit_cost: true``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from draftgen.config import load_yaml
from draftgen.errors import ConfigError

__all__ = [
    "ALL_FAULT_KINDS",
    "ALL_PARAMETERS",
    "BOUND_FAULT_KINDS",
    "FALLBACK_FAULTS",
    "FAULT_KINDS",
    "BatchBehaviour",
    "ModelInfo",
    "Provider",
    "Scenario",
    "builtin_scenario",
    "load_scenario",
]

FAULT_KINDS: tuple[str, ...] = (
    "rate_limit",
    "unavailable",
    "server_error",
    "legacy_raw",
    "cloudflare_1015",
    "edge_timeout",
    "error_in_200",
    "error_in_200_choices",
    "finish_error",
    "midstream_error",
    "empty_200",
    "hang",
    "reset",
)
FALLBACK_FAULTS = frozenset({"rate_limit", "unavailable", "server_error", "legacy_raw"})
BOUND_FAULT_KINDS: tuple[str, ...] = ("keepalive_only", "trickle", "huge_body")
ALL_FAULT_KINDS: tuple[str, ...] = FAULT_KINDS + BOUND_FAULT_KINDS

#: request parameters a provider may or may not support (``require_parameters`` checks these)
ALL_PARAMETERS: tuple[str, ...] = (
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "logprobs", "top_logprobs", "tools", "tool_choice",
    "reasoning", "include_reasoning", "response_format", "structured_outputs",
)


@dataclass
class Provider:
    """One endpoint serving the model. ``tag`` is the routing slug (``deepinfra/fp4``)."""

    name: str
    tag: str
    quantization: str = "unknown"
    price_prompt: float = 0.5
    price_completion: float = 2.5
    context_length: int = 262144
    max_completion_tokens: int = 65536
    ttft_s: tuple[float, float] = (0.0, 0.0)
    tokens_per_s: tuple[float, float] = (0.0, 0.0)  # 0 = instantaneous
    supports_logprobs: bool = False
    unsupported_parameters: tuple[str, ...] = ()
    faults: dict[str, float] = field(default_factory=dict)
    retry_after_s: float = 2.0
    # quirks seen on the wire
    reasoning_field: str = "reasoning"  # or "reasoning_content" (no reasoning_details then)
    drop_reasoning: bool = False  # reasoning text missing while reasoning_tokens > 0
    # share of the requests whose routing excludes it (provider.ignore / only / quantizations / max_price,
    # fallbacks off) that it serves all the same: a misrouting upstream (0 = routing is honoured)
    ignores_routing: float = 0.0
    trim_whitespace: bool = False  # whitespace trimmed at the edges of reasoning and content
    pad_body: bool = False  # non-streamed body starts with blank-line padding
    repeat_finish_chunk: bool = False  # finish chunk sent again with usage and non-empty choices
    model_permaslug: bool = False  # `model` echoes the canonical slug (moonshotai/kimi-k2.5-0127)
    omit_cost: bool = False  # usage without `cost` and `cost_details` (the client must price it)
    huge_body_bytes: int = 50_000_000  # size of this provider's huge_body fault bodies
    huge_body_ids: bool = True  # huge_body: token_ids (else content text)
    # service tier of this endpoint (``flex``/``priority``: its tag ends in the tier, its prices are the
    # tier's); served only to requests that ask for it (``emulator.tiers``)
    tier: str = "default"
    echo_tier: str | None = None  # set per request: the ``service_tier`` its response echoes
    batch: bool = True  # it has an endpoint in the model's ``:batch`` variant (``emulator.batch``)

    @property
    def slug(self) -> str:
        return self.tag.split("/", 1)[0]

    @property
    def supported_parameters(self) -> tuple[str, ...]:
        drop = set(self.unsupported_parameters)
        if not self.supports_logprobs:
            drop |= {"logprobs", "top_logprobs"}
        return tuple(p for p in ALL_PARAMETERS if p not in drop)

    @property
    def fault_total(self) -> float:
        return sum(self.faults.values())


@dataclass
class BatchBehaviour:
    """How the emulator's Batch API (``emulator.batch``) treats batches. Times in seconds, scaled by the
    scenario's ``time_scale``; rates are probabilities per batch (``fail_rate``, ``expire_rate``) or per
    request (``item_fail_rate``), drawn from the seed and the batch or request."""

    models: list[str] | None = None  # models with a ``:batch`` variant (None: every model served)
    discount: float = 0.5  # batch price = the provider's price × this ("typically 50%")
    validating_s: float = 1.0
    in_progress_s: float = 30.0  # every batch at least this long in progress ...
    per_request_s: float = 0.01  # ... plus this per request
    finalizing_s: float = 1.0
    window_s: float = 86400.0  # still unfinished this long after submission: expired, no results
    fail_rate: float = 0.0  # a batch that fails validation (status failed, error.message)
    expire_rate: float = 0.0  # a batch whose provider never finishes it (expired at window_s)
    item_fail_rate: float = 0.0  # a request whose result is an ``error`` (partially failed batch)
    item_cost: bool = True  # each result's body carries usage.cost (else only the batch's usage.cost)
    accept_delay_s: float = 0.0  # a submission is recorded, then answered this long after (kill tests)


@dataclass
class ModelInfo:
    """A model listed by /models. The OpenRouter routes answer any other model id with OpenRouter's 404
    (``model_not_found``), unless ``Scenario.accept_any_model``."""

    id: str
    canonical_slug: str = ""
    name: str = ""
    context_length: int = 262144
    max_completion_tokens: int = 65536


def _default_models() -> list[ModelInfo]:
    return [
        ModelInfo("moonshotai/kimi-k2.5", "moonshotai/kimi-k2.5-0127", "MoonshotAI: Kimi K2.5", 262144, 235929),
        ModelInfo("qwen/qwen3-8b", "qwen/qwen3-8b-04-28", "Qwen: Qwen3 8B", 131072, 32768),
        # one model of every other registered profile's family, so each can be rehearsed offline
        ModelInfo("moonshotai/kimi-k2-thinking", name="MoonshotAI: Kimi K2 Thinking"),
        ModelInfo("qwen/qwen3-235b-a22b-thinking-2507", name="Qwen: Qwen3 235B A22B Thinking 2507"),
        ModelInfo("deepseek/deepseek-r1", name="DeepSeek: R1", context_length=163840),
        ModelInfo("deepseek/deepseek-chat-v3.1", name="DeepSeek: DeepSeek V3.1", context_length=163840),
        ModelInfo("z-ai/glm-4.6", name="Z.AI: GLM 4.6", context_length=202752),
        ModelInfo("openai/gpt-oss-120b", name="OpenAI: gpt-oss-120b", context_length=131072),
    ]


@dataclass
class Scenario:
    name: str = "custom"
    providers: list[Provider] = field(default_factory=list)
    models: list[ModelInfo] = field(default_factory=_default_models)
    # OpenRouter routes: a model id not in ``models`` is OpenRouter's 404, as a mistyped slug is upstream
    accept_any_model: bool = False
    # vLLM/SGLang routes: a local server serves its one model under any name a request gives (False: vLLM's 404)
    local_accept_any_model: bool = True
    time_scale: float = 1.0
    # the emulated model
    pool_size: int = 256  # distinct outputs per (thinking, seed); requests map onto them by hash (~40 KB each)
    reasoning_tokens_median: int = 600
    content_tokens_median: int = 250
    length_sigma: float = 0.8  # lognormal spread of both lengths (long tail)
    max_generated_tokens: int = 16384  # cap of an ordinary sample; runaways go on to max_tokens
    runaway_rate: float = 0.02  # samples that do not end: finish_reason "length" at any max_tokens ...
    max_runaway_tokens: int = 32768  # ... up to this many; with a larger budget they end after about this many
    non_canonical_rate: float = 0.03
    tool_call_rate: float = 0.05
    leading_space_rate: float = 0.7  # Kimi: reasoning/content begin with a space; GLM: reasoning with "\n"
    # framing and timing
    keepalive_comments: int = 1  # ": OPENROUTER PROCESSING" lines at the start of a stream
    keepalive_s: float = 1.0  # interval of keep-alive comments / body padding while waiting
    stream_chunk_tokens: int = 32
    # local-server shapes (emulator/local_servers.py)
    vllm_legacy: bool = False  # vLLM before the rename: reasoning_content, flat {"object": "error", ...} errors
    sglang_incremental: bool = False  # SGLang --incremental-streaming-output: events carry only the new text/ids
    edge_timeout_s: float = 100.0
    hang_s: float = 600.0  # not scaled
    max_faulty_attempts: int | None = None
    # a rate-limit storm: every chat request in [start, start + length) seconds after the first one is
    # answered 429 with Retry-After ``storm_retry_after_s`` (both on the scenario's clock), whatever the provider
    storm_s: tuple[float, float] | None = None
    storm_retry_after_s: float = 2.0
    # account
    in_flight_budget_usd: float | None = None
    generation_lag_s: float = 1.0  # /generation answers 404 this long after completion
    batch: BatchBehaviour = field(default_factory=BatchBehaviour)

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    def provider(self, slug: str) -> Provider:
        for p in self.providers:
            if p.tag == slug or p.slug == slug or p.name == slug:
                return p
        raise ConfigError(f"scenario {self.name!r} has no provider {slug!r}; providers: "
                          + ", ".join(p.tag for p in self.providers))

    def with_provider(self, slug: str, **changes: Any) -> Scenario:
        """A copy with one provider changed (``slug``: tag, base slug or display name)."""
        target = self.provider(slug)
        providers = [dataclasses.replace(p, **changes) if p is target else p for p in self.providers]
        return self.replace(providers=providers)

    def scaled(self, seconds: float) -> float:
        return seconds * self.time_scale

    def validate(self, where: str = "scenario") -> Scenario:
        if not self.providers:
            raise ConfigError(f"{where}: providers is empty; a scenario needs at least one provider")
        tags = [p.tag for p in self.providers]
        if len(set(tags)) != len(tags):
            raise ConfigError(f"{where}: provider tags must be unique, got {tags}")
        for i, p in enumerate(self.providers):
            for kind, rate in p.faults.items():
                if kind not in ALL_FAULT_KINDS:
                    raise ConfigError(f"{where}: providers[{i}].faults.{kind}: unknown fault kind; "
                                      f"known: {', '.join(ALL_FAULT_KINDS)}")
                if not 0.0 <= rate <= 1.0:
                    raise ConfigError(f"{where}: providers[{i}].faults.{kind}: rate {rate} is not in [0, 1]")
            if p.fault_total > 1.0 + 1e-9:
                raise ConfigError(f"{where}: providers[{i}].faults: rates add up to {p.fault_total:.3f} > 1")
            if p.huge_body_bytes < 0:
                raise ConfigError(f"{where}: providers[{i}].huge_body_bytes must be >= 0")
            if p.reasoning_field not in ("reasoning", "reasoning_content"):
                raise ConfigError(f"{where}: providers[{i}].reasoning_field must be reasoning or reasoning_content")
            if p.tier not in ("default", "flex", "priority"):
                raise ConfigError(f"{where}: providers[{i}].tier must be default, flex or priority")
        b = self.batch
        for name in ("fail_rate", "expire_rate", "item_fail_rate"):
            if not 0.0 <= getattr(b, name) <= 1.0:
                raise ConfigError(f"{where}: batch.{name} {getattr(b, name)} is not in [0, 1]")
        if self.pool_size < 1:
            raise ConfigError(f"{where}: pool_size must be >= 1")
        if self.time_scale < 0:
            raise ConfigError(f"{where}: time_scale must be >= 0")
        if self.stream_chunk_tokens < 1:
            raise ConfigError(f"{where}: stream_chunk_tokens must be >= 1")
        if self.storm_s is not None and (len(self.storm_s) != 2 or min(self.storm_s) < 0):
            raise ConfigError(f"{where}: storm_s must be [start, length], seconds >= 0")
        return self


# -- built-ins -------------------------------------------------------------------------------------

def _fast() -> Scenario:
    return Scenario(
        name="fast",
        providers=[
            Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, 262144, 32768, supports_logprobs=True),
            Provider("Baseten", "baseten/fp4", "fp4", 0.60, 3.00, 262144, 65536),
            Provider("Chutes", "chutes/int4", "int4", 0.44, 2.00, 262144, 65535),
        ],
        keepalive_comments=1,
        stream_chunk_tokens=32,
        batch=BatchBehaviour(validating_s=0.0, in_progress_s=0.0, per_request_s=0.0, finalizing_s=0.0),
    )


def _roster(scale_faults: float, every_fault: bool) -> list[Provider]:
    def f(**rates: float) -> dict[str, float]:
        return {k: v * scale_faults for k, v in rates.items()}

    providers = [
        Provider("Chutes", "chutes/int4", "int4", 0.44, 2.00, 262144, 65535, (1.0, 8.0), (20.0, 70.0),
                 faults=f(rate_limit=0.02, empty_200=0.003, midstream_error=0.003),
                 retry_after_s=25.0, repeat_finish_chunk=True, pad_body=True, model_permaslug=True),
        Provider("SiliconFlow", "siliconflow/int4", "int4", 0.45, 2.25, 262144, 235929, (2.0, 8.0), (40.0, 65.0),
                 faults=f(unavailable=0.01, server_error=0.005), retry_after_s=10.0,
                 reasoning_field="reasoning_content"),
        Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, 262144, 32768, (0.3, 1.0), (150.0, 250.0),
                 supports_logprobs=True, faults=f(server_error=0.02, hang=0.002, reset=0.002)),
        Provider("Baseten", "baseten/fp4", "fp4", 0.60, 3.00, 262144, 262000, (0.3, 0.5), (200.0, 350.0),
                 faults=f(rate_limit=0.005, error_in_200=0.002), trim_whitespace=True),
        Provider("Fireworks", "fireworks", "unknown", 0.60, 3.00, 262144, 256000, (0.3, 1.0), (150.0, 250.0),
                 supports_logprobs=True, faults=f(empty_200=0.005, error_in_200_choices=0.002)),
        Provider("Novita", "novita", "unknown", 0.60, 3.00, 262144, 65536, (1.0, 3.0), (23.0, 33.0),
                 faults=f(legacy_raw=0.005, finish_error=0.003), drop_reasoning=True),
        Provider("Moonshot AI", "moonshotai/int4", "int4", 0.60, 3.00, 262144, 262144, (1.0, 4.0), (30.0, 60.0),
                 unsupported_parameters=("temperature", "top_p"), faults=f(rate_limit=0.01, edge_timeout=0.001)),
        Provider("AtlasCloud", "atlas-cloud/int4", "int4", 0.50, 2.50, 262144, 65536, (1.0, 2.0), (35.0, 45.0),
                 faults=f(cloudflare_1015=0.003, hang=0.001), pad_body=True),
    ]
    if every_fault:
        # Spread every kind over the roster, often: about 40 % of attempts fail per provider.
        for i, p in enumerate(providers):
            kinds = [FAULT_KINDS[(i + j) % len(FAULT_KINDS)] for j in range(0, len(FAULT_KINDS), 2)]
            p.faults = {k: 0.4 / len(kinds) for k in kinds}
            p.retry_after_s = 2.0
    return providers


def _realistic() -> Scenario:
    return Scenario(name="realistic", providers=_roster(1.0, False), pool_size=1024, keepalive_comments=3,
                    stream_chunk_tokens=4, reasoning_tokens_median=1500, content_tokens_median=400,
                    length_sigma=0.9, max_generated_tokens=32768,
                    batch=BatchBehaviour(validating_s=10.0, in_progress_s=300.0, per_request_s=0.05,
                                         finalizing_s=30.0))


def _chaos() -> Scenario:
    return Scenario(name="chaos", providers=_roster(1.0, True), time_scale=0.01, pool_size=512,
                    keepalive_comments=2, stream_chunk_tokens=8, runaway_rate=0.05, non_canonical_rate=0.1,
                    tool_call_rate=0.15, max_faulty_attempts=6,
                    batch=BatchBehaviour(fail_rate=0.05, expire_rate=0.02, item_fail_rate=0.05))


_BUILTINS = {"fast": _fast, "realistic": _realistic, "chaos": _chaos}


def builtin_scenario(name: str) -> Scenario:
    try:
        return _BUILTINS[name]().validate(name)
    except KeyError:
        raise ConfigError(f"unknown scenario {name!r}; use fast, realistic, chaos or a YAML file path") from None


def _check_keys(obj: Any, cls: type, where: str) -> None:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(obj).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    for k in obj:
        if k not in known:
            raise ConfigError(f"{where}.{k}: unknown key; known keys: {', '.join(sorted(known))}")


def scenario_from_dict(data: dict[str, Any], where: str = "scenario") -> Scenario:
    """Build a Scenario from YAML-shaped data (``base:`` + overrides)."""
    data = dict(data)
    base_name = data.pop("base", None)
    _check_keys(data, Scenario, where)
    for i, p in enumerate(data.get("providers") or []):
        _check_keys(p, Provider, f"{where}.providers[{i}]")
    for i, m in enumerate(data.get("models") or []):
        _check_keys(m, ModelInfo, f"{where}.models[{i}]")
    base = builtin_scenario(str(base_name)) if base_name else Scenario(name=where)
    merged = msgspec.to_builtins(base)
    merged.update(data)
    try:
        sc = msgspec.convert(merged, Scenario, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return sc.validate(where)


def load_scenario(spec: str) -> Scenario:
    """A built-in scenario name, or the path of a scenario YAML file."""
    if spec in _BUILTINS:
        return builtin_scenario(spec)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"scenario {spec!r}: not a built-in (fast, realistic, chaos) and no such file")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a scenario file must be a mapping")
    data.setdefault("name", path.stem)
    return scenario_from_dict(data, str(path))
