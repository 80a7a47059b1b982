"""``draftgen plan``: tokens, dollars, time and hidden-state disk per dataset, before spending.

A command above the phases (it runs ``prepare`` and, for its pilot, ``generate``). Modules: ``run``
(``run_plan``, ``estimate_plan``, the pilot), ``timing`` (waves of work per partition, each dataset's share of
the run's time) and ``modes`` (sync, flex and the Batch API side by side). Imports: run → {timing, modes}.
"""
