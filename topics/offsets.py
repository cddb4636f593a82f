"""Where a consumer starts, and what it commits: one place for every stage.

A partition the group has no committed offset for starts at its end *now* (or at its first
record since a time the caller gives: a new batcher group), given as a number:
a symbolic "latest" is resolved only at the first fetch, so a record produced between a
stage's ``ready:`` line and that fetch would be skipped. The pin is committed at once, so a
member that takes the partition over in a later rebalance resumes there too, instead of at a
new "latest" that would skip what came in between.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from clipstream.errors import InfraError
from topics.admin import watermarks

log = logging.getLogger("clipstream.topics")


def finished_prefix(part: OrderedDict[int, bool]) -> int | None:
    """Drop the finished offsets at the head of ``part`` (offset -> finished, in read order) and
    return the offset to commit after them, or None if the head is not finished: a member
    commits only past records it has served, never past one still open."""
    moved = None
    while part:
        offset, finished = next(iter(part.items()))
        if not finished:
            break
        part.popitem(last=False)
        moved = offset + 1
    return moved


def pin_and_assign(consumer: Consumer, partitions: list[TopicPartition], commit: bool = True,
                   also: list[TopicPartition] | None = None, since_ms: int | None = None) -> list[TopicPartition]:
    """An ``on_assign`` body: start each partition where the group left off, else at its end
    now, or with ``since_ms`` at its first record from then on (committed at once when
    ``commit``); returns what was assigned. If the broker cannot say, librdkafka's own reset
    policy decides rather than the consumer getting no partitions. ``also``: partitions whose
    start the caller fixed itself, assigned with them (``assign`` replaces the whole assignment)."""
    also = list(also or ())
    try:
        committed = consumer.committed(partitions, timeout=10) if partitions else []
        new = [tp for tp in committed if tp.offset < 0]
        since = {} if since_ms is None or not new else {
            (tp.topic, tp.partition): tp.offset
            for tp in consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, since_ms) for tp in new],
                                                 timeout=10)}
        pinned = []
        for tp in new:
            tp.offset = since.get((tp.topic, tp.partition), -1)
            if tp.offset < 0:  # no record since then (or not asked): the end now
                tp.offset = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)[1]
            pinned.append(TopicPartition(tp.topic, tp.partition, tp.offset))
        consumer.assign([*committed, *also])
    except KafkaException as exc:
        log.warning("could not fix the start offsets of %s (%s); using the reset policy",
                    sorted({tp.topic for tp in partitions}), exc)
        consumer.assign([*partitions, *also])
        return [*partitions, *also]
    if pinned and commit:
        try:
            consumer.commit(offsets=pinned, asynchronous=False)
        except KafkaException as exc:
            log.warning("could not commit the start offsets %s: %s", pinned, exc)
    return [*committed, *also]


def assign_at_end(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Assign partitions directly (no group: no rebalance ever delays a record), each from its
    end now, as a number (see the module's docstring). InfraError if the broker cannot say."""
    pinned = []
    for tp in partitions:
        try:
            _, high = watermarks(consumer, TopicPartition(tp.topic, tp.partition))
        except KafkaException as exc:
            raise InfraError(f"cannot read {tp.topic}[{tp.partition}]: {exc}") from exc
        pinned.append(TopicPartition(tp.topic, tp.partition, max(high, 0)))
    consumer.assign(pinned)


def committed_offset(consumer: Consumer, tp: TopicPartition, timeout_s: float, default: int = OFFSET_BEGINNING) -> int:
    """The group's committed offset of ``tp``, else ``default``, read with retries: on a fresh
    broker the offsets topic is still being created (NOT_COORDINATOR,
    COORDINATOR_LOAD_IN_PROGRESS), and librdkafka's one attempt at assign time can fail and
    stall the partition. InfraError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            (got,) = consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=5.0)
            if got.error is None:
                return got.offset if got.offset >= 0 else default
            error: Any = got.error
        except KafkaException as exc:
            error = exc
        if time.monotonic() > deadline:
            raise InfraError(f"cannot read the committed offset of {tp.topic}[{tp.partition}]: {error}")
        time.sleep(0.2)


class SpacedCommits:
    """Manual commits of one partition, at most one per ``interval_s`` (an offset commit is a
    write to the broker's offsets log; a crash redoes at most an interval's worth, as
    duplicates), and the last one at once when stopping (``flush``)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self._to_commit: int | None = None
        self._committed_at = 0.0

    def offer(self, offset: int | None) -> None:
        """The next offset that may be committed (one past the last record done), if any."""
        if offset is not None:
            self._to_commit = offset

    def commit(self, consumer: Consumer, interval_s: float, asynchronous: bool = True) -> bool:
        """Commit the offered offset if the interval has passed (always when not
        ``asynchronous``: the stop path); True if a commit was sent."""
        now = time.monotonic()
        if self._to_commit is None or (asynchronous and now - self._committed_at < interval_s):
            return False
        consumer.commit(offsets=[TopicPartition(self.topic, self.partition, self._to_commit)],
                        asynchronous=asynchronous)
        self._to_commit, self._committed_at = None, now
        return True
