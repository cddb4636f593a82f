"""Idempotent topic creation with the AdminClient."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from clipstream.errors import InfraError
from clipstream.settings import Settings
from topics.catalogue import Catalogue, TopicSpec, durability_config, replication_for
from topics.client import admin_config


def ensure_topics(
    settings: Settings, specs: Iterable[TopicSpec], timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist and grow ones with too few partitions.

    Returns the names created or grown. Waits until the broker's metadata shows every topic
    with its partitions, so a producer that starts right after finds them. New topics get
    ``CLIPSTREAM_REPLICATION_FACTOR`` copies, or by default ``min(3, brokers)`` for the
    brokers the cluster lists now, with ``min.insync.replicas`` to match.
    """
    specs = list(specs)
    admin = AdminClient(admin_config(settings))
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise InfraError(
            f"Kafka at {settings.kafka_bootstrap} does not answer ({exc}); "
            "start it with `clipstream infra up` or set CLIPSTREAM_KAFKA_BOOTSTRAP"
        ) from exc
    existing = metadata.topics
    changed: list[str] = []
    rf = replication_factor(settings, len(metadata.brokers))
    new = [
        NewTopic(s.name, s.partitions, rf, config={**durability_config(rf), **s.config})
        for s in specs
        if s.name not in existing
    ]
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
            try:
                fut.result()
                changed.append(name)
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError.INVALID_REPLICATION_FACTOR:
                    raise InfraError(
                        f"cannot create topic {name} with {rf} replicas on "
                        f"{len(metadata.brokers)} live broker(s): start the missing brokers or "
                        "set CLIPSTREAM_REPLICATION_FACTOR to at most the broker count"
                    ) from exc
                if code != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise InfraError(f"cannot create topic {name}: {exc}") from exc
    grow = [
        NewPartitions(s.name, s.partitions)
        for s in specs
        if s.name in existing and len(existing[s.name].partitions) < s.partitions
    ]
    if grow:
        for name, fut in admin.create_partitions(grow, operation_timeout=timeout_s).items():
            try:
                fut.result()
                changed.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:
                    raise InfraError(f"cannot grow topic {name}: {exc}") from exc
    if new or grow or any(existing[s.name].error is not None for s in specs if s.name in existing):
        _wait_for(admin, specs, timeout_s)  # a restart finds them all: no second round trip
    return changed


def replication_factor(settings: Settings, brokers: int) -> int:
    """``CLIPSTREAM_REPLICATION_FACTOR`` when set, else what the cluster's size allows."""
    return settings.replication_factor or replication_for(brokers)


def _wait_for(admin: AdminClient, specs: list[TopicSpec], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        missing = [
            s.name
            for s in specs
            if s.name not in topics
            or topics[s.name].error is not None
            or len(topics[s.name].partitions) < s.partitions
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise InfraError(f"topics not ready after {timeout_s:.0f}s: {missing}")
        time.sleep(0.05)


def ensure_core_topics(settings: Settings) -> list[str]:
    return ensure_topics(settings, Catalogue.from_settings(settings).core())


def ensure_model_topics(settings: Settings, model: str, replicas: int = 1) -> list[str]:
    return ensure_topics(settings, Catalogue.from_settings(settings).for_model(model, replicas))


def stage_topics(settings: Settings, models: Mapping[str, int]) -> list[TopicSpec]:
    """The core topics and those of every model (name -> replicas)."""
    cat = Catalogue.from_settings(settings)
    return [*cat.core(), *(spec for model, n in models.items() for spec in cat.for_model(model, n))]


def ensure_stage_topics(settings: Settings, models: Mapping[str, int]) -> list[str]:
    """``stage_topics``, with one client and one metadata request: a restarted stage is back in
    its group sooner."""
    return ensure_topics(settings, stage_topics(settings, models))


def learn_leaders(consumer: Consumer, topics: Iterable[str], timeout_s: float = 10.0) -> None:
    """Load the topics' metadata into ``consumer`` before it is assigned partitions at a
    logical offset (beginning, end): librdkafka looks such an offset up only once it knows the
    partition's leader, and one it does not know yet is looked up again half a second later,
    which every stage's start would wait out."""
    for topic in dict.fromkeys(topics):
        consumer.list_topics(topic, timeout=timeout_s)


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 15.0) -> tuple[int, int]:
    """Low and high offsets of a partition, retried while a fresh topic has no leader yet.

    Right after a topic is created the broker may answer NOT_LEADER_FOR_PARTITION (or
    UNKNOWN_TOPIC_OR_PART) for a moment; that is a wait, not an error.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            err = exc.args[0]
            if time.monotonic() > deadline or not (err.retriable() or err.code() in _NO_LEADER_YET):
                raise
            time.sleep(0.05)


_NO_LEADER_YET = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._TIMED_OUT,
)
