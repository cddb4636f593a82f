"""One model replica = one process: consume its ``batches.<model>`` partition, predict, emit.

The loop is a thin Kafka/Redis adapter around ``workers.batch.handle_batch``. Delivery is
at-least-once: a batch's offset is committed only after the broker acknowledged every record
it produced (Predictions, BatchStats, dead letters), so a worker killed mid-batch redoes that
batch on restart and the selector may see a duplicate, never a gap.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any

import redis
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from clipstream.errors import ClipstreamError, InfraError
from clipstream.settings import Settings
from schemas import decode_as, encode
from topics.admin import ensure_model_topics, ensure_topics
from topics.catalogue import Catalogue
from topics.client import consumer_config, producer_config
from workers.backends import BatchModel, warm_up
from workers.batch import BatchOutcome, dead_letter, handle_batch
from workers.settings import WorkerSettings


def log(msg: str) -> None:
    print(f"worker: {msg}", file=sys.stderr, flush=True)


class Worker:
    """Serves ``model`` as replica ``replica`` of ``replicas``."""

    def __init__(
        self,
        settings: Settings,
        model: BatchModel,
        name: str,
        *,
        version: str | None = None,
        replica: int = 0,
        replicas: int = 1,
        worker_settings: WorkerSettings | None = None,
    ) -> None:
        self.settings, self.model, self.name, self.version = settings, model, name, version
        self.replica, self.replicas = replica, max(replicas, replica + 1)
        self.ws = worker_settings or WorkerSettings()
        self.cat = cat = Catalogue.from_settings(settings)
        self.selector_partitions: int | None = None
        self.batches_topic = cat.batches(name, self.replicas).name
        self.predictions_topic = cat.predictions.name
        self.stats_topic = cat.batch_stats(name).name
        self.deadletter_topic = cat.deadletter.name
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{name}.{replica}"
        self.group_id = f"{settings.topic_prefix}worker.{name}.{replica}"
        self.running = True
        self._failed: list[str] = []

    # -- life cycle ----------------------------------------------------------------
    def start(self) -> None:
        """Topics, warm model, assigned partition; then the one ``ready:`` line supervisors wait for."""
        ensure_model_topics(self.settings, self.name, self.replicas)
        ensure_topics(self.settings, [self.cat.predictions, self.cat.deadletter])
        self.selector_partitions = self._partitions(self.predictions_topic)
        warm_up(self.model)
        self.producer = Producer(producer_config(self.settings))
        self.consumer = Consumer(
            consumer_config(
                self.settings, self.group_id,
                **{"enable.auto.commit": False, "auto.offset.reset": "earliest", "on_commit": self._commit_done},
            )
        )
        # resume from the group's committed offset, read by us (with retries) rather than by
        # librdkafka at assign time: on a fresh broker its one attempt can fail and stall the partition
        self.consumer.assign([TopicPartition(self.batches_topic, self.replica, self._committed_offset())])
        self.redis = redis.Redis.from_url(self.settings.redis_url)
        print(f"ready: worker {self.name} replica {self.replica} device {self.model.device}", flush=True)

    def _committed_offset(self) -> int:
        """Where this replica resumes: its group's committed offset, else the partition's start.

        On a fresh broker the offsets topic is still being created (NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS): those are retried until ``start_timeout_s``.
        """
        deadline = time.monotonic() + self.ws.start_timeout_s
        while True:
            try:
                (tp,) = self.consumer.committed([TopicPartition(self.batches_topic, self.replica)], timeout=5.0)
                if tp.error is None:
                    return tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                error: Any = tp.error
            except KafkaException as exc:
                error = exc
            if time.monotonic() > deadline:
                raise InfraError(f"cannot read the committed offset of {self.batches_topic}[{self.replica}]: {error}")
            time.sleep(0.2)

    def _commit_done(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:  # the batch will be redone after a restart: a duplicate, not a loss
            log(f"offset commit failed: {err}")

    def _partitions(self, topic: str) -> int | None:
        """Partitions the broker has for ``topic`` (the selector's parallelism), None if unknown."""
        from confluent_kafka.admin import AdminClient

        from topics.client import admin_config

        meta = AdminClient(admin_config(self.settings)).list_topics(topic, timeout=self.ws.start_timeout_s)
        found = meta.topics.get(topic)
        return len(found.partitions) if found is not None and found.error is None else None

    def stop(self, *_: Any) -> None:
        self.running = False

    def run(self) -> None:
        """Start, then serve until SIGTERM/SIGINT; the last batch's outputs are flushed first."""
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self.start()
        try:
            while self.running:
                # consume(n, timeout) would wait for n messages or the whole timeout: wait for the
                # first batch only, then take whatever else is already there without waiting
                first = self.consumer.poll(self.ws.poll_timeout_s)
                if first is None:
                    continue
                more = self.consumer.consume(self.ws.max_batches_per_poll - 1, 0) if self.ws.max_batches_per_poll > 1 else []
                self.serve([first, *more])
        finally:
            self.producer.flush(self.ws.flush_timeout_s)
            self.consumer.close()
            self.redis.close()

    # -- one poll's worth of batches ------------------------------------------------
    def serve(self, msgs: list[Message]) -> None:
        """Handle each batch, wait for the broker's acks, then commit past the last one."""
        first: int | None = None
        last: int | None = None
        for msg in msgs:
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log(f"consume error: {msg.error()}")
                continue
            first = msg.offset() if first is None else first
            last = msg.offset()
            try:
                self.handle(msg)
            except Exception as exc:  # a bug must not turn one batch into a crash loop (poison pill)
                log(f"batch at offset {msg.offset()} failed: {type(exc).__name__}: {exc}")
                self.produce(self.deadletter_topic, None, "DeadLetter", dead_letter(
                    f"worker failed on this batch: {type(exc).__name__}: {exc}",
                    source=(msg.topic(), msg.partition(), msg.offset()), payload=msg.value()))
            self.producer.poll(0)
        if last is None:
            return
        left = self.producer.flush(self.ws.flush_timeout_s)
        if left or self._failed:
            log(f"outputs not delivered ({left} pending, {self._failed[:1]}); redoing from offset {first}")
            self._failed.clear()
            time.sleep(1.0)  # the broker is in trouble: do not spin
            self.consumer.seek(TopicPartition(self.batches_topic, self.replica, first))
            return
        self.consumer.commit(offsets=[TopicPartition(self.batches_topic, self.replica, last + 1)], asynchronous=True)

    def handle(self, msg: Message) -> None:
        source = (msg.topic(), msg.partition(), msg.offset())
        received_us = time.time_ns() // 1000
        try:
            batch = decode_as("Batch", msg.value())
        except ClipstreamError as exc:
            self.produce(self.deadletter_topic, None, "DeadLetter",
                         dead_letter(f"undecodable batch: {exc}", source=source, payload=msg.value()))
            return
        outcome = handle_batch(
            self.model, batch, worker_id=self.worker_id, version=self.version,
            received_us=received_us, source=source, selector_partitions=self.selector_partitions,
        )
        self.emit(outcome)

    def emit(self, outcome: BatchOutcome) -> None:
        """Predictions first (the caller is waiting), then the cache, stats and dead letters."""
        for partition, record in outcome.predictions_records():
            self.produce(self.predictions_topic, partition, "Predictions", record)
        if outcome.cache:
            try:
                pipe = self.redis.pipeline(transaction=False)
                for key, value in outcome.cache:
                    pipe.set(key, value, ex=self.settings.cache_ttl_s)
                pipe.execute()
            except redis.RedisError as exc:  # the cache is an optimisation: keep serving
                log(f"cache fill failed: {exc}")
        if outcome.stats is not None:
            self.produce(self.stats_topic, None, "BatchStats", outcome.stats)
        for record in outcome.dead_letters:
            self.produce(self.deadletter_topic, None, "DeadLetter", record)

    def produce(self, topic: str, partition: int | None, name: str, record: dict[str, Any]) -> None:
        kwargs: dict[str, Any] = {"value": encode(name, record), "on_delivery": self._delivered}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let librdkafka drain it
                self.producer.poll(0.05)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failed.append(f"{msg.topic()}: {err}")
