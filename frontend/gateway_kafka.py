"""The gateway's Kafka side: publish queries and feedback, route replies to waiting callers.

Each gateway instance reads only its own reply topic (``Catalogue.replies(instance)``), so
instances run side by side without seeing each other's answers and without a consumer group
(the topic has one partition, assigned directly: no rebalance ever delays a reply).

Threads, and why: librdkafka calls are blocking C calls, so none of them runs on the event
loop. ``produce`` only enqueues (linger 0 sends at once); a poll thread serves delivery reports;
a reply thread polls the reply topic, decodes the Responses and hands each batch to the loop
with one ``call_soon_threadsafe``, where the waiting futures are resolved. The futures dict is
touched only on the loop thread, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from topics.admin import watermarks
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from clipstream.errors import DecodeError, InfraError
from clipstream.settings import Settings
from schemas import decode_as, encode
from topics.admin import ensure_topics
from topics.catalogue import Catalogue
from topics.client import admin_config, consumer_config, producer_config

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """Kafka's local queue is full: the caller gets 503 rather than an unbounded wait."""


class DeliveryFailed(Exception):
    """The broker did not take a record (feedback answers 503 with this)."""


class KafkaBus:
    """Producer + reply consumer of one gateway instance."""

    def __init__(self, settings: Settings, instance: str) -> None:
        cat = Catalogue.from_settings(settings)
        self._settings = settings
        self.reply_spec = cat.replies(instance)
        self.reply_topic = self.reply_spec.name
        self.queries_topic = cat.queries.name
        self.feedback_topic = cat.feedback.name
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # set by the gateway to count into its metrics (called on the loop thread)
        self.on_late: Callable[[int], None] = lambda n: None
        self.on_delivery_error: Callable[[], None] = lambda: None

    # -- lifecycle (blocking: call from a worker thread or before the loop serves) ----------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create the reply topic, connect, and start reading replies from the current end."""
        self._loop = loop
        cat = Catalogue.from_settings(self._settings)
        ensure_topics(self._settings, [self.reply_spec, cat.queries, cat.feedback])
        self._producer = Producer(
            producer_config(self._settings, **{"message.timeout.ms": 10_000})
        )
        conf = consumer_config(
            self._settings,
            f"gateway-{self.reply_topic}",
            **{"enable.auto.commit": False},
        )
        self._consumer = Consumer(conf)
        tp = TopicPartition(self.reply_topic, 0)
        try:
            _, high = watermarks(self._consumer, tp)
        except KafkaException as exc:
            raise InfraError(f"cannot read reply topic {self.reply_topic}: {exc}") from exc
        # an explicit offset, not OFFSET_END: END is resolved lazily at the first fetch, and a
        # reply produced before that fetch would be skipped
        self._consumer.assign([TopicPartition(self.reply_topic, 0, max(high, 0))])
        for name, target in (("gateway-produce-poll", self._poll_loop),
                             ("gateway-replies", self._reply_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def close(self, delete_reply_topic: bool = False) -> None:
        """Stop the threads; ``delete_reply_topic`` for a random instance id, which no later
        process will reuse (otherwise every restart would leave a topic behind)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._producer is not None:
            self._producer.flush(5)
        if self._consumer is not None:
            self._consumer.close()
        if delete_reply_topic:
            admin = AdminClient(admin_config(self._settings))
            for fut in admin.delete_topics([self.reply_topic], operation_timeout=5).values():
                try:
                    fut.result(timeout=10)
                except Exception as exc:  # best effort: the topic expires by retention anyway
                    log.warning("could not delete reply topic %s: %s", self.reply_topic, exc)

    # -- queries ------------------------------------------------------------------------
    def publish_query(self, event: dict[str, Any], key: bytes) -> asyncio.Future[dict[str, Any]]:
        """Send a QueryEvent and return the future its Response will resolve (loop thread only)."""
        assert self._loop is not None and self._producer is not None, "bus not started"
        value = encode("QueryEvent", event)
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        qid = event["query_id"]
        self._pending[qid] = fut
        try:
            self._producer.produce(
                self.queries_topic, value=value, key=key, on_delivery=self._query_delivered
            )
        except BufferError:
            self._pending.pop(qid, None)
            raise Overloaded("Kafka producer queue is full") from None
        except KafkaException as exc:
            self._pending.pop(qid, None)
            raise DeliveryFailed(str(exc)) from exc
        return fut

    def forget(self, query_id: str) -> None:
        """The caller stopped waiting (answered, timed out or went away)."""
        self._pending.pop(query_id, None)

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def _query_delivered(self, err: KafkaError | None, msg: Any) -> None:
        # poll thread; a failed query simply times out into the default answer
        if err is not None and self._loop is not None:
            log.warning("query not delivered: %s", err)
            self._loop.call_soon_threadsafe(self.on_delivery_error)

    # -- feedback -----------------------------------------------------------------------
    async def publish_feedback(self, record: dict[str, Any], key: bytes, timeout_s: float) -> None:
        """Send a Feedback record and wait for the broker to take it (DeliveryFailed if not)."""
        assert self._loop is not None and self._producer is not None, "bus not started"
        loop = self._loop
        fut: asyncio.Future[None] = loop.create_future()

        def done(err: KafkaError | None, msg: Any) -> None:
            loop.call_soon_threadsafe(_settle, fut, err)

        try:
            self._producer.produce(
                self.feedback_topic, value=encode("Feedback", record), key=key, on_delivery=done
            )
        except BufferError:
            raise Overloaded("Kafka producer queue is full") from None
        except KafkaException as exc:
            raise DeliveryFailed(str(exc)) from exc
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise DeliveryFailed(f"no acknowledgement from Kafka within {timeout_s:g}s") from None

    # -- health -------------------------------------------------------------------------
    def kafka_ok(self, timeout_s: float = 2.0) -> bool:
        """Blocking metadata round trip for the reply topic (run it in an executor)."""
        if self._producer is None:
            return False
        try:
            meta = self._producer.list_topics(self.reply_topic, timeout=timeout_s)
        except KafkaException:
            return False
        topic = meta.topics.get(self.reply_topic)
        return bool(meta.brokers) and topic is not None and topic.error is None

    # -- threads ------------------------------------------------------------------------
    def _poll_loop(self) -> None:
        assert self._producer is not None
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def _reply_loop(self) -> None:
        assert self._consumer is not None and self._loop is not None
        consumer, loop = self._consumer, self._loop
        while not self._stop.is_set():
            first = consumer.poll(0.1)  # returns as soon as one reply is there
            if first is None:
                continue
            records: list[dict[str, Any]] = []
            for msg in [first, *consumer.consume(999, timeout=0)]:
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("reply topic error: %s", msg.error())
                    continue
                try:
                    records.append(decode_as("Response", msg.value()))
                except DecodeError as exc:
                    log.warning("undecodable reply at offset %s: %s", msg.offset(), exc)
            if records:
                loop.call_soon_threadsafe(self._deliver, records)

    def _deliver(self, records: list[dict[str, Any]]) -> None:
        late = 0
        for record in records:
            fut = self._pending.pop(record["query_id"], None)
            if fut is None or fut.done():
                late += 1
            else:
                fut.set_result(record)
        if late:
            self.on_late(late)




def _settle(fut: asyncio.Future[None], err: KafkaError | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(DeliveryFailed(str(err)))
