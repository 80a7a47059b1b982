"""The generation engine: scheduling, retries, adaptive concurrency, budgets, writers, progress.

``Engine`` (``scheduler``) runs one generation over ``DatasetPlan``s and ``PartitionPlan``s with a
``Backend`` and one ``EngineOptions``; ``phases.generate.run.run_generate`` builds those from the config. Modules:
``plans`` (plans, options, result), ``scheduler`` (producers, shutdown), ``sample`` (one sample's slot,
reservation, attempts and record), ``sinks`` (the writers of its files), ``limiter`` (AIMD slots),
``retry`` (backoff and the retry decision), ``budget`` (tokens and dollars with reservations), ``writer``
(one group-committing writer task per file), ``prompts`` (streamed prompt cursors), ``assemble``
(Completion → ResponseRecord with ids, and what makes a response usable), ``health`` (provider
cool-downs and the routing applied to responses), ``usable`` (the model, the providers and the
completeness a response must have), ``intake`` (the one check every response goes through, whichever way
it arrived), ``keywatch`` (the API key's limit reread during a run), ``flight``
(one request on the wire) and ``tail`` (stalls, slow streams, hedges), ``stats`` (counters) and
``progress`` (rich/plain display and the run log). ``endpoint.mode: batch`` runs on ``batch.BatchRunner``
(OpenRouter batches: cut, journalled, submitted, polled), ``batch_ingest`` (results → the same records) and
``batch_journal`` (the crash-safe journal and the batch lines of the display and ``status``).
"""

from __future__ import annotations

from draftgen.engine.assemble import Assembler, request_hash
from draftgen.engine.budget import Admission, BudgetGovernor, Prices, TokenBudget, usage_cost
from draftgen.engine.health import HealthPolicy, ProviderHealth, RoutingGuard
from draftgen.engine.keywatch import key_limit_label, watch_key
from draftgen.engine.limiter import AdaptiveLimiter
from draftgen.engine.plans import DatasetPlan, EngineOptions, EngineResult, PartitionPlan
from draftgen.engine.progress import Display, RunLog, make_display, status_line, summary_lines
from draftgen.engine.prompts import PromptCursor, count_pending, estimate_prompt_tokens
from draftgen.engine.retry import RetryPolicy
from draftgen.engine.scheduler import Engine
from draftgen.engine.stats import DatasetCounts, RunStats
from draftgen.engine.tail import TailPolicy
from draftgen.engine.writer import RecordSink

__all__ = [
    "AdaptiveLimiter",
    "Admission",
    "Assembler",
    "BudgetGovernor",
    "DatasetCounts",
    "DatasetPlan",
    "Display",
    "Engine",
    "EngineOptions",
    "EngineResult",
    "HealthPolicy",
    "PartitionPlan",
    "Prices",
    "PromptCursor",
    "ProviderHealth",
    "RecordSink",
    "RetryPolicy",
    "RoutingGuard",
    "RunLog",
    "RunStats",
    "TailPolicy",
    "TokenBudget",
    "count_pending",
    "estimate_prompt_tokens",
    "key_limit_label",
    "make_display",
    "request_hash",
    "status_line",
    "summary_lines",
    "usage_cost",
    "watch_key",
]
