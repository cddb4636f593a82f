"""The last record of each partition of a topic, for tools that show where a stage stands.

A batcher stamps every batch, and every handover between versions, with the version it sends
to (``topics.markers``), so the last record of ``batches.<model>`` tells which version serves
now, which the registry alone does not while a new version's workers are still getting ready.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from clipstream.settings import Settings
from topics.admin import watermarks
from topics.client import consumer_config


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
