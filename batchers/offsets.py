"""What a batcher member may commit, and what it resumes when partitions move (docs/design/0024).

A member stores a ``requests.<model>`` offset only once every request at or below it is done:
its batch, or its prediction (cached, expired, failed), or its dead letter was acknowledged
by the broker. A member killed with requests queued leaves its committed offset before the
first one it had not done, so the member that takes the partition over reads them again and
serves them; the selector's join counts a second prediction of a query as a duplicate, and a
prediction for a query already answered as late, so a replay never answers a query twice.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from topics.offsets import finished_prefix, pin_and_assign

log = logging.getLogger("clipstream.batcher")

Part = tuple[str, int]  # (topic, partition)
Where = tuple[str, int, int]  # (topic, partition, offset)


class RequestOffsets:
    """Per owned partition: the offsets read and not yet done, and how far a commit may go.

    ``read`` and ``done`` run on the event loop; the rebalance callbacks (where the consumer
    is polled: the loop, or the intake's thread) change what is owned, hence the lock. Offsets
    are read in increasing order per partition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[Part, OrderedDict[int, bool]] = {}  # offset -> done
        self._next: dict[Part, int] = {}  # one past the last offset read
        self._storable: dict[Part, int] = {}  # offset to store, moved since ``take``
        self._parts: dict[Where, int] = {}  # parts still open of a record that serves several
        self.owned: set[Part] = set()

    def read(self, where: Where) -> None:
        """A request was read (and handed to the loop)."""
        part, offset = (where[0], where[1]), where[2]
        with self._lock:
            if part not in self.owned or offset < self._next.get(part, 0):
                return  # a partition given up meanwhile (its new owner commits), or read before
            self._next[part] = offset + 1
            self._open.setdefault(part, OrderedDict())[offset] = False

    def more(self, where: Where, parts: int) -> None:
        """The record at ``where`` asks ``parts`` more models (an ensemble's request record,
        docs/design/0082): it is done once each of its parts is."""
        if parts <= 0:
            return
        with self._lock:
            part = self._open.get((where[0], where[1]))
            if part is not None and where[2] in part:
                self._parts[where] = self._parts.get(where, 1) + parts

    def done(self, wheres: Iterable[Where | None]) -> None:
        """These requests were served: the broker took what answers them."""
        with self._lock:
            for where in wheres:
                if where is None:
                    continue
                left = self._parts.pop(where, 1) - 1
                if left > 0:  # another part of the same record is still open
                    self._parts[where] = left
                    continue
                part = self._open.get((where[0], where[1]))
                if part is not None and where[2] in part:
                    part[where[2]] = True
                    self._advance((where[0], where[1]), part)

    def _advance(self, key: Part, part: OrderedDict[int, bool]) -> None:
        moved = finished_prefix(part)
        if moved is not None:
            self._storable[key] = moved

    def take(self) -> list[TopicPartition]:
        """The offsets to store, of owned partitions whose offset moved since the last call."""
        with self._lock:
            out, self._storable = self._storable, {}
            return [TopicPartition(t, p, o) for (t, p), o in out.items() if (t, p) in self.owned]

    def waiting(self) -> int:
        """Requests read and not yet done."""
        with self._lock:
            return sum(1 for part in self._open.values() for finished in part.values() if not finished)

    def position(self, part: Part) -> int | None:
        with self._lock:
            return self._next.get(part)

    def own(self, parts: set[Part]) -> None:
        """The partitions now owned; what was read from the others is theirs to commit."""
        with self._lock:
            for gone in set(self._next) - parts:
                self._open.pop(gone, None)
                self._next.pop(gone, None)
                self._storable.pop(gone, None)
                for where in [w for w in self._parts if (w[0], w[1]) == gone]:
                    del self._parts[where]
            self.owned = set(parts)


class RequestHandover:
    """The request consumer's rebalance callbacks (``topics.intake.Rebalance``).

    The range assignor (eager) takes every partition back at a rebalance and gives most of
    them straight back: a revoke commits what is done; a partition that comes back resumes
    where this member was reading (its requests are still queued here), one new to it starts
    at the group's committed offset. ``on_owned`` hears the new assignment (for the credit
    share), where the consumer is polled. A partition the group never committed (a group new
    with its set of models) starts at its first request since ``since_ms``: the selector may
    have sent this model requests before this process started, and their callers wait."""

    def __init__(self, offsets: RequestOffsets, on_owned: Callable[[set[Part]], None] = lambda _: None,
                 since_ms: int | None = None) -> None:
        self.offsets, self.on_owned, self.since_ms = offsets, on_owned, since_ms

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        mine = {(tp.topic, tp.partition) for tp in partitions}
        resume, fresh = [], []
        for tp in partitions:
            at = self.offsets.position((tp.topic, tp.partition))
            if at is None:
                fresh.append(tp)
            else:
                resume.append(TopicPartition(tp.topic, tp.partition, at))
        self.offsets.own(mine)
        pin_and_assign(consumer, fresh, also=resume, since_ms=self.since_ms)
        self.on_owned(mine)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what is done before the partitions can move."""
        stored = self.offsets.take()
        try:
            if stored:
                consumer.store_offsets(offsets=stored)
            consumer.commit(asynchronous=False)
        except KafkaException as exc:  # nothing stored since the last commit, or the group moved on
            log.info("commit on revoke: %s", exc)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Dropped from the group: another member owns the partitions and replays them."""
        lost = {(tp.topic, tp.partition) for tp in partitions}
        self.offsets.own(self.offsets.owned - lost)
        self.on_owned(self.offsets.owned)
