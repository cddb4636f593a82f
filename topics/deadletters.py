"""Dead letters, built and written in one place.

A record a stage cannot handle goes to the ``deadletter`` topic with the stage, the reason,
where it came from and (some of) its bytes, so the pipeline keeps serving and an operator can
see what went wrong. ``dead_letter_record`` builds the record the ``DeadLetter`` schema wants;
``DeadLetters`` sends them; a stage that queues its output (the batcher, the worker) uses
``dead_letter_value`` or the record itself.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from typing import Any

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError
from schemas import DeadLetter, decode_as, encode

log = logging.getLogger("clipstream.topics")

Source = tuple[str, int, int]  # (topic, partition, offset)

# dead letters this process made, by (stage, reason_label): exported by ``topics.metrics``
COUNTS: Counter[tuple[str, str]] = Counter()


# what a reason's head may carry from the record itself: a quoted or bracketed value, or a
# word holding a digit or a sign (an id, a number, a dtype with its width)
_VALUE = re.compile(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\([^)]*\)|\S*[^a-z_\s-]\S*")


def reason_label(reason: str) -> str:
    """A bounded label for a free-text reason: the first four words before its first colon,
    without the values a record put there, so a stream of hostile records cannot grow the
    metric's series ("unknown app 'x1'" -> "unknown app", "bad input: shape ..." -> "bad input")."""
    head = _VALUE.sub(" ", reason.split(":", 1)[0].lower())
    return " ".join(head.split()[:4])[:40] or "unknown"


def source_of(msg: Any) -> Source | None:
    """Where a consumed message came from (None for None)."""
    return None if msg is None else (msg.topic(), msg.partition(), msg.offset())


def dead_letter_record(*, stage: str, reason: str, source: Source | None = None, query_id: str | None = None,
                       payload: bytes | None = None) -> DeadLetter:
    """The ``DeadLetter`` record of one record a stage could not handle."""
    topic, partition, offset = source if source is not None else (None, None, None)
    COUNTS[(stage, reason_label(reason))] += 1
    return DeadLetter(stage=stage, reason=reason, source_topic=topic, source_partition=partition,
                      source_offset=offset, query_id=query_id, payload=payload, created_us=now_us())


def dead_letter_value(*, stage: str, reason: str, source: Source | None = None, query_id: str | None = None,
                      payload: bytes | None = None) -> bytes:
    """The encoded ``DeadLetter`` record, ready to produce."""
    return encode(dead_letter_record(stage=stage, reason=reason, source=source, query_id=query_id, payload=payload))


class DeadLetters:
    """Writes dead letters to ``topic`` through ``producer`` (a ``topics.emitter.Emitter`` or a
    confluent-kafka ``Producer``), logging each one. ``stage``: the default for ``send``;
    ``max_payload`` keeps at most that many bytes of the record (None: all of it)."""

    def __init__(self, producer: Any, topic: str, stage: str | None = None, max_payload: int | None = None) -> None:
        self.producer = producer
        self.topic = topic
        self.stage = stage
        self.max_payload = max_payload
        self.count = 0

    def send(self, *, reason: str, stage: str | None = None, source: Source | None = None,
             query_id: str | None = None, payload: bytes | None = None, msg: Any = None) -> None:
        """One dead letter; ``msg``, a consumed message, gives ``source`` and ``payload``."""
        stage = stage or self.stage
        if stage is None:
            raise ValueError("a dead letter needs the stage that writes it")
        if msg is not None:
            source, payload = source or source_of(msg), payload if payload is not None else (msg.value() or b"")
        self.count += 1
        log.warning("dead letter from %s: %s (query %s)", stage, reason, query_id)
        if payload is not None and self.max_payload is not None:
            payload = payload[: self.max_payload]
        value = dead_letter_value(stage=stage, reason=reason, source=source, query_id=query_id, payload=payload)
        try:
            self.producer.produce(self.topic, value)
            self.producer.poll(0)
        except Exception as exc:  # a report of a failure must not become one: the stage goes on
            log.error("dead letter from %s not sent (%s): %s", stage, exc, reason)


# the stages that write dead letters (``DeadLetters(..., stage=...)``, ``dead_letter_value``/``_record``);
# listed here so ``clipstream deadletters --stage`` can refuse a name no record will ever carry
STAGES: tuple[str, ...] = ("gateway", "selector", "batcher", "worker", "registry")


def latest(settings: Any, count: int = 20, timeout_s: float = 10.0, stage: str | None = None) -> list[DeadLetter]:
    """The newest ``count`` dead letters on the deadletter topic (of ``stage`` only, if given),
    oldest first, for ``clipstream deadletters`` (a record that does not decode shows as stage
    ``?`` with why).

    With a stage, each partition is read backwards in growing windows until it holds ``count``
    records of that stage or its start is reached, so an older record of a quiet stage is not
    hidden behind the newest records of a busy one."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    from confluent_kafka import KafkaException

    from topics.admin import BrokerWatch, watermarks
    from topics.catalogue import Catalogue
    from topics.client import consumer_config

    topic = Catalogue.from_settings(settings).deadletter.name
    watch = BrokerWatch()
    consumer = Consumer(consumer_config(settings, f"deadletters-{uuid.uuid4().hex}", error_cb=watch,
                                        **{"enable.auto.commit": False}))
    out: list[DeadLetter] = []
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            consumer.poll(0)  # its error callbacks: a broker that refused the credentials says so
            if watch.refused:
                raise watch.refusal(settings) from exc
            raise
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        deadline = time.monotonic() + timeout_s
        for p in meta.partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p), timeout_s)
            span, end = count, high
            found: list[DeadLetter] = []
            while end > low and len(found) < count and time.monotonic() < deadline:
                start = max(low, end - span)
                read = _read_range(consumer, TopicPartition(topic, p, start), end, deadline)
                found = [d for d in read if stage is None or d.stage == stage] + found
                end, span = start, span * 2
            out.extend(found)
    finally:
        consumer.close()
    out.sort(key=lambda d: d.created_us)
    return out[-count:]


def _read_range(consumer: Any, start: Any, end: int, deadline: float) -> list[DeadLetter]:
    """The records of one partition from ``start`` (a TopicPartition with its offset) up to
    ``end``, decoded; fewer if ``deadline`` passes first, so a slow broker cannot hang the CLI."""
    consumer.assign([start])
    out: list[DeadLetter] = []
    while time.monotonic() < deadline:
        done = False
        for msg in consumer.consume(500, timeout=0.2):
            if msg.error():
                continue
            if msg.offset() < end:
                out.append(_decoded(msg))
            done = done or msg.offset() + 1 >= end
        if done:
            break
    return out


def _decoded(msg: Any) -> DeadLetter:
    try:
        return decode_as(DeadLetter, msg.value())
    except ClipstreamError as exc:
        return DeadLetter(stage="?", reason=f"not a DeadLetter record: {exc}", source_topic=msg.topic(),
                          source_partition=msg.partition(), source_offset=msg.offset(), query_id=None,
                          payload=msg.value(), created_us=(msg.timestamp()[1] or 0) * 1000)
