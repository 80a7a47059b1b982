"""A corpus of bad inputs, each run through the real CLI (``python -m draftgen.cli`` in a subprocess).

Every case must end with a non-zero exit, no traceback, and exactly one line on stderr, ``Error: …``,
that names the problem (each case lists words the line must contain). The corpus is generated here
rather than stored, so that a 20 MB line and non-UTF-8 bytes need no files in the repository.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from _common_helpers import ASSETS

from ._helpers import FAKE_KEY, base_config, cli_env, error_lines, run_cli, write_prompts

Files = dict[str, bytes | str]


@dataclass
class Case:
    id: str
    expect: tuple[str, ...]
    command: str = "prepare"
    config: dict[str, Any] | str | bytes | None = None  # None: the default config; str/bytes: raw file text
    patch: Callable[[dict[str, Any]], None] | None = None  # edits the default config
    files: Files = field(default_factory=dict)
    prompts: bytes | str | None = None  # replaces prompts.jsonl
    args: tuple[str, ...] = ()
    key: str | None = FAKE_KEY
    setup: Callable[[Path], None] | None = None
    config_name: str = "config.yaml"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def patch(cfg: dict[str, Any]) -> None:
        node = cfg
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value

    return patch


def _dataset(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def patch(cfg: dict[str, Any]) -> None:
        cfg["datasets"][0].update(changes)
        for k in [k for k, v in cfg["datasets"][0].items() if v is None]:
            del cfg["datasets"][0][k]

    return patch


def _msg(obj: Any) -> str:
    return json.dumps(obj) + "\n"


# A run marker as draftgen writes it (the config snapshot is empty: nothing to compare the config with).
_RUN_JSON = _msg({"config_hash": "0" * 16, "config": {}, "argv": ["draftgen"], "versions": {}})


GOOD = _msg({"messages": [{"role": "user", "content": "hello there"}]})
HUGE = GOOD + '{"messages": [{"role": "user", "content": "' + "x" * 20_000_000 + "\n" + GOOD


def _long_json_array(d: Path) -> None:
    """A JSON array whose second element (9 MB) is over the 8 MiB row limit, written in pieces."""
    with open(d / "prompts.json", "w", encoding="utf-8") as fh:
        fh.write("[" + GOOD.strip() + ',\n{"messages": [{"role": "user", "content": "')
        for _ in range(9):
            fh.write("x" * 1_000_000)
        fh.write('"}]}\n]\n')


def _corrupt_gzip(d: Path) -> None:
    """A gzip file whose deflate stream is damaged mid-way (zlib.error, not OSError, when read)."""
    lines = "".join(_msg({"prompt": f"p{i} " + hashlib.sha256(str(i).encode()).hexdigest()}) for i in range(5000))
    data = bytearray(gzip.compress(lines.encode(), mtime=0))
    for k in range(2000, 2100):
        data[k] ^= 0x55
    (d / "prompts.jsonl.gz").write_bytes(bytes(data))


def _write_run_json(run: Path, config_hash: str) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "run.json").write_text(json.dumps({
        "config_hash": config_hash, "config": {}, "argv": ["draftgen", "generate"], "versions": {},
    }), encoding="utf-8")


CASES = [
    # -- the config file ------------------------------------------------------------------------------
    Case("yaml_syntax", ("config.yaml", "yaml"), config="datasets: [\n  {name: a, path: p.jsonl\n"),
    Case("yaml_tab_indent", ("config.yaml", "yaml"), config="datasets:\n\t- name: a\n"),
    Case("unknown_top_key", ("unknown key", "concurency"), patch=_set("concurency", 5)),
    Case("unknown_nested_key", ("unknown key", "model.tokenzier"), patch=_set("model.tokenzier", "x")),
    Case("wrong_type", ("partitions.short.concurrency",), patch=_set("partitions.short.concurrency", "lots")),
    Case("empty_config", ("config.yaml", "empty"), config=""),
    Case("config_is_a_list", ("config.yaml", "mapping"), config="- a\n- b\n"),
    Case("config_missing", ("nope.yaml", "not found"), config_name="nope.yaml", setup=lambda d: None),
    Case("config_not_utf8", ("config.yaml", "utf-8"), config=b"run_dir: caf\xe9\ndatasets: []\n"),
    Case("datasets_empty", ("datasets", "empty"), patch=_set("datasets", [])),
    Case("dataset_name_twice", ("rel", "twice"),
         patch=lambda c: c["datasets"].append(dict(c["datasets"][0]))),
    Case("dataset_without_source", ("datasets[0]", "path"), patch=_dataset(path=None)),
    Case("dataset_bad_name", ("datasets[0].name",), patch=_dataset(name="my data")),
    Case("unknown_endpoint_kind", ("endpoint",), patch=_set("endpoint.kind", "bedrock")),
    Case("negative_spend", ("max_spend_usd",), patch=_set("budget.max_spend_usd", -1)),
    Case("bad_val_fraction", ("val_fraction",), patch=_set("merge.val_fraction", 1.5)),
    Case("unknown_format", ("format",), patch=_dataset(format="csv")),
    # -- tokenizer and profile ------------------------------------------------------------------------
    Case("unknown_profile", ("model.profile", "llama9", "not registered"), patch=_set("model.profile", "llama9")),
    Case("unknown_bundled_tokenizer", ("bundled:llama",), patch=_set("model.tokenizer", "bundled:llama")),
    Case("tokenizer_folder_missing", ("no_such_tok", "not found"), patch=_set("model.tokenizer", "no_such_tok")),
    Case("tokenizer_folder_empty", ("empty_tok", "tokenizer.json"), patch=_set("model.tokenizer", "empty_tok"),
         setup=lambda d: (d / "empty_tok").mkdir()),
    Case("tokenizer_json_corrupt", ("tokenizer.json",), patch=_set("model.tokenizer", "bad_tok"),
         files={"bad_tok/tokenizer.json": "{\"model\": {\"type\": \"BPE\", \"vocab\": "}),
    Case("tokenizer_sha_mismatch", ("sha256",), patch=_set("model.tokenizer_sha256", "0" * 64)),
    Case("tokenizer_does_not_match_model", ("tokenizer", "kimi"), patch=_set("model.profile", "kimi-k2.5")),
    Case("chat_template_missing", ("chat_template",), patch=_set("model.chat_template", "missing.jinja")),
    # -- prompt files ----------------------------------------------------------------------------------
    Case("prompts_missing", ("not found",), patch=_dataset(path="nothing_here.jsonl")),
    Case("prompts_malformed_json", ("prompts.jsonl:2", "json"), prompts=GOOD + "{\"messages\": [\n" + GOOD),
    Case("prompts_truncated_last_line", ("prompts.jsonl:2",),
         prompts=GOOD + '{"messages": [{"role": "user", "cont'),
    Case("prompts_utf16", ("prompts.jsonl",), prompts=GOOD.encode("utf-16")),
    Case("prompts_latin1", ("prompts.jsonl:2",),
         prompts=GOOD.encode() + '{"messages": [{"role": "user", "content": "café"}]}\n'.encode("latin-1")),
    Case("prompts_huge_line", ("prompts.jsonl:2",), prompts=HUGE),
    Case("prompts_missing_fields", ("prompts.jsonl:1",), prompts=_msg({"id": 1, "answer": "no prompt here"})),
    Case("messages_not_a_list", ("prompts.jsonl:1", "list"), prompts=_msg({"messages": "hi"})),
    Case("unknown_role", ("prompts.jsonl:1", "role"),
         prompts=_msg({"messages": [{"role": "wizard", "content": "hi"}]})),
    Case("content_wrong_type", ("prompts.jsonl:1", "content"),
         prompts=_msg({"messages": [{"role": "user", "content": 42}]})),
    Case("no_user_message", ("prompts.jsonl:1", "user"),
         prompts=_msg({"messages": [{"role": "system", "content": "a"}, {"role": "assistant", "content": "b"}]})),
    Case("row_is_a_number", ("prompts.jsonl:1",), prompts="12345\n"),
    Case("unsupported_file_type", ("unsupported file type",), patch=_dataset(path="prompts.csv"),
         files={"prompts.csv": "prompt\nhello\n"}),
    Case("json_array_not_closed", ("prompts.json", "not closed"), patch=_dataset(path="prompts.json"),
         files={"prompts.json": "[" + json.dumps({"messages": [{"role": "user", "content": "a"}]}) + ",\n"}),
    Case("parquet_corrupt", ("prompts.parquet", "parquet"), patch=_dataset(path="prompts.parquet"),
         files={"prompts.parquet": b"PAR1 this is not parquet"}),
    Case("empty_folder", ("holds no",), patch=_dataset(path="empty_dir"), setup=lambda d: (d / "empty_dir").mkdir()),
    Case("unknown_bundled_prompts", ("bundled:nope",), patch=_dataset(path="bundled:nope")),
    # -- prepare: bounds, empty datasets, messages that name their file ------------------------------------
    Case("prompt_over_context_length", ("prompts.jsonl:2", "tokens", "context length of 50", "model.context_length",
                                        "--skip-bad"),
         patch=_set("model.context_length", 50), prompts=GOOD + _msg({"messages": [
             {"role": "user", "content": " ".join(f"word{i}" for i in range(200))}]})),
    Case("context_length_not_positive", ("model.context_length",), patch=_set("model.context_length", 0)),
    Case("json_array_element_too_long", ("prompts.json:2", "8,388,608", "model.context_length", "jsonl"),
         patch=_dataset(path="prompts.json"), setup=_long_json_array),
    Case("prompts_empty_file", ("dataset rel", "prompts.jsonl", "no prompts", "no rows", "format", "field"), prompts=""),
    Case("prompts_blank_lines_only", ("dataset rel", "prompts.jsonl", "no prompts", "path"), prompts="\n \n\t\n"),
    Case("prompts_all_bad_skipped", ("dataset rel", "prompts.jsonl", "no prompts", "2 bad rows skipped", "format"),
         prompts="{not json\n" + _msg({"id": 1}), args=("--skip-bad",)),
    Case("json_array_empty", ("dataset rel", "prompts.json", "no prompts"), patch=_dataset(path="prompts.json"),
         files={"prompts.json": "[\n]\n"}),
    Case("gzip_corrupt", ("prompts.jsonl.gz", "cannot read"), patch=_dataset(path="prompts.jsonl.gz"),
         setup=_corrupt_gzip),
    Case("json_array_nested_too_deep", ("prompts.json:2", "nested"), patch=_dataset(path="prompts.json"),
         files={"prompts.json": "[" + GOOD.strip() + ",\n" + "[" * 100_000 + "]" * 100_000 + "]"}),
    Case("jsonl_nested_too_deep", ("prompts.jsonl:2", "nested"), prompts=GOOD + "[" * 100_000 + "]" * 100_000 + "\n"),
    Case("json_not_utf8", ("prompts.json:3", "utf-8"), patch=_dataset(path="prompts.json"),
         files={"prompts.json": b'[\n"a",\n"caf\xe9"\n]\n'}),
    # -- generate: keys, flags and run directories -------------------------------------------------------
    Case("no_api_key", ("OPENROUTER_API_KEY",), command="generate", key=None),
    Case("api_key_file_missing", ("no_key.txt",), command="generate", args=("--api-key-file", "no_key.txt")),
    Case("api_key_file_empty", ("empty",), command="generate", args=("--api-key-file", "key.txt"),
         files={"key.txt": ""}),
    Case("base_url_not_http", ("base_url", "http"), command="generate", args=("--base-url", "ftp://example")),
    Case("unknown_dataset_flag", ("nope",), command="generate", args=("--dataset", "nope")),
    Case("run_dir_of_another_config", ("another config",), command="generate",
         setup=lambda d: _write_run_json(d / "run", "0123456789abcdef")),
    Case("run_json_corrupt", ("run.json",), command="generate",
         setup=lambda d: (d / "run").mkdir() or (d / "run" / "run.json").write_text("{\"config_hash\": ")),
    Case("run_dir_is_a_file", ("run",), command="generate", setup=lambda d: (d / "run").write_text("x")),
    Case("raw_log_corrupt_line", ("raw_responses.jsonl:1",), command="merge",
         files={"run/run.json": _RUN_JSON, "run/raw/rel/raw_responses.jsonl":
                "{\"sample_id\": \"rel-b\", \"outp\n" + _msg({"sample_id": "rel-c", "output_ids": [3]})}),
    Case("raw_log_unknown_schema_version", ("raw_responses.jsonl:1", "schema_version 99"), command="merge",
         files={"run/run.json": _RUN_JSON, "run/raw/rel/raw_responses.jsonl":
                _msg({"sample_id": "rel-a", "output_ids": [1, 2], "schema_version": 99})}),
    Case("raw_log_dropped_in_by_hand", ("raw_responses.jsonl:1", "no provenance", "draftgen import"), command="merge",
         files={"run/run.json": _RUN_JSON, "run/raw/rel/raw_responses.jsonl":
                _msg({"sample_id": "rel-a", "output_ids": [1, 2]})}),
    Case("run_dir_not_draftgens", ("not made by draftgen", "run.json"), command="generate",
         files={"run/my_notes.txt": "mine\n"}),
    Case("import_negative_id", ("legacy.jsonl:2", "-5", "vocabulary"), command="import",
         args=("legacy.jsonl", "--dataset", "rel"),
         files={"legacy.jsonl": _msg({"sample_id": "rel-a", "output_ids": [1]})
                + _msg({"sample_id": "rel-b", "output_ids": [7, -5]})}),
    Case("import_id_over_int32", ("legacy.jsonl:1", str(2**31), "vocabulary"), command="import",
         args=("legacy.jsonl", "--dataset", "rel"),
         files={"legacy.jsonl": _msg({"sample_id": "rel-a", "output_ids": [2**31]})}),
    Case("import_without_output_ids", ("legacy.jsonl:1", "no output_ids"), command="import",
         args=("legacy.jsonl", "--dataset", "rel"), files={"legacy.jsonl": _msg({"sample_id": "rel-a"})}),
    Case("import_unknown_dataset", ("no dataset named", "nope"), command="import",
         args=("legacy.jsonl", "--dataset", "nope"), files={"legacy.jsonl": _msg({"sample_id": "rel-a"})}),
]


SHARED_TOKENIZERS = ASSETS  # DRAFTGEN_TEST_ASSETS (see _common_helpers)
if (SHARED_TOKENIZERS / "deepseek-r1").is_dir():  # CI has the assets; a bare checkout runs the rest
    CASES.append(Case("tokenizer_of_another_model", ("tokenizer", "qwen3"),
                      patch=_set("model.tokenizer", str(SHARED_TOKENIZERS / "deepseek-r1"))))


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def _materialise(case: Case, d: Path) -> list[str]:
    prompts = d / "prompts.jsonl"
    if case.prompts is None:
        write_prompts(prompts, 3)
    elif isinstance(case.prompts, bytes):
        prompts.write_bytes(case.prompts)
    else:
        prompts.write_text(case.prompts, encoding="utf-8")
    for rel, content in case.files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    if case.setup is not None:
        case.setup(d)
    cfg_path = d / case.config_name
    if case.config_name == "config.yaml":
        if case.config is None:
            cfg = base_config(prompts, d / "run", base_url="http://127.0.0.1:9/api/v1")
            cfg["datasets"][0]["path"] = "prompts.jsonl"  # relative: resolved from the config's folder
            cfg["run_dir"] = "run"
            if case.patch is not None:
                case.patch(cfg)
            cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        elif isinstance(case.config, bytes):
            cfg_path.write_bytes(case.config)
        else:
            cfg_path.write_text(case.config if isinstance(case.config, str) else yaml.safe_dump(case.config),
                                encoding="utf-8")
    return [case.command, str(cfg_path), *case.args]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_ends_in_one_clear_line(case: Case, tmp_path: Path) -> None:
    args = _materialise(case, tmp_path)
    res = run_cli(args, env=cli_env(case.key), cwd=tmp_path, timeout=120)
    lines = error_lines(res.stderr)
    assert res.returncode != 0, f"exit 0; stdout={res.stdout[-500:]!r}"
    assert "Traceback" not in res.stderr + res.stdout, res.stderr[-3000:]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}: {res.stderr[-1500:]}"
    line = lines[0]
    assert line.startswith("Error: "), line
    assert len(line) < 600, f"not a one-line message ({len(line)} chars)"
    for word in case.expect:
        assert word.lower() in line.lower(), f"{word!r} not named in: {line}"
