"""What a rerun of ``generate`` keeps and redoes: each record's generation settings against the config's.

Every record carries what made it: its ``max_tokens`` and, since issue 23, its ``settings`` (the config's
``sampling``, ``reasoning`` and ``routing`` sections, ``records.GenerationSettings``). A rerun compares them
with its own before sending anything and says, per dataset, how many records it keeps and what differs:

- changed: a record made with another ``max_tokens`` (its partition's), other sampling or reasoning
  settings, or served by a provider or quantization the routing now excludes;
- truncated: a record cut at its ``max_tokens`` (finish_reason ``length``) that was below today's, so a
  rerun would give it room to finish;
- routing settings that differ (``sort``, ``order``, ...) are said, not counted as changed: they decide who
  serves a request, not what it asks;
- a record without settings (written before they were kept, or imported) is compared on max_tokens only.

``generate --redo changed`` and ``--redo truncated`` regenerate them: their records are moved, byte for byte,
from ``raw/<dataset>/raw_responses.jsonl`` to ``raw/<dataset>/replaced.jsonl`` (``store.move_records``),
so their samples are pending again (resume stays by sample_id), the raw log keeps one record per sample
and what merge, audit and the report read holds the new record only. The replaced records stay on disk for
their spend: the dollar budget and the report count it; they are never merged.

Reads the raw logs (``ResponseSettingsView``); with a redo, writes those two files. Holds no lock of its
own: generate calls it under the run directory's writer lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from draftgen.backends import EndpointInfo
from draftgen.backends.pricing import eligible_endpoints
from draftgen.config import RunConfig
from draftgen.records import GenerationSettings, ResponseScanView, ResponseSettingsView, spend_usd
from draftgen.rundir import RunDir
from draftgen.store import iter_jsonl, move_records

__all__ = ["REDO_KINDS", "DatasetRerun", "generation_settings", "redo", "replaced_spend", "rerun_lines",
           "settings_report"]

#: what ``generate --redo`` may regenerate
REDO_KINDS = ("changed", "truncated")
#: differences named per dataset (the most frequent first)
_SHOWN = 4


def generation_settings(cfg: RunConfig) -> GenerationSettings:
    """The settings a record made with ``cfg`` carries (its sections as plain data, unset fields left out)."""
    return GenerationSettings(sampling=msgspec.to_builtins(cfg.sampling), reasoning=msgspec.to_builtins(cfg.reasoning),
                              routing=msgspec.to_builtins(cfg.routing))


@dataclass
class DatasetRerun:
    """One dataset's records against today's settings (see the module docstring)."""

    dataset: str
    records: int = 0
    unknown: int = 0
    """Records without settings: compared on max_tokens only."""
    changed: set[str] = field(default_factory=set)
    truncated: set[str] = field(default_factory=set)
    differences: Counter[str] = field(default_factory=Counter)
    routing: Counter[str] = field(default_factory=Counter)
    """Routing settings that differ (said, not counted as changed)."""


def _shown(v: Any) -> str:
    return "unset" if v is None else v if isinstance(v, str) else msgspec.json.encode(v).decode()


def _section_diffs(section: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [f"{section}.{k} {_shown(old.get(k))} → {_shown(new.get(k))}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _excluded(cfg: RunConfig, row: ResponseSettingsView) -> str | None:
    """Why the routing now keeps out the provider (or quantization) that served ``row``, or None."""
    if not row.provider:
        return None
    routing = cfg.routing if row.quantization else msgspec.structs.replace(cfg.routing, quantizations=None)
    ep = EndpointInfo(provider_name=row.provider, quantization=row.quantization)
    if eligible_endpoints([ep], routing):
        return None
    return f"served by {row.provider}" + (f" ({row.quantization})" if row.quantization else "") + \
        ", which the routing now excludes"


def _compare(cfg: RunConfig, row: ResponseSettingsView, now: GenerationSettings, acc: DatasetRerun) -> None:
    part = getattr(cfg.partitions, row.partition, cfg.partitions.short)
    diffs: list[str] = []
    if row.max_tokens is not None and row.max_tokens != part.max_tokens:
        diffs.append(f"partitions.{row.partition}.max_tokens {row.max_tokens:,} → {part.max_tokens:,}")
        if row.finish_reason == "length" and row.max_tokens < part.max_tokens:
            acc.truncated.add(row.sample_id)
    if row.settings is None:
        acc.unknown += 1
    else:
        diffs += _section_diffs("sampling", row.settings.sampling, now.sampling)
        diffs += _section_diffs("reasoning", row.settings.reasoning, now.reasoning)
        acc.routing.update(_section_diffs("routing", row.settings.routing, now.routing))
    why = _excluded(cfg, row)
    if why is not None:
        diffs.append(why)
    if diffs:
        acc.changed.add(row.sample_id)
        acc.differences.update(diffs)


def settings_report(cfg: RunConfig, rd: RunDir, names: Sequence[str]) -> list[DatasetRerun]:
    """Each dataset's records (the first per sample, as every reader takes it) against ``cfg``'s settings."""
    now = generation_settings(cfg)
    out = []
    for name in names:
        acc = DatasetRerun(name)
        seen: set[str] = set()
        for _, row in iter_jsonl(rd.raw(name), ResponseSettingsView):
            if row.sample_id in seen:
                continue
            seen.add(row.sample_id)
            acc.records += 1
            _compare(cfg, row, now, acc)
        out.append(acc)
    return out


def rerun_lines(report: Sequence[DatasetRerun], redoing: Sequence[str] = ()) -> list[str]:
    """What the rerun keeps and what differs, one line per dataset whose records differ from today's settings
    (none when nothing does); ``redoing``: the ``--redo`` kinds given."""
    lines = []
    for d in report:
        if not (d.changed or d.truncated or d.routing):
            continue
        redo = [k for k in REDO_KINDS if k in redoing]
        kept = d.records - len(_chosen(d, redo))
        parts = [f"{d.dataset}: {d.records:,} records from earlier runs, {kept:,} kept"]
        if d.changed:
            top = ", ".join(f"{what}: {n:,}" for what, n in d.differences.most_common(_SHOWN))
            more = f", and {len(d.differences) - _SHOWN} more" if len(d.differences) > _SHOWN else ""
            how = "redone now" if "changed" in redo else "`generate --redo changed` regenerates them"
            parts.append(f"{len(d.changed):,} made with other settings ({top}{more}): {how}")
        if d.truncated:
            how = "redone now" if "truncated" in redo or "changed" in redo else \
                "`generate --redo truncated` regenerates them"
            parts.append(f"{len(d.truncated):,} cut at a max_tokens below today's: {how}")
        if d.routing:
            parts.append("routing differs (" + ", ".join(d.routing) + "; said only: routing decides who serves)")
        if d.unknown:
            parts.append(f"{d.unknown:,} carry no settings (compared on max_tokens only)")
        lines.append("; ".join(parts))
    return lines


def _chosen(d: DatasetRerun, kinds: Sequence[str]) -> set[str]:
    """The samples of ``d`` the ``--redo`` kinds select."""
    return (d.changed if "changed" in kinds else set()) | (d.truncated if "truncated" in kinds else set())


def redo(rd: RunDir, report: Sequence[DatasetRerun], kinds: Sequence[str]) -> dict[str, int]:
    """Move the records of the ``kinds`` asked for out of each raw log into ``replaced.jsonl`` (see the module
    docstring); returns the records moved per dataset (those with none left out)."""
    moved: dict[str, int] = {}
    for d in report:
        n = move_records(rd.raw(d.dataset), rd.replaced(d.dataset), _chosen(d, kinds))
        if n:
            moved[d.dataset] = n
    return moved


def replaced_spend(rd: RunDir, name: str) -> float:
    """What the records ``--redo`` replaced in one dataset cost (spent all the same)."""
    total = 0.0
    for _, row in iter_jsonl(rd.replaced(name), ResponseScanView):
        if row.usage is not None:
            total += spend_usd(row.usage.cost, row.usage.is_byok, row.usage.upstream_cost)
    return total
