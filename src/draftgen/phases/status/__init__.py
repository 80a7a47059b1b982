"""``draftgen status``: a terminal summary of a run directory, read only. A command above the phases (it lists
the phase table's rows). One module, ``run`` (``run_status``, ``render_status``)."""
