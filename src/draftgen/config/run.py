"""The whole run configuration (``RunConfig``): every section, as one YAML file holds them. Pure data."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from draftgen.config.accept import AcceptConfig
from draftgen.config.audit import AuditConfig
from draftgen.config.base import Section
from draftgen.config.data import DatasetConfig, PrepareConfig
from draftgen.config.endpoint import EndpointConfig, RoutingConfig
from draftgen.config.generate import (
    BudgetConfig,
    PartitionsConfig,
    QualityConfig,
    ReasoningConfig,
    RetryConfig,
    SamplingConfig,
)
from draftgen.config.hidden import HiddenStatesConfig
from draftgen.config.merge import MergeConfig
from draftgen.config.model import ModelConfig
from draftgen.config.plan import PlanConfig, ProbeConfig
from draftgen.config.tail import TailConfig
from draftgen.config.train import TrainConfig
from draftgen.errors import ConfigError


class RunConfig(Section):
    datasets: list[DatasetConfig]
    run_dir: str = "runs/default"
    """Where every phase reads and writes (relative to the config file)."""
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    endpoint: EndpointConfig = msgspec.field(default_factory=EndpointConfig)
    routing: RoutingConfig = msgspec.field(default_factory=RoutingConfig)
    reasoning: ReasoningConfig = msgspec.field(default_factory=ReasoningConfig)
    sampling: SamplingConfig = msgspec.field(default_factory=SamplingConfig)
    partitions: PartitionsConfig = msgspec.field(default_factory=PartitionsConfig)
    prepare: PrepareConfig = msgspec.field(default_factory=PrepareConfig)
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    retry: RetryConfig = msgspec.field(default_factory=RetryConfig)
    audit: AuditConfig = msgspec.field(default_factory=AuditConfig)
    merge: MergeConfig = msgspec.field(default_factory=MergeConfig)
    quality: QualityConfig = msgspec.field(default_factory=QualityConfig)
    tail: TailConfig = msgspec.field(default_factory=TailConfig)
    hidden_states: HiddenStatesConfig = msgspec.field(default_factory=HiddenStatesConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    accept: AcceptConfig = msgspec.field(default_factory=AcceptConfig)
    plan: PlanConfig = msgspec.field(default_factory=PlanConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    progress: Literal["auto", "rich", "plain", "off"] = "auto"
    """Live display: ``auto`` (rich on a TTY, plain lines otherwise), ``rich``, ``plain`` or ``off``."""
    #: folder of the config file; relative paths resolve from here (not part of the file)
    base_dir: str = ""

    def path(self, p: str) -> Path:
        """Resolve a path from the config file's folder."""
        q = Path(p).expanduser()
        return q if q.is_absolute() else Path(self.base_dir or ".") / q

    @property
    def run_path(self) -> Path:
        return self.path(self.run_dir)

    def dataset(self, name: str) -> DatasetConfig:
        for d in self.datasets:
            if d.name == name:
                return d
        raise ConfigError(f"no dataset named {name!r}; datasets: {', '.join(d.name for d in self.datasets)}")
