"""``draftgen probe``: one real request that proves the setup before money is spent. A command above the
phases. One module, ``run`` (``run_probe``)."""
