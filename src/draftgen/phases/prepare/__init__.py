"""``draftgen prepare``: prompt datasets → ``prepared/<dataset>/``. One module, ``run`` (``run_prepare``,
the phase, and ``prepare_dataset``, one dataset)."""
