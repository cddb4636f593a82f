"""The benchmarks' one topic tap: a consumer thread that hands every record of some topics,
decoded to its typed record (``schemas.records``), to a handler.

The partitions are assigned, not subscribed (no consumer group to join, nothing committed):
each at its end as of when the tap is made (its high watermark, so nothing produced after that
is missed) or, for the topics named in ``from_beginning``, at its start. Each fetch is taken
whole: a poll for its first record, then whatever else is already there; every record of the
fetch goes to the handler with the time the fetch arrived (epoch microseconds).

    tap = Tap(settings, [catalogue.predictions]).start(on_record)   # on_record(record, msg, arrived_us)
    ...
    tap.close()

``stop`` ends the thread and keeps the assignment, so ``start`` can hand the next records to
another handler (the load generator reads its reply topic one run at a time).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from clipstream.clock import now_us
from schemas import Record, decode

# (the typed record, the confluent_kafka Message, when its fetch arrived in us); callers tell the
# record's type with isinstance
Handler = Callable[[Record, Any, int], None]


class Tap:
    def __init__(self, settings: Any, topics: Iterable[Any], *, from_beginning: Iterable[Any] = (),
                 group: str | None = None) -> None:
        """``topics`` and ``from_beginning``: ``topics.catalogue.TopicSpec`` (name, partitions)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from topics.admin import watermarks
        from topics.client import consumer_config

        self.consumer = Consumer(consumer_config(settings, group or f"bench-tap-{uuid.uuid4().hex[:8]}",
                                                 **{"enable.auto.commit": False}))
        parts = []
        for spec in topics:
            for p in range(spec.partitions):
                _, high = watermarks(self.consumer, TopicPartition(spec.name, p))
                parts.append(TopicPartition(spec.name, p, max(high, 0)))
        parts += [TopicPartition(spec.name, p, OFFSET_BEGINNING) for spec in from_beginning
                  for p in range(spec.partitions)]
        self.consumer.assign(parts)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_record: Handler) -> "Tap":
        self.stop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(on_record,), daemon=True)
        self._thread.start()
        return self

    def _run(self, on_record: Handler) -> None:
        consumer, stop = self.consumer, self._stop
        while not stop.is_set():
            # consume(n, t) waits for n records or all of t: wait for the first only, then take the rest
            first = consumer.poll(0.05)
            if first is None:
                continue
            arrived = now_us()
            for msg in [first, *consumer.consume(999, 0)]:
                if msg.error() is not None:
                    continue
                try:
                    record = decode(msg.value())
                except Exception:  # not a clipstream record: not ours to count
                    continue
                on_record(record, msg, arrived)

    def stop(self) -> None:
        """End the reading thread (the consumer stays assigned where it got to)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.consumer.close()

    def __enter__(self) -> "Tap":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
