"""Typed run configuration: one module per section, and this face.

Reads one YAML file (``draftgen <command> CONFIG``) through ``config.load``; every section is a
``config.base.Section`` (unknown keys refused). ``docs/config.md`` is generated from these classes
(``python -m draftgen.docgen``). Importing this package reads no file.

Sections: ``model`` (``config.model``), ``endpoint``/``routing``/``emulator`` (``config.endpoint``),
``reasoning``/``sampling``/``partitions``/``budget``/``retry``/``quality`` (``config.generate``),
``tail`` (``config.tail``), ``datasets``/``prepare`` (``config.data``), ``audit``, ``merge``, ``plan``,
``probe``, ``hidden_states`` (``config.hidden``), ``train``, ``accept``; the whole file is ``config.run.RunConfig``.
"""

from __future__ import annotations

from draftgen.config.audit import AuditConfig
from draftgen.config.base import Section
from draftgen.config.data import DatasetConfig, PrepareConfig
from draftgen.config.endpoint import BatchConfig, EmulatorConfig, EndpointConfig, RoutingConfig
from draftgen.config.generate import (
    PARTITION_DEFAULTS,
    BudgetConfig,
    PartitionConfig,
    PartitionsConfig,
    QualityConfig,
    ReasoningConfig,
    RetryConfig,
    SamplingConfig,
)
from draftgen.config.load import (
    apply_overrides,
    config_from_mapping,
    config_hash,
    load_config,
    load_yaml,
    resolve_api_key,
)
from draftgen.config.merge import MergeConfig
from draftgen.config.model import ModelConfig
from draftgen.config.plan import PlanConfig, ProbeConfig
from draftgen.config.run import RunConfig
from draftgen.config.tail import TailConfig

__all__ = [
    "PARTITION_DEFAULTS",
    "AuditConfig",
    "BatchConfig",
    "BudgetConfig",
    "DatasetConfig",
    "EmulatorConfig",
    "EndpointConfig",
    "MergeConfig",
    "ModelConfig",
    "PartitionConfig",
    "PartitionsConfig",
    "PlanConfig",
    "PrepareConfig",
    "ProbeConfig",
    "QualityConfig",
    "ReasoningConfig",
    "RetryConfig",
    "RoutingConfig",
    "RunConfig",
    "SamplingConfig",
    "Section",
    "TailConfig",
    "apply_overrides",
    "config_from_mapping",
    "config_hash",
    "load_config",
    "load_yaml",
    "resolve_api_key",
]
