"""Every record type through the real broker, and topic creation that is idempotent."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from schemas import decode, encode
from schemas.records import BY_NAME, from_avro
from tests.records import samples
from topics import Catalogue, consumer_config, producer_config
from topics.admin import ensure_core_topics, ensure_model_topics, ensure_topics
from topics.client import admin_config

pytestmark = pytest.mark.integration


def test_topics_are_created_idempotently_and_grow(settings):
    cat = Catalogue.from_settings(settings)
    first = ensure_core_topics(settings)
    assert set(first) == {s.name for s in cat.core()}
    assert ensure_core_topics(settings) == []
    ensure_model_topics(settings, "m", replicas=1)
    assert ensure_model_topics(settings, "m", replicas=3) == [cat.batches("m").name]
    meta = AdminClient(admin_config(settings)).list_topics(timeout=10).topics
    assert len(meta[cat.batches("m").name].partitions) == 3
    assert len(meta[cat.queries.name].partitions) == settings.selector_partitions


def test_registry_topic_is_compacted(settings):
    from confluent_kafka.admin import ConfigResource

    ensure_core_topics(settings)
    admin = AdminClient(admin_config(settings))
    res = ConfigResource("topic", Catalogue.from_settings(settings).registry.name)
    configs = list(admin.describe_configs([res]).values())[0].result()
    assert configs["cleanup.policy"].value == "compact"


def test_every_record_type_round_trips_through_the_broker(settings):
    topic = settings.topic_prefix + "roundtrip"
    ensure_topics(settings, [Catalogue.from_settings(settings)._spec("roundtrip", 1)])
    sent = {name: from_avro(BY_NAME[name], plain) for name, plain in samples().items()}
    producer = Producer(producer_config(settings))
    for name, record in sent.items():
        producer.produce(topic, key=name.encode(), value=encode(record))
    assert producer.flush(10) == 0

    consumer = Consumer(
        consumer_config(settings, f"rt-{uuid.uuid4().hex}", **{"auto.offset.reset": "earliest"})
    )
    consumer.subscribe([topic])
    got: dict[str, object] = {}
    deadline = time.monotonic() + 30
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            record = decode(msg.value())
            name = type(record).__name__
            assert msg.key().decode() == name
            got[name] = record
    finally:
        consumer.close()
    assert got == sent
