"""``draftgen emulate --model DIR``: a vLLM/SGLang-compatible server backed by a real transformers model on the CPU.

``real.server`` (routes and lifecycle), ``real.engine`` (batched greedy generation), ``real.http`` (sampling
fields, counters), ``real.extract`` (vLLM's hidden-state connector files) and ``real.spec``
(greedy speculative verification with a drafter)."""
