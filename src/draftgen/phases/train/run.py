"""``draftgen train``: a drafter (``train.algorithm``: EAGLE-3 and the rest of ``hidden.algorithms``) trained by
speculators 0.9 on the extracted hidden states.

Reads the hidden set (``train.hidden``, default ``hidden_states.output`` / ``<run>/hidden``) and the target
model folder (``train.verifier``, default ``hidden_states.model``, else the manifest's target name). Writes,
under ``<run>/train/`` (``RunDir.train_*``):

    inputs/        what speculators reads besides the states (train.inputs): its Arrow dataset (ids, loss
                   masks, lengths), token_freq.pt and draftgen_states.json (row i -> the set's own state
                   file, read in place: no second copy); for an object-store set, the full speculators export
    vocab/         d2t.npy (int64 offsets), t2d.npy (bool): the draft vocabulary (train.vocab)
    checkpoints/   speculators' own checkpoints (<epoch>/ with optimizer state; it resumes from the last)
    drafter/       the last checkpoint's config.json + model.safetensors: ``vllm serve train/drafter``
    eagle3/        the same drafter in the flat EAGLE-3 format (train.convert): SGLang's draft model path
    previous/      drafter/, eagle3/ and their train.json as published before a run whose drafter was refused
    log.jsonl      TrainLogRecord lines: loss and per-TTT-step accuracy, every step and every validation
    speculators.log  speculators' own console output
    train.json     TrainReport, written last

speculators runs as a subprocess in its own environment (``train.speculators`` / ``DRAFTGEN_SPECULATORS``:
its ``speculators`` executable or its Python), one process or ``torchrun``'s (``launch``):
``speculators_runner.py`` (a file of this package that imports only speculators) calls speculators' trainer
with the flags built here, fixes what it lacks on a machine without a GPU, and prints each metric record as a
tagged JSON line. Layer ids go as ``--target-layer-ids`` = the algorithm's own aux ids picked from the set's
(``hidden.algorithms.select``; vLLM convention, which speculators uses unshifted); the runner keeps only those
slots of each sample (``--draftgen-select``). A rerun resumes from the last complete checkpoint (step count
continues; log.jsonl keeps each step once); a changed hidden set is refused unless ``restart``. Before
anything is trained (``guards``): the verifier must be the extraction target, the set complete (or
``train.allow_partial``), the checkpoint resumed from loadable; while training, the verifier norm speculators
built must be the target's; the new checkpoint is loaded before drafter/ (and, for the EAGLE-3 family, eagle3/)
are swapped in, train.json last.

No drafter from nothing: the runner counts, on every rank, the samples of the training batches (those asked
for, those with a loss-mask token in a batch) from the drafter's first step into each checkpoint's marker
(``launch.samples_seen``); train.json carries them (``samples_trained``, ``samples_asked``, ``train_rows``). A
drafter that trained on fewer than ``train.min_trained_fraction`` of the samples its batches asked for (or on
none), or one the ``session`` refuses, is not published: the drafter published before moves to previous/ with
its train.json, train.json says why (exit_code 3, no checkpoint) and the run raises ThresholdBroken (exit 3).

One way in: ``run_train`` (``draftgen train``) and ``phase_run`` (the ``train`` row of ``phases.PHASES``, in the
run directory the pipeline holds) prepare what speculators trains on, then train it with ``trainer.train_prepared``:
a stored hidden set (``offline.prepare_offline``), or with ``train.online`` hidden states generated on demand by
the vLLM extract servers (``online``: its own ``Prepared``, its checking proxy as the ``session``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftgen.phases import Echo
from draftgen.records import TrainReport
from draftgen.rundir import RunDir
from draftgen.rundir.claim import writer

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.phases import PhaseContext, PhaseOutcome
    from draftgen.tokens import Profile

__all__ = ["phase_run", "run_train"]


def run_train(cfg: RunConfig, *, echo: Echo = print, profile: Profile | None = None, force: bool = False,
              restart: bool = False, argv: list[str] | None = None) -> TrainReport:
    """Train the drafter (see the module docstring): online with ``train.online``, else on the stored hidden
    set. ``profile``: not needed (the vocabulary comes from the token counts and the verifier's config).
    ``force``: hold a run directory made with another target (``rundir.claim.writer``). ``restart``: drop earlier
    checkpoints first. ``argv``: recorded in run.json."""
    with writer(cfg, "train", force=force, argv=argv) as rd:
        return _train(cfg, rd, echo, restart)


def _train(cfg: RunConfig, rd: RunDir, echo: Echo, restart: bool) -> TrainReport:
    if cfg.train.online:
        from draftgen.phases.train.online import train_online

        return train_online(cfg, rd, echo, restart)
    from draftgen.phases.train.offline import train_offline

    return train_offline(cfg, rd, echo, restart)


def phase_run(ctx: PhaseContext) -> PhaseOutcome:
    """The ``train`` row of ``phases.PHASES`` (``train.enabled``): train in the run directory the pipeline
    already holds (``run_train`` would take the writer lock again), resuming from the last checkpoint."""
    from draftgen.phases import PhaseOutcome

    _train(ctx.cfg, ctx.rd, ctx.echo, False)
    return PhaseOutcome()
