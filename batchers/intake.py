"""The batcher's way in: its topics read by librdkafka, not by faust agents.

``requests.<model>`` brings one record per query, and ``batch-stats.<model>`` one per batch,
so also one per query at batch size 1. Faust's per-event path (aiokafka in a consumer
thread, a hand-off per fetch, an Event with acks and sensors per record) cost 0.75–1.3 ms of
CPU per record on this project's machine, against 0.16–0.25 ms for a confluent-kafka consumer
in a thread that hands each fetch to the loop in one call, with lower latency too
(``python -m bench.intake``). On two cores shared with the broker and every other stage that
was most of the batcher's cost per query. Faust still runs the process: its lifecycle and
signals, the producer and the tasks; its own consumer is not started.

Offsets: a record's offset is stored when it is handed to the loop, and auto-commit sends it,
as faust did after the agent accepted the event: a request queued in a batcher that dies is
not replayed (its query gets the default at the deadline, which the selector guarantees).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from clipstream.settings import Settings
from topics.client import consumer_config

log = logging.getLogger("clipstream.batcher")

Record = tuple[bytes | None, tuple[str, int, int]]  # value, (topic, partition, offset)


class Intake:
    """A consumer thread that hands each fetched group of records to ``deliver`` with one
    loop call (``deliver`` runs on the loop thread). One intake may read several topics (a
    batcher serving several models): one fetch then brings every model's records and wakes
    the process once; each record carries its topic."""

    def __init__(self, settings: Settings, topics: str | list[str], group_id: str,
                 deliver: Callable[[list[Record]], None], max_group: int = 1000,
                 fetch_max_wait_ms: int | None = None) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.topic = ",".join(self.topics)  # for log lines
        self._deliver = deliver
        self._max_group = max_group
        # the broker answers a fetch as soon as any record arrives; this bounds an idle one
        # (None: ``topics.client``'s default for every consumer)
        overrides = {} if fetch_max_wait_ms is None else {"fetch.wait.max.ms": fetch_max_wait_ms}
        self._consumer = Consumer(consumer_config(settings, group_id, **overrides))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()  # partitions assigned and start offsets fixed

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._consumer.subscribe(self.topics, on_assign=self._on_assign)
        self._thread = threading.Thread(target=self._run, name=f"intake-{self.topics[0]}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self._consumer.close()  # commits the stored offsets and leaves the group
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer of %s: %s", self.topic, exc)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Start where the group left off, else at the current end, given as a number: a
        symbolic "latest" is resolved only at the first fetch, and a request produced between
        our ``ready:`` line and that fetch would be skipped."""
        try:
            committed = consumer.committed(partitions, timeout=10)
            for tp in committed:
                if tp.offset < 0:
                    tp.offset = consumer.get_watermark_offsets(tp, timeout=10)[1]
            consumer.assign(committed)
        except KafkaException as exc:  # keep librdkafka's own choice rather than no partitions
            log.warning("could not fix start offsets of %s (%s); using the reset policy", self.topic, exc)
            consumer.assign(partitions)
        if {tp.topic for tp in partitions} >= set(self.topics):
            self.ready.set()

    def _run(self) -> None:
        consumer, loop, deliver = self._consumer, self._loop, self._deliver
        assert loop is not None
        while not self._stop.is_set():
            first = consumer.poll(0.1)  # returns as soon as one record is there
            if first is None:
                continue
            group: list[Record] = []
            for msg in [first, *consumer.consume(self._max_group, timeout=0)]:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("%s: consumer error: %s", self.topic, err)
                    continue
                group.append((msg.value(), (msg.topic(), msg.partition(), msg.offset())))
            if group:
                try:
                    loop.call_soon_threadsafe(deliver, group)
                except RuntimeError:  # the loop closed under us: shutting down
                    return
