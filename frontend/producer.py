"""The Kafka side for applications: ``Producer`` publishes queries and feedback straight to
the topics without waiting, and ``ResponseReader`` reads the answers to queries sent that way.

Split from ``frontend.client`` (the REST side) because it needs librdkafka and the registry,
which a caller of the gateway never does.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, ConfigError, InfraError, InputError
from clipstream.settings import Settings, get_settings
from frontend.gateway_models import MAX_CONTEXT_CHARS, MAX_SLO_MS
from frontend.inputs import array_for, input_for, to_json
from registry.labels import label_problem, reward_problem
from registry.outputs import app_input, app_outputs
from registry.topic import RegistryFollower
from schemas import Feedback, QueryEvent, Response, Tensor, decode_as, encode
from topics.admin import watermarks
from topics.catalogue import Catalogue
from topics.client import consumer_config, producer_config
from topics.sizes import input_limit, too_large_input

__all__ = ["DeliveryCallback", "Producer", "ResponseReader"]

DeliveryCallback = Callable[[str, Exception | None], None]


class Producer:
    """Publishes QueryEvents and Feedback straight to Kafka, for callers that do not wait.

    ``send_*`` only enqueue (librdkafka sends at once, linger 0); delivery is reported to the
    optional ``on_delivery(query_id, error_or_None)`` callback from within ``send_*``/``poll``/
    ``flush``, and failures are kept in ``failed``. Answers to queries sent without a reply topic
    go to the ``responses`` topic: read them with ``ResponseReader``. The registry is read
    (once, lazily, at the first send): for an app's SLO when ``slo_ms`` is not given, to turn a
    nested list into the dtype and shape the app's model takes, and for the labels feedback may
    give. A numpy array is sent as it
    is: give it the model's dtype and shape (the worker refuses anything else).
    """

    def __init__(self, bootstrap: str | None = None, settings: Settings | None = None) -> None:
        from confluent_kafka import Producer as KafkaProducer

        settings = settings or get_settings()
        if bootstrap:
            settings = settings.model_copy(update={"kafka_bootstrap": bootstrap})
        self.settings = settings
        cat = Catalogue.from_settings(settings)
        self.queries_topic, self.feedback_topic = cat.queries.name, cat.feedback.name
        self._producer = KafkaProducer(producer_config(settings))
        self._registry: Any = None
        self._not_waited_for: set[str] = set()  # apps seen in the registry, or waited for once
        self.failed: list[tuple[str, str]] = []

    def send_query(
        self,
        app: str,
        input: Any,
        context: str | None = None,
        slo_ms: float | None = None,
        query_id: str | None = None,
        reply_topic: str | None = None,
        reply_partition: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> str:
        """Publish one query; returns its query id (yours, or a fresh uuid4 hex)."""
        query_id = query_id or uuid.uuid4().hex
        if context is not None and not (isinstance(context, str) and 1 <= len(context) <= MAX_CONTEXT_CHARS):
            raise InputError(f"context must be text of 1 to {MAX_CONTEXT_CHARS} characters, as the gateway takes it")
        tensor = Tensor.of(self._array(app, input))
        if len(tensor.data) > input_limit(self.settings.max_record_bytes):
            raise InputError(too_large_input(len(tensor.data), self.settings.max_record_bytes))
        if slo_ms is None:
            # the app's own, as the gateway takes it: the registry checked it, no caller's bound applies
            slo_ms = self._app_config(app).slo_ms
            if slo_ms <= 0:
                raise InputError("slo_ms must be positive")
        elif not 0 < slo_ms <= MAX_SLO_MS:  # the gateway's bound; a NaN compares false, so it is refused too
            raise InputError(f"slo_ms must be in (0, {MAX_SLO_MS:g}] ms, got {slo_ms!r}")
        created = now_us()
        event = QueryEvent(
            query_id=query_id, app=app, context=context, input=tensor,
            created_us=created, deadline_us=created + int(slo_ms * 1000),
            reply_topic=reply_topic, reply_partition=reply_partition,
            trace={"produced": created},
        )
        self._send(self.queries_topic, encode(event), context or query_id,
                   query_id, on_delivery)
        return query_id

    def send_feedback(
        self,
        app: str,
        query_id: str,
        label: Any = None,
        reward: float | None = None,
        context: str | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Publish the true label of, or a reward in [0, 1] for, an earlier query."""
        if label is None and reward is None:
            raise InputError("feedback needs a label or a reward")
        problem = reward_problem(reward)  # the learner's own check: a bool or a NaN too
        if problem is not None:
            raise InputError(problem)
        # the app and its labels, checked as the gateway checks them: the learner would only
        # dead-letter the record, where its sender does not look
        models = self._app_config(app).models
        outputs = app_outputs(self._registry.view(), models)
        problem = label_problem(label, outputs.kind, outputs.labels)
        if problem is not None:
            raise InputError(f"feedback label: {problem}")
        record = Feedback(
            query_id=query_id, app=app, context=context, label=to_json(label),
            reward=float(reward) if reward is not None else None, created_us=now_us(),
        )
        self._send(self.feedback_topic, encode(record), query_id, query_id, on_delivery)  # keyed as CONTRACTS says

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        return self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every record is delivered; InfraError if some are not (or failed)."""
        left = self._producer.flush(timeout_s)
        if left:
            raise InfraError(f"{left} records not delivered within {timeout_s:g}s")
        if self.failed:
            raise InfraError(f"{len(self.failed)} records failed, first: {self.failed[0]}")

    def close(self) -> None:
        self._producer.flush(10)
        if self._registry is not None:
            self._registry.stop()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, topic: str, value: bytes, key: str, query_id: str,
              on_delivery: DeliveryCallback | None) -> None:
        def report(err: Any, msg: Any) -> None:
            error = None if err is None else InfraError(str(err))
            if error is not None:
                self.failed.append((query_id, str(err)))
            if on_delivery is not None:
                on_delivery(query_id, error)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key.encode(), on_delivery=report)
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let librdkafka drain it, then retry
        self._producer.poll(0)

    def _app_config(self, app: str) -> Any:
        if self._registry is None:
            self._registry = RegistryFollower(self.settings).start()
            self._registry.wait_ready(30.0)
            self._warm()
        # a registry record written just before may reach the view a moment after wait_ready:
        # waited for once per app name; one removed, or already waited for, is refused at once
        deadline = time.monotonic() + (0.0 if app in self._not_waited_for else 2.0)
        while (cfg := self._registry.view().apps.get(app)) is None:
            if time.monotonic() > deadline:
                self._not_waited_for.add(app)
                raise ConfigError(f"unknown app {app!r} (not in the registry)")
            time.sleep(0.02)
        self._not_waited_for.add(app)
        return cfg

    def _warm(self) -> None:
        """Fetch the queries topic's metadata, and so connect to its leader, before the first
        query is stamped: otherwise that query's deadline pays for both, and a short SLO is
        spent before it reaches the selector."""
        from confluent_kafka import KafkaException

        try:
            self._producer.list_topics(self.queries_topic, timeout=5.0)
        except KafkaException:  # the send says what is wrong, as without this
            pass

    def _array(self, app: str, input: Any) -> np.ndarray:
        cfg = self._app_config(app)
        spec = app_input(self._registry.view(), cfg.models)
        if isinstance(input, np.ndarray):
            return array_for(input, spec)
        return input_for(input, spec)


class ResponseReader:
    """Decoded ``Response`` records (``schemas.Response``) from the responses topic (or any
    reply topic).

    Reads every partition from where it ends now (or from the beginning), assigned directly,
    without a consumer group: each reader sees every response, and none is skipped between
    creating the reader and the first read.

    Each query's Response is yielded once: the selector answers again a query whose answer was
    not yet committed when its partition moved to another member (a member killed or added),
    and the reader drops that second Response (counted in ``duplicates``). It remembers the
    last ``seen_capacity`` query ids, far more than are answered within a rebalance.
    """

    def __init__(self, settings: Settings | None = None, bootstrap: str | None = None,
                 topic: str | None = None, from_beginning: bool = False, seen_capacity: int = 100_000) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        settings = settings or get_settings()
        if bootstrap:
            settings = settings.model_copy(update={"kafka_bootstrap": bootstrap})
        self.topic = topic or Catalogue.from_settings(settings).responses.name
        self._consumer = Consumer(consumer_config(
            settings, f"responses-{uuid.uuid4().hex}", **{"enable.auto.commit": False}))
        try:
            meta = self._consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        except KafkaException as exc:  # no broker answered: said as the Producer says it
            self._consumer.close()
            raise InfraError(f"Kafka at {settings.kafka_bootstrap} did not answer ({exc.args[0]}): check "
                             "CLIPSTREAM_KAFKA_BOOTSTRAP (or bootstrap=), or start Kafka with "
                             "`clipstream infra up`") from None
        if meta is None or meta.error is not None:
            self._consumer.close()
            raise InfraError(f"topic {self.topic} does not exist")
        assignment = []
        for p in sorted(meta.partitions):
            low, high = watermarks(self._consumer, TopicPartition(self.topic, p))
            assignment.append(TopicPartition(self.topic, p, low if from_beginning else high))
        self._consumer.assign(assignment)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._seen_capacity = seen_capacity
        self.duplicates = 0

    def poll(self, timeout_s: float = 1.0) -> Response | None:
        """The next Response, or None when none arrived within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return None
            if not msg.error():
                try:
                    record = decode_as(Response, msg.value())
                except ClipstreamError:
                    continue  # not a Response (garbage on the topic): skip it, keep reading
                if self._first(record.query_id):
                    return record
                self.duplicates += 1
            if time.monotonic() >= deadline:
                return None

    def _first(self, query_id: str) -> bool:
        if query_id in self._seen:
            return False
        self._seen[query_id] = None
        if len(self._seen) > self._seen_capacity:
            self._seen.popitem(last=False)
        return True

    def __iter__(self) -> Iterator[Response]:
        """Every response as it arrives (blocks; stop with ``close`` or by leaving the loop)."""
        while True:
            record = self.poll(1.0)
            if record is not None:
                yield record

    def collect(self, query_ids: set[str] | list[str], timeout_s: float = 10.0) -> dict[str, Response]:
        """The responses to ``query_ids`` (others are skipped), as many as arrive in time."""
        want = set(query_ids)
        got: dict[str, Response] = {}
        deadline = time.monotonic() + timeout_s
        while want - got.keys() and time.monotonic() < deadline:
            record = self.poll(max(0.0, deadline - time.monotonic()))
            if record is not None and record.query_id in want:
                got[record.query_id] = record
        return got

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> "ResponseReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
