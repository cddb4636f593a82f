"""Dead letters, built and written in one place.

A record a stage cannot handle goes to the ``deadletter`` topic with the stage, the reason,
where it came from and (some of) its bytes, so the pipeline keeps serving and an operator can
see what went wrong. ``dead_letter_record`` builds the record the ``DeadLetter`` schema wants;
``DeadLetters`` sends them; a stage that queues its output (the batcher, the worker) uses
``dead_letter_value`` or the record itself.
"""

from __future__ import annotations

import logging
from typing import Any

from clipstream.clock import now_us
from schemas import DeadLetter, encode

log = logging.getLogger("clipstream.topics")

Source = tuple[str, int, int]  # (topic, partition, offset)


def source_of(msg: Any) -> Source | None:
    """Where a consumed message came from (None for None)."""
    return None if msg is None else (msg.topic(), msg.partition(), msg.offset())


def dead_letter_record(*, stage: str, reason: str, source: Source | None = None, query_id: str | None = None,
                       payload: bytes | None = None) -> DeadLetter:
    """The ``DeadLetter`` record of one record a stage could not handle."""
    topic, partition, offset = source if source is not None else (None, None, None)
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
        self.producer.produce(self.topic, value)
        self.producer.poll(0)
