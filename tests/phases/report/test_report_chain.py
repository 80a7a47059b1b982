"""report.html's extract, train and accept sections, and status's accept row, on tiny-chain's files (issue 34,
finding 6: on a3c8820 the page had none of them and status said "✓ accept (2 drafters measured)")."""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path

import msgspec

from _chain_helpers import write_chain
from _report_helpers import html_table as _table
from _report_helpers import make_config, write_run_dir
from draftgen.config import load_config
from draftgen.phases.report.run import run_report
from draftgen.phases.status.run import run_status
from draftgen.runview.chain import ChainView, read_chain


def test_the_report_shows_the_chain_acceptance_beside_the_baselines_per_position_and_per_dataset(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run)
    main, sg, other = write_chain(run)
    page = run_report(load_config(make_config(tmp_path, run)), echo=lambda _s: None).path.read_text()
    for section in ("extract", "train", "accept"):
        assert f'<h2 id="{section}">' in page, section
    extract = _table(page, "extract-table")
    assert extract[1][1:5] == ["256", "14,346", "0", "1, 2, 3 + final 4"], extract
    train = _table(page, "train-table")
    assert train[1][2:4] == ["243 / 243", "85"] and train[1][-2:] == ["2.9588", "2.530"], train
    acc = _table(page, "accept-table")
    assert acc[0][-3:] == ["position 1", "position 2", "position 3"]
    rows = {r[0].split(" ")[0] if not r[0].startswith("the drafter") else "drafter": r for r in acc[1:]}
    assert rows["drafter"][2:4] == ["2.040", "[1.870, 2.219]"] and rows["drafter"][-3:] == ["0.600", "0.300", "0.140"]
    assert rows["copy-last"][1:6] == ["replay", "1.070", "[1.036, 1.111]", "+0.970", "[+0.800, +1.150]"]
    assert rows["lookup"][2:6] == ["1.306", "[1.210, 1.414]", "+0.734", "[+0.573, +0.903]"]
    assert rows["zero-aux"][1:6] == ["server", "1.260", "[1.194, 1.332]", "+0.780", "[+0.618, +0.941]"]
    assert rows["max(copy-last,"][4:6] == ["+0.734", "[+0.573, +0.903]"]
    ds = _table(page, "accept-datasets")
    assert ds[0] == ["dataset", "prompts", "drafter", "95% interval", "copy-last", "lookup", "zero-aux"]
    assert ds[2] == ["count", "16", "2.781", "[2.521, 3.081]", "1.025", "1.881", "1.490"]
    said = re.search(r'<p id="accept-verdict"[^>]*><b>(.*?)</b>', page, re.S)
    assert said is not None and htmllib.unescape(said.group(1)).startswith(
        "The drafter beats the no-model drafters by +0.734 (95% interval +0.573 to +0.903)")
    passes = _table(page, "accept-passes")
    assert [(r[0], r[2], r[3]) for r in passes[1:]] == [
        (f"accept/{main.drafter_key}/{main.pass_name}.json (the latest)", "64", "2.040"),
        (f"accept/{sg.drafter_key}/{sg.pass_name}.json", "16", "1.964"),
        (f"accept/{other.drafter_key}/{other.pass_name}.json", "64", "1.013")]
    # every figure of the sections is in the embedded JSON, and it is what the files hold
    m = re.search(r'<script type="application/json" id="draftgen-chain">(.*?)</script>', page, re.S)
    assert m is not None
    assert msgspec.json.decode(m.group(1).encode(), type=ChainView) == read_chain(run)


def test_a_run_without_the_chain_has_no_chain_sections(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run)
    page = run_report(load_config(make_config(tmp_path, run)), echo=lambda _s: None).path.read_text()
    assert '<h2 id="accept">' not in page and 'id="draftgen-chain"' not in page


def test_status_shows_the_latest_acceptance_figure(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run_dir(run)
    write_chain(run)
    out: list[str] = []
    rep = run_status(str(run), echo=out.append)
    text = "\n".join(out)
    assert ("accept (AL 2.040 [1.870, 2.219] over 64 prompts (vllm), +0.734 [+0.573, +0.903] over max(copy-last, "
            "lookup); 2 drafters measured (3 passes))") in " ".join(text.split()), text
    accept = next(p for p in rep.summary.phases if p.name == "accept")  # status --json says the same
    assert accept.state == "done" and accept.detail is not None and accept.detail.startswith("AL 2.040 ")
