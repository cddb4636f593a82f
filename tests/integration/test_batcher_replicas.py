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
from topics.markers import is_handover, ready_marker

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
