"""report.html's data-loop tables (issue 35, item 2): the accept section's acceptance per dataset and prompt-length
bucket beside each dataset's share of the training tokens, and the rounds of generation. The runs are made the
real way (prepare, generate, merge, ``plan --next-round``, ``generate --round``); the accept pass is written as
``draftgen accept`` writes it (its report, the run's latest copy, and its ``.prompts.jsonl``)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import msgspec
from click.testing import CliRunner

from _common_helpers import config_dict, write_config
from _merge_helpers import chat_rows, fake_generate, make_config, prepared_run, write_jsonl
from _report_helpers import html_table
from draftgen.cli import cli
from draftgen.config import RunConfig, load_config
from draftgen.fmt import fmt_pct, fmt_time, fmt_usd
from draftgen.phases.accept.figures import compare
from draftgen.phases.accept.passes import length_bucket
from draftgen.phases.accept.run import drafter_key, pass_name
from draftgen.phases.generate.run import run_generate
from draftgen.phases.merge.run import run_merge
from draftgen.phases.plan.rounds import run_next_round
from draftgen.phases.prepare.run import run_prepare
from draftgen.phases.report.run import run_report
from draftgen.records import (
    AcceptanceFigures,
    AcceptReport,
    DatasetAcceptance,
    DatasetStats,
    MergeStats,
    PromptAcceptance,
    ThroughputFigures,
)
from draftgen.rundir import RunDir
from draftgen.runview.chain import ChainView, read_chain
from draftgen.runview.loop import RoundsView
from draftgen.runview.rounds import read_rounds, round_counts
from draftgen.store import JsonlWriter, atomic_write_json, read_json

QUIET = {"echo": lambda s: None}


def _prompt(sid: str, dataset: str, tokens: int | None, drafts: float, accepted: float,
            source: str | None = "vllm-per-request", tags: list[str] | None = None) -> PromptAcceptance:
    """One held-out prompt's line as accept's pass writes it (its bucket from accept's own rule)."""
    return PromptAcceptance(sample_id=sid, dataset=dataset, drafts=drafts if source else 0.0,
                            accepted=accepted if source else 0.0, completion_tokens=32, source=source,
                            prompt_tokens=tokens, length_bucket=length_bucket(tokens), tags=tags)


def _write_pass(run: Path, rows: list[PromptAcceptance], datasets: list[DatasetAcceptance], al: float,
                ci: list[float], tags: list[DatasetAcceptance] | None = None) -> AcceptReport:
    """The pass's report, the run's latest copy and its prompts file, where and as ``draftgen accept`` writes
    them."""
    rd = RunDir(run)
    ids = [r.sample_id for r in rows]
    rep = AcceptReport(
        drafter=str(rd.train_drafter), drafter_key=drafter_key(rd.train_drafter), pass_name=pass_name("vllm", ids),
        server="vllm", prompts=len(rows), sample_ids=ids, max_tokens=32, k=3, created_at=time.time(),
        acceptance=AcceptanceFigures(source="vllm-per-request", acceptance_length=al, ci95=ci,
                                     drafts=sum(r.drafts for r in rows), accepted=sum(r.accepted for r in rows)),
        speculative=ThroughputFigures(base_url="http://127.0.0.1:1/v1", requests=len(rows), completion_tokens=32,
                                      seconds=1.0, tokens_per_s=32.0),
        datasets=datasets, tags=tags or [], per_prompt=rows)
    with JsonlWriter(rd.accept_prompts(rep.drafter_key, rep.pass_name), fsync=False) as w:
        w.write_many(rows)
    atomic_write_json(rd.accept_report(rep.drafter_key, rep.pass_name), rep)
    atomic_write_json(rd.accept_json, rep)
    return rep


def _page(cfg: RunConfig) -> str:
    return run_report(cfg, **QUIET).path.read_text(encoding="utf-8")


def _embedded(page: str, element_id: str) -> bytes:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    assert m is not None, element_id
    return m.group(1).encode()


def test_the_accept_section_shows_acceptance_per_dataset_and_prompt_length_beside_the_training_share(
        tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"chat": chat_rows("chat", 12), "code": chat_rows("code", 6)})
    run_merge(cfg, **QUIET)
    run = cfg.run_path
    merged = read_json(RunDir(run).merged_stats, MergeStats)
    sup = {d.dataset: d.supervised_tokens for d in merged.datasets}
    total = merged.total.supervised_tokens
    assert total == sup["chat"] + sup["code"] > 0 and sup["chat"] != sup["code"]
    rows = [
        # chat: two short prompts, AL 3.0 and 1.0 one by one, 1 + 4/8 = 1.5 pooled; one long prompt, AL 1.0
        _prompt("chat-h0", "chat", 40, 2, 4), _prompt("chat-h1", "chat", 90, 6, 0),
        _prompt("chat-h2", "chat", 2000, 4, 0),
        # code: one of 256-1k tokens (AL 2.5), one of unknown length (AL 2.0), one without its own counters
        _prompt("code-h0", "code", 300, 4, 6), _prompt("code-h1", "code", None, 2, 2),
        _prompt("code-h2", "code", 50, 3, 3, source=None),
    ]
    _write_pass(run, rows, [DatasetAcceptance(dataset="chat", prompts=3, acceptance_length=1.3333, ci95=[1.1, 1.6]),
                            DatasetAcceptance(dataset="code", prompts=2, acceptance_length=2.3333, ci95=[2.0, 2.7])],
                al=1.6667, ci=[1.4, 1.9])
    page = _page(cfg)
    table = html_table(page, "accept-lengths")
    assert table[0] == ["dataset", "share of training tokens (supervised)", "acceptance length [95% interval]",
                        "prompts of <256 tokens", "prompts of 256-1k tokens", "prompts of 1k-4k tokens",
                        "prompts of unknown tokens"]
    share = {name: f"{fmt_pct(n / total)} ({n:,})" for name, n in sup.items()}
    assert table[1] == ["chat", share["chat"], "1.333 [1.100, 1.600]", "1.500 n=2", "–", "1.000 n=1", "–"]
    assert table[2] == ["code", share["code"], "2.333 [2.000, 2.700]", "–", "2.500 n=1", "–", "2.000 n=1"]
    assert table[3] == ["all", f"100.0% ({total:,})", "1.667 [1.400, 1.900]", "1.500 n=2", "2.500 n=1",
                        "1.000 n=1", "2.000 n=1"]
    # the cells below the pass's interval are marked; the prompt without counters is said to be left out
    lows = re.findall(r'<td class="low"[^>]*>([^<]*)', page[page.index('id="accept-lengths"'):])
    assert [c.strip() for c in lows] == ["1.000", "1.000"]
    rd = RunDir(run)
    rep = read_json(rd.accept_json, AcceptReport)
    assert (f"{rd.accept_prompts(rep.drafter_key, rep.pass_name).relative_to(run)}; 1 without them left out"
            in page)
    # every figure of the table is in the embedded chain, and it is what the files give
    chain = msgspec.json.decode(_embedded(page, "draftgen-chain"), type=ChainView)
    assert chain == read_chain(run) and chain.by_length is not None
    assert chain.by_length.rows[0].training_share == sup["chat"] / total
    # a run with one round shows no rounds
    assert 'id="rounds-table"' not in page and 'id="draftgen-rounds"' not in page


def test_an_unreadable_prompts_file_costs_the_table_with_a_note_not_the_page(tmp_path: Path) -> None:
    cfg = prepared_run(tmp_path, {"chat": chat_rows("chat", 4)})
    run = cfg.run_path
    rep = _write_pass(run, [_prompt("chat-h0", "chat", 40, 2, 2)],
                      [DatasetAcceptance(dataset="chat", prompts=1, acceptance_length=2.0)], al=2.0, ci=[2.0, 2.0])
    path = RunDir(run).accept_prompts(rep.drafter_key, rep.pass_name)
    path.write_bytes(path.read_bytes() + b'{"sample_id": 3}\n')
    page = _page(cfg)
    assert 'id="accept-table"' in page and 'id="accept-lengths"' not in page
    assert f"note: {path}:2: " in page


def _loop_config(tmp: Path) -> Path:
    """Datasets ``weak`` and ``strong`` of 40 prompts each, round 1 drawing 8 and 24 of them."""
    for name in ("weak", "strong"):
        rows = [msgspec.json.encode({"messages": [{"role": "user", "content": f"{name} question {i}?"}]})
                for i in range(40)]
        (tmp / f"{name}.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    ds = [{"name": n, "path": f"{n}.jsonl", "max_samples": m} for n, m in (("weak", 8), ("strong", 24))]
    return write_config(tmp, config_dict(tmp, ds, progress="off",
                                         partitions={"short": {"concurrency": 8, "max_tokens": 200}}))


def _round_cells(page: str) -> list[list[str]]:
    return html_table(page, "rounds-table")


def test_the_rounds_table_shows_each_round_once_a_later_one_is_proposed(tmp_path: Path) -> None:
    cfg_path = _loop_config(tmp_path)
    cfg = load_config(cfg_path)
    assert run_generate(cfg, argv=["draftgen"], prepare=run_prepare, **QUIET).exit_code == 0
    run_merge(cfg, **QUIET)
    run = cfg.run_path
    # the measurement plan --next-round reads: weak accepts less than strong
    _write_pass(run, [_prompt(f"weak-h{i}", "weak", 20, 4, 2) for i in range(4)]
                + [_prompt(f"strong-h{i}", "strong", 20, 4, 8) for i in range(4)],
                [DatasetAcceptance(dataset="weak", prompts=4, acceptance_length=1.5, ci95=[1.4, 1.6]),
                 DatasetAcceptance(dataset="strong", prompts=4, acceptance_length=3.0, ci95=[2.9, 3.1])],
                al=2.25, ci=[2.0, 2.5])
    page = _page(cfg)
    assert 'id="rounds-table"' not in page and '<h2 id="rounds">' not in page  # one round: no table

    # round 2 proposed: round 1 as configured (from the whole run), round 2 with what it would add
    two = run_next_round(cfg, add_tokens=4000, **QUIET)
    table = _round_cells(_page(cfg))
    assert table[0] == ["round", "spread", "budget", "started", "weak: prompts added / done",
                        "strong: prompts added / done", "merged rows", "acceptance length, measured → expected"]
    merged = read_json(RunDir(run).merged_stats, MergeStats)
    assert table[1] == ["1", "as configured", "–", "–", "8 / 8", "24 / 24", f"{merged.total.samples:,}", "–"]
    adds = {d.dataset: d for d in two.datasets}
    assert adds["weak"].add_samples > 0 and two.weighted_now is not None and two.weighted_expected is not None

    def cell(d: str, done: int) -> str:
        line = adds[d]
        expected = (f" → AL {line.expected_acceptance_length:.3f}"
                    if line.expected_acceptance_length is not None else "")
        return f"{line.add_samples:,} / {done}{expected}"

    assert table[2] == ["2", "guided", f"{two.budget:,.0f} tokens", "proposed", cell("weak", 0), cell("strong", 0),
                        "0", f"{two.weighted_now:.3f} → {two.weighted_expected:.3f}"]

    # round 2 generated and merged, round 3 proposed (uniform, in dollars)
    res = CliRunner().invoke(cli, ["generate", str(cfg_path), "--round", "2"])
    assert res.exit_code == 0, res.output
    run_merge(cfg, **QUIET)
    three = run_next_round(cfg, spread="uniform", add_usd=0.01, **QUIET)
    page = _page(cfg)
    table = _round_cells(page)
    started = read_rounds(run)[0]
    assert started.round == 2 and started.started_at is not None
    counts = {c.round: c for c in round_counts(run, ["weak", "strong"])}
    merged = read_json(RunDir(run).merged_stats, MergeStats)
    assert [r[0] for r in table[1:]] == ["1", "2", "3"]
    assert table[2][:4] == ["2", "guided", f"{two.budget:,.0f} tokens", fmt_time(started.started_at)]
    done = {d: counts[2].by_dataset.get(d, [0, 0])[1] for d in ("weak", "strong")}  # a dataset it adds none to
    assert table[2][4:6] == [cell("weak", done["weak"]), cell("strong", done["strong"])]
    assert counts[2].done == sum(d.add_samples for d in two.datasets) > 0  # every round-2 prompt answered
    assert [r[6] for r in table[1:3]] == [f"{merged.total.rounds['1']:,}", f"{merged.total.rounds['2']:,}"]
    assert table[3][:4] == ["3", "uniform", fmt_usd(three.budget), "proposed"]
    view = msgspec.json.decode(_embedded(page, "draftgen-rounds"), type=RoundsView)
    assert [r.round for r in view.rows] == [1, 2, 3] and view.rows[1].started_at == started.started_at


def test_a_tagged_datasets_tags_get_rows_of_their_own_under_it(tmp_path: Path) -> None:
    """``chat`` prepared with ``tags_field`` (tags x, y, both, none), ``code`` without: both acceptance tables
    show a ``chat / <tag>`` row per tag under chat, with accept's per-tag figures (``figures.compare`` on the
    pass's prompts, as accept makes them), the cells pooled from the prompts carrying the tag, and the tag's
    estimated share of the training tokens (chat's × the tag's share of chat's drawn prompts)."""
    topics: list[object] = ["x", ["x", "y"], None, "y", "x", None]
    write_jsonl(tmp_path / "chat.jsonl", [{**r, **({"topic": t} if t else {})}
                                          for r, t in zip(chat_rows("chat", 6), topics, strict=True)])
    write_jsonl(tmp_path / "code.jsonl", chat_rows("code", 4))
    cfg = make_config(tmp_path, [{"name": "chat", "path": "chat.jsonl", "tags_field": "topic"},
                                 {"name": "code", "path": "code.jsonl"}])
    run_prepare(cfg, **QUIET)
    fake_generate(cfg)
    run_merge(cfg, **QUIET)
    run = cfg.run_path
    merged = read_json(RunDir(run).merged_stats, MergeStats)
    sup = {d.dataset: d.supervised_tokens for d in merged.datasets}
    total = merged.total.supervised_tokens
    rows = [
        _prompt("chat-h0", "chat", 40, 2, 4, tags=["x"]),  # AL 3.0
        _prompt("chat-h1", "chat", 90, 6, 0, tags=["x", "y"]),  # AL 1.0, in x and in y
        _prompt("chat-h2", "chat", 2000, 4, 0),  # AL 1.0, untagged
        _prompt("chat-h3", "chat", 300, 4, 6, tags=["y"]),  # AL 2.5
        _prompt("code-h0", "code", 300, 4, 6),
    ]
    cmp = compare(rows, [None] * len(rows), None, counted=True)
    assert [(t.dataset, t.tag, t.prompts) for t in cmp.tags] == [("chat", "", 1), ("chat", "x", 2), ("chat", "y", 2)]
    _write_pass(run, rows, cmp.datasets, al=1.9, ci=[1.5, 2.3], tags=cmp.tags)
    page = _page(cfg)
    figs = {t.tag: t for t in cmp.tags}
    assert [f.acceptance_length for f in figs.values()] == [1.0, 1.5, round(1 + 6 / 10, 4)]

    def al_ci(f: DatasetAcceptance) -> str:
        return f"{f.acceptance_length:.3f}" + (f" [{f.ci95[0]:.3f}, {f.ci95[1]:.3f}]" if f.ci95 else "")

    stats = read_json(RunDir(run).prepared_stats("chat"), DatasetStats)
    assert stats.tags == {"x": 3, "y": 2, "": 2} and stats.samples == 6

    def share(tag: str) -> str:
        n = round(sup["chat"] * stats.tags[tag] / stats.samples)
        return f"{fmt_pct(n / total)} ({n:,})"

    table = html_table(page, "accept-lengths")
    assert [r[0] for r in table] == ["dataset", "chat", "chat / (untagged)", "chat / x", "chat / y", "code", "all"]
    assert table[0][3:] == ["prompts of <256 tokens", "prompts of 256-1k tokens", "prompts of 1k-4k tokens"]
    assert table[2] == ["chat / (untagged)", share(""), al_ci(figs[""]), "–", "–", "1.000 n=1"]
    assert table[3] == ["chat / x", share("x"), al_ci(figs["x"]), "1.500 n=2", "–", "–"]
    assert table[4] == ["chat / y", share("y"), al_ci(figs["y"]), "1.000 n=1", "2.500 n=1", "–"]
    assert table[1][:3] == ["chat", f"{fmt_pct(sup['chat'] / total)} ({sup['chat']:,})", al_ci(cmp.datasets[0])]
    assert "a dataset / tag row's is an estimate" in page
    datasets = html_table(page, "accept-datasets")
    assert [r[:4] for r in datasets[1:]] == [
        ["chat", "4", al_ci(cmp.datasets[0]).split(" ")[0], _ci(cmp.datasets[0].ci95)],
        *[[f"chat / {t or '(untagged)'}", str(figs[t].prompts), f"{figs[t].acceptance_length:.3f}", _ci(figs[t].ci95)]
          for t in ("", "x", "y")],
        ["code", "1", f"{cmp.datasets[1].acceptance_length:.3f}", "–"]]


def _ci(ci: list[float] | None) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "–"
