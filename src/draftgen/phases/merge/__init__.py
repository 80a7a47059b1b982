"""``draftgen merge``: raw responses of every dataset → one shuffled, training-ready ``merged/``. One
module, ``run`` (``run_merge``)."""
