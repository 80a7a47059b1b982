"""``python -m draftgen.cli``: the ``draftgen`` command."""

from draftgen.cli import main

main()
