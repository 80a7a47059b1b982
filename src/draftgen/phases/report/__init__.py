"""The run's dashboards: ``metrics`` (every figure, from the run directory, with ``datasets``, ``providers``,
``charts`` and ``verdict``), ``status`` (terminal) and ``html`` (the self-contained ``report.html``). Imports
are per module so ``draftgen status`` stays light."""
