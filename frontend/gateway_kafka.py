"""The gateway's Kafka side: publish queries and feedback, route replies to waiting callers.

Each gateway instance reads only its own reply topic (``Catalogue.replies(instance)``), so
instances run side by side without seeing each other's answers and without a consumer group
(the topic has one partition, assigned directly: no rebalance ever delays a reply).

Threads, and why: librdkafka calls are blocking C calls, so none of them runs on the event
loop. ``produce`` only enqueues (linger 0 sends at once). A query's delivery report matters
only when it failed, so the loop serves the queries' reports every ``IDLE_POLL_S``, many at a
time, instead of a thread waking for each query (docs/design/0050); feedback goes through a
producer of its own whose thread serves each report at once, as its caller waits for the ack.
A ``topics.intake`` reads the reply topic: the loop polls it when librdkafka's queue wakes it
(or a thread hands each fetch over), decodes the Responses (and the Predictions of queries sent
to their model straight, docs/design/0083) and resolves the waiting futures.
The futures dict is touched only on the loop thread, so it needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from clipstream.clock import now_us
from clipstream.settings import Settings
from clipstream.errors import ClipstreamError, DecodeError, InputError
from frontend.state import Reply
from schemas import Feedback, ModelRequest, Predictions, QueryEvent, Response, decode, encode
from topics.admin import ensure_model_topics, ensure_topics, watermarks
from topics.catalogue import Catalogue
from topics.client import admin_config
from topics.deadletters import DeadLetters
from topics.emitter import DeliveryFailed, Emitter
from topics.intake import Intake
from topics.stage import IDLE_POLL_S

__all__ = ["DeliveryFailed", "KafkaBus", "Overloaded", "watermarks"]

log = logging.getLogger(__name__)


class Overloaded(ClipstreamError):
    """Kafka's local queue is full: the caller gets 503 rather than an unbounded wait."""


class KafkaBus:
    """Producer + reply consumer of one gateway instance."""

    def __init__(self, settings: Settings, instance: str) -> None:
        cat = Catalogue.from_settings(settings)
        self._settings = settings
        self.reply_spec = cat.replies(instance)
        self.reply_topic = self.reply_spec.name
        self.queries_topic = cat.queries.name
        self.feedback_topic = cat.feedback.name
        self._deadletter_topic = cat.deadletter.name
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._request_topics: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: Emitter | None = None
        self._acked: Emitter | None = None  # feedback's producer, made at the first feedback
        self._reports: asyncio.Task[None] | None = None
        self._intake: Intake | None = None
        # set by the gateway to count into its metrics (called on the loop thread)
        self.on_late: Callable[[list[int | None]], None] = lambda late_by_us: None
        self.on_delivery_error: Callable[[], None] = lambda: None

    # -- lifecycle (blocking: call from a worker thread or before the loop serves) ----------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create the reply topic, connect, and start reading replies from the current end."""
        self._loop = loop
        cat = Catalogue.from_settings(self._settings)
        ensure_topics(self._settings, [self.reply_spec, cat.queries, cat.feedback, cat.deadletter])
        self._producer = Emitter(self._settings, name="gateway", **{"message.timeout.ms": 10_000})
        loop.call_soon_threadsafe(self._serve_reports)
        # the one partition from its end now, as a number (``topics.offsets.assign_at_end``)
        self._intake = Intake(self._settings, self.reply_topic, f"gateway-{self.reply_topic}", self._deliver,
                              max_group=999, convert=_decode_reply, assign=[TopicPartition(self.reply_topic, 0)],
                              name="gateway-replies", on_undecodable=self._undecodable)
        self._intake.start(loop)

    def _serve_reports(self) -> None:
        """On the loop: the queries' delivery reports, served every ``IDLE_POLL_S``."""
        assert self._loop is not None and self._producer is not None
        self._reports = self._loop.create_task(self._producer.serve_reports(IDLE_POLL_S))

    def _undecodable(self, msg: Any, exc: Exception) -> None:
        """A record on the reply topic that is no Response: a dead letter (where the intake polls)."""
        if self._producer is not None:
            DeadLetters(self._producer, self._deadletter_topic, stage="gateway", max_payload=65536).send(
                reason=f"undecodable reply: {exc}", msg=msg)

    def close(self, delete_reply_topic: bool = False) -> None:
        """Stop the threads; ``delete_reply_topic`` for a random instance id, which no later
        process will reuse (otherwise every restart would leave a topic behind)."""
        if self._intake is not None:
            self._intake.stop()
        if self._reports is not None:
            self._reports.cancel()
        for emitter in (self._producer, self._acked):
            if emitter is not None:
                emitter.close(5)
        if delete_reply_topic:
            admin = AdminClient(admin_config(self._settings))
            for fut in admin.delete_topics([self.reply_topic], operation_timeout=5).values():
                try:
                    fut.result(timeout=10)
                except Exception as exc:  # best effort: the topic expires by retention anyway
                    log.warning("could not delete reply topic %s: %s", self.reply_topic, exc)

    # -- queries ------------------------------------------------------------------------
    def publish_query(self, event: QueryEvent, key: bytes) -> asyncio.Future[Reply]:
        """Send a QueryEvent and return the future its Response will resolve (loop thread only)."""
        return self._publish(self.queries_topic, event.query_id, encode(event), key)

    def publish_request(self, request: ModelRequest) -> asyncio.Future[Reply]:
        """Send a one-model app's query straight to its model (docs/design/0083) and return the
        future its Prediction will resolve; ``request_topic`` first (loop thread only)."""
        return self._publish(self._request_topics[request.model], request.query_id, encode(request),
                             request.query_id.encode())

    def request_topic(self, model: str) -> str | None:
        """The model's ``requests.<model>`` topic once ``ensure_request_topic`` made sure of it."""
        return self._request_topics.get(model)

    def ensure_request_topic(self, model: str) -> None:
        """Make sure the model's topics exist, once per model (blocking: run it in an executor),
        as the selector does before its first request to a model."""
        ensure_model_topics(self._settings, model)
        self._request_topics[model] = Catalogue.from_settings(self._settings).requests(model).name

    def _publish(self, topic: str, query_id: str, value: bytes, key: bytes) -> asyncio.Future[Reply]:
        assert self._loop is not None and self._producer is not None, "bus not started"
        fut: asyncio.Future[Reply] = self._loop.create_future()
        self._pending[query_id] = fut
        try:
            self._producer.produce(topic, value=value, key=key, on_delivery=self._query_delivered)
        except BufferError:
            self._pending.pop(query_id, None)
            raise Overloaded("Kafka producer queue is full") from None
        except KafkaException as exc:
            self._pending.pop(query_id, None)
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
    async def publish_feedback(self, record: Feedback, key: bytes, timeout_s: float) -> None:
        """Send a Feedback record and wait for the broker to take it (DeliveryFailed if not; a
        record that does not encode is the caller's bad input, an InputError)."""
        assert self._loop is not None and self._producer is not None, "bus not started"
        try:
            value = encode(record)
        except (ValueError, OverflowError) as exc:  # a label the route let through that Avro cannot hold
            raise InputError(f"feedback cannot be stored: {exc}") from None
        if self._acked is None:
            self._acked = Emitter(self._settings, name="gateway feedback",
                                  **{"message.timeout.ms": 10_000}).start_polling()
        done, fut = self._acked.delivered(self._loop)
        try:
            self._acked.produce(self.feedback_topic, value=value, key=key, on_delivery=done)
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

    # -- replies (the intake hands each fetch to the loop) ----------------------------------
    def _deliver(self, records: list[Response | Predictions]) -> None:
        late: list[int | None] = []
        now = 0  # read once per fetch, and only if a reply in it is late
        for record in records:
            if isinstance(record, Predictions):  # a one-model app's queries, answered by the model
                for item in record.items:
                    fut = self._pending.pop(item.query_id, None)
                    if fut is None or fut.done():
                        late.append(None)  # its deadline went with its caller
                    else:
                        fut.set_result(item)
                continue
            fut = self._pending.pop(record.query_id, None)
            if fut is None or fut.done():
                now = now or now_us()
                late.append(now - record.deadline_us)
            else:
                fut.set_result(record)
        if late:
            self.on_late(late)


def _decode_reply(msg: Message) -> Response | Predictions:
    """Where the intake polls: a Response, or a model's Predictions, off the reply topic
    (anything else is a DecodeError: dead-lettered)."""
    record = decode(msg.value())
    if not isinstance(record, (Response, Predictions)):
        raise DecodeError(f"expected a Response or Predictions record, got a {type(record).__name__}")
    return record
