"""The way out for every stage: one librdkafka producer with its delivery reports served.

librdkafka, not aiokafka: a record sent one at a time costs a fraction of the CPU, and its own
thread does the I/O (docs/design/0009-batcher-intake-on-librdkafka.md). ``produce`` only queues a record (linger 0 puts it on the wire at
once); delivery reports are callbacks run by ``poll``, which someone has to call:

- ``start_polling()``: a thread of its own polls (a stage with no loop to spare, or one that
  wants each report served as it comes: a report's ``latency()`` runs until it is served);
- ``serve_reports()``: an asyncio task polls now and then (the stage also polls after its sends);
- neither: the stage polls after each send (``send(..., poll=True)``).

``delivered`` turns a report into an asyncio future's result for a caller that awaits the ack.
An ``Emitter`` also answers ``produce``/``poll``/``flush``/``list_topics`` as a confluent-kafka
``Producer`` does (they are that producer's own methods), so code written against a producer
(and its tests' fakes) takes one as it is.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Producer

from clipstream.errors import ClipstreamError
from clipstream.settings import Settings
from topics.client import producer_config
from topics.stage import IDLE_POLL_S

log = logging.getLogger("clipstream.topics")

Report = Callable[[KafkaError | None, Any], None]


class DeliveryFailed(ClipstreamError):
    """The broker did not take a record."""


class Emitter:
    """A producer configured by ``topics.client.producer_config`` (plus ``overrides``).

    Records sent by ``send`` without their own ``on_delivery`` are counted in ``errors`` when
    the broker does not take them, with a warning naming ``name``."""

    def __init__(self, settings: Settings, name: str = "", **overrides: Any) -> None:
        self.name = name
        self.producer = Producer(producer_config(settings, **overrides))
        # the Producer's own calls, bound as they are: no Python layer on a hot path
        self.produce = self.producer.produce
        self.poll = self.producer.poll
        self.flush = self.producer.flush
        self.list_topics = self.producer.list_topics
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pending(self) -> int:
        """Records sent whose delivery reports are not served yet (the broker's ack pending).
        A method, not ``__len__``: an emitter with nothing pending must still be truthy."""
        return len(self.producer)

    # -- sending ----------------------------------------------------------------------------
    def send(self, topic: str, value: bytes | None, *, key: bytes | None = None, partition: int | None = None,
             on_delivery: Report | None = None, poll: bool = False) -> None:
        """Queue one record; BufferError when librdkafka's local queue is full."""
        kwargs: dict[str, Any] = {"on_delivery": on_delivery or self._report}
        if key is not None:
            kwargs["key"] = key
        if partition is not None:
            kwargs["partition"] = partition
        self.producer.produce(topic, value, **kwargs)
        if poll:
            self.producer.poll(0)

    def send_waiting(self, topic: str, value: bytes | None, **kwargs: Any) -> None:
        """``send``, waiting while librdkafka's local queue is full (backpressure)."""
        while True:
            try:
                self.send(topic, value, **kwargs)
                return
            except BufferError:  # let librdkafka drain it
                self.producer.poll(0.05)

    def delivered(self, loop: asyncio.AbstractEventLoop) -> tuple[Report, asyncio.Future[None]]:
        """An ``on_delivery`` callback and the future it settles on ``loop`` (DeliveryFailed
        when the broker did not take the record)."""
        fut: asyncio.Future[None] = loop.create_future()

        def report(err: KafkaError | None, msg: Any) -> None:
            loop.call_soon_threadsafe(_settle, fut, err)

        return report, fut

    def _report(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors += 1
            log.warning("%s: a record for %s was not delivered: %s", self.name or "emitter", msg.topic(), err)

    # -- serving delivery reports --------------------------------------------------------------
    def start_polling(self, every_s: float = IDLE_POLL_S) -> Emitter:
        """A thread that serves delivery reports as they come, until ``close``."""
        def run() -> None:
            while not self._stop.is_set():
                self.producer.poll(every_s)

        self._thread = threading.Thread(target=run, name=f"{self.name or 'emitter'}-poll", daemon=True)
        self._thread.start()
        return self

    async def serve_reports(self, every_s: float = 0.1) -> None:
        """An asyncio task's body: delivery reports while nothing else polls; at its end (the
        task cancelled) what is queued is flushed."""
        try:
            while True:
                self.producer.poll(0)
                await asyncio.sleep(every_s)
        finally:
            self.close()

    def close(self, timeout_s: float = 5.0) -> int:
        """Stop the polling thread, wait for what is queued; how many records were left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, timeout_s))
            self._thread = None
        left = self.producer.flush(timeout_s)
        if left:
            log.warning("%s stopped with %d records undelivered", self.name or "emitter", left)
        return left


def _settle(fut: asyncio.Future[None], err: KafkaError | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(DeliveryFailed(str(err)))
