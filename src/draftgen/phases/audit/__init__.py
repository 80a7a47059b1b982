"""``draftgen audit``: prove the run's token ids (``audit.run``), with its per-record checks (``audit.checks``), the
reference ids of the BPE audit (``audit.reference``) and the verdict that tells merge what to leave out
(``audit.verdict``)."""
