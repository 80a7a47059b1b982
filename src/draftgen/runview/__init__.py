"""The run directory read as numbers: every figure ``report``, ``status``, ``plan`` and generate's summary
show.

Modules: ``metrics`` (``compute_metrics(run_dir) -> RunMetrics``, reading each file of the run once), with
``datasets`` (the datasets table and the raw-log scan), ``providers`` (the providers table), ``charts``
(histograms, timeline, activity, sequence lengths), ``grade`` (the run's verdict) and ``chain`` (the drafter
chain's files: the hidden set, train.json, the accept passes and the accept verdict sentence) with ``loop`` (the
acceptance per dataset and prompt length beside the training share, and the rounds of generation, for the
report). Reads only; writes nothing; imports no phase. Imported per module, so ``import draftgen.runview``
loads none of them.
"""
