"""``topics.admin``: which requests ensuring a stage's topics sends, with a fake AdminClient."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

import topics.admin as admin_mod
from clipstream.settings import Settings
from topics.admin import ensure_stage_topics, stage_topics
from topics.catalogue import Catalogue

SETTINGS = Settings(topic_prefix="t.")


class FakeAdmin:
    """A broker that holds ``topics`` (name -> partitions) and counts metadata requests."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = dict(topics)
        self.metadata_requests = 0
        self.created: list[str] = []

    def list_topics(self, timeout: float = 0.0) -> Any:
        self.metadata_requests += 1
        return SimpleNamespace(brokers={1: object()}, topics={
            name: SimpleNamespace(partitions=dict.fromkeys(range(n)), error=None) for name, n in self.topics.items()})

    def create_topics(self, new: list[Any], operation_timeout: float = 0.0) -> dict[str, Future[None]]:
        done: dict[str, Future[None]] = {}
        for topic in new:
            self.topics[topic.topic] = topic.num_partitions
            self.created.append(topic.topic)
            done[topic.topic] = Future()
            done[topic.topic].set_result(None)
        return done


def _stage_specs(models: dict[str, int]) -> dict[str, int]:
    return {s.name: s.partitions for s in stage_topics(SETTINGS, models)}


def test_a_restart_finds_every_topic_with_one_metadata_request(monkeypatch: pytest.MonkeyPatch) -> None:
    models = {"m1": 1, "m2": 2}
    fake = FakeAdmin(_stage_specs(models))
    monkeypatch.setattr(admin_mod, "AdminClient", lambda conf: fake)
    assert ensure_stage_topics(SETTINGS, models) == []
    assert fake.metadata_requests == 1 and fake.created == []


def test_a_missing_topic_is_created_and_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    models = {"m1": 1, "m2": 2}
    present = _stage_specs(models)
    missing = Catalogue.from_settings(SETTINGS).batches("m2", 2).name
    del present[missing]
    fake = FakeAdmin(present)
    monkeypatch.setattr(admin_mod, "AdminClient", lambda conf: fake)
    assert ensure_stage_topics(SETTINGS, models) == [missing]
    assert fake.created == [missing]
    assert fake.metadata_requests == 2  # the second shows it, so a producer started next finds it
