"""Loading a run configuration: a YAML file plus CLI flag overrides, checked.

Unknown keys, wrong types and bad values are a ``ConfigError`` naming the file and the key path
(``datasets[1].formt``) and what to do, with the nearest key suggested. Relative paths in the file resolve
from the file's folder. Also ``config_hash`` and ``resolve_api_key`` (a key from an environment variable or a
key file, never from the config). Reads the YAML file and, for the key, a key file."""

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

from draftgen.config.generate import PARTITION_DEFAULTS
from draftgen.config.run import RunConfig
from draftgen.errors import ConfigError

_PATH_RE = re.compile(r"\$\.?(.*)`?$")


_HIDDEN_KEYS = frozenset({"base_dir"})  # set by the loader, never by the file


class _YamlLoader(yaml.SafeLoader):
    """YAML's safe loader, reading ``1e-4`` as the float it means (YAML 1.1 wants a dot: ``1.0e-4``)."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """Parse YAML text as draftgen reads every YAML file (configs, scenarios): safely, with ``1e-4`` a float.
    Raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=_YamlLoader)


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


def _literal_values(key: str, in_key: bool = False) -> list[str]:
    """The values a Literal at ``key`` allows (``in_key``: the Literal keys of the mapping at ``key``)."""
    tp = _type_at(key)
    if in_key and typing.get_origin(tp) is dict:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is Literal:
        return [str(v) for v in typing.get_args(tp)]
    return []


def _explain(exc: msgspec.ValidationError, where: str) -> ConfigError:
    """One line from msgspec's validation error: the key path, and what to write instead. An unknown key gets
    the nearest valid key of its section ("did you mean"), a bad enum value the list of valid values."""
    msg = str(exc)
    m = re.search(r"- at (`key` in )?`\$(.*)`", msg)
    key = m.group(2).lstrip(".") if m else ""
    in_key = bool(m and m.group(1))
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
        values = _literal_values(key, in_key)
        if values:
            bad = re.search(r"'(.*)'", head)
            close = difflib.get_close_matches(bad.group(1), values, n=1, cutoff=0.6) if bad else []
            mean = f" (did you mean {close[0]!r}?)" if close else ""
            what = f" among the keys of {key!r}" if in_key else (f" at {key!r}" if key else "")
            return ConfigError(f"{where}: {head}{what}{mean}; valid values: {', '.join(values)}")
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
        for name in ("concurrency", "max_tokens"):
            if getattr(p, name) < 1:
                raise ConfigError(f"{where}: partitions.{part}.{name} {getattr(p, name)} must be >= 1")
    if cfg.budget.max_spend_usd is not None and not cfg.budget.max_spend_usd >= 0:
        raise ConfigError(f"{where}: budget.max_spend_usd {cfg.budget.max_spend_usd} must be >= 0 (USD)")
    budgets = [("budget.token_budget", cfg.budget.token_budget)] + [
        (f"datasets[{i}].token_budget", d.token_budget) for i, d in enumerate(cfg.datasets)]
    for key, value in budgets:
        if value is not None and value < 0:
            raise ConfigError(f"{where}: {key} {value} must be >= 0 (completion tokens)")
    for i, d in enumerate(cfg.datasets):
        if not d.traffic >= 0:
            raise ConfigError(f"{where}: datasets[{i}].traffic {d.traffic} must be >= 0 (its weight in the "
                              "served traffic; 1 on every dataset: equal shares)")
    if not 0 < cfg.plan.round_alpha <= 2:
        raise ConfigError(f"{where}: plan.round_alpha {cfg.plan.round_alpha} must be in (0, 2]")
    if cfg.plan.pilot < 0:
        raise ConfigError(f"{where}: plan.pilot {cfg.plan.pilot} must be >= 0 (prompts per dataset)")
    if cfg.hidden_states.workers < 1:
        raise ConfigError(f"{where}: hidden_states.workers {cfg.hidden_states.workers} must be >= 1")
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
    _validate_generation(cfg, where)
    _validate_no_key(cfg, where)


def _validate_generation(cfg: RunConfig, where: str) -> None:
    """The ranges OpenRouter's API reference documents for the sampling and reasoning settings (a request
    outside them fails with HTTP 400 on every sample): refused at load, naming the key and the range."""
    s, r = cfg.sampling, cfg.reasoning
    ranges = (("sampling.temperature", s.temperature, 0.0, 2.0, "[0, 2]", True),
              ("sampling.top_p", s.top_p, 0.0, 1.0, "(0, 1]", False),
              ("sampling.top_logprobs", s.top_logprobs, 0, 20, "0 to 20", True))
    for key, value, lo, hi, shown, lo_ok in ranges:
        if value is not None and not ((lo <= value if lo_ok else lo < value) and value <= hi):
            raise ConfigError(f"{where}: {key} {value!r} is out of range; OpenRouter accepts {shown}")
    if s.stop is not None and len(s.stop) > 4:
        raise ConfigError(f"{where}: sampling.stop has {len(s.stop)} strings; OpenRouter accepts up to 4")
    if s.top_logprobs is not None and not s.logprobs:
        raise ConfigError(f"{where}: sampling.top_logprobs needs sampling.logprobs: true")
    if r.max_tokens is not None and r.max_tokens < 0:
        raise ConfigError(f"{where}: reasoning.max_tokens must be >= 0 (a thinking budget in tokens)")
    if r.effort is not None and r.max_tokens is not None:
        raise ConfigError(f"{where}: reasoning.effort and reasoning.max_tokens are both set; OpenRouter takes one "
                          "of them: keep the effort or the token budget")


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _validate_no_key(cfg: RunConfig, where: str) -> None:
    """No API key where a variable name, a path or a URL belongs (nor anywhere else in the config), so a
    key pasted by mistake is refused at load time, before anything is written. Messages never echo it."""
    from draftgen.secrets import contains_key, looks_like_key, url_credentials

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

    _validate_no_storage_credentials(cfg, where)

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


def _validate_no_storage_credentials(cfg: RunConfig, where: str) -> None:
    """No storage credential in the hidden-state destination (``hidden_states.output`` and its
    ``storage_options``) nor in ``train.hidden``: refused by key path, the value never echoed."""
    from draftgen.secrets import storage_credentials

    hs = cfg.hidden_states
    for url, url_key, opts in ((hs.output, "hidden_states.output", hs.storage_options),
                               (cfg.train.hidden, "train.hidden", None)):
        why = storage_credentials(url, opts, url_key=url_key, options_key="hidden_states.storage_options")
        if why:
            raise ConfigError(f"{where}: {why}")


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
    routing = data.get("routing")
    if isinstance(routing, dict) and isinstance(routing.get("quantizations"), list):
        # quantization names are compared case-insensitively (OpenRouter lists them in lower case)
        data["routing"] = {**routing, "quantizations": [q.lower() if isinstance(q, str) else q
                                                         for q in routing["quantizations"]]}
    parts = data.get("partitions")
    if isinstance(parts, dict):
        # A partially given partition (e.g. only a flag's concurrency) keeps the other default.
        parts = dict(parts)
        for name, default in PARTITION_DEFAULTS.items():
            if isinstance(parts.get(name), dict):
                parts[name] = {**default, **parts[name]}
        data["partitions"] = parts
    try:
        cfg = msgspec.convert(data, type=RunConfig, str_keys=True)
    except msgspec.ValidationError as exc:
        raise _explain(exc, where) from None
    _validate(cfg, where)
    return cfg


def load_config(path: str | Path, overrides: dict[str, Any] | None = None, *,
                flags: dict[str, str] | None = None) -> RunConfig:
    """Read and validate a YAML config; ``overrides`` are dotted keys → values from CLI flags, ``flags`` the
    flag that sets each key (``{"budget.max_spend_usd": "--max-spend"}``): a value a flag set that the checks
    refuse is blamed on the flag, not on the file."""
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
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{p}{loc}: {problem}; fix the YAML syntax") from None
    if data is None:
        raise ConfigError(f"{p}: the config file is empty")
    base_dir = p.resolve().parent
    if not overrides:
        return config_from_mapping(data, where=str(p), base_dir=base_dir)
    try:
        return config_from_mapping(apply_overrides(data, overrides, where=str(p)), where=str(p), base_dir=base_dir)
    except ConfigError as exc:
        raise _blame(exc, data, overrides, flags or {}, str(p), base_dir) from None


def _blame(exc: ConfigError, data: Any, overrides: dict[str, Any], flags: dict[str, str], where: str,
           base_dir: Path) -> ConfigError:
    """``exc`` (the file with the flags over it refused) blamed on the flag that set the refused value, when
    the file alone with that flag gives the same refusal and the file alone does not; else ``exc``."""
    message = str(exc)
    try:
        config_from_mapping(data, where=where, base_dir=base_dir)
    except ConfigError as own:
        if str(own) == message:
            return exc  # the file's own value
    for key, value in overrides.items():
        if value is None:
            continue
        try:
            config_from_mapping(apply_overrides(data, {key: value}, where=where), where=where, base_dir=base_dir)
        except ConfigError as one:
            if str(one) == message:
                flag = flags.get(key, key)
                # a number is echoed; a string never is (a key given where a path or URL belongs must not be)
                shown = f" {value}" if isinstance(value, int | float) else ""
                rest = message[len(where) + 2:] if message.startswith(f"{where}: ") else message
                return ConfigError(f"{flag}{shown}: {rest} (the flag sets {key}, over the config file {where})")
    return exc


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


#: a key file written as a shell line: ``NAME=value`` or ``export NAME=value``
_SHELL_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*[\"']?")


def resolve_api_key(cfg: RunConfig, *, required: bool = True) -> str | None:
    """The API key from ``endpoint.api_key_file`` or the environment variable. Never logged."""
    from draftgen.secrets import redact

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
        assignment = _SHELL_ASSIGNMENT.match(key)
        if assignment:
            raise ConfigError(f"{shown}: holds a shell assignment ({assignment.group(1)}=…); the API key file must "
                              f"hold only the key: remove '{assignment.group(1)}=' (and any 'export' or quotes)")
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
