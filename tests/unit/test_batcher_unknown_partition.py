"""A record for a partition the batcher's producer does not know yet (a replica added live) is
held and sent once a metadata refresh shows the partition, in order, and never dropped."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from batchers.outputs import Out, Outputs


class StaleProducer:
    """Knows ``known`` partitions of every topic; each ``list_topics`` call is a metadata
    refresh, and the ``learn_after``-th one learns ``partitions``."""

    def __init__(self, known: int, partitions: int, learn_after: int) -> None:
        self.known, self.partitions, self.learn_after = known, partitions, learn_after
        self.refreshes = 0
        self.sent: list[tuple[str, bytes, int | None]] = []
        self.fail_with: int | None = None

    def produce(self, topic: str, value: bytes, partition: int | None = None, on_delivery: Any = None) -> None:
        if self.fail_with is not None:
            raise KafkaException(KafkaError(self.fail_with))
        if partition is not None and partition >= self.known:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        self.sent.append((topic, value, partition))

    def poll(self, timeout: float) -> int:
        return 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.refreshes += 1
        if self.refreshes >= self.learn_after:
            self.known = self.partitions
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.known)))})


class Sender(Outputs):
    def __init__(self, producer: StaleProducer) -> None:
        self.producer = producer  # type: ignore[assignment]
        self.offsets = None
        self.counts = {"send_errors": 0}
        self.topic_predictions, self.topic_deadletter = "predictions", "deadletter"
        self.held, self._resending = [], None


def batch(value: bytes, partition: int) -> Out:
    return ("batches.m", value, partition, None)


def test_a_record_for_an_unknown_partition_waits_for_it_and_keeps_its_partitions_order() -> None:
    producer = StaleProducer(known=1, partitions=2, learn_after=2)
    out = Sender(producer)

    async def scenario() -> None:
        out._send_all([batch(b"a", 0), batch(b"b", 1)])  # b's partition is unknown: held, no raise
        out._send_all([batch(b"c", 1), batch(b"d", 0)])  # c queues behind b; d goes at once
        assert [v for _, v, _ in producer.sent] == [b"a", b"d"]
        assert [r[1] for r in out.held] == [b"b", b"c"]
        assert out._resending is not None
        await asyncio.wait_for(out._resending, 5)  # the second refresh learns partition 1

    asyncio.run(scenario())
    assert producer.sent == [("batches.m", b"a", 0), ("batches.m", b"d", 0),
                             ("batches.m", b"b", 1), ("batches.m", b"c", 1)]
    assert out.held == [] and producer.refreshes == 2


def test_knows_partitions_refreshes_and_counts() -> None:
    producer = StaleProducer(known=1, partitions=3, learn_after=1)
    out = Sender(producer)
    assert out.knows_partitions("batches.m", 3) and producer.known == 3
    assert not out.knows_partitions("batches.m", 4)


def test_any_other_produce_error_still_raises() -> None:
    producer = StaleProducer(known=2, partitions=2, learn_after=1)
    producer.fail_with = KafkaError._MSG_TIMED_OUT
    with pytest.raises(KafkaException):
        Sender(producer)._send_all([batch(b"a", 1)])
