"""A replica added while the batcher runs (``clipstream set-replicas``), against the real broker.

``set-replicas`` adds a partition to ``batches.<model>`` and writes the registry; the batcher
follows the registry, while its producer's cached metadata still knows only the old partition
count (librdkafka refreshes it every few minutes). A batch produced to the new partition
before the producer knows it used to raise ``_UNKNOWN_PARTITION`` and end the batcher; the
test plays the workers, the new one announcing itself with a ready marker.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from clipstream.clock import now_us
from clipstream.settings import Settings
from clipstream.testing.models import make_python_model
from registry.topic import RegistryWriter, wait_for
from schemas import Batch, encode
from tests.integration.batcher_harness import uniq
from topics import consumer_config
from topics.admin import ensure_model_topics
from topics.markers import is_handover, is_retirement, ready_marker

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays the workers

SRC = "class Model:\n    def __init__(self, path, config): pass\n"


def test_a_replica_added_live_gets_batches_and_the_batcher_keeps_running(
    run_batcher: Any, wire: Any, settings: Settings, tmp_path: Path
) -> None:
    model = uniq("grow")
    w = wire(model, 1)
    path = make_python_model(tmp_path, model, SRC, labels=[0, 1], shape=(2,))
    with RegistryWriter(settings) as reg:
        reg.model(model, "1", path, replicas=1)
    wait_for(settings, lambda v: model in v.models)
    b = run_batcher(model, "--no-cache", "--batch-delay-ms", "0")  # follows the registry's replicas
    pid = b.proc.pid
    topic = w.cat.batches(model).name
    x = np.zeros(2, np.float32)
    batched: dict[str, int] = {}  # query id -> the partition its batch came on

    def worker(batch: Batch, msg: Any) -> None:
        """Each replica's worker: report every batch at once, so credit never runs out."""
        if not is_handover(batch):
            for item in batch.items:
                batched[item.query_id] = msg.partition()
            w.stats(batch, 1_000)

    # one replica: the batcher's producer learns the topic's metadata (one partition)
    w.request("before", x)
    w.take(topic, Batch, lambda g: "before" in batched, on=worker)
    assert batched["before"] == 0

    # `clipstream set-replicas MODEL 2`: the new partition first, then the registry record
    ensure_model_topics(settings, model, 2)
    with RegistryWriter(settings) as reg:
        reg.model(model, "1", path, replicas=2)
    # the new worker is ready on partition 1
    w.raw(w.cat.batch_stats(model).name, encode(ready_marker(model, "1", 1, "test-replica-1", now_us())))
    # the test's consumer of batches learns of partition 1 now, not at its next metadata refresh
    w.consumers.pop(topic).close()
    watch = Consumer(consumer_config(settings, f"test-{uuid.uuid4().hex}", **{"auto.offset.reset": "earliest"}))
    watch.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    w.consumers[topic] = watch

    # requests until one is batched to the new replica, then as many again: none is lost
    sent: list[str] = []

    def on_partition_1(_: list[Any]) -> bool:
        if any(p == 1 for q, p in batched.items() if q in sent):
            return True
        assert b.proc.poll() is None, f"the batcher exited:\n{b.output()[-3000:]}"
        if all(q in batched for q in sent):  # the last one was batched: send the next
            sent.append(f"q{len(sent)}")
            w.request(sent[-1], x)
        return False

    w.take(topic, Batch, on_partition_1, timeout_s=60, on=worker)
    more = [f"r{i}" for i in range(20)]
    for q in more:
        w.request(q, x)
    sent += more
    w.take(topic, Batch, lambda _: all(q in batched for q in sent) or b.proc.poll() is not None,
            timeout_s=60, on=worker)

    assert b.proc.poll() is None and b.proc.pid == pid, f"the batcher exited:\n{b.output()[-3000:]}"
    assert b.output().count("ready: batcher") == 1  # the same process, never restarted
    assert "Traceback" not in b.output() and "fatal:" not in b.output(), b.output()[-3000:]
    # the producer knew partition 1 before replica 1's first batch: none was refused and held
    assert "is not known to the producer yet" not in b.output(), b.output()[-3000:]
    assert [q for q in sent if q not in batched] == []  # every request batched
    assert {batched[q] for q in sent} == {0, 1}  # and both replicas serve


def test_a_replica_removed_live_gets_a_retirement_after_its_last_batch(
    run_batcher: Any, wire: Any, settings: Settings, tmp_path: Path
) -> None:
    """`set-replicas MODEL 1` from 2: the batcher stops sending to partition 1 and writes a
    retirement there, after the batches already sent to it, so that replica's worker serves
    them and stops (``up`` lets it leave instead of killing it)."""
    model = uniq("shrink")
    w = wire(model, 1)
    ensure_model_topics(settings, model, 2)
    path = make_python_model(tmp_path, model, SRC, labels=[0, 1], shape=(2,))
    with RegistryWriter(settings) as reg:
        reg.model(model, "1", path, replicas=2)
    wait_for(settings, lambda v: model in v.models and v.models[model].replicas == 2)
    b = run_batcher(model, "--no-cache", "--batch-delay-ms", "0")
    topic = w.cat.batches(model).name
    w.consumers.pop(topic).close()
    watch = Consumer(consumer_config(settings, f"test-{uuid.uuid4().hex}", **{"auto.offset.reset": "earliest"}))
    watch.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    w.consumers[topic] = watch
    x = np.zeros(2, np.float32)
    seen: list[tuple[int, str]] = []  # (partition, query id or "retired"), in the order read
    batched: set[str] = set()

    def worker(batch: Batch, msg: Any) -> None:
        if is_retirement(batch):
            seen.append((msg.partition(), "retired"))
        elif not is_handover(batch):
            seen.extend((msg.partition(), item.query_id) for item in batch.items)
            batched.update(item.query_id for item in batch.items)
            w.stats(batch, 1_000)

    sent: list[str] = []

    def both_replicas(_: list[Any]) -> bool:  # one request at a time until each replica had one
        if {p for p, _ in seen} == {0, 1}:
            return True
        if all(q in batched for q in sent):
            sent.append(f"q{len(sent)}")
            w.request(sent[-1], x)
        return False

    w.take(topic, Batch, both_replicas, timeout_s=60, on=worker)
    with RegistryWriter(settings) as reg:  # what `clipstream set-replicas MODEL 1` writes
        reg.model(model, "1", path, replicas=1)
    w.take(topic, Batch, lambda _: (1, "retired") in seen, timeout_s=30, on=worker)
    after = [f"r{i}" for i in range(10)]
    for q in after:
        w.request(q, x)
    w.take(topic, Batch, lambda _: all(q in batched for q in after), timeout_s=30, on=worker)

    on_1 = [q for p, q in seen if p == 1]
    assert on_1[-1] == "retired" and on_1.count("retired") == 1  # the last word on partition 1
    assert all(p == 0 for p, q in seen if q in after)  # later batches go to the replica left
    assert b.proc.poll() is None and "Traceback" not in b.output(), b.output()[-3000:]
