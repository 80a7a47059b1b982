"""Record provenance: which model, profile and tokenizer made a response record, and the check that refuses
a record made by another (unless ``--force``).

Pure functions over ``records.Provenance`` and the config; reads and writes nothing. ``generate``,
``import``, ``audit`` and ``merge`` check every record they read with ``check_provenance``; the run's own
config is checked against ``run.json`` by ``rundir.claim.writer``.
"""

from __future__ import annotations

from draftgen.config import RunConfig
from draftgen.errors import RunDirError
from draftgen.records import Provenance

__all__ = ["check_provenance", "expected_provenance"]


def expected_provenance(cfg: RunConfig, tokenizer_sha256: str) -> Provenance:
    """The provenance a record made with this config carries."""
    return Provenance(model_id=cfg.model.id, profile=cfg.model.profile, tokenizer_sha256=tokenizer_sha256)


def check_provenance(got: Provenance | None, want: Provenance, where: str, *, force: bool,
                     forced: set[str] | None = None) -> None:
    """Refuse a record made by another model, profile or tokenizer (or with no provenance at all).

    With ``force`` the difference is accepted and added to ``forced`` (what the phase's output records).
    ``where`` is ``file:line``.
    """
    if got is None:
        problem = ("the record has no provenance (records from elsewhere come in through `draftgen import`, "
                   "which checks and stamps them)")
    else:
        problem = ""
        for name in ("model_id", "profile", "tokenizer_sha256"):
            a, b = getattr(got, name), getattr(want, name)
            if a != b:
                shown = (a[:12], b[:12]) if name == "tokenizer_sha256" else (a, b)
                problem = f"provenance.{name} is {shown[0]!r}, the config's is {shown[1]!r}"
                break
        if not problem:
            return
    if force:
        if forced is not None:
            forced.add(problem.split(" (")[0])
        return
    raise RunDirError(f"{where}: {problem}; use the run's config, or pass --force to accept it")
