"""Groups: models served together, as one queue, one batch and one worker process per replica.

An ensemble's models all answer each of its queries. Served one by one, each query costs a
batch share, a prediction and a report per model; served as a group, it costs one of each
(docs/design/0088). A model joins a group by its registry record's ``group``; what the group
is follows from its members, so there is no group record to keep in step with them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from registry.spec import ModelSpec

if TYPE_CHECKING:
    from registry.view import ModelConfig


def group_version(members: dict[str, str]) -> str:
    """A version that changes with any member's, and comes back when every member's does (a
    rollback finds the workers it left still serving)."""
    text = ";".join(f"{name}={version}" for name, version in sorted(members.items()))
    return "g" + hashlib.sha1(text.encode()).hexdigest()[:10]


def _least(values: list[float | int | None]) -> float | int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


@dataclass(frozen=True)
class GroupConfig:
    """A group as the batcher, the worker and ``up`` serve it: a model whose batches hold
    every member's work. Its knobs are the strictest of its members'."""

    name: str
    members: tuple[ModelConfig, ...]  # by name

    @property
    def member_versions(self) -> dict[str, str]:
        return {m.name: m.version for m in self.members}

    @property
    def version(self) -> str:
        return group_version(self.member_versions)

    @property
    def replicas(self) -> int:
        return max(m.replicas for m in self.members)

    @property
    def latency_objective_ms(self) -> float | None:
        return _least([m.latency_objective_ms for m in self.members])

    @property
    def max_batch_size(self) -> int | None:
        return _least([m.max_batch_size for m in self.members])  # type: ignore[return-value]

    @property
    def batch_delay_ms(self) -> float | None:
        return _least([m.batch_delay_ms for m in self.members])

    @property
    def spec(self) -> ModelSpec | None:
        """The members' shared input spec (the first member's); None until every member's loaded."""
        specs = [m.spec for m in self.members]
        return specs[0] if all(s is not None for s in specs) else None


def groups_of(models: dict[str, ModelConfig]) -> dict[str, GroupConfig]:
    """Every group the models name, with its members."""
    members: dict[str, list[ModelConfig]] = {}
    for model in models.values():
        if model.group:
            members.setdefault(model.group, []).append(model)
    return {name: GroupConfig(name, tuple(sorted(ms, key=lambda m: m.name))) for name, ms in sorted(members.items())}


def name_clash(view: Any, models: Mapping[str, str | None]) -> str | None:
    """Why models (name -> the group each joins, or None) cannot be written beside what
    ``view`` holds, or None: a group and a model share their topics' name, so a group may not
    be named like a model outside it, nor a new model like a group it is not in. An app file
    checks its own models against each other; this checks them against the registry."""
    joined = {g for g in models.values() if g is not None}
    for name, group in models.items():
        if group is not None and group in view.models and group not in models:
            return (f"group {group!r} (of model {name}) has the name of model {group} in the registry: "
                    "give the group its own")
        if group is None and name in view.groups and name not in joined:
            return f"model {name!r} has the name of a group in the registry: give the model its own"
    return None
