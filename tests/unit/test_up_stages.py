"""Which stages `clipstream up` runs for a registry view, per model or with one shared batcher."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from clipstream.up import Pipeline, wanted_stages
from registry.topic import ModelConfig, RegistryView

SPEC: Any = object()  # any non-None spec: the model loaded


def view(**versions: str) -> RegistryView:
    models = {n: ModelConfig(n, v, Path("/m"), replicas=2 if n == "b" else 1, spec=SPEC) for n, v in versions.items()}
    models["broken"] = ModelConfig("broken", "1", Path("/x"), spec=None)  # no model.yaml: not served
    return RegistryView(models=models)


def test_per_model_batchers_carry_the_version() -> None:
    w = wanted_stages(view(a="1", b="3"), shared_batcher=False)
    assert w["batcher-a-v1"] == ["batcher", "--model", "a", "--version", "1"]
    assert w["batcher-b-v3"] == ["batcher", "--model", "b", "--version", "3"]
    assert sorted(k for k in w if k.startswith("worker-")) == ["worker-a-v1-0", "worker-b-v3-0", "worker-b-v3-1"]
    assert not any("broken" in k for k in w)


def test_a_shared_batcher_serves_every_loaded_model_and_is_named_by_them_not_their_versions() -> None:
    w = wanted_stages(view(b="3", a="1"))  # the default
    assert [k for k in w if k.startswith("batcher")] == ["batchers-a+b"]
    assert w["batchers-a+b"] == ["batcher", "--model", "a", "--model", "b"]
    assert "worker-b-v3-1" in w
    again = wanted_stages(view(a="2", b="3"), shared_batcher=True)  # a new version of a
    assert "batchers-a+b" in again and "worker-a-v2-0" in again  # the batcher stays; a's worker is replaced


class FakeStage:
    def __init__(self) -> None:
        self.ready = threading.Event()


class FakeSupervisor:
    def __init__(self) -> None:
        self.stages: dict[str, FakeStage] = {}
        self.removed: list[str] = []

    def add(self, name: str, argv: list[str], env: dict[str, str]) -> FakeStage:
        self.stages[name] = FakeStage()
        return self.stages[name]

    def remove(self, name: str) -> None:
        self.removed.append(name)
        del self.stages[name]


def test_a_replaced_shared_batcher_stops_only_once_its_successor_is_ready() -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1"))
    sup.stages["batchers-a"].ready.set()
    pipe.sync(view(a="1", b="1"))  # a model came: a new batcher for both
    assert "batchers-a" in sup.stages and "batchers-a+b" in sup.stages
    pipe.retire()
    assert "batchers-a" in sup.stages  # the new one is not ready yet: the old one keeps serving
    sup.stages["batchers-a+b"].ready.set()
    pipe.retire()
    assert sup.removed == ["batchers-a"] and "batchers-a+b" in sup.stages

