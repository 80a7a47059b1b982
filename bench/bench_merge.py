"""Merge at the reference's scale: 40k samples, 138M tokens, within 4 GB RSS on 2 cores.

Builds a synthetic run directory (eight short datasets plus one long one, like the reference: 2,800 long
samples hold 44.9M tokens) by writing JSONL bytes directly from pooled id strings, then runs
``draftgen.phases.merge.run.run_merge`` in a subprocess and reads its peak RSS (``ru_maxrss`` of the child) and time.

The ids are slices of the bundled prompt sets encoded with Qwen3's tokenizer (so decoding costs what real
text costs); they repeat, so the Parquet files compress far better than real data would.

Baseline, in the same run: a naive merge (``json.loads`` every record, keep everything as Python lists,
shuffle, build masks, write Parquet through ``pa.table``) on a slice of the same data, scaled linearly to the
full size; it is what "load it all and go" costs.

    python bench/bench_merge.py                  # full size (about 1.4 GB of raw JSONL in a temp dir)
    python bench/bench_merge.py --scale 0.05     # quick look
    python bench/bench_merge.py --no-exports     # Parquet only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from draftgen.config import load_config
from draftgen.provenance import expected_provenance
from draftgen.rundir.claim import writer
from draftgen.tokens import profile_from_config

REF_SAMPLES = 40_114
REF_TOKENS = 138_400_000
LONG_SAMPLES = 2_800
LONG_TOKENS = 44_900_000
SHORT_SETS = 8
THINK, THINK_END, IM_END = 151667, 151668, 151645

CHILD = r"""
import json, resource, sys, time
from draftgen.config import load_config
from draftgen.phases.merge.run import run_merge
cfg = load_config(sys.argv[1])
if sys.argv[2] == "parquet":
    cfg.merge.exports = []
t = time.perf_counter()
rep = run_merge(cfg, echo=lambda s: None)
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": dt, "rss": rss, "rows": rep.train_rows + rep.validation_rows,
                  "tokens": rep.stats.total.prompt_tokens + rep.stats.total.completion_tokens}))
"""

NAIVE = r"""
import json, random, resource, sys, time
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
run = Path(sys.argv[1]); names = sys.argv[2].split(","); fraction = float(sys.argv[3])
t = time.perf_counter()
rows = []
for name in names:
    lines = (run / "raw" / name / "raw_responses.jsonl").read_bytes().splitlines()
    for line in lines[: max(1, int(len(lines) * fraction))]:
        rows.append(json.loads(line))
for r in rows:
    ids = r["prompt_ids"] + r["output_ids"]
    r["input_ids"] = ids[:8192]
    r["loss_mask"] = ([0] * len(r["prompt_ids"]) + [1] * len(r["output_ids"]))[:8192]
random.Random(0).shuffle(rows)
table = pa.table({"input_ids": [r["input_ids"] for r in rows], "loss_mask": [r["loss_mask"] for r in rows],
                  "sample_id": [r["sample_id"] for r in rows]})
pq.write_table(table, str(run / "naive.parquet"))
dt = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": dt, "rss": rss, "rows": len(rows),
                  "tokens": sum(len(r["prompt_ids"]) + len(r["output_ids"]) for r in rows)}))
"""


def _pool(n: int) -> tuple[bytes, list[int]]:
    """A long comma-separated string of real token ids (the bundled prompt sets, encoded with Qwen3's
    tokenizer and repeated) and the offsets of its commas, so a slice holds whole ids."""
    from importlib import resources

    from draftgen.tokens import load_profile

    tok = load_profile("qwen3", "bundled:qwen3").tokenizer
    folder = resources.files("draftgen") / "data" / "prompts"
    text = "".join((folder / f"{name}.jsonl").read_text(encoding="utf-8") for name in ("chat", "code", "tools"))
    base = [str(i).encode() for i in tok.encode(text)]
    ids = (base * (n // len(base) + 1))[:n]
    buf = b",".join(ids)
    commas = [-1]
    pos = -1
    for tok_bytes in ids[:-1]:
        pos += len(tok_bytes) + 1
        commas.append(pos)
    commas.append(len(buf))
    return buf, commas


def _ids(pool: tuple[bytes, list[int]], n: int, rng: random.Random) -> bytes:
    buf, commas = pool
    a = rng.randrange(0, len(commas) - n - 1)
    return buf[commas[a] + 1: commas[a + n]]


def build_run(root: Path, scale: float, exports: bool) -> tuple[Path, int, int]:
    rng = random.Random(0)
    pool = _pool(400_000)
    text = ("lorem ipsum dolor sit amet " * 2000).encode()
    long_n = max(1, round(LONG_SAMPLES * scale))
    short_n = max(1, round((REF_SAMPLES - LONG_SAMPLES) * scale / SHORT_SETS))
    short_avg = (REF_TOKENS - LONG_TOKENS) / (REF_SAMPLES - LONG_SAMPLES)
    long_avg = LONG_TOKENS / LONG_SAMPLES
    sets = [(f"short{i}", short_n, short_avg, 0.35) for i in range(SHORT_SETS)] + [("long", long_n, long_avg, 0.85)]
    cfg = {
        "run_dir": "run", "endpoint": "emulator",
        "model": {"profile": "qwen3", "tokenizer": "bundled:qwen3"},
        "datasets": [{"name": name, "path": f"{name}.jsonl"} for name, *_ in sets],
        "merge": {"val_fraction": 0.01, "exports": ["speculators", "specforge"] if exports else []},
        "hidden_states": {"hidden_size": 7168},
    }
    (root / "cfg.yaml").write_text(json.dumps(cfg), encoding="utf-8")
    loaded = load_config(root / "cfg.yaml")
    with writer(loaded, "bench"):  # claims the run directory (run.json) the way every command does
        pass
    provenance = msgspec.json.encode(expected_provenance(loaded, profile_from_config(loaded).tokenizer_sha256))
    samples = tokens = 0
    for name, n, avg, prompt_share in sets:
        raw = root / "run" / "raw" / name / "raw_responses.jsonl"
        prep = root / "run" / "prepared" / name / "prompts.jsonl"
        raw.parent.mkdir(parents=True)
        prep.parent.mkdir(parents=True)
        with open(raw, "wb") as fr, open(prep, "wb") as fp:
            for i in range(n):
                total = max(16, int(rng.expovariate(1 / avg)))
                total = min(total, 390_000)
                p = max(8, int(total * prompt_share))
                c = max(16, total - p)
                r = max(3, c // 3)
                sid = f"{name}-{hashlib.sha256(f'{name}{i}'.encode()).hexdigest()[:16]}"
                out = b"%d,%s,%d,%s,%d" % (THINK, _ids(pool, r - 2, rng), THINK_END, _ids(pool, c - r - 1, rng), IM_END)
                reasoning = text[: min(len(text), 4 * r)].decode()
                content = text[: min(len(text), 4 * (c - r))].decode()
                fr.write(b'{"sample_id":"%s","dataset":"%s","reasoning":%s,"content":%s,"finish_reason":"stop",'
                         b'"provider":"Bench","output_ids":[%s],"prompt_ids":[%s],"ids_source":"exact",'
                         b'"provenance":%s}\n' % (
                             sid.encode(), name.encode(), json.dumps(reasoning).encode(),
                             json.dumps(content).encode(), out, _ids(pool, p, rng), provenance))
                fp.write(json.dumps({"sample_id": sid, "dataset": name, "content_hash": sid,
                                     "messages": [{"role": "user", "content": f"prompt {i} of {name}"}]}).encode()
                         + b"\n")
                samples += 1
                tokens += p + c
    return root / "cfg.yaml", samples, tokens


def _child(code: str, *args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the reference size (default 1.0)")
    ap.add_argument("--baseline-fraction", type=float, default=0.04, help="slice the naive merge reads")
    ap.add_argument("--no-exports", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic run directory")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_merge_"))
    try:
        t = time.perf_counter()
        cfg, samples, tokens = build_run(root, args.scale, not args.no_exports)
        raw_bytes = sum(f.stat().st_size for f in (root / "run" / "raw").rglob("*.jsonl"))
        print(f"synthetic run: {samples:,} samples, {tokens / 1e6:.1f}M tokens, {raw_bytes / 1e9:.2f} GB raw JSONL "
              f"(built in {time.perf_counter() - t:.0f} s)")
        runs = [("parquet only", "parquet")] + ([] if args.no_exports else [("parquet + exports", "all")])
        ours: dict[str, dict[str, float]] = {}
        for label, mode in runs:
            res = ours[mode] = _child(CHILD, str(cfg), mode)
            out_bytes = sum(f.stat().st_size for d in ("merged", "exports") for f in (root / "run" / d).rglob("*")
                            if f.is_file())
            print(f"draftgen merge ({label}): {res['seconds']:.1f} s, peak RSS {res['rss'] / 2**30:.2f} GiB, "
                  f"{int(res['rows']):,} rows kept ({res['tokens'] / 1e6:.1f}M tokens after the 8,192 cap), "
                  f"{tokens / res['seconds'] / 1e6:.2f}M input tokens/s, merged/ + exports/ {out_bytes / 1e9:.2f} GB")
        names = ",".join([f"short{i}" for i in range(SHORT_SETS)] + ["long"])
        base = _child(NAIVE, str(root / "run"), names, str(args.baseline_fraction))
        scale = tokens / base["tokens"]
        est_rss, est_s = base["rss"] * scale, base["seconds"] * scale
        print(f"baseline, naive json.loads merge of {base['tokens'] / 1e6:.1f}M tokens: {base['seconds']:.1f} s, "
              f"peak RSS {base['rss'] / 2**30:.2f} GiB; scaled to {tokens / 1e6:.0f}M tokens: "
              f"~{est_s:.0f} s, ~{est_rss / 2**30:.1f} GiB")
        p = ours["parquet"]
        print(f"ratios (parquet only vs naive, scaled): peak RSS {est_rss / p['rss']:.1f}x lower, "
              f"{est_s / p['seconds']:.2f}x the speed")
        worst = max(r["rss"] for r in ours.values())
        limit = 4 * 2**30
        print(f"4 GB RSS budget: {'within' if worst < limit else 'OVER'} (worst {worst / 2**30:.2f} GiB, "
              f"{worst / limit:.0%} of it)")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
