"""Several models' replicas in one worker process, as Triton and MLServer host many models.

Each model keeps its own lane: its ``batches.<model>`` partition, its three-stage pipeline,
its offsets and its reports, exactly as a worker of its own would (``workers.worker``). What
the lanes share is what costs CPU on every batch whatever the model: one consumer, whose one
fetch brings the batches of every model that a query of an ensemble asked at once; one
producer, whose predictions for one query's models leave in one request; one Redis client;
and one process to wake. A model that crashes the process takes its neighbours with it: the
price of the layout, as in a Triton server (docs/design/0084).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from clipstream.errors import ClipstreamError
from clipstream.redisclient import UnansweredWrites, sync_client
from clipstream.settings import Settings
from topics.admin import learn_leaders
from topics.client import consumer_config
from topics.emitter import Emitter
from topics.metrics import expose, serve_metrics
from topics.offsets import committed_offset
from topics.stage import announce_ready, heartbeat, stop_on_signals
from workers.settings import WorkerSettings
from workers.worker import Worker, consumer_options


def log(msg: str) -> None:
    print(f"worker host: {msg}", file=sys.stderr, flush=True)


class WorkerHost:
    """Serves each of ``lanes`` (workers of different models, one replica each) in this process."""

    def __init__(self, settings: Settings, lanes: Sequence[Worker], worker_settings: WorkerSettings | None = None) -> None:
        if len({lane.batches_topic for lane in lanes}) != len(lanes):
            raise ClipstreamError("a worker host serves each model once")
        self.settings, self.ws = settings, worker_settings or WorkerSettings()
        self.lanes = {lane.batches_topic: lane for lane in lanes}
        self.running = True
        # commits go under each model's own group, as its own worker's would; this group only reads
        self.group_id = f"{settings.topic_prefix}worker-host.{'+'.join(sorted(l.name for l in lanes))}"

    def stop(self, *_: object) -> None:
        self.running = False

    def start(self) -> None:
        for lane in self.lanes.values():
            lane.prepare()
        self.producer = Emitter(self.settings, name="worker host")
        self.consumer = Consumer(consumer_config(self.settings, self.group_id, **consumer_options(self.group_id)))
        learn_leaders(self.consumer, list(self.lanes))
        starts = []
        for lane in self.lanes.values():
            lane.producer, lane.consumer = self.producer, self.consumer
            lane.commit_via = Consumer(consumer_config(self.settings, lane.group_id, **consumer_options(lane.group_id)))
            tp = lane.partition()
            starts.append(TopicPartition(tp.topic, tp.partition,
                                         committed_offset(lane.commit_via, tp, self.ws.start_timeout_s)))
        self.consumer.assign(starts)
        self._first = self._first_fetch(self.ws.start_timeout_s)
        self.redis, self.cache_writes = sync_client(self.settings), UnansweredWrites(self.settings)
        for lane in self.lanes.values():
            lane.attach(self.redis, self.cache_writes)
            expose(lane.metrics.registry)
        serve_metrics("worker")
        announce_ready("worker", " ".join(f"{l.name} replica {l.replica} device {l.model.device}"
                                          for l in self.lanes.values()))
        for lane in self.lanes.values():
            lane.announce_version()

    def _first_fetch(self, timeout_s: float) -> list[Message]:
        """Wait until every lane's partition was fetched once (``Worker._first_fetch``'s reason):
        the batches read meanwhile, to be fed first."""
        waiting, read = set(self.lanes), []
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            msg = self.consumer.poll(0.05)
            if msg is None:
                continue
            waiting.discard(msg.topic())
            err = msg.error()
            if err is None or err.code() != KafkaError._PARTITION_EOF:
                read.append(msg)
        if waiting:
            raise ClipstreamError(f"nothing fetched from {sorted(waiting)} within {timeout_s:.0f}s of their "
                                  f"assignment; is the broker reachable?")
        return read

    def run(self) -> None:
        """Start, then serve until SIGTERM/SIGINT, or until the batcher hands one of the models
        over to another version: ``up`` then runs a host with that version beside this one, and
        this host, which served the old version until then, leaves (docs/design/0084)."""
        stop_on_signals(self.stop)
        self.start()
        for lane in self.lanes.values():
            lane.start_pipeline()
        try:
            for msg in self._first:
                self._feed(msg)
            while self.running:
                heartbeat("consume")
                self._feed(self.consumer.poll(self.ws.poll_timeout_s))
                for lane in self.lanes.values():
                    lane.housekeep()
                    if not lane.running:
                        log(f"{lane.name} moved to another version; this host leaves once its batches are done")
                        self.running = False
        finally:
            for lane in self.lanes.values():
                lane.stop_pipeline()
                assert lane.commit_via is not None
                lane.commit_via.close()
                lane.redis_guard.close()
            self.consumer.close()
            self.redis.close()
            self.cache_writes.close()

    def _feed(self, msg: Message | None) -> None:
        while msg is not None:  # a batch served on this thread may have read the next
            lane = self.lanes.get(msg.topic())
            if lane is None:
                return
            msg = lane.feed(msg)
