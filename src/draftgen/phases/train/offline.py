"""The offline half of ``draftgen train``: a stored hidden set as speculators' inputs (``train/inputs/``).

``prepare_offline``: the set (``train.hidden``, default ``hidden_states.output``) opened and checked (the
verifier is its target, the set complete or ``train.allow_partial``), the algorithm's layer ids picked from the
set's (``hidden.algorithms.select``), and ``inputs.build_index`` run: a local set is read in place (inputs/
holds only the index), an object-store set is copied once (``hidden.exports``' ``speculators`` format).
Checkpoints of another set are refused unless ``restart``. ``train_offline`` trains on it
(``trainer.train_prepared``). The set's Source leaves out its flagged samples and the rows of providers the
extract's fidelity check flagged under ``hidden_states.fidelity_action: exclude``; train.json counts the latter
(``excluded``, "fidelity: <provider>"). Reads the set's manifest and token rows; writes ``train/inputs/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftgen.errors import InputError
from draftgen.hidden.algorithms import select
from draftgen.phases import Echo
from draftgen.phases.train.guards import check_complete, check_verifier
from draftgen.phases.train.launch import SELECT_FLAG, find_speculators_python, last_complete
from draftgen.phases.train.trainer import Prepared, norm_digest, train_prepared, verifier_path
from draftgen.records import HiddenExportReport
from draftgen.store import read_json

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.records import TrainReport
    from draftgen.rundir import RunDir

__all__ = ["prepare_offline", "train_offline"]


def train_offline(cfg: RunConfig, rd: RunDir, echo: Echo, restart: bool) -> TrainReport:
    """Train on the stored hidden set (``prepare_offline``), resuming from the last complete checkpoint."""
    return train_prepared(cfg, rd, echo, prepare_offline(cfg, rd, echo, restart), restart=restart)


def prepare_offline(cfg: RunConfig, rd: RunDir, echo: Echo, restart: bool) -> Prepared:
    """A stored hidden set as speculators' inputs (``train/inputs/``, the states read in place)."""
    from draftgen.hidden.exports import EXPORT_REPORT, export_hidden
    from draftgen.hidden.format import open_hidden
    from draftgen.hidden.stream import hidden_url
    from draftgen.phases.train.inputs import INDEX_FORMAT, STATES_FLAG, STATES_MAP, build_index

    tc = cfg.train  # its values are checked at config load (TrainConfig.__post_init__)
    python = find_speculators_python(tc.speculators)
    url = hidden_url(cfg, tc.hidden)
    hset = open_hidden(url, dict(cfg.hidden_states.storage_options))
    manifest = hset.manifest
    verifier = verifier_path(cfg, manifest.target.name)
    check_verifier(verifier, manifest, url)
    ids, slots = select(tc.algorithm, manifest.layer_ids.aux, manifest.num_layers, tc.layer_ids)
    missing = check_complete(manifest, url, run_root=rd.root, allow_partial=tc.allow_partial, echo=echo)
    data = rd.train_inputs
    old = read_json(data / EXPORT_REPORT, HiddenExportReport) if (data / EXPORT_REPORT).is_file() else None

    def say(line: str) -> None:  # the export's echo returns None; ours may return anything
        echo(line)

    # a local set is read in place (inputs/ holds only the index); an object-store set is copied once
    rep = build_index(hset, data, echo=say) or export_hidden(cfg, ["speculators"], data, hidden=url, echo=say)[0]
    if old is not None and old.manifest_fingerprint != rep.manifest_fingerprint and not restart \
            and last_complete(rd.train_checkpoints):
        raise InputError(f"{rd.train_checkpoints}: these checkpoints were trained on another hidden set; rerun "
                         "with --restart to train from scratch on the new one")
    flags = [STATES_FLAG, str(data / STATES_MAP)] if rep.format == INDEX_FORMAT else []
    if slots != list(range(len(manifest.layer_ids.aux))):
        flags += [SELECT_FLAG, ",".join(str(i) for i in slots)]
    return Prepared(python=python, verifier=verifier, data=data, samples=rep.samples, source=url,
                    fingerprint=rep.manifest_fingerprint, layer_ids=ids, norm_sha256=norm_digest(verifier),
                    runner_flags=flags, speculators_flags=["--on-missing", "raise"], missing=missing,
                    excluded={f"fidelity: {p}": n for p, n in rep.excluded_fidelity.items()})
