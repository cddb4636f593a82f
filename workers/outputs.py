"""What a worker writes for a batch, and when the broker has taken it: a batch's offset may be
committed only once every record it produced is acknowledged (``workers.offsets``)."""

from __future__ import annotations

import functools
from typing import Any

import redis
from confluent_kafka import KafkaException

from clipstream.redisclient import REDIS_AWAY, RedisGuard, UnansweredWrites
from clipstream.settings import Settings
from schemas import encode
from topics.emitter import Emitter
from topics.sizes import fitted, too_large
from workers.batch import BatchOutcome
from workers.log import log
from workers.metrics import WorkerMetrics
from workers.offsets import OffsetTracker


class Outputs:
    """The writing half of ``Worker``, which sets these attributes."""

    settings: Settings
    producer: Emitter
    tracker: OffsetTracker
    metrics: WorkerMetrics
    redis_guard: RedisGuard
    cache_writes: UnansweredWrites
    predictions_topic: str
    stats_topic: str
    deadletter_topic: str

    def emit(self, outcome: BatchOutcome, offset: int) -> None:
        """Predictions first (the caller is waiting), then the cache, stats and dead letters."""
        records: list[tuple[str, int | None, bytes]] = [
            (topic or self.predictions_topic, partition, value)
            for topic, partition, record in outcome.predictions_records()
            for value in fitted(record, self.settings.max_record_bytes)]
        if outcome.stats is not None:
            records.append((self.stats_topic, None, encode(outcome.stats)))
            self.metrics.batch(outcome.stats)
        records += [(self.deadletter_topic, None, encode(r)) for r in outcome.dead_letters]
        # counted before the first produce, so an early ack cannot close the batch too soon
        self.tracker.produced(offset, len(records))
        for topic, partition, value in records[:1]:
            self.produce(topic, partition, value, offset)
        if outcome.cache and self.redis_guard.available():
            try:
                ttl = self.settings.cache_ttl_s
                self.cache_writes.send([("SET", key, value, "EX", ttl) for key, value in outcome.cache])
            except (redis.RedisError, *REDIS_AWAY) as exc:  # the cache is an optimisation: keep serving
                if isinstance(exc, REDIS_AWAY):
                    self.redis_guard.failed(exc)
                log(f"cache fill failed: {exc}")
        for topic, partition, value in records[1:]:
            self.produce(topic, partition, value, offset)

    def produce(self, topic: str, partition: int | None, value: bytes, offset: int) -> None:
        kwargs: dict[str, Any] = {"value": value, "on_delivery": functools.partial(
            self._acked, offset, topic not in (self.predictions_topic, self.stats_topic, self.deadletter_topic))}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let librdkafka drain it
                self.producer.poll(0.05)
            except KafkaException as exc:
                if not too_large(exc):
                    raise
                # a record no retry could send (a dead letter carrying a whole batch, say): it
                # is not held against the batch's offset, which a redo would only refuse again
                log(f"a record of {len(value)} bytes for {topic} is over the producer's limit; not sent")
                self.tracker.acked(offset, None)
                return

    def _acked(self, offset: int, to_caller: bool, err: Any, msg: Any) -> None:
        """A record of the batch at ``offset`` was taken, or not. Predictions sent straight to
        a gateway's reply topic are the caller's alone: one that is refused (the gateway went,
        and its topic with it) is logged, not redone, as no redo could reach that caller."""
        if err is not None and to_caller:
            log(f"predictions for {msg.topic()} not delivered ({err}); that caller gets its default")
            err = None
        self.tracker.acked(offset, None if err is None else f"{msg.topic()}: {err}")
