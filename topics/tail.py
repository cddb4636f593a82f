"""The last record of each partition of a topic, for tools that show where a stage stands.

A batcher stamps every batch, and every handover between versions, with the version it sends
to (``topics.markers``), so the last record of ``batches.<model>`` tells which version serves
now, which the registry alone does not while a new version's workers are still getting ready.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from clipstream.errors import ClipstreamError
from clipstream.settings import Settings
from schemas import Batch, decode_as
from topics.admin import watermarks
from topics.client import consumer_config
from topics.markers import is_retirement


def last_records(settings: Settings, topic: str, partitions: int, timeout_s: float = 10.0) -> dict[int, bytes]:
    """Partition -> the value of its last record, for partitions ``0 .. partitions-1`` that hold
    one (a partition whose records all expired, or a topic not created yet, is left out)."""
    consumer = Consumer(consumer_config(settings, f"tail-{uuid.uuid4().hex[:8]}", **{"enable.auto.commit": False}))
    try:
        known = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if known is None or known.error is not None:
            return {}
        wanted = [p for p in sorted(known.partitions) if p < partitions]
        assign = []
        for p in wanted:
            low, high = watermarks(consumer, TopicPartition(topic, p), timeout_s)
            if high > low:
                assign.append(TopicPartition(topic, p, high - 1))
        consumer.assign(assign)
        found: dict[int, bytes] = {}
        waiting = {tp.partition for tp in assign}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:  # one record each: the last, or a newer one
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            waiting.discard(msg.partition())
            if msg.value() is not None:
                found[msg.partition()] = msg.value()
        return found
    finally:
        consumer.close()


def served_versions(settings: Settings, topic: str, replicas: int, timeout_s: float = 10.0) -> dict[int, str | None]:
    """Replica -> the version the batches on ``topic`` (a model's or group's ``batches``) carry
    now: its partition's last record, a batch or a handover. A replica whose last record
    retired it (an earlier scale-down) has served nothing since, and is left out, as is one
    with no batch yet."""
    out: dict[int, str | None] = {}
    for part, value in sorted(last_records(settings, topic, replicas, timeout_s).items()):
        try:
            batch = decode_as(Batch, value)
        except ClipstreamError:
            continue  # not a batch: as if nothing was sent there
        if not is_retirement(batch):
            out[part] = batch.version
    return out
