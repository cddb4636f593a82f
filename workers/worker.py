"""One model replica = one process: consume its ``batches.<model>`` partition, predict, emit.

Under load the worker is a three-stage pipeline, so the device never waits for the CPU work
around it (Triton and TF-Serving overlap the same way): the main thread reads and checks the
next batch, a device thread runs ``predict_batch`` (ONNX Runtime, torch and the simulated
accelerator release the GIL while they compute), and an emitter thread shapes the outputs and
writes them out. A batch that finds both threads idle is served on the main thread instead,
with no hand-off to wake them; if the next batch arrives while it runs on the device, its
outputs go to the emitter and the pipeline takes over (docs/design/0050). Delivery stays
at-least-once: a batch's offset is committed only after the broker acknowledged every record
it produced (``workers.offsets``), so a worker killed mid-batch redoes that batch on restart
and the selector may see a duplicate, never a gap.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError
from clipstream.redisclient import RedisGuard, UnansweredWrites, sync_client
from clipstream.settings import Settings
from schemas import Batch, decode_as, encode
from topics.admin import ensure_model_topics, ensure_topics, learn_leaders, partition_count
from topics.catalogue import Catalogue
from topics.client import consumer_config
from topics.emitter import Emitter
from topics.markers import is_handover, is_retirement, ready_marker, sender_of
from topics.metrics import LAG, expose, serve_metrics
from topics.offsets import SpacedCommits, committed_offset
from topics.stage import IDLE_POLL_S, announce_ready, fail_if_fatal, heartbeat, stop_on_signals
from workers import group
from workers.backends import BatchModel
from workers.batch import BatchOutcome, Prepared, Ran, dead_letter
from workers.failures import ModelFailures
from workers.leaving import SendersLeft
from workers.loaded import LoadedWord, served_by
from workers.log import log
from workers.metrics import WorkerMetrics
from workers.offsets import OffsetTracker
from workers.outputs import Outputs
from workers.settings import WorkerSettings


class Worker(Outputs):
    """Serves ``model`` as replica ``replica`` of ``replicas``: one model, or a group of them
    (``workers.group``: then ``name`` and ``version`` are the group's)."""

    def __init__(
        self,
        settings: Settings,
        model: BatchModel | group.GroupModel,
        name: str,
        *,
        version: str | None = None,
        replica: int = 0,
        replicas: int = 1,
        worker_settings: WorkerSettings | None = None,
        own_version_only: bool = False,
        batches: bool = True,
    ) -> None:
        """``own_version_only``: serve only batches stamped with ``version`` (or with none), and
        stop once the batcher hands this replica's partition over to another version (a
        deployment, where ``version`` is known); off, a worker serves whatever it is sent."""
        self.settings, self.model, self.name, self.version = settings, model, name, version
        self.batches = batches  # its batches may hold several requests: tried on two at its start
        self.own_version_only = own_version_only and version is not None
        self.ready_us = 0  # when it could serve: a handover made before then is an old one
        self._skipping: set[str] = set()  # versions whose batches it has said it skips
        self._first: Message | None = None  # read while starting, fed first
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
        self.senders = SendersLeft()  # who must hand over before this worker leaves
        self.redis_guard = RedisGuard(lambda: self.redis.ping(), name=f"worker {name}.{replica}")
        self.metrics = WorkerMetrics(name, replica, version)
        self.failures = ModelFailures(replica)  # a failing model call's log line, rate limited
        self.word = LoadedWord(settings, served_by(name, version, model), replica)

    # -- life cycle ----------------------------------------------------------------
    def start(self) -> None:
        """Topics, warm model, assigned partition; then the one ``ready:`` line supervisors wait for."""
        ensure_model_topics(self.settings, self.name, self.replicas)
        ensure_topics(self.settings, [self.cat.predictions, self.cat.deadletter])
        self.selector_partitions = partition_count(self.settings, self.predictions_topic, self.ws.start_timeout_s)
        group.warm(self.model, batches=self.batches)
        self.producer = Emitter(self.settings, name=f"worker {self.name}.{self.replica}")
        self.consumer = Consumer(
            consumer_config(
                self.settings, self.group_id,
                **{"enable.auto.commit": False, "auto.offset.reset": "earliest", "on_commit": self._commit_done,
                   "enable.partition.eof": True, **LAG.config(self.group_id)},
            )
        )
        # resume from the group's committed offset, read by us (with retries) rather than by
        # librdkafka at assign time: on a fresh broker its one attempt can fail and stall the partition
        # (its committed offset, else the partition's start: ``topics.offsets.committed_offset``)
        tp = TopicPartition(self.batches_topic, self.replica)
        learn_leaders(self.consumer, [tp.topic])  # a first start begins at a logical offset
        self.consumer.assign([TopicPartition(tp.topic, tp.partition,
                                             committed_offset(self.consumer, tp, self.ws.start_timeout_s))])
        self._first = self._first_fetch(self.ws.start_timeout_s)
        # bounded waits, and no cache writes at all while Redis is away: the cache is an
        # optimisation, and a batch's answers must not wait on it
        self.redis = sync_client(self.settings)
        self.cache_writes = UnansweredWrites(self.settings)  # no reply to wait for on each batch
        self.ready_us = now_us()
        expose(self.metrics.registry)
        serve_metrics("worker")
        announce_ready("worker", f"{self.name} replica {self.replica} device {self.model.device}")
        self.word.say(self.cache_writes)
        if self.own_version_only:
            self._say_ready()

    def _say_ready(self) -> None:
        """Tell the batcher this version's replica is loaded and warm, so it may move the
        model's batches to it (``batchers.version``, docs/design/0021)."""
        marker = ready_marker(self.name, self.version or "", self.replica, self.worker_id, self.ready_us)
        self.producer.produce(self.stats_topic, value=encode(marker))
        if self.producer.flush(self.ws.start_timeout_s) > 0:
            raise ClipstreamError(f"the ready marker for {self.stats_topic} was not acknowledged within "
                                  f"{self.ws.start_timeout_s:.0f}s; is the broker reachable?")

    def _first_fetch(self, timeout_s: float) -> Message | None:
        """Wait for the consumer's first fetch: a batch, or word that the partition has no more.
        A new consumer fetches only a while after its assignment (up to a second on a busy
        machine), and a worker that said it was ready before then would leave the first batches
        of a version change waiting. Returns the batch read, to be fed first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.05)
            if msg is None:
                continue
            err = msg.error()
            return None if err is not None and err.code() == KafkaError._PARTITION_EOF else msg
        raise ClipstreamError(f"nothing fetched from {self.batches_topic} partition {self.replica} within "
                              f"{timeout_s:.0f}s of its assignment; is the broker reachable?")

    def _commit_done(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:  # the batch will be redone after a restart: a duplicate, not a loss
            log(f"offset commit failed: {err}")

    def stop(self, *_: Any) -> None:
        self.running = False

    def run(self) -> None:
        """Start, then serve until SIGTERM/SIGINT; batches already read are finished first."""
        stop_on_signals(self.stop)
        self.start()
        self.start_pipeline()
        try:
            msg = self._first
            while self.running:
                heartbeat("consume")  # proof of life for `up`: a wedged loop or device stops it
                if msg is None:
                    msg = self.consumer.poll(self.ws.poll_timeout_s)
                while msg is not None:  # a batch served on this thread may have read the next
                    msg = self.feed(msg)
                self.housekeep()
                self.failures.tick()
                if self.word.due():
                    self.word.say(self.cache_writes)
                if self.senders.since_us is not None:  # handed over by some batchers: the rest are waited for
                    self._maybe_stop(now_us())
        finally:
            self.stop_pipeline()
            self.consumer.close()
            self.word.say(self.cache_writes, loaded=False)  # a replica that stops no longer serves
            self.redis_guard.close()
            self.redis.close()
            self.cache_writes.close()

    # -- the pipeline -----------------------------------------------------------------
    def start_pipeline(self) -> None:
        # batches read and checked ahead of the device: one waits while one runs
        self._to_device: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, self.ws.prefetch_batches))
        self._to_emit: queue.Queue[Job | None] = queue.Queue()
        self.tracker = OffsetTracker()
        self.commits = SpacedCommits(self.batches_topic, self.replica)
        self._threads = [threading.Thread(target=self._device_loop, name="device", daemon=True),
                         threading.Thread(target=self._emit_loop, name="emitter", daemon=True)]
        for t in self._threads:
            t.start()

    def stop_pipeline(self) -> None:
        """Finish what was read, wait for the acks, commit, stop the threads."""
        self.drain(self.ws.flush_timeout_s)
        try:
            self._to_device.put(None, timeout=1.0)
        except queue.Full:  # the device is stuck in a model call: its thread is a daemon
            log("the device did not finish its batch; stopping without it")
        for t in self._threads:
            t.join(timeout=self.ws.flush_timeout_s)
        self.producer.flush(self.ws.flush_timeout_s)
        self.housekeep(asynchronous=False)
        self.failures.close()  # failures folded since their last line

    def drain(self, timeout_s: float) -> bool:
        """Wait until every batch read so far has been handed to the producer."""
        deadline = time.monotonic() + timeout_s
        for q in (self._to_device, self._to_emit):
            with q.all_tasks_done:
                if not q.all_tasks_done.wait_for(lambda q=q: q.unfinished_tasks == 0,  # type: ignore[misc]
                                                 max(0.0, deadline - time.monotonic())):
                    return False
        return True

    def feed(self, msg: Message) -> Message | None:
        """Main thread: decode and check one batch, then serve it here when the device and
        emitter threads are idle, else queue it for the device (blocking while the device is a
        batch behind, which is the backpressure on reading). Returns a message read meanwhile,
        to be fed next."""
        if msg.error() is not None:
            if msg.error().code() != KafkaError._PARTITION_EOF:
                log(f"consume error: {msg.error()}")
                fail_if_fatal(msg.error(), f"the consumer of {self.batches_topic}")
            return None
        source = (msg.topic(), msg.partition(), msg.offset())
        job = Job(msg.offset())
        try:
            batch = decode_as(Batch, msg.value())
            if self._not_ours(batch):
                job.outcome = BatchOutcome()  # nothing to do; its offset is committed in turn
            else:
                job.prepared = group.prepare(self.model, batch, version=self.version, received_us=now_us(),
                                             source=source, selector_partitions=self.selector_partitions,
                                             catalogue=self.cat)
        except ClipstreamError as exc:
            job.outcome = BatchOutcome(dead_letters=[
                dead_letter(f"undecodable batch: {exc}", source=source, payload=msg.value())])
        except Exception as exc:  # a bug must not turn one batch into a crash loop (poison pill)
            job.outcome = _crashed(exc, source, msg.value())
        job.source, job.payload = source, msg.value()
        self.tracker.begin(msg.offset())
        if self._to_device.unfinished_tasks == 0 and self._to_emit.unfinished_tasks == 0:
            return self._serve_here(job)  # only this thread adds work: idle stays idle meanwhile
        while True:
            try:
                self._to_device.put(job, timeout=0.1)
                return None
            except queue.Full:
                if self.housekeep():
                    return None  # recovered from a failed delivery: this batch is read again after the seek

    def _serve_here(self, job: Job) -> Message | None:
        """An idle worker's batch, on the main thread: no hand-off wakes the device and emitter
        threads. A batch that arrived while the device ran goes to the pipeline, and this one's
        outputs to the emitter, so the device does not wait for them."""
        if job.prepared is None:  # nothing to run: a handover, or a batch that failed its checks
            self._complete(job)
            return None
        job.ran = group.run(self.model, job.prepared)
        nxt = self.consumer.poll(0)
        if nxt is not None and nxt.error() is None:
            self._to_emit.put(job)
            return nxt
        self._complete(job)
        return nxt

    def _not_ours(self, batch: Batch) -> bool:
        """A batch with nothing for this worker: a handover (no items), or, when it serves only
        its own version, one stamped with another. A handover to another version, or one that
        retires this replica, made since this worker was ready means no batch for it follows
        from that batcher: it stops once every batcher that sent to it lately has said so
        (``workers.leaving``), after the batches read."""
        foreign = self.own_version_only and batch.version is not None and batch.version != self.version
        sender, now = sender_of(batch.batch_id), now_us()
        if is_handover(batch):
            if (foreign or is_retirement(batch)) and batch.created_us >= self.ready_us and self.running:
                first = self.senders.since_us is None
                self.senders.handed_over(sender, now)
                if first:
                    why = ("the registry removed this replica" if is_retirement(batch)
                           else f"the batcher moved to version {batch.version}")
                    log(f"{self.name} replica {self.replica}: {why}; version {self.version} stops once its "
                        "batches are done" + self._others())
                self._maybe_stop(now)
            return True
        self.senders.sent(sender, now)
        if foreign and batch.version not in self._skipping:
            self._skipping.add(batch.version)  # type: ignore[arg-type]
            log(f"skipping batches of version {batch.version} (this worker serves version {self.version})")
        return foreign

    def _others(self) -> str:
        left = self.senders.waiting_for()
        return f" and {len(left)} more batcher(s) hand over" if left else ""

    def _maybe_stop(self, now: int) -> None:
        if self.running and self.senders.may_stop(now):
            left = self.senders.waiting_for()
            if left:  # a member that died before it handed over: waited for as long as it may be
                log(f"{self.name} replica {self.replica}: stopping without a handover from {len(left)} batcher(s)")
            self.running = False

    def _device_loop(self) -> None:
        while True:
            job = self._to_device.get()
            if job is not None and job.prepared is not None:
                job.ran = group.run(self.model, job.prepared)
            self._to_emit.put(job)
            self._to_device.task_done()
            if job is None:
                return

    def _emit_loop(self) -> None:
        while True:
            try:
                # while acks are pending, their reports are served between jobs; with none
                # pending there is nothing to serve until the next job
                job = self._to_emit.get(timeout=0.05 if self.producer.pending() else IDLE_POLL_S)
            except queue.Empty:
                self.producer.poll(0)  # delivery reports while idle
                continue
            if job is None:
                self._to_emit.task_done()
                return
            self._complete(job)
            self._to_emit.task_done()

    def _complete(self, job: Job) -> None:
        """Shape a batch's outputs and write them out (the emitter's part)."""
        try:
            outcome = job.outcome
            if outcome is None and job.prepared is not None:
                outcome = group.finish(job.prepared, job.ran, worker_id=self.worker_id, failures=self.failures)
        except Exception as exc:
            outcome = _crashed(exc, job.source, job.payload)
        self.emit(outcome or BatchOutcome(), job.offset)
        self.producer.poll(0)

    def housekeep(self, asynchronous: bool = True) -> bool:
        """Main thread: commit what the broker has acknowledged; redo from the oldest open batch
        when a delivery failed for good (the broker is in trouble: duplicates, not gaps)."""
        if self.tracker.failure is not None:
            log(f"outputs not delivered ({self.tracker.failure}); redoing from the oldest unacknowledged batch")
            self.drain(self.ws.flush_timeout_s)
            self.producer.flush(self.ws.flush_timeout_s)
            resume = self.tracker.first_open()
            self.tracker.reset()
            if resume is not None:
                time.sleep(1.0)  # do not spin against a failing broker
                self.consumer.seek(TopicPartition(self.batches_topic, self.replica, resume))
            return True
        # at most one commit per interval, and the last one when stopping (``SpacedCommits``)
        self.commits.offer(self.tracker.take_committable())
        self.commits.commit(self.consumer, self.ws.commit_interval_s, asynchronous)
        return False


@dataclass
class Job:
    """One batch on its way through the pipeline."""

    offset: int
    prepared: Prepared | None = None
    ran: Ran | group.GroupRan | None = None
    outcome: BatchOutcome | None = None  # set instead of ``prepared`` for a batch that cannot run
    source: tuple[str, int, int] | None = None
    payload: bytes | None = None


def _crashed(exc: Exception, source: tuple[str, int, int] | None, payload: bytes | None) -> BatchOutcome:
    log(f"batch at offset {source[2] if source else '?'} failed: {type(exc).__name__}: {exc}")
    return BatchOutcome(dead_letters=[dead_letter(f"worker failed on this batch: {type(exc).__name__}: {exc}",
                                                  source=source, payload=payload)])
