"""``draftgen import``: records made elsewhere brought into a run, checked. A command above the phases (it
runs ``prepare`` when the dataset is not prepared). One module, ``run`` (``run_import``)."""
