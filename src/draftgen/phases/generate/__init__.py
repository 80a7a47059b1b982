"""``draftgen generate``: prepared prompts → raw responses with exact token ids, resumable, within budget.

Modules: ``run`` (``run_generate``, the phase: set-up, resume, the engine, the summary), ``batch`` (the Batch
API phase before synchronous requests, ``endpoint.mode: batch``), ``rerun`` (what a rerun keeps and ``--redo``
generates again), ``excluded`` (samples the audit excluded, generated again) and ``summary`` (the lines printed
and logged at the end). Imports: run → {batch, rerun, excluded, summary}; nothing imports run. Imported
per module, so ``import draftgen.phases.generate`` loads none of them.
"""
