"""``draftgen prepare`` stays bounded on hostile inputs, and two runs at once do not trip over each other.

Each test drives the real CLI in a subprocess. The 200 MB line is generated in ``tmp_path`` (and removed
after), and the CLI runs under a small wrapper that reports its peak RSS (``ru_maxrss`` of its one child).
The wrapper also caps the child's data segment at 2 GiB, so a reader that loads the whole line fails in
seconds instead of taking the CI machine's memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from draftgen.records import DatasetStats, PromptRecord

from ._helpers import base_config, cli_cmd, cli_env, error_lines, run_cli, write_config, write_prompts

MIB = 1 << 20
RSS_LIMIT_MB = 600

_MEASURE = """
import json, resource, subprocess, sys
def cap():
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))
res = subprocess.run(sys.argv[1:], capture_output=True, text=True, preexec_fn=cap)
kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr,
                  "peak_mb": kb / (1 << 20) if sys.platform == "darwin" else kb / 1024}))
"""


def _measured(args: list[str], cwd: Path) -> dict[str, Any]:
    """Run ``draftgen ARGS`` under the wrapper; its result plus ``peak_mb`` and ``seconds``."""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", _MEASURE, *cli_cmd(*args)], env=cli_env(), cwd=cwd,
                         capture_output=True, text=True, timeout=120, check=True)
    out: dict[str, Any] = json.loads(res.stdout)
    out["seconds"] = time.monotonic() - t0
    return out


def _msg(content: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": content}]}) + "\n"


def _config(tmp_path: Path, prompts: Path, **extra: Any) -> Path:
    cfg = base_config(prompts, tmp_path / "run", **extra)
    return write_config(tmp_path, cfg)


def _prepared(run: Path, name: str = "rel") -> tuple[list[PromptRecord], DatasetStats]:
    folder = run / "prepared" / name
    dec = msgspec.json.Decoder(PromptRecord)
    rows = [dec.decode(line) for line in (folder / "prompts.jsonl").read_bytes().splitlines()]
    stats = msgspec.json.decode((folder / "stats.json").read_bytes(), type=DatasetStats)
    return rows, stats


def test_a_200mb_line_is_refused_in_bounded_memory_or_skipped(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    chunk = "x" * MIB
    with open(prompts, "w", encoding="utf-8") as fh:
        fh.write(_msg("first prompt"))
        fh.write('{"messages": [{"role": "user", "content": "')
        for _ in range(200):
            fh.write(chunk)
        fh.write('"}]}\n')
        fh.write(_msg("third prompt"))
    cfg = _config(tmp_path, prompts)
    try:
        refused = _measured(["prepare", str(cfg)], tmp_path)
        skipped = _measured(["prepare", str(cfg), "--skip-bad"], tmp_path)
    finally:
        prompts.unlink()
    print(f"200 MB line: refused in {refused['seconds']:.1f} s at {refused['peak_mb']:.0f} MB peak RSS; "
          f"skipped in {skipped['seconds']:.1f} s at {skipped['peak_mb']:.0f} MB")

    lines = error_lines(refused["stderr"])
    assert refused["rc"] != 0 and len(lines) == 1, refused["stderr"][-2000:]
    line = lines[0]
    assert "Traceback" not in refused["stderr"]
    for word in (f"{prompts}:2", "209,715,2", "8,388,608", "model.context_length", "--skip-bad"):
        assert word in line, f"{word!r} not in {line}"
    assert refused["peak_mb"] < RSS_LIMIT_MB, f"peak RSS {refused['peak_mb']:.0f} MB"

    assert skipped["rc"] == 0, skipped["stderr"][-2000:]
    assert skipped["peak_mb"] < RSS_LIMIT_MB, f"peak RSS {skipped['peak_mb']:.0f} MB"
    assert f"skipped {prompts}:2" in skipped["stdout"]
    rows, stats = _prepared(tmp_path / "run")
    assert [r.messages[0].content for r in rows] == ["first prompt", "third prompt"]
    assert [r.source for r in rows] == [f"{prompts}:1", f"{prompts}:3"]
    assert stats.samples == 2 and stats.bad_lines_skipped == 1


def test_a_prompt_over_the_context_length_names_line_tokens_and_limit(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    long = " ".join(f"w{i}" for i in range(300))  # a few hundred tokens, far under the byte limit
    prompts.write_text(_msg("short one") + _msg(long) + _msg("short two"), encoding="utf-8")
    cfg = _config(tmp_path, prompts, model={"context_length": 200})
    res = run_cli(["prepare", str(cfg)], cwd=tmp_path)
    lines = error_lines(res.stderr)
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-2000:]
    line = lines[0]
    assert "Traceback" not in res.stderr
    for word in (f"{prompts}:2", "tokens", "over the context length of 200", "model.context_length", "--skip-bad"):
        assert word in line, f"{word!r} not in {line}"
    n = int(line.split("the prompt has ", 1)[1].split(" tokens", 1)[0].replace(",", ""))
    assert n > 200

    res = run_cli(["prepare", str(cfg), "--skip-bad"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows, stats = _prepared(tmp_path / "run")
    assert [r.messages[0].content for r in rows] == ["short one", "short two"]
    assert stats.bad_lines_skipped == 1 and stats.max_prompt_tokens <= 200


def test_the_default_context_length_is_the_tokenizer_configs(tmp_path: Path) -> None:
    # 150k words: about 150k tokens, over Qwen3's model_max_length (131,072), in well under 8 MiB.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(_msg("fine") + _msg("hello " * 150_000), encoding="utf-8")
    cfg = _config(tmp_path, prompts)
    res = run_cli(["prepare", str(cfg)], cwd=tmp_path)
    lines = error_lines(res.stderr)
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-2000:]
    for word in (f"{prompts}:2", "tokens", "131,072", "model_max_length", "model.context_length", "--skip-bad"):
        assert word in lines[0], f"{word!r} not in {lines[0]}"
    # Raising the limit accepts it, with its exact count.
    cfg = _config(tmp_path, prompts, model={"context_length": 200_000})
    res = run_cli(["prepare", str(cfg)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rows, _ = _prepared(tmp_path / "run")
    assert rows[1].prompt_tokens is not None and 131_072 < rows[1].prompt_tokens < 200_000


def test_two_prepares_at_once_never_share_a_temp_file(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3000)
    cfg = _config(tmp_path, prompts)
    run = tmp_path / "run"
    for round_ in range(4):
        if run.exists():
            for f in sorted(run.rglob("*"), key=lambda p: -len(p.parts)):
                f.rmdir() if f.is_dir() else f.unlink()
        procs = [subprocess.Popen(cli_cmd("prepare", str(cfg)), env=cli_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        for rc, out, err in results:
            assert ".tmp" not in out + err and "No such file" not in err, f"round {round_}: {err[-1000:]}"
            assert "Traceback" not in err, err[-2000:]
            # Either run may be turned away by a run-directory lock, in one line; none may fail otherwise.
            assert rc == 0 or len(error_lines(err)) == 1, f"round {round_}: exit {rc}: {err[-1000:]}"
        assert any(rc == 0 for rc, _, _ in results), f"round {round_}: {[r[2][-300:] for r in results]}"
        rows, stats = _prepared(run)
        assert len(rows) == stats.samples == 3000 and len({r.sample_id for r in rows}) == 3000
        left = [p.name for p in (run / "prepared" / "rel").iterdir()]
        assert sorted(left) == ["prompts.jsonl", "stats.json"], left
