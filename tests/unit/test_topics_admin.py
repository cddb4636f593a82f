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

    def __init__(self, topics: dict[str, int], brokers: int = 1, copies: int = 1) -> None:
        self.topics = dict(topics)
        self.brokers, self.copies = brokers, copies  # live brokers; copies of each existing partition
        self.metadata_requests = 0
        self.created: list[str] = []

    def list_topics(self, timeout: float = 0.0) -> Any:
        self.metadata_requests += 1
        replicas = list(range(1, self.copies + 1))
        return SimpleNamespace(brokers=dict.fromkeys(range(1, self.brokers + 1)), topics={
            name: SimpleNamespace(partitions={p: SimpleNamespace(replicas=replicas) for p in range(n)}, error=None)
            for name, n in self.topics.items()})

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


def test_a_models_topics_are_not_made_with_fewer_copies_than_the_registry_has(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker of three is down: the default would give the new topics two copies for good."""
    from clipstream.errors import InfraError

    present = _stage_specs({})  # the core topics, the registry among them, made with 3 copies
    fake = FakeAdmin(present, brokers=2, copies=3)
    monkeypatch.setattr(admin_mod, "AdminClient", lambda conf: fake)
    with pytest.raises(InfraError, match=r"with 3 copies, as the registry has: only 2 broker\(s\) are up"):
        ensure_stage_topics(SETTINGS, {"new": 1})
    assert fake.created == []
    pinned = Settings(topic_prefix="t.", replication_factor=2)  # fewer, asked for on purpose
    assert len(ensure_stage_topics(pinned, {"new": 1})) == 3 and len(fake.created) == 3


class AwayAdmin:
    """No broker: each metadata request fails as librdkafka's does, and ``poll`` serves the
    errors librdkafka reported meanwhile to the client's ``error_cb`` (``errors`` of them)."""

    def __init__(self, conf: dict[str, Any], errors: list[Any]) -> None:
        self.error_cb = conf["error_cb"]
        self.errors = errors
        self.waits: list[float] = []

    def list_topics(self, timeout: float = 0.0) -> Any:
        from confluent_kafka import KafkaError, KafkaException

        self.waits.append(timeout)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))

    def poll(self, timeout: float = 0.0) -> int:
        for err in self.errors:
            self.error_cb(err)
        return len(self.errors)


REFUSED = [("_TRANSPORT", "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
                          "(after 0ms in state CONNECT)"),
           ("_ALL_BROKERS_DOWN", "1/1 brokers are down")]


def _away(monkeypatch: pytest.MonkeyPatch, errors: list[tuple[str, str]], reached: bool) -> list[AwayAdmin]:
    import threading

    from confluent_kafka import KafkaError

    made: list[AwayAdmin] = []
    kafka_errors = [KafkaError(getattr(KafkaError, code), text) for code, text in errors]
    monkeypatch.setattr(admin_mod, "AdminClient", lambda conf: made.append(AwayAdmin(conf, kafka_errors)) or made[-1])
    flag = threading.Event()
    if reached:
        flag.set()
    monkeypatch.setattr(admin_mod, "_REACHED", flag)
    return made


def test_a_start_with_every_broker_refusing_fails_after_the_short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    from clipstream.errors import InfraError

    made = _away(monkeypatch, REFUSED, reached=False)
    with pytest.raises(InfraError) as caught:
        admin_mod.ensure_core_topics(Settings(kafka_bootstrap="127.0.0.1:1"))
    assert made[0].waits == [pytest.approx(admin_mod.UNREACHABLE_S, abs=0.5)]  # not the 30 s
    message = str(caught.value)
    assert "CLIPSTREAM_KAFKA_BOOTSTRAP" in message and "`clipstream infra status`" in message
    assert "(Connect to ipv4#127.0.0.1:1 failed: Connection refused)" in message


def test_a_broker_that_took_the_connection_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """No "all brokers down": a broker slow to answer, not away; the whole timeout is waited."""
    from clipstream.errors import InfraError

    made = _away(monkeypatch, [("_TIMED_OUT", "b:9092/1: ApiVersionRequest failed: Local: Timed out")], reached=False)
    with pytest.raises(InfraError, match="does not answer within 30s"):
        admin_mod.ensure_core_topics(Settings(kafka_bootstrap="b:9092"))
    assert len(made[0].waits) == 2 and made[0].waits[0] == pytest.approx(admin_mod.UNREACHABLE_S, abs=0.5)


def test_a_process_that_had_kafka_waits_out_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a stage's start, Kafka away is a failover or a restart: no short wait."""
    from clipstream.errors import InfraError

    made = _away(monkeypatch, REFUSED, reached=True)
    with pytest.raises(InfraError, match="does not answer within 30s"):
        admin_mod.ensure_model_topics(Settings(kafka_bootstrap="127.0.0.1:1"), "m")
    assert made[0].waits == [pytest.approx(30.0, abs=0.5)]


def test_metadata_once_had_marks_the_process_as_having_reached_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    flag = threading.Event()
    monkeypatch.setattr(admin_mod, "_REACHED", flag)
    fake = FakeAdmin(_stage_specs({}))
    monkeypatch.setattr(admin_mod, "AdminClient", lambda conf: fake)
    ensure_stage_topics(SETTINGS, {})
    assert flag.is_set()
