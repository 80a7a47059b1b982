"""Adding a hidden-state export format is a sink plus one ``@register_hidden_exporter`` line.

A toy format (an ``ExportSink``: the Source's samples come to its ``write`` in batches) is registered here that declares ``needs_norm`` (it writes post-norm final states, one ``.pt``
per sample) and is run by ``export_hidden`` over a real hidden set (a tiny seeded Qwen3 target, stored with
``hidden.format``): the loop selects the samples, loads the target's final norm because the format declared
it, lists every sample in ``sample_ids.jsonl``, writes ``export.json`` last, and finds the folder up to date
on the second run. Each written state is checked against the target's own ``model.norm``. The
registration is removed afterwards, and the name is then refused with the registered ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from _extract_helpers import build_tiny_model
from _hidden_export_helpers import make_hidden_set
from draftgen.errors import ConfigError, InputError
from draftgen.hidden.exports import (
    EXPORT_REPORT,
    HIDDEN_EXPORTERS,
    SAMPLE_IDS,
    ExportSink,
    export_hidden,
    register_hidden_exporter,
)
from draftgen.hidden.stream import StreamSample
from draftgen.records import HiddenExportReport, HiddenExportSample
from draftgen.store import iter_jsonl, read_json

# -- the toy format: what a plugin module would hold ---------------------------------------------------------


class ToySink(ExportSink):
    """One ``toy_{i}.pt`` per sample: its id, ids, mask and post-norm final state (float32)."""

    def write(self, batch: Sequence[StreamSample]) -> None:
        ctx = self.ctx
        for item in batch:
            s = item.decode()
            rel = f"toy_{item.index:05d}.pt"
            torch.save({"sample_id": item.sample_id, "input_ids": s.input_ids.clone(),
                        "loss_mask": s.loss_mask.clone(), "post_norm": ctx.post_norm(s.final).float()}, ctx.out / rel)
            ctx.files.append(rel)


@pytest.fixture
def toy() -> Iterator[str]:
    register_hidden_exporter("toy", needs_norm=True, doc="post-norm finals, one .pt per sample")(ToySink)
    try:
        yield "toy"
    finally:
        if "toy" in HIDDEN_EXPORTERS:
            HIDDEN_EXPORTERS.unregister("toy")


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hx-toy")
    model_dir = build_tiny_model(root / "target", layers=8, hidden=32)
    dest, rows = make_hidden_set(model_dir, root / "hidden", n=5, dtype="fp32")
    return model_dir, dest, rows


def test_a_registered_format_runs_through_export_hidden(hidden: tuple[Path, Path, list[Any]], toy: str,
                                                        tmp_path: Path) -> None:
    model_dir, dest, rows = hidden
    assert HIDDEN_EXPORTERS.names()[-1] == toy and HIDDEN_EXPORTERS.docs()[toy].startswith("post-norm")
    out = tmp_path / "toy"
    with pytest.raises(InputError, match=r"no readable config\.json"):  # needs_norm: the target's norm is loaded
        export_hidden(str(dest), [toy], out, target_dir=tmp_path)
    lines: list[str] = []
    rep = export_hidden(str(dest), [toy], out, target_dir=model_dir, echo=lines.append)[0]
    assert rep.format == toy and rep.samples == len(rows) and rep.tokens == sum(len(r[1]) for r in rows)
    assert read_json(out / EXPORT_REPORT, HiddenExportReport) == rep
    listing = [s for _, s in iter_jsonl(out / SAMPLE_IDS, HiddenExportSample)]
    assert [(s.index, s.sample_id, s.file) for s in listing] == [
        (i, r[0], f"toy_{i:05d}.pt") for i, r in enumerate(rows)]

    from transformers import AutoModelForCausalLM

    norm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().model.norm
    for s, (sid, ids, mask, _aux, final) in zip(listing, rows, strict=True):
        got = torch.load(out / s.file)
        assert got["sample_id"] == sid and got["input_ids"].tolist() == ids and got["loss_mask"].tolist() == mask
        with torch.no_grad():
            want = norm(final.float())
        assert float((got["post_norm"] - want).norm() / want.norm()) < 1e-5

    again = export_hidden(str(dest), [toy], out, target_dir=model_dir, echo=lines.append)[0]
    assert again == rep and lines[-1].startswith(f"export-hidden {toy}: {out} is up to date")


def test_the_registration_is_gone_afterwards(hidden: tuple[Path, Path, list[Any]], tmp_path: Path) -> None:
    _model_dir, dest, _rows = hidden
    assert "toy" not in HIDDEN_EXPORTERS
    with pytest.raises(ConfigError) as info:
        export_hidden(str(dest), ["toy"], tmp_path / "toy")
    assert str(info.value) == ("export-hidden --format: hidden export format 'toy' is not registered; "
                               "use one of speculators, specforge, modelopt")
    assert not (tmp_path / "toy").exists()
