"""The run's dashboards: ``metrics`` (every figure, from the run directory, with ``datasets``, ``providers``,
``charts`` and ``grade``), ``html`` (the self-contained ``report.html`` page) and ``run`` (``run_report``,
the report phase, which writes the page). Imports are per module so ``draftgen status`` stays light."""
