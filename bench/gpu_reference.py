"""GPU check of the teacher/reference check (issue 33 item 2): is a correct capture ever flagged, and is a
broken one always flagged, on a Qwen3-8B-shaped random bf16 target?

Builds the target in memory (random weights, built on ``--device``; only its config.json is written, to a
temporary folder, and the hf backend is handed the built model instead of loading weights), makes ``--rows``
rows of 1,000-4,000 random ids (tiny: 100-300) and captures them through the hf backend (float32 storage, so
each storage dtype rounds the captured values itself) in batches of ``--batch-tokens``, with hooks on each aux
id and the id after it. The variants below and their storage rounding are made on ``--device``. Each
sample's reference (the plain forward and its padded twin) is computed once and shared by all its checks. Each sample is checked by ``check_teacher`` as stored in each ``--dtypes``
(fp8: ``quantize_fp8`` round trip):

- ``correct`` (every row): the state comparison and the final's log-prob check; on the first
  ``--through-rows`` rows also ``teacher_aux`` (each aux slot run on through the layers: ~3 forwards per dtype);
- on the first ``--broken-rows`` rows, without ``teacher_aux``: ``layer_shift`` (every aux slot holds id+1's
  states), ``position_shift`` (the states of t+1 at t), ``missing`` (the middle slot zeros) and ``duplicated``
  (the middle slot holds the first slot's states).

Goal: 0 correct samples flagged, every broken one flagged ``reference_aux``. Prints a table and writes
``--out``/gpu_reference.json after each stage (build, each capture batch, end: per sample its errors,
tolerances and noise), so a run cut short still leaves its figures.

    python bench/gpu_reference.py --size 8b --device cuda --out "$OUT"     # H200: about 2 minutes
    python bench/gpu_reference.py --size tiny --device cpu --out /tmp/gr   # rehearsal: about a minute
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: hidden, layers, intermediate, heads, kv heads, head dim, vocabulary
SHAPES = {"8b": (4096, 36, 12288, 32, 8, 128, 151_936), "tiny": (128, 8, 384, 4, 2, 32, 4096)}
#: rows, through rows, broken rows, shortest and longest row (tokens)
DEFAULTS = {"8b": (96, 24, 16, 1000, 4000), "tiny": (8, 2, 4, 100, 300)}
VARIANTS = ("correct", "layer_shift", "position_shift", "missing", "duplicated")


def build_model(size: str, device: str) -> Any:
    """The random bf16 Qwen3 of ``size``, built on ``device``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    H, L, inter, NH, KV, HD, V = SHAPES[size]
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=inter, num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=40960,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            return Qwen3ForCausalLM(cfg).eval()  # type: ignore[no-untyped-call]
    finally:
        torch.set_default_dtype(torch.float32)


@contextlib.contextmanager
def loads_as(folder: Path, model: Any) -> Iterator[None]:
    """``AutoModelForCausalLM.from_pretrained(folder)`` gives ``model`` (the backend takes the built model
    instead of 16 GB written and read back); any other folder loads as usual."""
    from transformers import AutoModelForCausalLM

    inner = AutoModelForCausalLM.from_pretrained
    own = vars(AutoModelForCausalLM).get("from_pretrained")  # the descriptor, when the class defines it

    def from_pretrained(ref: Any, *args: Any, **kw: Any) -> Any:
        return model if Path(str(ref)) == folder else inner(ref, *args, **kw)

    AutoModelForCausalLM.from_pretrained = from_pretrained  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        if own is None:
            del AutoModelForCausalLM.from_pretrained
        else:
            AutoModelForCausalLM.from_pretrained = own  # type: ignore[method-assign]


def variant(captured: Any, name: str, ids: list[int], aux: list[int]) -> Any:
    """The aux states [T, n_aux*H] of ``name`` from the captured slots (``ids``: each aux id and the one after)."""
    import torch

    s = captured.chunk(len(ids), dim=-1)
    own, nxt = [s[ids.index(k)] for k in aux], [s[ids.index(k + 1)] for k in aux]
    mid = len(own) // 2
    if name == "layer_shift":
        own = nxt
    elif name == "position_shift":
        own = [torch.cat([x[1:], x[-1:]]) for x in own]
    elif name == "missing":
        own = [torch.zeros_like(x) if i == mid else x for i, x in enumerate(own)]
    elif name == "duplicated":
        own = [own[0] if i == mid else x for i, x in enumerate(own)]
    return torch.cat(own, dim=-1)


def stored(x: Any, dtype: str) -> Any:
    """``x`` as the storage dtype holds it, float32."""
    import torch

    from draftgen.hidden.codec import quantize_fp8

    if dtype == "fp8":
        q, scale = quantize_fp8(x)
        return q.float() * scale
    return x.to({"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]).float()


def record(r: Any) -> dict[str, Any]:
    t = r.teacher
    keys = ("aux_rel_err", "aux_rel_tol", "final_max_rel_err", "final_rel_tol", "state_noise", "logprob_err",
            "logprob_tol", "aux_logprob_err")
    return {"failed": r.failed, **{k: getattr(t, k, None) for k in keys}}


def table(res: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per storage/variant: samples checked, flagged (any check), flagged by the state comparison."""
    out: dict[str, dict[str, int]] = {}
    for s in res["samples"]:
        for key, r in s["checks"].items():
            t = out.setdefault(key, {"checked": 0, "flagged": 0, "flagged_reference_states": 0, "through": 0})
            t["checked"] += 1
            t["flagged"] += bool(r["failed"])
            t["flagged_reference_states"] += any(f in r["failed"] for f in ("reference_aux", "reference_final"))
            t["through"] += r["aux_logprob_err"] is not None
    return out


def save(res: dict[str, Any], out_dir: Path, t0: float) -> None:
    res["t"] = round(time.monotonic() - t0, 1)
    res["table"] = table(res)
    (out_dir / "gpu_reference.json").write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, help="rows captured and checked correct (8b: 96, tiny: 8)")
    ap.add_argument("--through-rows", type=int, help="rows whose correct check runs teacher_aux (8b: 24, tiny: 2)")
    ap.add_argument("--broken-rows", type=int, help="rows checked in each broken variant (8b: 16, tiny: 4)")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--dtypes", default="bf16,fp16,fp8")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import numpy as np
    import torch

    from draftgen.config import config_from_mapping
    from draftgen.hidden.codec import LoadedSample
    from draftgen.phases.extract.batches import split_batches
    from draftgen.target import ExtractRow
    from draftgen.target.checks import CheckResult, check_teacher
    from draftgen.target.hf import HFExtractBackend
    from draftgen.target.layers import LayerIds, default_aux_ids

    t0 = time.monotonic()
    n, n_through, n_broken, lo, hi = DEFAULTS[args.size]
    n = args.rows or n
    n_through = min(n, n_through if args.through_rows is None else args.through_rows)
    n_broken = min(n, n_broken if args.broken_rows is None else args.broken_rows)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    V, L = SHAPES[args.size][6], SHAPES[args.size][1]
    rng = random.Random(0)
    rows = []
    for i in range(n):
        t = rng.randint(lo, hi)
        rows.append(ExtractRow(f"g-{i:03d}", np.array([rng.randrange(V) for _ in range(t)], dtype=np.int64),
                               np.array([0] * (t // 4) + [1] * (t - t // 4), dtype=np.uint8)))
    order = {r.sample_id: i for i, r in enumerate(rows)}
    aux = default_aux_ids(L)
    dtypes = args.dtypes.split(",")
    ids = sorted({*aux, *(k + 1 for k in aux)})
    res: dict[str, Any] = {"size": args.size, "device": args.device, "rows": n, "through_rows": n_through,
                           "broken_rows": n_broken, "tokens": sum(len(r.input_ids) for r in rows), "aux": aux,
                           "dtypes": dtypes, "stage": "build", "samples": []}
    with tempfile.TemporaryDirectory(prefix="dg-gpu-reference-") as tmp:
        folder = Path(tmp) / "target"
        model = build_model(args.size, args.device)
        model.config.save_pretrained(folder)  # config.json only: the backend records its digest
        hs = {"model": str(folder), "device": args.device, "dtype": "fp32", "compute_dtype": "bf16",
              "teacher_fraction": 1.0, "teacher_min_margin": None, "layer_ids": ids}
        cfg = config_from_mapping({"run_dir": str(Path(tmp) / "run"), "endpoint": "emulator", "progress": "off",
                                   "datasets": [{"name": "g", "path": "g.jsonl"}], "hidden_states": hs},
                                  where="gpu_reference", base_dir=Path(tmp))
        with loads_as(folder, model):
            be = HFExtractBackend(cfg)
        del model
        res["build_s"] = round(time.monotonic() - t0, 1)
        res["stage"] = "capture"
        save(res, out_dir, t0)
        capture_info, check_info = be.info.layers, LayerIds(aux=tuple(aux), final=L)
        refs: dict[str, Any] = {}
        inner = be.reference
        use_through = [True]

        def reference(row: ExtractRow, pos: Any) -> Any:  # one reference per sample, shared by its checks
            if row.sample_id not in refs:
                refs.clear()
                refs[row.sample_id] = inner(row, pos)
            ref = refs[row.sample_id]
            return ref if use_through[0] else dataclasses.replace(ref, through=None)

        be.reference = reference  # type: ignore[method-assign,assignment]
        t_capture = t_check = 0.0
        for batch in split_batches(rows, args.batch_tokens):
            t1 = time.monotonic()
            be.info.layers = capture_info
            caps = be.capture(batch)
            be.info.layers = check_info
            t2 = time.monotonic()
            t_capture += t2 - t1
            with torch.inference_mode():
                for c, row in zip(caps, batch, strict=True):
                    i = order[row.sample_id]
                    checks: dict[str, Any] = {}
                    # variants and storage rounding on the device (the comparisons run there); the final
                    # (RMSNorm by the host's norm weight) and a slot run on through the layers (``perturbed``'s
                    # host noise) are compared from the host
                    if c.staged is not None:
                        c.staged.wait()  # the pinned host copies may still be in flight
                    captured, final = c.aux.to(args.device).float(), c.final.to(args.device).float()
                    for v in VARIANTS if i < n_broken else VARIANTS[:1]:
                        a = variant(captured, v, ids, aux)
                        use_through[0] = v == "correct" and i < n_through
                        for d in dtypes:
                            a_d = stored(a, d)
                            s = LoadedSample(row.sample_id, torch.from_numpy(row.input_ids),
                                             torch.from_numpy(row.loss_mask), a_d.cpu() if use_through[0] else a_d,
                                             stored(final, d).cpu(), d)
                            r = CheckResult()
                            check_teacher(s, row, be, cfg.hidden_states, r)
                            checks[f"{d}/{v}"] = record(r)
                    refs.clear()
                    res["samples"].append({"sample_id": row.sample_id, "length": len(row.input_ids), "checks": checks})
            t_check += time.monotonic() - t2
            res.update(capture_s=round(t_capture, 1), check_s=round(t_check, 1))
            save(res, out_dir, t0)
            del caps
        be.close()
    res["stage"] = "done"
    save(res, out_dir, t0)
    report(res)


def report(res: dict[str, Any]) -> None:
    print(f"{res['size']} on {res['device']}: {res['rows']} rows, {res['tokens']} tokens, aux ids {res['aux']}; "
          f"build {res['build_s']} s, capture {res['capture_s']} s, checks {res['check_s']} s, total {res['t']} s")
    print(f"{'storage/variant':26} {'flagged':>9} {'reference_*':>12} {'teacher_aux':>12}  goal")
    for key, t in sorted(res["table"].items(), key=lambda kv: (VARIANTS.index(kv[0].split("/")[1]), kv[0])):
        goal = "0" if key.endswith("/correct") else "all"
        print(f"{key:26} {t['flagged']:>5}/{t['checked']:<3} {t['flagged_reference_states']:>8}/{t['checked']:<3} "
              f"{t['through']:>8} run  {goal}")
    for d in res["dtypes"]:
        noise = sorted(max(s["checks"][f"{d}/correct"]["state_noise"] or [0.0]) for s in res["samples"])
        err = sorted(max(s["checks"][f"{d}/correct"]["aux_rel_err"] or [0.0]) for s in res["samples"])
        print(f"{d}: state noise (worst state per sample) median {noise[len(noise) // 2]:.4f}, max {noise[-1]:.4f}; "
              f"correct aux error median {err[len(err) // 2]:.4f}, max {err[-1]:.4f}")


if __name__ == "__main__":
    main()
