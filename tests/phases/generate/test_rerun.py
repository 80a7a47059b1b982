"""phases.generate.rerun: a rerun with other generation settings says what differs and what it keeps, and
``generate --redo changed|truncated`` regenerates those samples without duplicating a record (issue 23)."""

from __future__ import annotations

from pathlib import Path

from _generate_helpers import claim, emulator, make_config, responses, write_prompts
from draftgen.config import RunConfig
from draftgen.fmt import render_text
from draftgen.phases.generate.run import run_generate
from draftgen.phases.status.run import render_status, run_status
from draftgen.records import ResponseRecord
from draftgen.runview.metrics import compute_metrics
from draftgen.store import iter_jsonl
from draftgen.tokens import Profile


def _cfg(tmp: Path, url: str, max_tokens: int, temperature: float) -> RunConfig:
    return make_config(tmp, ["a"], base_url=url, sampling={"temperature": temperature},
                       partitions={"short": {"concurrency": 8, "max_tokens": max_tokens}})


def test_a_rerun_says_what_differs_and_redo_regenerates_without_duplicates(tmp_path: Path, qwen3_profile: Profile) -> None:
    run_dir = claim(make_config(tmp_path, ["a"]))
    ids = write_prompts(run_dir, "a", 6)
    profile = qwen3_profile  # loaded once for the five runs
    with emulator(profile_obj=profile) as emu:
        first = run_generate(_cfg(tmp_path, emu.base_url, 64, 0.6), echo=lambda s: None, profile=profile)
        assert first.done == 6
        old = {r.sample_id: r for r in responses(run_dir, "a")}
        assert all(r.settings is not None and r.settings.sampling == {"temperature": 0.6} for r in old.values())
        cut = {sid for sid, r in old.items() if r.finish_reason == "length"}
        assert cut and all(r.max_tokens == 64 for r in old.values())

        # Other settings: said, counted, kept; nothing is sent.
        lines: list[str] = []
        again = run_generate(_cfg(tmp_path, emu.base_url, 2048, 0.3), echo=lines.append, profile=profile)
        said = next(ln for ln in lines if ln.startswith("a: 6 records from earlier runs, 6 kept"))
        assert "6 made with other settings" in said and "partitions.short.max_tokens 64 → 2,048: 6" in said
        assert "sampling.temperature 0.6 → 0.3: 6" in said and "`generate --redo changed` regenerates them" in said
        assert f"{len(cut)} cut at a max_tokens below today's" in said
        assert again.requests == 0

        # --redo truncated: only the cut samples again; one record per sample, the old ones set aside.
        lines = []
        redone = run_generate(_cfg(tmp_path, emu.base_url, 2048, 0.3), echo=lines.append,
                              redo=["truncated"], profile=profile)
        assert redone.done == len(cut)
        assert f"a: --redo truncated: {len(cut)} records moved to raw/a/replaced.jsonl" in "\n".join(lines)
        now = responses(run_dir, "a")
        assert sorted(r.sample_id for r in now) == sorted(ids)
        assert {r.sample_id for r in now if r.max_tokens == 2048} == cut
        replaced = [r for _, r in iter_jsonl(run_dir / "raw" / "a" / "replaced.jsonl", ResponseRecord)]
        assert {r.sample_id for r in replaced} == cut and all(r.max_tokens == 64 for r in replaced)
        m = compute_metrics(run_dir, ["a"])
        assert m.total.done == 6 and m.total.duplicates == 0 and m.total.replaced == len(cut)
        spent_old = sum(r.usage.cost for r in replaced if r.usage)
        assert m.total.spent_usd == m.total.cost_usd + spent_old > m.total.cost_usd
        status = run_status(str(run_dir), echo=lambda s: None)  # status's spend is the metrics', replaced included
        assert status.summary.spend_usd == round(m.total.spent_usd, 6) > round(m.total.cost_usd, 6)
        assert f"{len(cut)} records set aside by --redo" in render_text(render_status(status.metrics, status.summary, now=0.0))

        # --redo changed: the rest, made with the old settings, again; nothing is duplicated.
        redone = run_generate(_cfg(tmp_path, emu.base_url, 2048, 0.3), echo=lambda s: None,
                              redo=["changed"], profile=profile)
        assert redone.done == 6 - len(cut)
        now = responses(run_dir, "a")
        assert sorted(r.sample_id for r in now) == sorted(ids)
        assert all(r.max_tokens == 2048 and r.settings and r.settings.sampling == {"temperature": 0.3} for r in now)
        lines = []
        assert run_generate(_cfg(tmp_path, emu.base_url, 2048, 0.3), echo=lines.append,
                            redo=["changed"], profile=profile).requests == 0
        assert not any("records from earlier runs" in ln for ln in lines)
