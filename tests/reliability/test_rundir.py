"""draftgen owns its run directory, and only it: the marker, the one writer lock, provenance, the prepared
set, the merge manifest and the exit codes, each attacked through the real CLI as an operator would.

Every case here was reproduced against the code before the run directory had an owner (issue 10): a
user's folder emptied by ``run``, a pilot writing beside ``generate``, a DeepSeek config merging a Qwen3
run, stale samples merged, a manifest that lied after two merges, a run of failures exiting 0.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from draftgen.records import SCHEMA_VERSION, MergeManifest, MergeStats, ResponseRecord

from ._helpers import error_lines, read_raw, run_cli, start_cli, write_config, write_prompts

SLOW = """\
base: fast
providers:
  - {name: Slow, tag: slow/bf16, quantization: bf16, price_prompt: 0.5, price_completion: 2.5, ttft_s: [0.4, 0.6]}
"""

ALL_FAIL = """\
base: fast
providers:
  - {name: Broken, tag: broken/bf16, quantization: bf16, faults: {server_error: 1.0}}
"""

HALF_FAIL = """\
base: fast
providers:
  - {name: Flaky, tag: flaky/bf16, quantization: bf16, faults: {server_error: 0.5}}
"""


def emu_config(tmp: Path, *, n: int = 12, scenario: str = "fast", run: Path | None = None, **extra: Any) -> Path:
    """A config over ``n`` prompts and the embedded emulator (``scenario`` may be YAML text)."""
    prompts = write_prompts(tmp / "prompts.jsonl", n)
    if "\n" in scenario:
        (tmp / "scenario.yaml").write_text(scenario, encoding="utf-8")
        scenario = str(tmp / "scenario.yaml")
    cfg: dict[str, Any] = {
        "run_dir": str(run or tmp / "run"),
        "endpoint": {"kind": "emulator", "emulator": {"scenario": scenario}},
        "partitions": {"short": {"concurrency": 8, "max_tokens": 256}, "long": {"concurrency": 2, "max_tokens": 256}},
        "retry": {"max_attempts": 2, "base_delay_s": 0.01, "max_delay_s": 0.05},
        "datasets": [{"name": "rel", "path": str(prompts)}],
        "progress": "plain",
    }
    for k, v in extra.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return write_config(tmp, cfg)


def one_error(res: Any, *words: str) -> str:
    lines = error_lines(res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return str(lines[0])


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- 1. ownership ---------------------------------------------------------------------------------------


def test_every_command_refuses_a_folder_draftgen_did_not_make(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    (user / "merged" / "speculators").mkdir(parents=True)
    (user / "merged" / "train-00000-of-00003.parquet").write_bytes(b"PAR1 my own data")
    (user / "merged" / "speculators" / "my_export_2023.jsonl").write_text('{"mine": 1}\n')
    (user / "report.html").write_text("<p>my report</p>")
    before = snapshot(user)
    cfg = emu_config(tmp_path, run=user)
    (tmp_path / "legacy.jsonl").write_text('{"sample_id": "x", "output_ids": [1]}\n')
    for args in (["run"], ["prepare"], ["generate"], ["audit"], ["merge"], ["report"], ["plan"],
                 ["import", str(tmp_path / "legacy.jsonl"), "--dataset", "rel"]):
        cmd = [args[0], str(cfg), *args[1:]]
        res = run_cli(cmd)
        assert res.returncode == 1, (args, res.stdout, res.stderr)
        one_error(res, str(user), "not made by draftgen", "run.json")
        assert snapshot(user) == before, f"`draftgen {args[0]}` changed a folder it does not own"


def test_merge_removes_only_what_its_previous_manifest_lists(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=6)
    assert run_cli(["run", str(cfg)]).returncode == 0
    run = tmp_path / "run"
    mine = [run / "merged" / "notes.txt", run / "merged" / "speculators" / "my_export_2023.jsonl",
            run / "merged" / "train-00000-of-00003.parquet", run / "exports" / "speculators" / "my_export_2023.jsonl"]
    for p in mine:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("mine\n")
    res = run_cli(["merge", str(cfg)])
    assert res.returncode == 0, res.stderr
    for p in mine:
        assert p.read_text() == "mine\n", p
    man = msgspec.json.decode((run / "merged" / "manifest.json").read_bytes(), type=MergeManifest)
    for f in man.files:
        data = (run / f.path).read_bytes()
        assert len(data) == f.bytes and hashlib.sha256(data).hexdigest() == f.sha256


# -- 2. one writer at a time -------------------------------------------------------------------------------


def _wait_for_lock(run: Path, timeout: float = 60.0) -> dict[str, Any]:
    lock = run / ".draftgen.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.is_file() and lock.read_bytes().strip():
            return dict(json.loads(lock.read_bytes()))
        time.sleep(0.05)
    raise AssertionError("the writer lock was never taken")


def test_a_second_writer_is_refused_naming_the_holder_and_readers_never_block(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=40, scenario=SLOW, budget={"max_spend_usd": 0.05},
                     partitions={"short": {"concurrency": 4, "max_tokens": 256}})
    run = tmp_path / "run"
    gen = start_cli(["generate", str(cfg)], log=tmp_path / "gen.log")
    try:
        holder = _wait_for_lock(run)
        assert holder["pid"] == gen.pid and holder["command"] == "generate"
        for args in (["plan", "--pilot", "20"], ["prepare"], ["audit"], ["merge"], ["report"], ["run"],
                     ["generate"]):
            res = run_cli([args[0], str(cfg), *args[1:]])
            assert res.returncode == 1, (args, res.stderr)
            one_error(res, "`draftgen generate`", f"pid {gen.pid}", "since")
        status = run_cli(["status", str(run)], timeout=30)
        assert status.returncode == 0, status.stderr
    finally:
        assert gen.wait(timeout=120) in (0, 4)
    log = read_raw(run / "raw" / "rel" / "raw_responses.jsonl")
    ids = [r.sample_id for r in log.records]
    assert len(ids) == len(set(ids)) == 40
    assert not (run / "plan" / "pilot").exists()
    assert not (run / ".draftgen.lock").read_bytes().strip()  # released, holder cleared


def test_plan_pilot_and_generate_at_once_never_duplicate_or_overspend(tmp_path: Path) -> None:
    budget = 0.02
    cfg = emu_config(tmp_path, n=60, scenario=SLOW, budget={"max_spend_usd": budget},
                     partitions={"short": {"concurrency": 6, "max_tokens": 256}})
    run = tmp_path / "run"
    gen = start_cli(["generate", str(cfg)], log=tmp_path / "gen.log")
    pilot = start_cli(["plan", str(cfg), "--pilot", "30"], log=tmp_path / "pilot.log")
    codes = {"gen": gen.wait(timeout=180), "pilot": pilot.wait(timeout=180)}
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in codes}
    # Exactly one got the run directory; the other was refused with the holder's name. The winner may
    # itself stop on the budget (exit 1, "stopped: dollar budget …").
    refused = [name for name, text in logs.items() if "is writing to this run directory" in text]
    assert len(refused) == 1 and codes[refused[0]] == 1, (codes, logs)
    (winner,) = set(codes) - set(refused)
    assert codes[winner] in (0, 1, 4) and "Traceback" not in logs[winner], logs[winner][-2000:]
    recs = read_raw(run / "raw" / "rel" / "raw_responses.jsonl").records
    ids = [r.sample_id for r in recs]
    assert len(ids) == len(set(ids))
    spent = sum(r.usage.cost for r in recs if r.usage is not None)
    worst = 6 * 256 * 2.5e-6 + 6 * 2000 * 0.5e-6  # what may be in flight when the budget closes
    assert spent <= budget + worst


def test_two_merges_at_once_leave_a_true_manifest(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=30)
    assert run_cli(["generate", str(cfg)]).returncode == 0
    run = tmp_path / "run"
    for _ in range(3):
        a = start_cli(["merge", str(cfg)], log=tmp_path / "a.log")
        b = start_cli(["merge", str(cfg)], log=tmp_path / "b.log")
        codes = sorted([a.wait(timeout=120), b.wait(timeout=120)])
        assert codes[0] == 0 and codes[1] in (0, 1), codes
        man = msgspec.json.decode((run / "merged" / "manifest.json").read_bytes(), type=MergeManifest)
        for f in man.files:
            data = (run / f.path).read_bytes()
            assert len(data) == f.bytes and hashlib.sha256(data).hexdigest() == f.sha256, f.path
    text = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    assert "No such file" not in text and "Traceback" not in text


# -- 3. provenance -----------------------------------------------------------------------------------------


def _rewrite(path: Path, edit: Any) -> None:
    lines = path.read_bytes().splitlines()
    obj = json.loads(lines[0])
    edit(obj)
    lines[0] = json.dumps(obj).encode()
    path.write_bytes(b"\n".join(lines) + b"\n")


@pytest.fixture()
def done_run(tmp_path: Path) -> tuple[Path, Path]:
    cfg = emu_config(tmp_path, n=8)
    res = run_cli(["generate", str(cfg)])
    assert res.returncode == 0, res.stderr
    return cfg, tmp_path / "run"


def test_a_config_for_another_target_is_refused_by_audit_and_merge(done_run: tuple[Path, Path],
                                                                  tokenizer_assets: Path) -> None:
    cfg, run = done_run
    data = yaml.safe_load(cfg.read_text())
    data["model"] = {"id": "deepseek/deepseek-r1", "profile": "deepseek-r1",
                     "tokenizer": str(tokenizer_assets / "deepseek-r1")}
    other = cfg.with_name("deepseek.yaml")
    other.write_text(yaml.safe_dump(data))
    for cmd in ("audit", "merge", "generate"):
        res = run_cli([cmd, str(other)])
        assert res.returncode == 1, res.stderr
        one_error(res, "model.")
    assert not (run / "merged").exists() and not (run / "audit").exists()


def test_records_of_another_model_or_schema_are_refused_naming_the_line(done_run: tuple[Path, Path]) -> None:
    cfg, run = done_run
    raw = run / "raw" / "rel" / "raw_responses.jsonl"
    original = raw.read_bytes()
    _rewrite(raw, lambda o: o["provenance"].update(model_id="other/model"))
    for cmd in ("audit", "merge", "generate"):
        res = run_cli([cmd, str(cfg)])
        assert res.returncode == 1, res.stderr
        one_error(res, f"{raw}:1", "provenance.model_id", "--force")
    res = run_cli(["merge", str(cfg), "--force"])
    assert res.returncode == 0, res.stderr
    man = msgspec.json.decode((run / "merged" / "manifest.json").read_bytes(), type=MergeManifest)
    assert man.forced and "model_id" in man.forced[0]

    raw.write_bytes(original)
    _rewrite(raw, lambda o: o.update(schema_version=99))
    for cmd in ("audit", "merge", "generate"):
        one_error(run_cli([cmd, str(cfg)]), f"{raw}:1", "schema_version 99")

    raw.write_bytes(original)
    _rewrite(raw, lambda o: o.pop("provenance"))
    one_error(run_cli(["merge", str(cfg)]), f"{raw}:1", "no provenance", "draftgen import")


@pytest.mark.parametrize("bad", [-1, 2**31, 2**40])
def test_ids_outside_the_vocabulary_are_one_line_errors(done_run: tuple[Path, Path], bad: int) -> None:
    cfg, run = done_run
    raw = run / "raw" / "rel" / "raw_responses.jsonl"
    _rewrite(raw, lambda o: o["output_ids"].append(bad))
    for cmd in ("audit", "merge"):
        res = run_cli([cmd, str(cfg)])
        assert res.returncode == 1
        one_error(res, f"{raw}:1", str(bad), "vocabulary")


# -- import ------------------------------------------------------------------------------------------------


def test_local_sglang_records_come_in_through_import_and_resume_keeps_them(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=10)
    assert run_cli(["prepare", str(cfg)]).returncode == 0
    run = tmp_path / "run"
    sids = [json.loads(line)["sample_id"] for line in (run / "prepared" / "rel" / "prompts.jsonl").read_text().splitlines()]
    legacy = tmp_path / "sglang.jsonl"
    rows = [{"sample_id": s, "output_ids": [100 + i, 200, 151645]} for i, s in enumerate(sids[:4])]
    rows.append({"sample_id": "rel-not-prepared", "output_ids": [1, 2]})
    legacy.write_text("".join(json.dumps(r) + "\n" for r in rows))

    res = run_cli(["import", str(cfg), str(legacy), "--dataset", "rel"])
    assert res.returncode == 0, res.stderr
    assert "4 records" in res.stdout and "1 not in the prepared set" in res.stdout
    again = run_cli(["import", str(cfg), str(legacy), "--dataset", "rel"])
    assert "0 records" in again.stdout and "4 already there" in again.stdout

    assert run_cli(["generate", str(cfg)]).returncode == 0
    recs = read_raw(run / "raw" / "rel" / "raw_responses.jsonl").records
    by_id = {r.sample_id: r for r in recs}
    assert len(recs) == len(by_id) == 10
    for i, s in enumerate(sids[:4]):  # resumed, not regenerated
        assert by_id[s].output_ids == [100 + i, 200, 151645]
        assert by_id[s].provenance is not None and by_id[s].provenance.imported_from == str(legacy)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"sample_id": sids[5], "output_ids": [5, -3]}) + "\n")
    one_error(run_cli(["import", str(cfg), str(bad), "--dataset", "rel"]), f"{bad}:1", "-3", "vocabulary")
    bad.write_text(json.dumps({"sample_id": sids[5], "output_ids": [5], "schema_version": 7}) + "\n")
    one_error(run_cli(["import", str(cfg), str(bad), "--dataset", "rel"]), f"{bad}:1", "schema_version 7")


# -- 4. the prepared set decides what is merged --------------------------------------------------------------


def test_a_shrunk_dataset_merges_only_its_prepared_samples(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=30)
    assert run_cli(["run", str(cfg)]).returncode == 0
    data = yaml.safe_load(cfg.read_text())
    data["datasets"][0]["max_samples"] = 20
    cfg.write_text(yaml.safe_dump(data))
    res = run_cli(["run", str(cfg)])
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    stats = msgspec.json.decode((run / "merged" / "stats.json").read_bytes(), type=MergeStats)
    assert stats.total.records == 20 and stats.total.orphans == 10 and stats.total.samples <= 20
    assert "orphans" in res.stdout
    status = run_cli(["status", str(run)])
    assert "150%" not in status.stdout and "20/20" in status.stdout.replace(" ", ""), status.stdout
    page = (run / "report.html").read_text()
    assert "orphan" in page


# -- 11. exit codes ------------------------------------------------------------------------------------------


def test_a_run_where_every_request_failed_exits_4_and_merges_nothing(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=6, scenario=ALL_FAIL)
    res = run_cli(["generate", str(cfg)])
    assert res.returncode == 4, (res.stdout, res.stderr)
    assert "6 samples failed" in res.stdout
    res = run_cli(["run", str(cfg)])
    assert res.returncode == 4, (res.stdout, res.stderr)
    assert "nothing usable to merge" in res.stdout
    assert not (tmp_path / "run" / "merged").exists()


def test_some_failures_merge_what_is_done_and_exit_4(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=24, scenario=HALF_FAIL, retry={"max_attempts": 1})
    res = run_cli(["run", str(cfg)])
    assert res.returncode == 4, (res.stdout, res.stderr)
    man = msgspec.json.decode((tmp_path / "run" / "merged" / "manifest.json").read_bytes(), type=MergeManifest)
    assert 0 < sum(f.rows for f in man.files if f.kind == "parquet") < 24


def test_a_finished_run_exits_0_and_a_bad_config_2(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=4)
    assert run_cli(["run", str(cfg)]).returncode == 0
    bad = emu_config(tmp_path / "b", n=2, retry={"max_attempts": 0})
    one_error(run_cli(["run", str(bad)]), "retry.max_attempts")
    assert run_cli(["run", str(bad)]).returncode == 2
    assert run_cli(["run", str(cfg), "--no-such-flag"]).returncode == 2


# -- 12. messages --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "..", "-x", "a/b"])
def test_dataset_names_must_be_plain(tmp_path: Path, name: str) -> None:
    cfg = emu_config(tmp_path, n=2)
    data = yaml.safe_load(cfg.read_text())
    data["datasets"][0]["name"] = name
    cfg.write_text(yaml.safe_dump(data))
    res = run_cli(["prepare", str(cfg)])
    assert res.returncode == 2
    one_error(res, "plain name", "datasets[0].name")
    assert not (tmp_path / "run").exists()


def test_the_pilot_says_stopped_once(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=20, budget={"max_spend_usd": 0.0005})
    res = run_cli(["plan", str(cfg), "--pilot", "10"])
    out = res.stdout + res.stderr
    assert out.count("stopped:") == 1 and out.count("cannot cover the next request") == 1, out


def test_records_stay_valid_json(tmp_path: Path) -> None:
    """Every record written in this module decodes strictly (a guard for the fixtures above)."""
    cfg = emu_config(tmp_path, n=3)
    assert run_cli(["generate", str(cfg)]).returncode == 0
    for line in (tmp_path / "run" / "raw" / "rel" / "raw_responses.jsonl").read_bytes().splitlines():
        rec = msgspec.json.decode(line, type=ResponseRecord)
        assert rec.provenance is not None and rec.provenance.profile == "qwen3" and rec.schema_version == SCHEMA_VERSION


def test_a_full_disk_under_the_log_names_the_log(tmp_path: Path) -> None:
    cfg = emu_config(tmp_path, n=3)
    assert run_cli(["prepare", str(cfg)]).returncode == 0
    log = tmp_path / "run" / "logs" / "generate.log"
    log.parent.mkdir(parents=True)
    log.symlink_to("/dev/full")  # every write: ENOSPC
    res = run_cli(["generate", str(cfg)])
    assert res.returncode == 1
    one_error(res, str(log), "no space left on device")
