"""The schemas topic: how a stage reads the records of a newer clipstream during an upgrade.

A record carries only its schema's fingerprint (``schemas.codec``). A stage knows the schemas of
its own version and of the earlier ones (``schemas/earlier/``), but not those of a version
released after it, so while a pipeline's stages are replaced one by one an old stage could not
read what a new one writes. So every process publishes the schemas it writes with to a
compacted topic, keyed by fingerprint, before it writes a record; a stage that meets a
fingerprint it does not know reads that topic and resolves the record against its own schema
(Avro's schema resolution: added fields are skipped, removed ones take their defaults).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from clipstream.settings import Settings
from schemas.codec import Codec, default_codec
from topics.admin import watermarks
from topics.catalogue import Catalogue
from topics.client import consumer_config, producer_config

log = logging.getLogger("clipstream.schemas")

# one read of the topic at most this often: a stream of records with made-up fingerprints
# must not make a stage read it for each
READ_EVERY_S = 5.0
READ_TIMEOUT_S = 5.0

_published: set[tuple[str, str]] = set()  # (bootstrap, topic) this process published to
_lock = threading.Lock()


def publish(settings: Settings, codec: Codec | None = None, timeout_s: float = 10.0) -> None:
    """Write every schema ``codec`` writes with to the schemas topic (once per process and
    topic; compaction keeps one record per fingerprint)."""
    codec = codec or default_codec()
    topic = Catalogue.from_settings(settings).schemas.name
    with _lock:
        if codec is default_codec() and (settings.kafka_bootstrap, topic) in _published:
            return
        producer = Producer(producer_config(settings, acks="all"))
        for fp, canonical in sorted(codec.written().items()):
            producer.produce(topic, key=fp.encode(), value=canonical.encode())
        left = producer.flush(timeout_s)
        if left:
            log.warning("%d schema(s) not yet written to %s: a stage of another version may not read "
                        "this one's records until they are", left, topic)
            return
        if codec is default_codec():
            _published.add((settings.kafka_bootstrap, topic))


class SchemaLookup:
    """``Codec.resolver``: on a fingerprint the codec does not know, read the schemas topic
    (at most once per ``READ_EVERY_S``) and teach the codec every schema of it."""

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.settings, self.codec = settings, codec
        self.topic = Catalogue.from_settings(settings).schemas.name
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self.reads = 0

    def __call__(self, fp: int) -> None:
        with self._lock:
            if time.monotonic() - self._read_at < READ_EVERY_S:
                return
            self._read_at = time.monotonic()
            self.reads += 1
            try:
                schemas = self._schemas()
            except Exception as exc:  # Kafka away: the record is refused as unknown, the stage goes on
                log.warning("could not read %s for schema %016x: %s", self.topic, fp, exc)
                return
            learnt = sum(self._learn(schema) for schema in schemas)
            log.info("read %s for schema %016x: %d schema(s) known from it", self.topic, fp, learnt)

    def _learn(self, schema: object) -> bool:
        try:
            return self.codec.learn(schema) is not None
        except Exception as exc:  # a record there that is no Avro schema: skipped, the others still count
            log.warning("skipping a record of %s that is not a usable schema: %s", self.topic, exc)
            return False

    def _schemas(self) -> list[dict[str, object]]:
        consumer = Consumer(consumer_config(self.settings, f"schemas-{uuid.uuid4().hex[:8]}",
                                            **{"enable.auto.commit": False}))
        try:
            tp = TopicPartition(self.topic, 0)
            low, high = watermarks(consumer, tp, READ_TIMEOUT_S)
            if high <= low:
                return []
            consumer.assign([TopicPartition(self.topic, 0, low)])
            found, deadline = [], time.monotonic() + READ_TIMEOUT_S
            while time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                try:
                    found.append(json.loads(msg.value()))
                except (TypeError, ValueError):
                    pass  # not a schema: skipped
                if msg.offset() + 1 >= high:
                    break
            return found
        finally:
            consumer.close()


def install(settings: Settings) -> None:
    """For a stage: publish this version's schemas, and read newer versions' records."""
    publish(settings)
    codec = default_codec()
    if codec.resolver is None:
        codec.resolver = SchemaLookup(settings, codec)
