"""The registry as every stage sees it: apps, models and the groups they are served in, built
from the registry topic's records by ``registry.topic``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.groups import GroupConfig
from registry.spec import ModelSpec


@dataclass(frozen=True)
class AppConfig:
    name: str
    policy: str
    slo_ms: float
    default_output: Any
    policy_config: dict[str, float] = field(default_factory=dict)
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    name: str
    version: str
    path: Path  # the model's folder on this host (for a remote location: its local copy)
    replicas: int = 1
    latency_objective_ms: float | None = None
    max_batch_size: int | None = None
    batch_delay_ms: float | None = None
    spec: ModelSpec | None = None
    spec_error: str | None = None
    previous_versions: tuple[str, ...] = ()
    previous_paths: tuple[str, ...] = ()
    # what the registry holds (Model.path): a location in the model repository, a URL, or an
    # absolute path; the verbs that rewrite a model write this back, never ``path``
    location: str = ""
    group: str | None = None  # served together with the group's other models (``registry.groups``)
    # versions a rollback left, with their locations: never given another folder (``registry.versions``)
    retired_versions: tuple[str, ...] = ()
    retired_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class RegistryView:
    apps: dict[str, AppConfig] = field(default_factory=dict)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    groups: dict[str, GroupConfig] = field(default_factory=dict)

    def app(self, name: str) -> AppConfig | None:
        return self.apps.get(name)

    def model(self, name: str) -> ModelConfig | None:
        return self.models.get(name)

    def served(self) -> dict[str, ModelConfig | GroupConfig]:
        """What batchers and workers serve, by name: each group, and each model in none."""
        alone: dict[str, ModelConfig | GroupConfig] = {n: m for n, m in self.models.items() if not m.group}
        return {**alone, **self.groups}
