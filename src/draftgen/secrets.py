"""API keys: recognise them, and remove them from anything draftgen prints or writes.

A key reaches draftgen only through the environment variable named by ``endpoint.api_key_env`` or a key
file (``endpoint.api_key_file`` / ``--api-key-file``). Everything else (messages, logs, run.json, the
report, ``status``) passes through ``redact`` / ``redact_obj`` (a command line: ``scrub_argv``, which also
hides the value after a key flag), and config values and argv that look like a key are refused with
``looks_like_key`` before anything is written.

What counts as a key:

- OpenRouter ``sk-or-…`` (``sk-or-v1-…``), Anthropic ``sk-ant-…``, OpenAI ``sk-proj-…`` / ``sk-svcacct-…`` /
  ``sk-admin-…``: any token with one of these prefixes;
- other ``sk-`` tokens with 20+ characters after ``sk-`` and a long random-looking run (OpenAI legacy
  ``sk-`` + 48 characters, DeepSeek ``sk-`` + 32 hex, …);
- the token after ``Bearer``;
- in URLs, the ``user:password@`` part and the values of query parameters such as ``key``, ``api_key``,
  ``token``, ``secret``, ``password``, ``sig``.

Storage (fsspec / S3) credentials have no shape to recognise, so ``storage_credentials`` refuses them by
name: an option such as ``key``, ``secret``, ``token``, ``password``, ``aws_secret_access_key`` (also
nested, e.g. under ``client_kwargs``), and any ``user:password@`` part in the URL or in an option's value.

Paths, model slugs (``moonshotai/kimi-k2.5``), sample ids (``dataset-<16 hex>``), sha256 hex strings and
environment variable names are not keys.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

__all__ = [
    "REDACTED",
    "STORAGE_CREDENTIALS_FIX",
    "contains_key",
    "looks_like_key",
    "redact",
    "redact_obj",
    "scrub_argv",
    "storage_credentials",
    "url_credentials",
]

REDACTED = "…[redacted]"

#: prefixes that only API keys carry
_KEY_PREFIXES = ("sk-or-", "sk-ant-", "sk-proj-", "sk-svcacct-", "sk-admin-")
_TOKEN_CHARS = r"A-Za-z0-9_\-"
_SK_RE = re.compile(rf"(?<![A-Za-z0-9])sk-[{_TOKEN_CHARS}]+")
_BEARER_RE = re.compile(r"\b([Bb]earer\s+)([A-Za-z0-9._~+/=\-]+)")
#: the user:password@ part of a URL (any userinfo: a token alone is a credential too)
_USERINFO_RE = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)([^/\s@\"'<>\\]+)@")
#: names of query parameters that carry credentials
_SECRET_PARAMS = ("key", "api_key", "apikey", "api-key", "access_key", "token", "access_token", "auth",
                  "auth_token", "secret", "client_secret", "password", "passwd", "pwd", "sig", "signature",
                  "x-api-key")
_QUERY_RE = re.compile(rf"([?&](?:{'|'.join(re.escape(p) for p in _SECRET_PARAMS)})=)([^&\s#\"'<>\\]+)",
                       re.IGNORECASE)


def _entropy(s: str) -> float:
    """Shannon entropy of ``s`` in bits per character."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def _random_run(body: str) -> bool:
    """Whether ``body`` (what follows ``sk-``) holds a long random-looking run, as generated keys do."""
    for run in re.findall(r"[A-Za-z0-9]+", body):
        if len(run) >= 20:
            return True
        if len(run) >= 12 and re.search(r"[0-9]", run) and re.search(r"[A-Za-z]", run) and _entropy(run) >= 3.0:
            return True
    return False


def looks_like_key(value: str) -> bool:
    """Whether ``value`` (surrounding whitespace and quotes aside) is itself an API key or bearer token."""
    v = value.strip().strip("'\"").strip()
    if v.lower().startswith("bearer "):
        v = v[7:].strip()
    if not v.startswith("sk-") or not re.fullmatch(rf"[{_TOKEN_CHARS}]+", v):
        return False
    if v.startswith(_KEY_PREFIXES):
        return len(v) > max(len(p) for p in _KEY_PREFIXES if v.startswith(p))
    body = v[3:]
    return len(body) >= 20 and _random_run(body)


def contains_key(text: str) -> bool:
    """Whether ``text`` holds an API key anywhere in it (``sk-…`` shapes only: prose about "Bearer tokens"
    or URLs with query strings is not flagged; use ``redact`` to scrub those)."""
    return "sk-" in text and any(looks_like_key(m.group(0)) for m in _SK_RE.finditer(text))


def _sk_sub(m: re.Match[str]) -> str:
    token = m.group(0)
    if not looks_like_key(token):
        return token
    prefix = next((p for p in _KEY_PREFIXES if token.startswith(p)), "sk-")
    if prefix == "sk-or-" and token.startswith("sk-or-v1-"):
        prefix = "sk-or-v1-"
    return prefix + REDACTED


def redact(text: str) -> str:
    """``text`` with anything shaped like an API key, bearer token or URL credential replaced by
    ``…[redacted]`` (a key keeps its kind: ``sk-or-v1-…[redacted]``). Everything else is unchanged."""
    if not text:
        return text
    out = _BEARER_RE.sub(lambda m: m.group(1) + REDACTED, text) if "earer" in text else text
    if "sk-" in out:
        out = _SK_RE.sub(_sk_sub, out)
    if "@" in out:
        out = _USERINFO_RE.sub(lambda m: m.group(1) + REDACTED + "@", out)
    if "=" in out:
        out = _QUERY_RE.sub(lambda m: m.group(1) + REDACTED, out)
    return out


def redact_obj(obj: Any) -> Any:
    """A copy of ``obj`` (nested dicts, lists and tuples) with every string passed through ``redact``,
    keys included; other values are returned as they are."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_obj(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact_obj(v) for v in obj)
    return obj


def url_credentials(url: str) -> str | None:
    """What in ``url`` is a credential (``"a user:password@ part"``, ``"a 'key=' query parameter"``,
    ``"an API key"``), or None when it holds none. Never returns the credential itself."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(url.strip())
    except ValueError:
        parts = None
    if "@" in (parts.netloc if parts is not None else "") or _USERINFO_RE.search(url):
        return "a user:password@ part"
    if parts is not None and parts.query:
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name.lower() in _SECRET_PARAMS:
                return f"a '{name.lower()}=' query parameter"
            if looks_like_key(value):
                return "an API key in its query string"
    if _QUERY_RE.search(url):
        return "a credential query parameter"
    if redact(url) != url:
        return "an API key"
    return None


#: where storage credentials come from instead of the config (what the refusal tells the user to do)
STORAGE_CREDENTIALS_FIX = ("credentials come from the environment: export AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or set AWS_PROFILE to a profile in "
                           "~/.aws/credentials")
#: option names (lower case, '-' as '_') that are a credential whatever their value
_CREDENTIAL_NAMES = frozenset({"key", "secret", "token", "password", "passwd", "pwd", "auth", "sig",
                               "signature", "credentials", "connection_string", "sas", "sas_token"})
#: ``_``-separated words of an option name that make it a credential (``aws_session_token``, ``client_secret``)
_CREDENTIAL_WORDS = frozenset({"secret", "token", "password", "passwd", "credential", "credentials"})
#: parts of an option name that make it a credential (``aws_access_key_id``, ``sse_customer_key``)
_CREDENTIAL_PARTS = ("access_key", "account_key", "private_key", "api_key", "apikey", "customer_key")


def _credential_name(name: str) -> bool:
    n = name.strip().lower().replace("-", "_")
    return (n in _CREDENTIAL_NAMES or bool(_CREDENTIAL_WORDS.intersection(n.split("_")))
            or n.endswith("_key") or any(p in n for p in _CREDENTIAL_PARTS))


def _option_credential(obj: Any, key: str) -> tuple[str, str] | None:
    """(key path, what) of the first credential in ``obj`` (nested mappings and lists), or None."""
    if isinstance(obj, str):
        what = url_credentials(obj) if ("://" in obj or "@" in obj or "=" in obj) else None
        if what is None and contains_key(obj):
            what = "an API key"
        return (key, f"holds {what}") if what else None
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{key}.{k}"
            if _credential_name(str(k)) and v not in (None, "", False):
                return path, "is a credential"
            found = _option_credential(v, path)
            if found:
                return found
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            found = _option_credential(v, f"{key}[{i}]")
            if found:
                return found
    return None


def storage_credentials(url: str | None, options: Any, *, url_key: str, options_key: str) -> str | None:
    """Why a storage destination (an fsspec ``url`` and its ``options``) holds a credential, as the tail of a
    one-line message naming the key path and the fix (``"hidden_states.storage_options.key is a credential;
    ..."``), or None when it holds none. Never contains the credential itself."""
    what = url_credentials(url) if url and "://" in url else None
    found = (url_key, f"holds {what}") if what else _option_credential(options or {}, options_key)
    if found is None:
        return None
    path, how = found
    fix = "give the URL without it (e.g. http://host:9000)" if how.startswith("holds") else "remove it"
    return f"{path} {how}; credentials never go in the config: {fix}; {STORAGE_CREDENTIALS_FIX}"


_SECRET_FLAGS = ("--api-key", "--management-key", "--key", "--token", "--password")


def scrub_argv(argv: list[str]) -> list[str]:
    """argv without secrets: the value after ``--api-key*``/``--*key``/``--token`` flags is replaced, and
    anything else that looks like a key is redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        low = arg.lower()
        flag, eq, _ = low.partition("=")
        secret = flag.startswith("--") and (flag.startswith(_SECRET_FLAGS) or flag.endswith(("-key", "_key", "token")))
        if secret and eq:
            out.append(arg.split("=", 1)[0] + "=***")
        elif secret:
            out.append(arg)
            hide_next = True
        else:
            out.append(redact(arg))
    return out
