"""``draftgen accept``: the served drafter's acceptance on held-out prompts.

Modules: ``run`` (``run_accept``, the phase: the requests, the scrapes, the report), ``heldout`` (which
prepared prompts no merged row saw), ``counters`` (the servers' counters and the acceptance formulas over
them) and ``figures`` (bootstrap intervals, the no-model drafters' replay, comparisons). Imports: run →
{heldout, counters, figures}; nothing imports run.
"""
