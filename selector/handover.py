"""What a selector member may commit, and what it hands over when its partitions move.

Every query gets exactly one Response at its reader, even when members die or join: the
selector stores a ``queries`` offset only once every query at or below it has been answered
and the broker has acknowledged the Response (``enable.auto.offset.store`` off, the stored
offsets auto-committed). A member killed with queries in flight leaves its committed offset
before the first one it had not answered, so the member that takes the partition over reads
them again and answers them there; readers drop the second Response of a query that was
answered but not yet committed (docs/design/0018).

``predictions`` offsets are stored as they are read: a prediction for a query the new owner
replays is asked for again at its dispatch.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from topics.offsets import finished_prefix, pin_and_assign

log = logging.getLogger("selector")


class QueryOffsets:
    """Per ``queries`` partition: the offsets read and not yet answered, and how far a commit may go.

    The join loop reads; delivery reports (another thread) say which queries are answered, so
    it has its own lock. Offsets are read in increasing order within a partition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, OrderedDict[int, bool]] = {}  # partition -> offset -> answered
        self._where: dict[str, list[tuple[int, int]]] = {}  # query id -> its open (partition, offset)s
        self._next: dict[int, int] = {}  # partition -> one past the last offset read
        self._storable: dict[int, int] = {}  # partition -> offset to store, moved since ``take``

    def read(self, partition: int, offset: int, query_id: str | None) -> None:
        """A query was read; ``query_id`` None: nothing to answer (an undecodable record)."""
        with self._lock:
            if offset < self._next.get(partition, 0):
                return  # read before: its first reading is tracked (or done)
            self._next[partition] = offset + 1
            self._open.setdefault(partition, OrderedDict())[offset] = query_id is None
            if query_id is None:
                self._advance(partition)
            else:
                self._where.setdefault(query_id, []).append((partition, offset))

    def source(self, query_id: str) -> tuple[int, int] | None:
        """(partition, offset) a query still unanswered was first read at; None if none is open."""
        with self._lock:
            where = self._where.get(query_id)
            return where[0] if where else None

    def answered(self, query_id: str) -> None:
        """The broker acknowledged the query's Response."""
        with self._lock:
            for partition, offset in self._where.pop(query_id, ()):
                part = self._open.get(partition)
                if part is not None and offset in part:
                    part[offset] = True
                    self._advance(partition)

    def _advance(self, partition: int) -> None:
        moved = finished_prefix(self._open[partition])
        if moved is not None:
            self._storable[partition] = moved

    def take(self) -> dict[int, int]:
        """Partition -> the offset to store, for the partitions whose offset moved since the last call."""
        with self._lock:
            out, self._storable = self._storable, {}
            return out

    def position(self, partition: int) -> int | None:
        """Where reading the partition goes on: one past the last offset read (None: never read)."""
        with self._lock:
            return self._next.get(partition)

    def partitions(self) -> set[int]:
        """The partitions read from (and not forgotten)."""
        with self._lock:
            return set(self._next)

    def waiting(self, partition: int) -> int:
        """Queries read on ``partition`` whose Response is not yet acknowledged."""
        with self._lock:
            return sum(1 for done in self._open.get(partition, {}).values() if not done)

    def forget(self, partitions: Iterable[int]) -> None:
        """The partitions went to another member: it answers what is open here."""
        gone = set(partitions)
        with self._lock:
            for p in gone:
                self._open.pop(p, None)
                self._next.pop(p, None)
                self._storable.pop(p, None)
            for qid in [q for q, where in self._where.items() if any(p in gone for p, _ in where)]:
                kept = [(p, o) for p, o in self._where[qid] if p not in gone]
                if kept:
                    self._where[qid] = kept
                else:
                    del self._where[qid]


class Handover:
    """The join consumer's rebalance callbacks and offset storing.

    The range assignor (eager) moves every partition at once: a member gives up all it owns,
    and most of it comes straight back. So a revoke only commits what is answered; the join
    state of a partition is dropped at the next assign, and only if the partition went to
    another member. One that came back resumes where this member was reading, not at the
    committed offset, as its queries in flight are still in the join here."""

    def __init__(self, queries_topic: str, predictions_topic: str, offsets: QueryOffsets,
                 drop: Callable[[set[int]], int], on_assigned: Callable[[], None] = lambda: None) -> None:
        self.queries_topic, self.predictions_topic = queries_topic, predictions_topic
        self.offsets, self.drop, self.on_assigned = offsets, drop, on_assigned
        self.owned: set[tuple[str, int]] = set()
        self._predictions_next: dict[int, int] = {}  # one past the last predictions offset read
        self._predictions_moved: set[int] = set()
        self.dropped = 0  # queries handed over unanswered

    # -- storing, from the join loop -------------------------------------------------------------
    def read_predictions(self, partition: int, offset: int) -> None:
        if offset + 1 > self._predictions_next.get(partition, 0):
            self._predictions_next[partition] = offset + 1
            self._predictions_moved.add(partition)

    def _predictions_stored(self) -> list[tuple[int, int]]:
        out = [(p, self._predictions_next[p]) for p in self._predictions_moved]  # ``_forget`` drops both
        self._predictions_moved.clear()
        return out

    def store(self, consumer: Consumer) -> None:
        """Store (for the auto-commit) every offset that moved, of partitions still owned."""
        q, pr = self.queries_topic, self.predictions_topic
        tps = [TopicPartition(q, p, o) for p, o in self.offsets.take().items() if (q, p) in self.owned]
        tps += [TopicPartition(pr, p, o) for p, o in self._predictions_stored() if (pr, p) in self.owned]
        if tps:
            try:
                consumer.store_offsets(offsets=tps)
            except KafkaException as exc:  # a partition lost in between: its new owner goes on
                log.warning("could not store offsets %s: %s", tps, exc)

    # -- rebalance callbacks (run inside the consumer's poll) -------------------------------------
    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what is answered before the partitions can move."""
        self.store(consumer)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:  # nothing stored since the last commit, or the group moved on
            log.info("commit on revoke: %s", exc)
        self.owned -= {(tp.topic, tp.partition) for tp in partitions}

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """This member was dropped from the group (too slow to heartbeat): another owns the
        partitions already, and answers their queries, so nothing is committed from here."""
        self.owned -= {(tp.topic, tp.partition) for tp in partitions}
        self._forget({tp.partition for tp in partitions if tp.topic == self.queries_topic},
                     {tp.partition for tp in partitions if tp.topic == self.predictions_topic})

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        mine = {(tp.topic, tp.partition) for tp in partitions}
        # the partitions this member read before and did not get back: their join state goes
        self._forget({p for p in self.offsets.partitions() if (self.queries_topic, p) not in mine},
                     {p for p in self._predictions_next if (self.predictions_topic, p) not in mine})
        resume, fresh = [], []
        for tp in partitions:
            at = (self.offsets.position(tp.partition) if tp.topic == self.queries_topic
                  else self._predictions_next.get(tp.partition))
            if at is None:
                fresh.append(tp)
            else:
                resume.append(TopicPartition(tp.topic, tp.partition, at))
        pin_and_assign(consumer, fresh, also=resume)
        self.owned = mine
        if resume or fresh:
            log.info("selector assigned %s (resumed where it was reading: %s)",
                     sorted(mine), sorted((tp.topic, tp.partition) for tp in resume))
        self.on_assigned()

    def _forget(self, queries: set[int], predictions: set[int]) -> None:
        if queries:
            self.dropped += self.drop(queries)
            self.offsets.forget(queries)
        for p in predictions:
            self._predictions_next.pop(p, None)
            self._predictions_moved.discard(p)
