"""Typed run configuration: a YAML file plus CLI flag overrides.

Reads one YAML file (``draftgen <command> CONFIG``). Unknown keys, wrong types and bad values are a
``ConfigError`` naming the file and the key path (``datasets[1].formt``) and what to do. Relative paths
in the file resolve from the file's folder. Defaults live here, in code; ``docs/config.md`` is generated
from these classes (``python -m draftgen.docgen``), so the reference cannot drift.

Shape (every section optional except ``datasets``)::

    run_dir: runs/quickstart
    model:     {id, profile, tokenizer, tokenizer_sha256, chat_template, thinking}
    endpoint:  emulator | openrouter | openai | vllm | sglang   (or a mapping, see EndpointConfig)
    routing:   OpenRouter provider object {order, only, ignore, sort, allow_fallbacks, quantizations, ...}
    reasoning: {effort, max_tokens, exclude, enabled}
    sampling:  {temperature, top_p, seed, stop, logprobs, top_logprobs}
    partitions: {short: {concurrency, max_tokens}, long: {concurrency, max_tokens}}
    datasets:  [{name, path | hf, format, partition, max_samples, token_budget, weight, cap}, ...]
    prepare, budget, retry, audit, merge, hidden_states, plan, probe
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from .config_accept import AcceptConfig
from .config_hidden import HiddenStatesConfig
from .config_train import TrainConfig
from .errors import ConfigError

__all__ = [
    "AcceptConfig",
    "AuditConfig",
    "BudgetConfig",
    "DatasetConfig",
    "EmulatorConfig",
    "EndpointConfig",
    "HiddenStatesConfig",
    "MergeConfig",
    "ModelConfig",
    "PartitionConfig",
    "PartitionsConfig",
    "PlanConfig",
    "PrepareConfig",
    "ProbeConfig",
    "QualityConfig",
    "ReasoningConfig",
    "RetryConfig",
    "RoutingConfig",
    "RunConfig",
    "SamplingConfig",
    "config_hash",
    "load_config",
    "resolve_api_key",
]


class _C(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class ModelConfig(_C):
    """The target model."""

    id: str = "qwen/qwen3-8b"
    """API model slug sent as ``model`` (OpenRouter: ``moonshotai/kimi-k2.5``)."""
    profile: str = "qwen3"
    """Token profile, one of those registered in ``draftgen.tokens.PROFILE_TABLE``."""
    tokenizer: str = "bundled:qwen3"
    """Tokenizer: ``bundled:qwen3``, a local folder, or ``hf:org/name@revision``."""
    tokenizer_sha256: str | None = None
    """Optional sha256 pin of the vocabulary file (uncompressed)."""
    chat_template: str | None = None
    """Optional path to a chat template overriding the tokenizer folder's."""
    thinking: bool = True
    """Whether the model reasons (selects the thinking prompt and suffix)."""
    profile_options: dict[str, Any] = msgspec.field(default_factory=dict)
    """Markers of the ``generic`` profile: think_start, think_end, end_of_turn, reasoning_lead,
    reasoning_trail, content_lead, tool_specials, thinking_kwarg, expected_ids (see draftgen.tokens.generic)."""
    template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    """Extra chat-template variables, e.g. gpt-oss ``reasoning_effort`` / ``current_date``."""
    context_length: int | None = None
    """Longest prompt, in tokens, that ``prepare`` accepts (default: the tokenizer config's ``model_max_length``, else 131,072)."""


class EmulatorConfig(_C):
    """The embedded emulator used when ``endpoint: emulator``."""

    scenario: str = "fast"
    """fast | realistic | chaos, or a path to a scenario YAML file."""
    seed: int = 0
    """Seed of the emulated model and its faults; a fixed seed reproduces a run."""
    credits: float = 100.0
    """Starting credits of the emulated account, in USD."""
    ground_truth: bool = True
    """Write the emulator's true ids to ``<run_dir>/emulator/ground_truth.jsonl`` (for the BPE audit)."""


class EndpointConfig(_C):
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


class RoutingConfig(_C):
    """OpenRouter's ``provider`` object, sent as is (omitted fields are not sent)."""

    order: list[str] | None = None
    """Providers to try first, in this order (routing slugs such as ``siliconflow/int4``)."""
    only: list[str] | None = None
    """Allow-list of providers; a base slug (``deepinfra``) also matches its variants."""
    ignore: list[str] | None = None
    """Providers never to use (the reference run ignored the NVFP4/FP4 ones)."""
    sort: str | None = None
    """``price``, ``throughput`` or ``latency``."""
    allow_fallbacks: bool | None = None
    """Whether OpenRouter may fall back to other providers (default true upstream)."""
    quantizations: list[str] | None = None
    """Allowed quantizations, e.g. ``[int4, fp8]``."""
    require_parameters: bool | None = None
    """Route only to providers supporting every parameter sent (e.g. logprobs)."""
    data_collection: str | None = None
    """``allow`` or ``deny``."""
    max_price: dict[str, float | str] | None = None
    """Price ceilings in USD per million tokens: ``{prompt: 0.6, completion: 2.5}`` (numbers or numeric strings, as OpenRouter's spec types them)."""


class ReasoningConfig(_C):
    """OpenRouter's ``reasoning`` object, sent as is (omitted fields are not sent)."""

    effort: str | None = None
    """``max``, ``xhigh``, ``high``, ``medium``, ``low``, ``minimal`` or ``none``."""
    max_tokens: int | None = None
    """Thinking budget in tokens (use either this or ``effort``)."""
    exclude: bool | None = None
    """True: the model reasons but the text is not returned (ids cannot then be rebuilt)."""
    enabled: bool | None = None
    """Switch reasoning on or off where the model allows it."""


class SamplingConfig(_C):
    """Sampling parameters sent with every request (omitted fields are not sent)."""

    temperature: float | None = None
    """Sampling temperature in [0, 2]."""
    top_p: float | None = None
    """Nucleus sampling mass in (0, 1]."""
    seed: int | None = None
    """Request seed (determinism is best-effort upstream)."""
    stop: list[str] | None = None
    """Up to 4 stop strings."""
    logprobs: bool | None = None
    """Ask for per-token logprobs: where a provider returns them, content ids are recovered exactly."""
    top_logprobs: int | None = None
    """Alternatives per position (0–20)."""


class PartitionConfig(_C):
    concurrency: int
    """Requests in flight for this partition (default short 2,000, long 500)."""
    max_tokens: int
    """max_tokens sent for this partition (default short 10,240, long 16,384)."""


_PARTITION_DEFAULTS: dict[str, dict[str, int]] = {
    "short": {"concurrency": 2000, "max_tokens": 10240},
    "long": {"concurrency": 500, "max_tokens": 16384},
}


class PartitionsConfig(_C):
    """Requests in flight and max_tokens per partition (the reference run: 2,000/10,240 and 500/16,384)."""

    short: PartitionConfig = msgspec.field(default_factory=lambda: PartitionConfig(**_PARTITION_DEFAULTS["short"]))
    long: PartitionConfig = msgspec.field(default_factory=lambda: PartitionConfig(**_PARTITION_DEFAULTS["long"]))


class DatasetConfig(_C):
    """One prompt source."""

    name: str
    """Unique plain dataset name (a letter or digit, then letters, digits, ``_ - .``); used in sample ids and paths."""
    path: str | None = None
    """Local JSONL/JSON/Parquet file or folder, or ``bundled:<name>`` for a prompt set shipped with draftgen."""
    hf: str | None = None
    """Hugging Face dataset name (needs ``datasets``)."""
    hf_subset: str | None = None
    """Hugging Face dataset configuration (subset) name."""
    split: str = "train"
    """Split to read (HF datasets and split-named files in a folder)."""
    format: Literal["auto", "messages", "sharegpt", "alpaca", "prompt", "glaive"] = "auto"
    """Row format; ``auto`` detects messages, ShareGPT, Alpaca, plain prompts and glaive rows."""
    field: str | None = None
    """Column holding the conversation or prompt, when not the format's usual one."""
    partition: Literal["auto", "short", "long"] = "auto"
    """``short``/``long`` for the whole dataset, or ``auto`` by prompt length (prepare.long_prompt_tokens)."""
    max_samples: int | None = None
    """At most this many samples, drawn with prepare.seed."""
    token_budget: int | None = None
    """Completion-token budget for this dataset (done + in flight)."""
    multi_turn: Literal["last", "all"] | None = None
    """Overrides prepare.multi_turn for this dataset."""
    weight: float = 1.0
    """Merge weight: the share of this dataset's samples kept is weight (<= 1) or it is repeated (> 1)."""
    cap: int | None = None
    """Merge cap: at most this many samples of the dataset in the merged output."""


class PrepareConfig(_C):
    long_prompt_tokens: int = 4096
    """Prompts at least this long go to the long partition (when a dataset's partition is auto)."""
    multi_turn: Literal["last", "all"] = "last"
    """``last``: regenerate the last assistant turn; ``all``: one sample per assistant turn."""
    skip_bad: bool = False
    """Skip and count malformed input lines instead of stopping (``--skip-bad``)."""
    dedupe: bool = True
    """Drop prompts whose content hash was already seen in the dataset."""
    seed: int = 0
    """Seed for drawing max_samples."""


class BudgetConfig(_C):
    max_spend_usd: float | None = None
    """Dollar budget for the run directory, hard: each request reserves its cost before it is sent (under ``token_policy: expected``: at the mean observed output length while the money left after reservations is at least the worst case of a tenth of the slots, else max_tokens × price). Spend never passes it by more than the worst case of the requests in flight (strict: never)."""
    token_budget: int | None = None
    """Default per-dataset completion-token budget."""
    token_policy: Literal["strict", "expected"] = "expected"
    """What a request reserves against its dataset's token budget. ``strict``: ``max_tokens``; a request is admitted only if done + reserved + max_tokens <= budget, so the budget is never passed (a 10M budget at max_tokens 10,240 holds at most 976 requests in flight). ``expected``: the running p90 of the completion lengths seen for that dataset and partition (``max_tokens`` until 20 responses are in); admission stops when done + reserved reaches the budget, so the overshoot is at most what was in flight beyond its reservations (≤ concurrency × max_tokens) and is reported."""
    allow_unpriced: bool = False
    """Run with ``max_spend_usd`` even when neither ``usage.cost`` nor the model's prices are known (the dollar budget then cannot be enforced)."""


class RetryConfig(_C):
    """Retries, backoff and shutdown."""

    max_attempts: int = 6
    """Attempts per sample in one run before it is recorded as a failure (retried on the next run)."""
    base_delay_s: float = 0.5
    """First backoff delay; full jitter is applied; ``Retry-After`` wins when given."""
    multiplier: float = 2.0
    """Backoff growth per attempt."""
    max_delay_s: float = 60.0
    """Longest single backoff wait."""
    adaptive_concurrency: bool = True
    """Shrink the requests in flight during 429 storms and grow back after."""
    shutdown_grace_s: float = 30.0
    """On SIGINT/SIGTERM, how long in-flight requests may finish before the run stops."""


class AuditConfig(_C):
    """The audit's reference ids and the thresholds that make ``draftgen audit`` exit non-zero."""

    reference: str | None = None
    """Reference ids (emulator ground truth or exact-id records) for the BPE audit."""
    max_structural_failure_rate: float | None = 0.0
    """Largest share of records allowed to fail a structural check (null: no limit)."""
    max_billing_disagreement: float | None = 0.005
    """Aggregate |rebuilt - billed| / billed completion tokens allowed over the rows merge keeps, after the exclusions (the reference run: 0.0004; null: no limit)."""
    max_semantic_mismatch_rate: float | None = 0.0
    """Largest share of the compared rows merge keeps whose decoded text differs from the reference (null: no limit)."""
    max_tokenization_mismatch_rate: float | None = None
    """Largest share of compared records with the same text but other ids (BPE drift)."""


class MergeConfig(_C):
    """How ``merge`` builds merged/ from the raw responses."""

    max_seq_len: int = 8192
    """Cap on prompt + completion tokens per sample; longer samples are cut (``overflow``)."""
    overflow: Literal["truncate", "drop"] = "truncate"
    """Over ``max_seq_len``: keep the first ``max_seq_len`` tokens, or drop the sample."""
    drop_truncated: bool = False
    """Drop samples whose generation hit max_tokens (finish_reason ``length``)."""
    drop_audit_failed: bool = True
    """Drop samples listed in audit/audit.json ``failed_sample_ids`` (skipped when there is no audit)."""
    min_tokens: int = 0
    """Drop samples with fewer completion tokens than this."""
    max_tokens: int | None = None
    """Drop samples with more completion tokens than this (before the ``max_seq_len`` cap)."""
    dedupe: bool = True
    """Keep one sample per ``dedupe_key`` across all datasets (the first dataset in config order wins)."""
    dedupe_key: Literal["prompt", "sequence"] = "prompt"
    """What counts as a duplicate: the same prompt (content hash), or the same prompt + completion ids."""
    seed: int = 0
    """Seed of the weight/cap draw, the shuffle and the train/validation split."""
    val_fraction: float = 0.0
    """Share of distinct samples put in the validation split."""
    mask_reasoning: bool = False
    """loss_mask 0 over the reasoning tokens (through the end-of-think marker) as well as the prompt."""
    exports: list[str] = msgspec.field(default_factory=lambda: ["speculators", "specforge"])
    """Peer formats written to exports/<format>/ beside merged/, each one of those registered in ``draftgen.export.EXPORTERS``."""


class QualityConfig(_C):
    """What counts as a usable response, and what happens to a provider that keeps failing."""

    keep_unusable: bool = False
    """Keep responses still unusable after ``retry.max_attempts`` (dropped reasoning, an excluded provider or quantization) as records flagged ``unusable:<reason>``, and merge them; by default they are failures, never merged."""
    provider_window: int = 20
    """Outcomes per provider (the most recent) that its health is judged on."""
    provider_min_outcomes: int = 5
    """A provider is judged only once it has this many outcomes in the window."""
    provider_max_failure_rate: float = 0.5
    """Share of bad outcomes (errors, dropped reasoning, billing far off) that sends a provider to the cool-down."""
    provider_cooldown_s: float = 300.0
    """How long a failing provider stays on the run's ignore list."""
    billing_tolerance: float = 0.05
    """A response whose rebuilt completion length differs from the billed one by more than this share is billed far off."""


class PlanConfig(_C):
    """What ``draftgen plan`` bases its estimates on."""

    pilot: int = 0
    """Prompts per dataset to send as a pilot; their responses are kept and reused by the run."""
    avg_output_tokens: int | None = None
    """Used when there is no pilot."""
    avg_latency_s: float | None = None
    """Mean request latency assumed for the time estimate when there is no pilot."""
    confirm_above_usd: float = 1.0
    """``draftgen run`` prints the plan first; when its expected cost (USD) is over this, it asks before
    generating (on a terminal; without one it refuses unless ``--yes``). Backends that cost nothing (the
    emulator, self-hosted servers) and costs that are not known never ask."""


class ProbeConfig(_C):
    """The one request ``draftgen probe`` sends."""

    prompt: str = "In one short paragraph, why is the sky blue?"
    """The probe's user prompt."""
    max_tokens: int | None = None
    """The probe's max_tokens; unset: 4096 when ``model.thinking`` is on (room for a short reasoning to
    finish and the answer to follow), else 512. A thinking model cut inside its reasoning is not a warning:
    the probe says so on one neutral line, with how to raise this."""


class RunConfig(_C):
    datasets: list[DatasetConfig]
    run_dir: str = "runs/default"
    """Where every phase reads and writes (relative to the config file)."""
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    endpoint: EndpointConfig = msgspec.field(default_factory=EndpointConfig)
    routing: RoutingConfig = msgspec.field(default_factory=RoutingConfig)
    reasoning: ReasoningConfig = msgspec.field(default_factory=ReasoningConfig)
    sampling: SamplingConfig = msgspec.field(default_factory=SamplingConfig)
    partitions: PartitionsConfig = msgspec.field(default_factory=PartitionsConfig)
    prepare: PrepareConfig = msgspec.field(default_factory=PrepareConfig)
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    audit: AuditConfig = msgspec.field(default_factory=AuditConfig)
    merge: MergeConfig = msgspec.field(default_factory=MergeConfig)
    quality: QualityConfig = msgspec.field(default_factory=QualityConfig)
    hidden_states: HiddenStatesConfig = msgspec.field(default_factory=HiddenStatesConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    accept: AcceptConfig = msgspec.field(default_factory=AcceptConfig)
    plan: PlanConfig = msgspec.field(default_factory=PlanConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    progress: Literal["auto", "rich", "plain", "off"] = "auto"
    """Live display: ``auto`` (rich on a TTY, plain lines otherwise), ``rich``, ``plain`` or ``off``."""
    #: folder of the config file; relative paths resolve from here (not part of the file)
    base_dir: str = ""

    def path(self, p: str) -> Path:
        """Resolve a path from the config file's folder."""
        q = Path(p).expanduser()
        return q if q.is_absolute() else Path(self.base_dir or ".") / q

    @property
    def run_path(self) -> Path:
        return self.path(self.run_dir)

    def dataset(self, name: str) -> DatasetConfig:
        for d in self.datasets:
            if d.name == name:
                return d
        raise ConfigError(f"no dataset named {name!r}; datasets: {', '.join(d.name for d in self.datasets)}")


_PATH_RE = re.compile(r"\$\.?(.*)`?$")


_HIDDEN_KEYS = frozenset({"base_dir"})  # set by the loader, never by the file


def _unwrap(tp: Any) -> Any:
    """The Struct (or Literal) inside ``X | None`` and ``list[X]``; other types unchanged."""
    while True:
        origin = typing.get_origin(tp)
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if (origin is list and args) or (origin in (typing.Union, types.UnionType) and len(args) == 1):
            tp = args[0]
        else:
            return tp


def _type_at(key: str) -> Any:
    """The declared type at a dotted key path of the config (``datasets[0].format`` → its Literal), or None
    when the path leaves the typed structure (a free-form mapping, an unknown key)."""
    tp: Any = RunConfig
    for part in filter(None, re.sub(r"\[\d+\]", "", key).split(".")):
        tp = _unwrap(tp)
        if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
            return None
        field = next((f for f in msgspec.structs.fields(tp) if f.name == part), None)
        if field is None:
            return None
        tp = field.type
    return _unwrap(tp)


def _valid_keys(section: str) -> list[str]:
    tp = _type_at(section)
    if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
        return []
    return [f.name for f in msgspec.structs.fields(tp) if f.name not in _HIDDEN_KEYS]


def _literal_values(key: str) -> list[str]:
    tp = _type_at(key)
    if typing.get_origin(tp) is Literal:
        return [str(v) for v in typing.get_args(tp)]
    return []


def _explain(exc: msgspec.ValidationError, where: str) -> ConfigError:
    """One line from msgspec's validation error: the key path, and what to write instead. An unknown key gets
    the nearest valid key of its section ("did you mean"), a bad enum value the list of valid values."""
    msg = str(exc)
    m = re.search(r"- at `\$(.*)`", msg)
    key = m.group(1).lstrip(".") if m else ""
    head = msg.split(" - at ")[0]
    unknown = re.match(r"Object contains unknown field `(.+)`", head)
    if unknown:
        name = unknown.group(1)
        field_path = f"{key}.{name}" if key else name
        valid = _valid_keys(key)
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if close:
            return ConfigError(f"{where}: unknown key {field_path!r} (did you mean {close[0]!r}?); "
                               "see docs/config.md")
        listed = f"; valid keys{' in ' + repr(key) if key else ''}: {', '.join(valid)}" if valid else ""
        return ConfigError(f"{where}: unknown key {field_path!r}; check the spelling{listed} (see docs/config.md)")
    if head.startswith("Invalid enum value"):
        values = _literal_values(key)
        if values:
            return ConfigError(f"{where}: {head}" + (f" at {key!r}" if key else "")
                               + f"; valid values: {', '.join(values)}")
    return ConfigError(f"{where}: {head}" + (f" at {key!r}" if key else "") + "; see docs/config.md")


def _validate(cfg: RunConfig, where: str) -> None:
    names = [d.name for d in cfg.datasets]
    if not names:
        raise ConfigError(f"{where}: 'datasets' is empty; list at least one dataset")
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"{where}: dataset name {sorted(dup)[0]!r} is used twice; names must be unique")
    for i, d in enumerate(cfg.datasets):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", d.name):
            raise ConfigError(f"{where}: datasets[{i}].name {d.name!r} must be a plain name: a letter or digit, "
                              "then letters, digits, '_', '-', '.' (it names a folder of the run directory)")
        if (d.path is None) == (d.hf is None):
            raise ConfigError(f"{where}: datasets[{i}] ({d.name}) needs exactly one of 'path' or 'hf'")
    for part in ("short", "long"):
        p = getattr(cfg.partitions, part)
        if p.concurrency < 1 or p.max_tokens < 1:
            raise ConfigError(f"{where}: partitions.{part} concurrency and max_tokens must be >= 1")
    if cfg.budget.max_spend_usd is not None and cfg.budget.max_spend_usd < 0:
        raise ConfigError(f"{where}: budget.max_spend_usd must be >= 0")
    if cfg.retry.max_attempts < 1:
        raise ConfigError(f"{where}: retry.max_attempts must be >= 1")
    for k, v in (cfg.routing.max_price or {}).items():
        try:
            price = float(v)
        except ValueError:
            raise ConfigError(f"{where}: routing.max_price.{k} {v!r} is not a number (USD per million tokens)") from None
        if not price >= 0:
            raise ConfigError(f"{where}: routing.max_price.{k} must be >= 0 (USD per million tokens)")
    if not 0.0 <= cfg.merge.val_fraction < 1.0:
        raise ConfigError(f"{where}: merge.val_fraction must be in [0, 1)")
    _validate_no_key(cfg, where)


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _validate_no_key(cfg: RunConfig, where: str) -> None:
    """No API key where a variable name, a path or a URL belongs (nor anywhere else in the config), so a
    key pasted by mistake is refused at load time, before anything is written. Messages never echo it."""
    from .secrets import contains_key, looks_like_key, url_credentials

    ep = cfg.endpoint
    how = f"set {ep.api_key_env} to the key, or pass --api-key-file PATH (a file holding only the key)"
    for name in ("api_key_env", "management_key_env"):
        value = getattr(ep, name)
        if value is None:
            continue
        if looks_like_key(value) or contains_key(value):
            raise ConfigError(f"{where}: endpoint.{name} looks like an API key; it takes the NAME of an environment "
                              "variable (e.g. OPENROUTER_API_KEY) that holds the key: export the key in that "
                              "variable, or pass --api-key-file PATH (a file holding only the key)")
        if not _ENV_NAME_RE.fullmatch(value):
            raise ConfigError(f"{where}: endpoint.{name} must be the name of an environment variable "
                              "(letters, digits and '_', e.g. OPENROUTER_API_KEY)")
    if ep.api_key_file:
        value = ep.api_key_file.strip()
        parts = [value, *Path(value).parts]
        if any(looks_like_key(p) or contains_key(p) for p in parts) and not cfg.path(value).is_file():
            raise ConfigError(f"{where}: endpoint.api_key_file (--api-key-file) looks like an API key, not a path; "
                              f"never pass the key itself: write it to a file holding only the key and pass "
                              f"--api-key-file with that file's path, or set {ep.api_key_env} to the key")
    urls = [("endpoint.base_url", ep.base_url)] + [(f"endpoint.base_urls[{i}]", u) for i, u in enumerate(ep.base_urls)]
    for name, url in urls:
        what = url_credentials(url) if url else None
        if what:
            flag = " (--base-url)" if name == "endpoint.base_url" else ""
            raise ConfigError(f"{where}: {name}{flag} holds {what}; credentials never go in the URL: "
                              f"give the bare API root (e.g. https://openrouter.ai/api/v1) and {how}")

    def walk(obj: Any, key: str) -> None:
        if isinstance(obj, str):
            if contains_key(obj):
                raise ConfigError(f"{where}: {key or 'the config'} holds what looks like an API key; keys never "
                                  f"go in the config: {how}")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(str(k), key)
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{key}[{i}]")

    walk({k: v for k, v in msgspec.to_builtins(cfg).items() if k != "base_dir"}, "")


def config_from_mapping(data: Any, *, where: str, base_dir: Path) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the config must be a YAML mapping of keys to values")
    data = dict(data)
    ep = data.get("endpoint")
    if isinstance(ep, str):
        data["endpoint"] = {"kind": ep}
    if data.get("progress") is False:  # YAML reads a bare `off` as false
        data["progress"] = "off"
    data["base_dir"] = str(base_dir)
    parts = data.get("partitions")
    if isinstance(parts, dict):
        # A partially given partition (e.g. only a flag's concurrency) keeps the other default.
        parts = dict(parts)
        for name, default in _PARTITION_DEFAULTS.items():
            if isinstance(parts.get(name), dict):
                parts[name] = {**default, **parts[name]}
        data["partitions"] = parts
    try:
        cfg = msgspec.convert(data, type=RunConfig, str_keys=True)
    except msgspec.ValidationError as exc:
        raise _explain(exc, where) from None
    _validate(cfg, where)
    return cfg


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read and validate a YAML config; ``overrides`` are dotted keys → values from CLI flags."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; save the config as UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a folder; give the path of a YAML config file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{p}{loc}: {problem}; fix the YAML syntax") from None
    if data is None:
        raise ConfigError(f"{p}: the config file is empty")
    if overrides:
        data = apply_overrides(data, overrides, where=str(p))
    return config_from_mapping(data, where=str(p), base_dir=p.resolve().parent)


def apply_overrides(data: Any, overrides: dict[str, Any], *, where: str) -> Any:
    """Set dotted keys (``partitions.short.concurrency``) in the raw mapping; None values are skipped."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the config must be a YAML mapping of keys to values")
    data = dict(data)
    if isinstance(data.get("endpoint"), str):
        data["endpoint"] = {"kind": data["endpoint"]}
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[parts[-1]] = value
    return data


def config_hash(cfg: RunConfig) -> str:
    """Hash of what decides the content of a run's outputs (model, prompts, sampling), not of knobs
    like concurrency or budgets, so a resumed run may change those freely."""
    keyed = {
        "model": msgspec.to_builtins(cfg.model),
        "reasoning": msgspec.to_builtins(cfg.reasoning),
        "sampling": msgspec.to_builtins(cfg.sampling),
        "datasets": [{"name": d.name, "path": d.path, "hf": d.hf, "format": d.format} for d in cfg.datasets],
    }
    return hashlib.sha256(msgspec.json.encode(keyed, order="sorted")).hexdigest()[:16]


def resolve_api_key(cfg: RunConfig, *, required: bool = True) -> str | None:
    """The API key from ``endpoint.api_key_file`` or the environment variable. Never logged."""
    from .secrets import redact

    ep = cfg.endpoint
    if ep.api_key_file:
        path = cfg.path(ep.api_key_file)
        shown = redact(str(path))
        if shown != str(path) and not path.is_file():
            raise ConfigError("--api-key-file (endpoint.api_key_file) looks like an API key, not a path; write the "
                              "key to a file holding only the key and pass that file's path, "
                              f"or set {ep.api_key_env} to the key")
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise ConfigError(f"{shown}: cannot read the API key file; check the path and permissions") from None
        if not key:
            raise ConfigError(f"{shown}: the API key file is empty")
        if len(key.split()) > 1:
            raise ConfigError(f"{shown}: the API key file must hold only the key (one line, nothing else)")
        return key
    key = os.environ.get(ep.api_key_env, "").strip()
    if key:
        return key
    if required:
        raise ConfigError(
            f"no API key: set {ep.api_key_env} or pass --api-key-file PATH (a file holding only the key)"
        )
    return None
