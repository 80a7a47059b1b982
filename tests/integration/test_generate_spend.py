"""One booked spend after a Ctrl-C with requests in flight (issue 34, finding 2): the live display's last line,
generate's summary, ``status --json`` and report.html give the same figure and name the part held for the
abandoned requests; a later ``GET /generation`` (the emulator's, which bills a stream the client abandons for
the tokens it sent) settles each hold by its bill; spent + left never passes the budget."""

from __future__ import annotations

import html as htmllib
import os
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec

from _generate_helpers import claim, emulator, make_config, write_prompts
from draftgen.emulator import Provider, builtin_scenario
from draftgen.phases.generate.run import run_generate
from draftgen.phases.report.run import run_report
from draftgen.phases.status.run import StatusSummary, run_status
from draftgen.records import AttemptRecord, SettlementRecord
from draftgen.rundir import RunDir
from draftgen.runview.providers import provider_metrics
from draftgen.store import iter_jsonl

BUDGET = 5.0
MAX_TOKENS = 512
_HELD = re.compile(r"billed \$([0-9.]+) \+ \$([0-9.]+) held for ([0-9,]+) abandoned requests?, worst case")


def _interrupt_when(check: Callable[[], bool]) -> threading.Thread:
    """Ctrl-C (the engine's own SIGINT handler) once ``check()`` holds."""

    def go() -> None:
        while not check():
            threading.Event().wait(0.02)
        threading.Event().wait(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _status(cfg_run: Path) -> StatusSummary:
    js: list[str] = []
    run_status(str(cfg_run), echo=js.append, as_json=True)
    return msgspec.json.decode(js[0], type=StatusSummary)


def test_ctrl_c_books_one_spend_everywhere_and_generation_settles_it(tmp_path: Path) -> None:
    slow = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, tokens_per_s=(150.0, 400.0)),
            Provider("Baseten", "baseten/fp4", "fp4", 0.60, 3.00, tokens_per_s=(150.0, 400.0))]
    sc = builtin_scenario("fast").replace(pool_size=64, providers=slow)
    base = make_config(tmp_path, ["q"])
    claim(base)
    write_prompts(base.run_path, "q", 14)
    rd = RunDir(base.run_path)
    raw = rd.raw("q")
    # the bills are not known before the run ends (404 for a minute): the holds stay, named
    with emulator(sc, generation_lag_s=60.0) as emu:
        cfg = make_config(tmp_path, ["q"], base_url=emu.base_url, budget={"max_spend_usd": BUDGET},
                          partitions={"short": {"concurrency": 8, "max_tokens": MAX_TOKENS}},
                          retry={"shutdown_grace_s": 0.05})
        said: list[str] = []
        killer = _interrupt_when(lambda: raw.is_file() and raw.read_bytes().count(b"\n") >= 3)
        rep = run_generate(cfg, echo=said.append)
        killer.join()
        assert rep.exit_code == 130

        abandoned = [a for _, a in iter_jsonl(rd.attempts, AttemptRecord) if a.outcome == "abandoned"]
        assert abandoned and all(a.generation_id and a.cost > 0 for a in abandoned)
        n = len(abandoned)
        held = sum(a.cost for a in abandoned)

        # generate's summary: this run dir's booked spend, the held part named
        summary = " ".join(" ".join(said).split())  # the end-of-run lines, however they wrap
        m = re.search(r"\$([0-9.]+) in this run dir: " + _HELD.pattern, summary)
        assert m, summary
        booked_summary, billed, held_summary, n_summary = float(m[1]), float(m[2]), float(m[3]), int(m[4].replace(",", ""))
        assert n_summary == n and abs(held_summary - held) < 1e-4
        assert abs(booked_summary - (billed + held_summary)) < 2e-4

        # the display's last line (logs/generate.log): the same figure, spent + left within the budget
        last = [line for line in rd.log("generate").read_text().splitlines() if " | budget: $" in line][-1]
        d = re.search(r"budget: \$([0-9.]+) spent \(" + _HELD.pattern + r"\) · \$([0-9.]+) left", last)
        assert d, last
        end = re.search(r"budget: \$([0-9.]+) spent \(" + _HELD.pattern + r"\) \+ \$([0-9.]+) left = \$5", summary)
        assert end and float(end[1]) == booked_summary and float(end[1]) + float(end[5]) <= BUDGET + 1e-4, summary
        assert abs(float(d[1]) - booked_summary) <= 0.005 and int(d[4].replace(",", "")) == n
        assert float(d[1]) + float(d[5]) <= BUDGET + 0.005

        # status --json and its text
        st = _status(rd.root)
        assert abs(st.spend_usd - booked_summary) < 1e-4 and st.abandoned == n
        assert abs(st.held_usd - held) < 1e-4 and abs(st.billed_usd - billed) < 1e-4
        text: list[str] = []
        run_status(str(rd.root), echo=text.append)
        assert f"held for {n} abandoned request" in " ".join(" ".join(text).split())

        # report.html: the same booked figure, the held part named
        run_report(cfg, echo=lambda s: None)
        page = htmllib.unescape(rd.report_html.read_text())
        assert f"${booked_summary:,.4f}" in page and f"held for {n} abandoned request" in page

        # the providers table names the abandoned requests, never "unknown"
        names = {p.provider for p in provider_metrics(rd.root, ["q"])}
        assert "unknown" not in names

        # a later lookup settles each hold by its bill: the next run, once GET /generation answers
        emu.core.generation_lag_s = 0.0
        bills = {g.id: g.total_cost for g in emu.state.generations.values() if g.cancelled}
        assert set(bills) >= {a.generation_id for a in abandoned}
        rep2 = run_generate(cfg, echo=lambda s: None)
        assert rep2.exit_code == 0
        emulator_billed = emu.state.spend_usd

    settled = {s.generation_id: s for _, s in iter_jsonl(rd.settlements, SettlementRecord)}
    assert set(settled) == {a.generation_id for a in abandoned}
    for s in settled.values():
        assert abs(s.billed_usd - bills[s.generation_id]) < 1e-9 and s.billed_usd < s.held_usd
    st = _status(rd.root)
    assert st.abandoned == 0 and st.held_usd == 0
    # after settlement the booked spend is what the server billed, to the cent's hundredth
    assert abs(st.spend_usd - emulator_billed) < 1e-4, (st.spend_usd, emulator_billed)
    assert st.spend_usd == st.billed_usd


def test_the_run_that_abandons_settles_its_holds_when_the_bills_are_in(tmp_path: Path) -> None:
    slow = [Provider("DeepInfra", "deepinfra/fp4", "fp4", 0.45, 2.25, tokens_per_s=(150.0, 400.0))]
    base = make_config(tmp_path, ["q"])
    claim(base)
    write_prompts(base.run_path, "q", 8)
    rd = RunDir(base.run_path)
    with emulator(builtin_scenario("fast").replace(pool_size=64, providers=slow), generation_lag_s=0.2) as emu:
        cfg = make_config(tmp_path, ["q"], base_url=emu.base_url, budget={"max_spend_usd": BUDGET},
                          partitions={"short": {"concurrency": 6, "max_tokens": MAX_TOKENS}},
                          retry={"shutdown_grace_s": 0.05})
        said: list[str] = []
        killer = _interrupt_when(lambda: rd.raw("q").is_file() and rd.raw("q").read_bytes().count(b"\n") >= 1)
        rep = run_generate(cfg, echo=said.append)
        killer.join()
        emulator_billed = emu.state.spend_usd
    assert rep.exit_code == 130
    abandoned = {a.generation_id for _, a in iter_jsonl(rd.attempts, AttemptRecord) if a.outcome == "abandoned"}
    settled = {s.generation_id for _, s in iter_jsonl(rd.settlements, SettlementRecord)}
    assert abandoned and settled == abandoned
    summary = " ".join(" ".join(said).split())
    assert "held for" not in summary
    assert f"${emulator_billed:.4f} in this run dir)" in summary, (summary, emulator_billed)
    assert "settled" in rd.log("generate").read_text()
