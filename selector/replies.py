"""How the selector's answers reach their callers: a Response goes to the topic its query
named, and one its topic keeps refusing is given up rather than held, as its query's offset
could not be committed while it waits."""

from __future__ import annotations

import functools
from typing import Any

from confluent_kafka import KafkaException

from schemas import Response, encode
from selector.handover import QueryOffsets
from selector.join import Asked
from selector.kafka import log
from selector.metrics import SelectorMetrics
from selector.reply_budget import ReplyBudget
from topics.catalogue import Catalogue
from topics.deadletters import DeadLetters
from topics.emitter import Emitter

# a Response refused this often (each after librdkafka's own retries) has nowhere to go
REPLY_SENDS = 3


class Replies:
    """The answering half of ``Selector``, which sets these attributes."""

    catalogue: Catalogue
    reply_producer: Emitter
    reply_budget: ReplyBudget
    offsets: QueryOffsets
    dead: DeadLetters
    metrics: SelectorMetrics
    stats: dict[str, int]

    def _reply(self, asked: Asked, record: Response, late_us: int | None = None) -> None:
        topic = asked.reply_topic or self.catalogue.responses.name
        kwargs: dict[str, Any] = {"key": record.query_id.encode()}
        if asked.reply_topic and asked.reply_partition is not None:
            kwargs["partition"] = int(asked.reply_partition)
        # only answers made at the cutoff teach the budget: it is for them (an answer complete
        # earlier has time to spare), and their trips come when every stage is busy with newer
        # queries. Every report marks its query answered, so its offset may be committed.
        # Reports are served by ``run``'s reply-acks thread.
        value = encode(record)
        teach = late_us if self.reply_budget.adaptive else None
        kwargs["on_delivery"] = functools.partial(self._reply_acked, query_id=record.query_id, late_us=teach,
                                                  resend=(topic, value, dict(kwargs)))
        try:
            self.reply_producer.produce(topic, value, **kwargs)
        except KafkaException as exc:  # a partition its topic does not have: nowhere to answer
            self._given_up(record.query_id, topic, value, str(exc))
            return
        if not self.reply_budget.adaptive:
            self.reply_producer.poll(0)
        self.stats["responses"] += 1
        self.metrics.answered(record)

    def _reply_acked(self, err: Any, msg: Any, *, query_id: str, late_us: int | None,
                     resend: tuple[str, bytes, dict[str, Any]], sends: int = 1) -> None:
        """Delivery report of a Response. Acknowledged: the query is answered, and its trip to
        the broker and back, from when the answer was due, feeds the budget (``latency()`` runs
        to now, so this must be served as the report arrives). Not taken: it is sent again, as
        its query counts as unanswered until a Response of it is taken; after ``REPLY_SENDS``
        refusals its topic is taken to be gone (a gateway that left), and it is given up."""
        if err is not None:
            topic, value, kwargs = resend
            if sends >= REPLY_SENDS:
                self._given_up(query_id, topic, value, str(err))
                return
            log.warning("the Response to %s was not delivered (%s); sending it again", query_id, err)
            try:
                self.reply_producer.produce(topic, value, on_delivery=functools.partial(
                    self._reply_acked, query_id=query_id, late_us=None, resend=resend, sends=sends + 1), **kwargs)
            except BufferError:  # left unanswered: replayed from Kafka after a restart or rebalance
                log.error("the Response to %s could not be queued again", query_id)
            except KafkaException as exc:
                self._given_up(query_id, topic, value, str(exc))
            return
        self.offsets.answered(query_id)
        if late_us is not None:
            self.reply_budget.observe(int(msg.latency() * 1e6) + late_us)

    def _given_up(self, query_id: str, topic: str, value: bytes, why: str) -> None:
        """A Response that cannot be delivered: a dead letter says so, and its query counts as
        answered, so that the commits of its partition move on past it."""
        log.error("the Response to %s could not be delivered to %s (%s): given up", query_id, topic, why)
        read_at = self.offsets.source(query_id)  # the query's own record, for whoever looks into it
        source = (self.catalogue.queries.name, *read_at) if read_at is not None else None
        self.dead.send(reason=f"the Response could not be delivered to {topic}: {why}", query_id=query_id,
                       payload=value, source=source)
        self.offsets.answered(query_id)
