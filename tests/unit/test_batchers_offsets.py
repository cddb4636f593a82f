"""Batcher members without a broker: what a member may commit, what it resumes after a
rebalance, and its share of each replica's credit (docs/design/0024)."""

import asyncio
from typing import Any

import numpy as np
from confluent_kafka import TopicPartition

from batchers.aimd import AIMD
from batchers.core import BatcherCore, Pending
from batchers.dispatch import Dispatcher
from batchers.offsets import RequestHandover, RequestOffsets
from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from clipstream.settings import Settings
from schemas import ModelRequest, Tensor, encode

T = "p.requests.m"


def owned(*partitions: int) -> RequestOffsets:
    o = RequestOffsets()
    o.own({(T, p) for p in partitions})
    return o


def test_an_offset_is_stored_only_once_every_request_at_or_below_it_is_done() -> None:
    o = owned(0)
    for off in (10, 11, 12):
        o.read((T, 0, off))
    o.done([(T, 0, 11)])
    assert o.take() == []  # 10 is still queued: a crash now must replay it
    o.done([(T, 0, 10)])
    assert [(tp.partition, tp.offset) for tp in o.take()] == [(0, 12)]
    assert o.take() == []  # nothing moved since
    assert o.waiting() == 1
    o.done([(T, 0, 12), None])  # None: a request with no record (nothing to commit)
    assert [tp.offset for tp in o.take()] == [13] and o.waiting() == 0


def test_partitions_given_up_are_not_stored_nor_tracked() -> None:
    o = owned(0, 1)
    o.read((T, 0, 5))
    o.read((T, 1, 7))
    o.own({(T, 1)})  # partition 0 went to another member: it replays from the committed offset
    o.done([(T, 0, 5), (T, 1, 7)])
    assert [(tp.partition, tp.offset) for tp in o.take()] == [(1, 8)]
    o.read((T, 0, 6))  # fetched before the revoke, handed over after: served, not tracked
    assert o.waiting() == 0 and o.position((T, 0)) is None


class FakeConsumer:
    def __init__(self, committed: dict[int, int]) -> None:
        self._committed = committed
        self.assigned: list[TopicPartition] = []
        self.stored: list[TopicPartition] = []
        self.commits = 0

    def committed(self, partitions: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self._committed.get(tp.partition, -1001)) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0) -> tuple[int, int]:
        return 0, 100

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def commit(self, offsets: Any = None, asynchronous: bool = True) -> None:
        self.commits += 1

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        self.stored += offsets


def test_a_partition_that_comes_back_resumes_where_this_member_read_a_new_one_at_the_commit() -> None:
    o, shares = RequestOffsets(), []
    h = RequestHandover(o, lambda mine: shares.append(sorted(p for _, p in mine)))
    c = FakeConsumer({0: 3, 1: 40})
    h.on_assign(c, [TopicPartition(T, 0)])  # type: ignore[arg-type]
    assert [(tp.partition, tp.offset) for tp in c.assigned] == [(0, 3)]
    o.read((T, 0, 3))
    o.read((T, 0, 4))
    o.done([(T, 0, 3)])
    h.on_revoke(c, [TopicPartition(T, 0)])  # type: ignore[arg-type]
    assert [(tp.partition, tp.offset) for tp in c.stored] == [(0, 4)] and c.commits == 1
    # eager rebalance: partition 0 comes back (4 is still queued here: not read twice), 1 is new
    h.on_assign(c, [TopicPartition(T, 0), TopicPartition(T, 1)])  # type: ignore[arg-type]
    assert sorted((tp.partition, tp.offset) for tp in c.assigned) == [(0, 5), (1, 40)]
    assert shares == [[0], [0, 1]]
    h.on_lost(c, [TopicPartition(T, 0)])  # type: ignore[arg-type]
    assert shares[-1] == [1] and o.owned == {(T, 1)}


def test_members_split_each_replicas_credit_by_their_share_of_the_partitions() -> None:
    d = Dispatcher(2, lambda: AIMD(20_000, start=4, cap=64), max_in_flight=2, batch_delay_us=0,
                   credit_timeout_us=1_000_000, credit_lead_us=None)
    c = BatcherCore("m", "1", d, coalesce=False)
    d.set_credit(1)  # one member of two: one batch at each replica, the other member the other
    for i in range(12):
        r = ModelRequest(query_id=f"q{i}", app="a", model="m", input=Tensor.of(np.zeros(1, np.float32)),
                         deadline_us=10_000_000, selector_partition=0, trace={})
        c.admit(Pending(r, None, 0, (T, 0, i)))
    step = c.poll(0)
    assert sorted(b.replica for b in step.batches) == [0, 1]  # one each, then no credit
    assert [w for b in step.batches for w in b.wheres] == [(T, 0, i) for i in range(8)]
    d.set_credit(2)  # alone again: the full credit
    assert len(c.poll(0).batches) == 1  # 4 left, one more batch fits


class DeliveringProducer:
    """Queues records; ``deliver`` runs their delivery reports, as librdkafka's poll would."""

    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.topics: list[str] = []
        self.sent: list[tuple[str, bytes, int | None]] = []

    def produce(self, topic: str, value: bytes, partition: int | None = None, on_delivery: Any = None) -> None:
        self.topics.append(topic)
        self.sent.append((topic, value, partition))
        self.reports.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return 0

    def deliver(self) -> None:
        reports, self.reports = self.reports, []
        for report in reports:
            report(None, None)


def test_a_request_is_committable_once_the_batch_or_dead_letter_serving_it_is_delivered() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(0)
        setup = ModelSetup("m", "1", 1, latency_objective_ms=20, max_batch_size=8, batch_delay_ms=0, cache=False)

        class Guard:
            def available(self) -> bool:
                return True

        svc = BatcherService(Settings(topic_prefix="p."), BatcherSettings(), setup, producer,  # type: ignore[arg-type]
                             guard=Guard(), offsets=offsets)  # type: ignore[arg-type]
        r = ModelRequest(query_id="q", app="a", model="m", input=Tensor.of(np.zeros(1, np.float32)),
                         deadline_us=2**62, selector_partition=0, trace={})
        svc.accept_group([(encode(r), (T, 0, 0)), (b"junk", (T, 0, 1))])
        lookups = asyncio.get_running_loop().create_task(svc.lookup_loop())
        batches = asyncio.get_running_loop().create_task(svc.batch_loop())
        for _ in range(500):  # at most 5 s for the two loops to send the batch and the dead letter
            if len(producer.topics) >= 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(producer.topics) == ["p.batches.m", "p.deadletter"]
        assert offsets.take() == [] and offsets.waiting() == 2  # sent, not yet acknowledged
        producer.deliver()
        assert [tp.offset for tp in offsets.take()] == [2] and offsets.waiting() == 0
        lookups.cancel()
        batches.cancel()

    asyncio.run(run())
