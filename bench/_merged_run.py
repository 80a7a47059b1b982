"""A run directory holding only merged/ (one train shard and its manifest) and its config, for the extract
benches (``bench_extract``'s CPU and GPU modes): ``write_merged_run(root, name, ids, masks, sids)`` writes it
under ``root`` and returns the config's path. Needs only the project's src, pyarrow and pyyaml."""

from __future__ import annotations

import hashlib
from pathlib import Path


def write_merged_run(root: Path, name: str, ids: list[list[int]], masks: list[list[int]], sids: list[str]) -> Path:
    """``root/cfg.yaml`` (dataset ``name``, endpoint ``emulator``) and its run dir ``root/run`` whose merged/ holds
    the rows (``ids``, ``masks``, ``sids`` in that order; dataset ``name``; no provider known) as one train shard
    listed by the merge manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from draftgen.config import config_from_mapping
    from draftgen.records import MANIFEST_LAYOUT, MergedFile, MergeManifest
    from draftgen.rundir.claim import writer
    from draftgen.store import atomic_write_json

    data = {"run_dir": str(root / "run"), "endpoint": "emulator", "progress": "off",
            "datasets": [{"name": name, "path": f"{name}.jsonl"}]}
    cfg_path = root / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    cfg = config_from_mapping(data, where=str(cfg_path), base_dir=str(root))
    with writer(cfg, name) as rd:
        rd.merged.mkdir(parents=True, exist_ok=True)
        shard = rd.merged_shard("train", 0, 1)
        pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())),
                                 "loss_mask": pa.array(masks, pa.list_(pa.int8())),
                                 "sample_id": pa.array(sids, pa.string()),
                                 "dataset": pa.array([name] * len(sids), pa.string()),
                                 "provider": pa.array([None] * len(sids), pa.string())}), shard)
        body = shard.read_bytes()
        atomic_write_json(rd.merged_manifest, MergeManifest(
            files=[MergedFile(path=str(shard.relative_to(rd.root)), split="train", kind="parquet", rows=len(ids),
                              bytes=len(body), sha256=hashlib.sha256(body).hexdigest())],
            seed=0, merge={}, datasets=[name], profile="qwen3", layout=MANIFEST_LAYOUT))
    return cfg_path
