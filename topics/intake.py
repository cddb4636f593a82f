"""The way in for an asyncio stage: a librdkafka consumer whose fetches reach the event loop.

The loop itself polls the consumer, with no wait, whenever librdkafka's queue wakes it through
a pipe (``topics.wakeup``): a fetch then costs the process one wake-up. Where that pipe cannot
be had (or ``CLIPSTREAM_KAFKA_LOOP_WAKEUP=false``), a thread blocks in ``poll`` and hands each
fetch to the loop with one ``call_soon_threadsafe`` (docs/design/0053). Either way a
confluent-kafka consumer costs a fraction of the CPU per record of a stream framework's
per-event path (faust on aiokafka: an Event with acks and sensors per record), with lower
latency too (docs/design/0009-batcher-intake-on-librdkafka.md). One intake may read several
topics: one fetch then brings every topic's records and wakes the process once; each record
carries its topic. Conversions, rebalance callbacks and ``on_ready`` run where the polling
runs: on the loop, or on the thread.

Two ways to get partitions:

- ``group_id`` with subscribe (the default): start offsets are pinned at assignment
  (``topics.offsets.pin_and_assign``); a record's offset is stored when it is handed to the
  loop and auto-commit sends it, so a record queued in a process that dies is not replayed.
- ``assign=[TopicPartition, ...]``: those partitions directly, from their end now, no group
  and no commits (a gateway's own reply topic: no rebalance ever delays a reply).
- ``rebalance=``: the caller's own rebalance callbacks (``Rebalance``) with subscribe; with
  ``enable.auto.offset.store`` off, the caller stores what it has done (``store``), so a record
  read and not yet done is read again by the member that takes its partition over.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from clipstream.errors import DecodeError
from clipstream.settings import Settings
from topics.client import consumer_config
from topics.deadletters import Source
from topics.offsets import assign_at_end, pin_and_assign
from topics.stage import IDLE_POLL_S, fail_if_fatal
from topics.wakeup import QueueWakeup, attach

log = logging.getLogger("clipstream.topics")

Record = tuple[bytes | None, Source]  # value, where it came from


class Rebalance(Protocol):
    """Rebalance callbacks (run on the consumer thread, inside its poll); ``on_assign`` assigns."""

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None: ...


def raw_record(msg: Message) -> Record:
    """The default conversion: the value and where it came from."""
    return msg.value(), (msg.topic(), msg.partition(), msg.offset())


class Intake:
    """Hands each fetched group of records to ``deliver`` in one call on the loop thread.

    ``convert`` turns each message into what ``deliver`` gets, where the consumer is polled (a
    ``DecodeError`` there drops the record with a warning); ``on_ready`` is called there once
    every topic has partitions and start offsets (``ready`` is set then too).
    ``fetch_max_wait_ms`` bounds an idle fetch (None: ``topics.client``'s default);
    ``loop_wakeup`` (None: ``CLIPSTREAM_KAFKA_LOOP_WAKEUP``) lets the loop poll the consumer
    itself when librdkafka's queue can wake it; ``overrides`` are more consumer settings.
    """

    def __init__(self, settings: Settings, topics: str | list[str], group_id: str,
                 deliver: Callable[[list[Any]], None], *, max_group: int = 1000,
                 fetch_max_wait_ms: int | None = None, convert: Callable[[Message], Any] = raw_record,
                 assign: list[TopicPartition] | None = None, on_ready: Callable[[], None] | None = None,
                 name: str | None = None, rebalance: Rebalance | None = None,
                 on_undecodable: Callable[[Message, Exception], None] | None = None,
                 loop_wakeup: bool | None = None, **overrides: Any) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.topic = ",".join(self.topics)  # for log lines
        self._deliver, self._convert, self._on_ready = deliver, convert, on_ready
        self._max_group = max_group
        self._assign = assign
        self._rebalance = rebalance
        self._on_undecodable = on_undecodable  # on the consumer thread: a dead letter, say
        if fetch_max_wait_ms is not None:
            overrides["fetch.wait.max.ms"] = fetch_max_wait_ms
        if assign is not None:
            overrides.setdefault("enable.auto.commit", False)
        conf = consumer_config(settings, group_id, **overrides)
        self._consumer = Consumer(conf)
        self._client_id = str(conf.get("client.id", "rdkafka"))  # librdkafka's default
        self._loop_wakeup = settings.kafka_loop_wakeup if loop_wakeup is None else loop_wakeup
        self._wakeup: QueueWakeup | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._name = name or f"intake-{self.topics[0]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()  # partitions assigned and start offsets fixed
        self._store_lock = threading.Lock()
        self._to_store: list[TopicPartition] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Subscribe (or assign, blocking: InfraError if the broker cannot say where the
        partitions end) and start the thread."""
        self._loop = loop
        if self._rebalance is not None:
            self._consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._rebalance.on_revoke,
                                     on_lost=self._rebalance.on_lost)
        elif self._assign is None:
            self._consumer.subscribe(self.topics, on_assign=self._on_assign)
        else:
            assign_at_end(self._consumer, self._assign)
            self._set_ready()
        self._wakeup = attach(self._consumer, self._client_id) if self._loop_wakeup else None
        if self._wakeup is not None:
            loop.call_soon_threadsafe(self._watch)  # start may run off the loop's thread
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    @property
    def on_loop(self) -> bool:
        """True when the loop polls the consumer (no thread of its own)."""
        return self._wakeup is not None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._wakeup is not None:
            self._unwatch_from_any_thread()
            self._wakeup.close()
            self._wakeup = None
        try:
            self._consumer.close()  # commits the stored offsets and leaves the group
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer of %s: %s", self.topic, exc)

    def store(self, offsets: list[TopicPartition]) -> None:
        """Offsets to store for the next commit, from any thread: the consumer thread stores
        them before its next poll (a store from another thread waits for that poll to end)."""
        with self._store_lock:
            self._to_store += offsets

    def _store(self, consumer: Consumer) -> None:
        with self._store_lock:
            offsets, self._to_store = self._to_store, []
        try:
            consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:  # a partition no longer owned: its new owner commits
            log.info("%s: offsets %s not stored: %s", self.topic, offsets, exc)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._rebalance is not None:
            self._rebalance.on_assign(consumer, partitions)
        else:
            pin_and_assign(consumer, partitions)
        if {tp.topic for tp in partitions} >= set(self.topics):
            self._set_ready()

    def _set_ready(self) -> None:
        if not self.ready.is_set():
            self.ready.set()
            if self._on_ready is not None:
                self._on_ready()

    # -- polled on the loop ----------------------------------------------------------------------
    def _watch(self) -> None:
        assert self._loop is not None and self._wakeup is not None
        if self._stop.is_set():
            return
        self._loop.add_reader(self._wakeup.fd, self._serve)
        self._idle_poll()  # what came before the pipe was watched, and a poll every IDLE_POLL_S

    def _idle_poll(self) -> None:
        """librdkafka wants a consumer polled now and then even with nothing queued (a group
        member that is not polled leaves after ``max.poll.interval.ms``)."""
        assert self._loop is not None
        try:
            self._serve()
        finally:  # a ``deliver`` that raised must not end the polls
            if not self._stop.is_set():
                self._tick = self._loop.call_later(IDLE_POLL_S, self._idle_poll)

    def _serve(self) -> None:
        """Everything queued, without waiting; librdkafka writes to the pipe again only once its
        queue has been served."""
        if self._stop.is_set() or self._wakeup is None:
            return
        self._wakeup.drain()
        if self._to_store:
            self._store(self._consumer)
        msgs = self._consumer.consume(self._max_group, timeout=0)
        if len(msgs) == self._max_group:
            assert self._loop is not None
            self._loop.call_soon(self._serve)  # more than one group's worth was queued
        group = self._convert_all(msgs)
        if group:
            self._deliver(group)  # what it raises goes to the loop's handler, as a callback's

    def _unwatch(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self._wakeup is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._wakeup.fd)

    def _unwatch_from_any_thread(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running() or _on_thread_of(loop):
            self._unwatch()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        loop.call_soon_threadsafe(lambda: (self._unwatch(), done.set_result(None)))
        try:
            done.result(timeout=5)
        except concurrent.futures.TimeoutError:
            log.warning("%s: the loop did not stop watching the consumer's pipe", self.topic)

    # -- polled on a thread of its own -----------------------------------------------------------
    def _run(self) -> None:
        consumer, loop, deliver = self._consumer, self._loop, self._deliver
        assert loop is not None
        while not self._stop.is_set():
            if self._to_store:
                self._store(consumer)
            first = consumer.poll(IDLE_POLL_S)  # returns as soon as one record is there
            if first is None:
                continue
            group = self._convert_all([first, *consumer.consume(self._max_group, timeout=0)])
            if group:
                try:
                    loop.call_soon_threadsafe(deliver, group)
                except RuntimeError:  # the loop closed under us: shutting down
                    return

    def _convert_all(self, msgs: list[Message]) -> list[Any]:
        """The records ``deliver`` gets: errors logged (a fatal one stops the stage), EOF
        markers skipped, undecodable records reported and dropped."""
        convert = self._convert
        group: list[Any] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("%s: consumer error: %s", self.topic, err)
                    fail_if_fatal(err, f"the consumer of {self.topic}")
                continue
            try:
                group.append(convert(msg))
            except DecodeError as exc:
                log.warning("undecodable record %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), exc)
                if self._on_undecodable is not None:
                    try:
                        self._on_undecodable(msg, exc)
                    except Exception:  # a report of a bad record must not stop the intake
                        log.exception("reporting the undecodable record at %s failed", msg.offset())
        return group


def _on_thread_of(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
